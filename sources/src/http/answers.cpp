#include "answers.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <simdjson.h>

namespace idem::http::detail {

namespace {

using writer = rapidjson::Writer<rapidjson::StringBuffer>;

// Returns text with each byte that is not part of a well-formed UTF-8 sequence replaced by
// U+FFFD: answers quote what clients sent (a row key from the URL, a detail naming an id), and
// a JSON answer must be UTF-8 whatever they sent.
std::string utf8_or_replaced(std::string_view text) {
    if (simdjson::validate_utf8(text.data(), text.size())) return std::string(text);
    std::string out;
    out.reserve(text.size() + 16);
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const std::size_t n = text.size();
    for (std::size_t i = 0; i < n;) {
        const unsigned char c = p[i];
        std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        bool ok = len != 0 && i + len <= n;
        for (std::size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
        if (ok && len > 1) ok = simdjson::validate_utf8(text.data() + i, len);  // overlong, surrogates, past U+10FFFF
        if (ok) {
            out.append(text.substr(i, len));
            i += len;
        } else {
            out.append("\xEF\xBF\xBD");
            ++i;
        }
    }
    return out;
}

void string_field(writer& w, const char* name, std::string_view value) {
    const auto text = utf8_or_replaced(value);
    w.Key(name);
    w.String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
}

}  // namespace

bool answered_as_dead_letter(const outcome& o) noexcept {
    return o.kind == outcome_kind::dead_lettered ||
           (o.kind == outcome_kind::duplicate_message && o.first == outcome_kind::dead_lettered);
}

std::string outcomes_json(const std::vector<event_result>& results, std::uint64_t durable_commit) {
    rapidjson::StringBuffer buf;
    writer w{buf};
    w.StartObject();
    w.Key("outcomes");
    w.StartArray();
    for (const auto& r : results) {
        w.StartObject();
        if (r.error) {
            string_field(w, "outcome", "error");
            string_field(w, "detail", r.error.message());
        } else {
            const auto kind = answered_as_dead_letter(r.result) ? outcome_kind::dead_lettered : r.result.kind;
            string_field(w, "outcome", to_string(kind));
            w.Key("commit");
            w.Uint64(r.result.commit);
            if (r.result.why != reason::none) string_field(w, "reason", to_string(r.result.why));
            if (!r.result.detail.empty()) string_field(w, "detail", r.result.detail);
        }
        w.EndObject();
    }
    w.EndArray();
    w.Key("durable_commit");
    w.Uint64(durable_commit);
    w.EndObject();
    return std::string(buf.GetString(), buf.GetSize()) + "\n";
}

std::string error_json(std::string_view text) {
    rapidjson::StringBuffer buf;
    writer w{buf};
    w.StartObject();
    string_field(w, "error", text);
    w.EndObject();
    return std::string(buf.GetString(), buf.GetSize()) + "\n";
}

std::string row_json(const projection_base& p, const snapshot::raw_row_view& r) {
    std::string state;
    p.write_json(*p.load(r.state, r.state_version), state);
    rapidjson::StringBuffer buf;
    writer w{buf};
    w.StartObject();
    string_field(w, "key", r.key);
    w.Key("version");
    w.Uint64(r.version);
    w.Key("state");
    w.RawValue(state.data(), state.size(), rapidjson::kObjectType);
    w.EndObject();
    return std::string(buf.GetString(), buf.GetSize()) + "\n";
}

std::pair<unsigned, std::string> readiness(const health_report& h) {
    if (h.state == health_state::stalled || h.state == health_state::paused) {
        return {503, std::string(to_string(h.state)) + ": " + h.reason + "\n"};
    }
    return {200, "ready\n"};
}

}  // namespace idem::http::detail
