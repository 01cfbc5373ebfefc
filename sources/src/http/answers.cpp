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

std::string metrics_text(const engine& eng, const http_figures& f) {
    std::string out = eng.prometheus();
    static constexpr std::array<const char*, 6> classes{"2xx", "400", "401", "413", "4xx", "503"};
    out += "# HELP idem_http_answers_total HTTP answers by status class.\n# TYPE idem_http_answers_total counter\n";
    for (std::size_t i = 0; i < classes.size(); ++i) {
        out += "idem_http_answers_total{status=\"" + std::string(classes[i]) + "\"} " +
               std::to_string(f.answers[i]) + "\n";
    }
    out += "# HELP idem_http_connections Open HTTP connections.\n# TYPE idem_http_connections gauge\n";
    out += "idem_http_connections " + std::to_string(f.connections) + "\n";
    out += "# HELP idem_http_refused_connections_total Connections refused past the limit or while stopping.\n"
           "# TYPE idem_http_refused_connections_total counter\n";
    out += "idem_http_refused_connections_total " + std::to_string(f.refused) + "\n";
    out += "# HELP idem_http_accept_failures_total Accepts that failed for want of descriptors (each backed off).\n"
           "# TYPE idem_http_accept_failures_total counter\n";
    out += "idem_http_accept_failures_total " + std::to_string(f.accept_failures) + "\n";
    out += "# HELP idem_http_timeouts_total Connections cut off by a read or idle timeout.\n"
           "# TYPE idem_http_timeouts_total counter\n";
    out += "idem_http_timeouts_total " + std::to_string(f.timeouts) + "\n";
    out += "# HELP idem_http_in_flight Events submitted over HTTP and not yet answered.\n"
           "# TYPE idem_http_in_flight gauge\n";
    out += "idem_http_in_flight " + std::to_string(f.in_flight) + "\n";
    // The store's own figures (kept across restarts, unlike the engine's counters): a
    // snapshot's table entry counts, cheap.
    auto snap = eng.read();
    auto consumer = snap.consumer(eng.options().store.consumer);
    const auto durable = consumer.stats();
    out += "# HELP idem_inbox_size Message ids in the consumer's inbox.\n# TYPE idem_inbox_size gauge\n";
    out += "idem_inbox_size " + std::to_string(consumer.inbox_size()) + "\n";
    out += "# HELP idem_dead_letters_total Events dead-lettered, ever (the store's durable counter).\n"
           "# TYPE idem_dead_letters_total counter\n";
    out += "idem_dead_letters_total " +
           std::to_string(durable.outcomes[static_cast<std::size_t>(outcome_kind::dead_lettered)]) + "\n";
    out += "# HELP idem_parked Events parked until their stream's gap fills.\n# TYPE idem_parked gauge\n";
    out += "idem_parked " + std::to_string(consumer.parked()) + "\n";
    // Lag of an HTTP source: what is accepted and not yet durable (commits and events).
    out += "# HELP idem_commit_lag Commits made and not yet known durable.\n# TYPE idem_commit_lag gauge\n";
    const auto last = snap.commit();
    const auto dur = eng.durable_commit();
    out += "idem_commit_lag " + std::to_string(last > dur ? last - dur : 0) + "\n";
    return out;
}

}  // namespace idem::http::detail
