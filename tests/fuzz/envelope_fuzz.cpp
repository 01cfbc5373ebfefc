// Fuzzes the CloudEvents envelope parser: any bytes either parse into an envelope that
// obeys the envelope rules and survives to_json() unchanged, or are rejected with a reason
// and a detail. Also: append_json_string() of any bytes is valid JSON that reads back as
// the same bytes whenever they are valid UTF-8.

#include <idem/storage/envelope.hpp>

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

// Reports a broken invariant and aborts, so libFuzzer saves the input as a crash.
void require(bool ok, const char* what, std::string_view input) {
    if (ok) return;
    std::fprintf(stderr, "envelope_fuzz: invariant broken: %s\ninput (%zu bytes): %.*s\n", what, input.size(),
                 static_cast<int>(input.size()), input.data());
    std::abort();
}

bool same(const idem::envelope& a, const idem::envelope& b) {
    return a.id == b.id && a.source == b.source && a.type == b.type && a.subject == b.subject &&
           a.sequence == b.sequence && a.time == b.time && a.msgid == b.msgid && a.data == b.data &&
           a.datacontenttype == b.datacontenttype && a.data_binary == b.data_binary;
}

// What simdjson's DOM parser, which validates the whole document, makes of text: the oracle
// for "is this one JSON object". Its number limits (no infinities) are not
// JSON's, so a number it refuses proves nothing.
enum class oracle { object, not_object, invalid, unsure };

oracle judge(std::string_view text) {
    static simdjson::dom::parser dom;
    simdjson::dom::element root;
    auto e = dom.parse(text.data(), text.size()).get(root);
    if (e == simdjson::NUMBER_ERROR || e == simdjson::DEPTH_ERROR) return oracle::unsure;
    if (e != simdjson::SUCCESS) return oracle::invalid;
    return root.is_object() ? oracle::object : oracle::not_object;
}

void check_parse(idem::envelope_parser& parser, std::string_view text) {
    idem::envelope ev;
    idem::parse_error err;
    const bool ok = parser.parse(text, ev, err);
    require(ok == (err.why == idem::reason::none), "parse() result and err.why disagree", text);
    // Never accept what is not one JSON object, never call one malformed. (A body with several
    // defects is rejected for the first one found, which need not be its syntax.)
    // A leading byte order mark is skipped by the parser, so the oracle judges what follows it.
    const auto verdict = judge(text.starts_with("\xEF\xBB\xBF") ? text.substr(3) : text);
    const bool syntax = err.why == idem::reason::invalid_json || err.why == idem::reason::invalid_utf8;
    require(!(ok && (verdict == oracle::invalid || verdict == oracle::not_object)), "invalid JSON accepted", text);
    require(!(syntax && verdict == oracle::object), "a valid JSON object rejected as invalid_json or invalid_utf8", text);
    if (!ok) {
        require(!err.detail.empty(), "a rejection without a detail", text);
        require(idem::to_string(err.why) != "unknown", "a rejection with an unnamed reason", text);
        return;
    }
    require(!ev.id.empty() && !ev.source.empty() && !ev.type.empty(), "accepted without id, source or type", text);
    require(!ev.sequence || (*ev.sequence > 0 && !ev.subject.empty()), "accepted a bad sequence", text);
    require(ev.data_binary || !ev.data.empty(), "accepted with empty JSON data", text);
    require(ev.message_id().size() > 1 && !idem::describe(ev).empty(), "empty identity", text);

    // The same text parsed again with a parser and an envelope that held another event.
    idem::envelope again;
    idem::parse_error again_err;
    static const std::string other =
        R"({"specversion":"1.0","id":"other-id","source":"/other","type":"t","subject":"s","sequence":7,"msgid":"m",)"
        R"("time":"2026-12-02T10:00:00Z","datacontenttype":"image/png","data_base64":"AAEC"})";
    require(parser.parse(other, again, again_err), "the reference event does not parse", other);
    require(parser.parse(text, again, again_err) && same(ev, again), "a reused parser or envelope changes the result",
            text);

    // to_json() writes what parse() reads back identically.
    const std::string json = ev.to_json();
    idem::envelope round;
    idem::parse_error round_err;
    require(parser.parse(json, round, round_err), "to_json() output does not parse", json);
    require(same(ev, round), "to_json() does not round-trip", text);
}

void check_json_string(idem::envelope_parser& parser, std::string_view bytes) {
    idem::envelope ev;
    ev.id.assign(bytes);
    ev.source = "/fuzz";
    ev.type = "fuzz";
    const std::string json = ev.to_json();
    idem::envelope back;
    idem::parse_error err;
    require(simdjson::validate_utf8(json.data(), json.size()), "append_json_string() wrote invalid UTF-8", bytes);
    const bool ok = parser.parse(json, back, err);
    if (bytes.empty()) {
        require(!ok && err.why == idem::reason::missing_id, "an empty id was not missing_id", bytes);
        return;
    }
    if (!ok) {
        // Written as valid JSON, but an id with a control character is not a CloudEvents String.
        require(err.why == idem::reason::invalid_field &&
                    err.detail.find("which a CloudEvents String may not hold") != std::string::npos,
                "append_json_string() output does not parse", json);
        return;
    }
    if (simdjson::validate_utf8(bytes.data(), bytes.size())) {
        require(back.id == bytes, "a valid UTF-8 string does not read back unchanged", bytes);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static idem::envelope_parser parser;
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    check_parse(parser, text);
    check_json_string(parser, text);
    return 0;
}
