#include "json_writer.hpp"

#include <idem/storage/envelope.hpp>

#include <cstdio>

namespace idem::cli::detail {

void json_writer::separate() {
    if (after_key_) {
        after_key_ = false;
        return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_.push_back(',');
    first_.back() = false;
}

json_writer& json_writer::begin_object() {
    separate();
    out_.push_back('{');
    first_.push_back(true);
    return *this;
}

json_writer& json_writer::end_object() {
    out_.push_back('}');
    first_.pop_back();
    return *this;
}

json_writer& json_writer::begin_array() {
    separate();
    out_.push_back('[');
    first_.push_back(true);
    return *this;
}

json_writer& json_writer::end_array() {
    out_.push_back(']');
    first_.pop_back();
    return *this;
}

json_writer& json_writer::key(std::string_view k) {
    separate();
    append_json_string(out_, k);
    out_.push_back(':');
    after_key_ = true;
    return *this;
}

json_writer& json_writer::value(std::string_view s) {
    separate();
    append_json_string(out_, s);
    return *this;
}

json_writer& json_writer::value(std::uint64_t n) {
    separate();
    out_.append(std::to_string(n));
    return *this;
}

json_writer& json_writer::value(bool b) {
    separate();
    out_.append(b ? "true" : "false");
    return *this;
}

json_writer& json_writer::null() {
    separate();
    out_.append("null");
    return *this;
}

json_writer& json_writer::fixed(double v, int decimals) {
    separate();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    out_.append(buf);
    return *this;
}

json_writer& json_writer::raw(std::string_view json) {
    separate();
    out_.append(json);
    return *this;
}

std::string& json_writer::raw_value() {
    separate();
    return out_;
}

json_writer& json_writer::field(std::string_view k, const std::optional<std::string>& v) {
    key(k);
    return v ? value(*v) : null();
}

}  // namespace idem::cli::detail
