#include "answers.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace idem::http::detail {

namespace {

using writer = rapidjson::Writer<rapidjson::StringBuffer>;

void string_field(writer& w, const char* name, std::string_view value) {
    w.Key(name);
    w.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
}

}  // namespace

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
            string_field(w, "outcome", to_string(r.result.kind));
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

}  // namespace idem::http::detail
