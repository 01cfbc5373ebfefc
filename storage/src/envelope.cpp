#include <idem/storage/envelope.hpp>

#include <simdjson.h>

#include <charconv>

namespace idem {

std::string_view to_string(reason r) noexcept {
    switch (r) {
    case reason::none: return "none";
    case reason::invalid_json: return "invalid_json";
    case reason::missing_id: return "missing_id";
    case reason::missing_source: return "missing_source";
    case reason::missing_type: return "missing_type";
    case reason::invalid_field: return "invalid_field";
    case reason::unsupported_specversion: return "unsupported_specversion";
    case reason::invalid_sequence: return "invalid_sequence";
    case reason::missing_key: return "missing_key";
    case reason::key_too_long: return "key_too_long";
    case reason::decode_failed: return "decode_failed";
    case reason::handler_failed: return "handler_failed";
    case reason::sequence_gap: return "sequence_gap";
    case reason::sequence_conflict: return "sequence_conflict";
    case reason::unknown_type: return "unknown_type";
    case reason::too_large: return "too_large";
    case reason::invalid_utf8: return "invalid_utf8";
    case reason::late_event: return "late_event";
    case reason::id_conflict: return "id_conflict";
    case reason::released_dropped: return "released_dropped";
    }
    return "unknown";
}

std::vector<reason> dead_letter_reasons() {
    std::vector<reason> out;
    for (auto r = static_cast<int>(reason::invalid_json); r <= static_cast<int>(reason::released_dropped); ++r) {
        out.push_back(static_cast<reason>(r));
    }
    return out;
}

std::optional<reason> reason_from_string(std::string_view name) noexcept {
    for (auto r = static_cast<int>(reason::invalid_json); r <= static_cast<int>(reason::released_dropped); ++r) {
        if (to_string(static_cast<reason>(r)) == name) return static_cast<reason>(r);
    }
    return std::nullopt;
}

std::string envelope::event_id() const {
    // Length-prefixing the source makes (source, id) -> text injective.
    std::string out = std::to_string(source.size());
    out.push_back(':');
    out.append(source);
    out.append(id);
    return out;
}

std::string transport_message_id(std::string_view msgid) {
    std::string out = "m";
    out.append(msgid);
    return out;
}

std::string envelope::message_id() const {
    if (!msgid.empty()) {
        return transport_message_id(msgid);
    }
    return "e" + event_id();
}

std::string describe(const envelope& e) {
    std::string out = "event (source '";
    out.append(e.source).append("', id '").append(e.id).append("')");
    return out;
}

void append_json_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    auto escape_byte = [&](unsigned char u) {
        out += "\\u00";
        out.push_back(hex[u >> 4]);
        out.push_back(hex[u & 0xF]);
    };
    out.push_back('"');
    std::size_t i = 0;
    while (i < s.size()) {
        auto u = static_cast<unsigned char>(s[i]);
        if (u < 0x80) {
            switch (u) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (u < 0x20) {
                    escape_byte(u);
                } else {
                    out.push_back(static_cast<char>(u));
                }
            }
            ++i;
            continue;
        }
        // A well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, nothing
        // past U+10FFFF) is copied; any other byte is escaped on its own.
        std::size_t len = 0;
        unsigned char lo = 0x80;  // the range of the second byte, which rules out the ill-formed cases
        unsigned char hi = 0xBF;
        if (u >= 0xC2 && u <= 0xDF) {
            len = 2;
        } else if (u >= 0xE0 && u <= 0xEF) {
            len = 3;
            if (u == 0xE0) lo = 0xA0;
            if (u == 0xED) hi = 0x9F;
        } else if (u >= 0xF0 && u <= 0xF4) {
            len = 4;
            if (u == 0xF0) lo = 0x90;
            if (u == 0xF4) hi = 0x8F;
        }
        bool ok = len != 0 && i + len <= s.size();
        for (std::size_t k = 1; ok && k < len; ++k) {
            auto c = static_cast<unsigned char>(s[i + k]);
            ok = k == 1 ? (c >= lo && c <= hi) : (c & 0xC0) == 0x80;
        }
        if (ok) {
            out.append(s.substr(i, len));
            i += len;
        } else {
            escape_byte(u);
            ++i;
        }
    }
    out.push_back('"');
}

std::string envelope::to_json() const {
    std::string out = R"({"specversion":"1.0","id":)";
    append_json_string(out, id);
    out += ",\"source\":";
    append_json_string(out, source);
    out += ",\"type\":";
    append_json_string(out, type);
    if (!subject.empty()) {
        out += ",\"subject\":";
        append_json_string(out, subject);
    }
    if (sequence) {
        out += ",\"sequence\":\"" + std::to_string(*sequence) + "\"";
    }
    if (!time.empty()) {
        out += ",\"time\":";
        append_json_string(out, time);
    }
    if (!msgid.empty()) {
        out += ",\"msgid\":";
        append_json_string(out, msgid);
    }
    out += ",\"data\":";
    out += data;
    out.push_back('}');
    return out;
}

struct envelope_parser::impl {
    simdjson::ondemand::parser parser;
    std::string buffer;  // input copy with simdjson's padding
};

envelope_parser::envelope_parser() : impl_(std::make_unique<impl>()) {}
envelope_parser::~envelope_parser() = default;
envelope_parser::envelope_parser(envelope_parser&&) noexcept = default;
envelope_parser& envelope_parser::operator=(envelope_parser&&) noexcept = default;

namespace {

using simdjson::ondemand::json_type;

std::string_view trim_right(std::string_view s) noexcept {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
        s.remove_suffix(1);
    }
    return s;
}

// RFC 8259's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, any magnitude.
bool is_json_number(std::string_view s) noexcept {
    std::size_t i = 0;
    auto digits = [&] {
        const auto from = i;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
        return i > from;
    };
    if (i < s.size() && s[i] == '-') ++i;
    if (i < s.size() && s[i] == '0') {
        ++i;
    } else if (!digits()) {
        return false;
    }
    if (i < s.size() && s[i] == '.') {
        ++i;
        if (!digits()) return false;
    }
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        ++i;
        if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
        if (!digits()) return false;
    }
    return i == s.size();
}

// Reads a value to its end, checking all of it: the on-demand parser checks only what is
// read, so a value that is skipped (an extension, `data`) could hide `nul` or `1x2`.
simdjson::error_code validate(simdjson::ondemand::value value) {
    json_type type{};
    if (auto e = value.type().get(type); e != simdjson::SUCCESS) return e;
    switch (type) {
    case json_type::object: {
        simdjson::ondemand::object o;
        if (auto e = value.get_object().get(o); e != simdjson::SUCCESS) return e;
        for (auto field : o) {
            std::string_view key;
            if (auto e = field.unescaped_key().get(key); e != simdjson::SUCCESS) return e;
            simdjson::ondemand::value v;
            if (auto e = field.value().get(v); e != simdjson::SUCCESS) return e;
            if (auto e = validate(v); e != simdjson::SUCCESS) return e;
        }
        return simdjson::SUCCESS;
    }
    case json_type::array: {
        simdjson::ondemand::array a;
        if (auto e = value.get_array().get(a); e != simdjson::SUCCESS) return e;
        for (auto element : a) {
            simdjson::ondemand::value v;
            if (auto e = element.get(v); e != simdjson::SUCCESS) return e;
            if (auto e = validate(v); e != simdjson::SUCCESS) return e;
        }
        return simdjson::SUCCESS;
    }
    case json_type::string: {
        std::string_view s;
        return value.get_string().get(s);
    }
    case json_type::number:
        return is_json_number(trim_right(value.raw_json_token())) ? simdjson::SUCCESS : simdjson::NUMBER_ERROR;
    case json_type::boolean: {
        const auto token = trim_right(value.raw_json_token());
        return token == "true" || token == "false" ? simdjson::SUCCESS : simdjson::T_ATOM_ERROR;
    }
    case json_type::null:
        return trim_right(value.raw_json_token()) == "null" ? simdjson::SUCCESS : simdjson::N_ATOM_ERROR;
    }
    return simdjson::TAPE_ERROR;
}

bool fail(parse_error& err, reason why, std::string detail) {
    err.why = why;
    err.detail = std::move(detail);
    return false;
}

// Reads a string attribute; a wrong JSON type is invalid_field, naming the attribute.
bool read_string(simdjson::ondemand::value value, std::string_view name, std::string& out, parse_error& err) {
    std::string_view s;
    if (value.get_string().get(s) != simdjson::SUCCESS) {
        return fail(err, reason::invalid_field, "attribute '" + std::string(name) + "' must be a string");
    }
    out.assign(s);
    return true;
}

bool read_sequence(simdjson::ondemand::value value, std::optional<std::uint64_t>& out, parse_error& err) {
    json_type type{};
    if (value.type().get(type) != simdjson::SUCCESS) {
        return fail(err, reason::invalid_json, "attribute 'sequence' is not valid JSON");
    }
    std::uint64_t n = 0;
    if (type == json_type::number) {
        if (value.get_uint64().get(n) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_sequence, "attribute 'sequence' must be a positive integer");
        }
    } else if (type == json_type::string) {
        std::string_view s;
        if (value.get_string().get(s) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_sequence, "attribute 'sequence' is not a valid string");
        }
        auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
        if (ec != std::errc{} || ptr != s.data() + s.size() || s.empty()) {
            return fail(err, reason::invalid_sequence,
                        "attribute 'sequence' must be a decimal integer, got \"" + std::string(s) + "\"");
        }
    } else {
        return fail(err, reason::invalid_sequence, "attribute 'sequence' must be a string or an integer");
    }
    if (n == 0) {
        return fail(err, reason::invalid_sequence, "attribute 'sequence' is 1-based; 0 is not a position");
    }
    out = n;
    return true;
}

}  // namespace

bool envelope_parser::parse(std::string_view text, envelope& out, parse_error& err) {
    // Reset field by field: a reused envelope keeps its strings' capacity.
    out.id.clear();
    out.source.clear();
    out.type.clear();
    out.subject.clear();
    out.sequence.reset();
    out.time.clear();
    out.msgid.clear();
    out.data.assign("null");
    err.why = reason::none;
    err.detail.clear();
    auto& buf = impl_->buffer;
    buf.assign(text);
    buf.append(simdjson::SIMDJSON_PADDING, '\0');

    simdjson::ondemand::document doc;
    if (auto e = impl_->parser.iterate(buf.data(), text.size(), buf.size()).get(doc); e != simdjson::SUCCESS) {
        if (e == simdjson::UTF8_ERROR) return fail(err, reason::invalid_utf8, "the body is not valid UTF-8");
        return fail(err, reason::invalid_json, "not a JSON document");
    }
    simdjson::ondemand::object object;
    if (doc.get_object().get(object) != simdjson::SUCCESS) {
        return fail(err, reason::invalid_json, "the body is not a single JSON object");
    }
    unsigned seen = 0;
    auto once = [&](unsigned bit, std::string_view name) {
        if ((seen & bit) != 0) {
            return fail(err, reason::invalid_field, "attribute '" + std::string(name) + "' appears twice");
        }
        seen |= bit;
        return true;
    };
    std::string specversion;
    for (auto field : object) {
        std::string_view name;
        if (field.unescaped_key().get(name) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed attribute name");
        }
        simdjson::ondemand::value value;
        if (field.value().get(value) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed value of attribute '" + std::string(name) + "'");
        }
        bool ok = true;
        if (name == "id") {
            ok = once(1u << 0, name) && read_string(value, name, out.id, err);
        } else if (name == "source") {
            ok = once(1u << 1, name) && read_string(value, name, out.source, err);
        } else if (name == "type") {
            ok = once(1u << 2, name) && read_string(value, name, out.type, err);
        } else if (name == "subject") {
            ok = once(1u << 3, name) && read_string(value, name, out.subject, err);
        } else if (name == "time") {
            ok = once(1u << 4, name) && read_string(value, name, out.time, err);
        } else if (name == "msgid") {
            ok = once(1u << 5, name) && read_string(value, name, out.msgid, err);
        } else if (name == "specversion") {
            ok = once(1u << 6, name) && read_string(value, name, specversion, err);
        } else if (name == "sequence") {
            ok = once(1u << 7, name) && read_sequence(value, out.sequence, err);
        } else if (name == "data") {
            ok = once(1u << 8, name);
            if (ok) {
                // A scalar is its token; an object or array runs from its first token to the one after it.
                json_type type{};
                const auto token = value.raw_json_token();
                const char* end = token.data() + token.size();
                if (value.type().get(type) != simdjson::SUCCESS || validate(value) != simdjson::SUCCESS ||
                    ((type == json_type::object || type == json_type::array) &&
                     doc.current_location().get(end) != simdjson::SUCCESS)) {
                    return fail(err, reason::invalid_json, "attribute 'data' is not valid JSON");
                }
                out.data.assign(trim_right(std::string_view(token.data(), static_cast<std::size_t>(end - token.data()))));
            }
        } else if (validate(value) != simdjson::SUCCESS) {
            // Unknown attributes (extensions) are allowed and ignored; they must still be valid JSON.
            return fail(err, reason::invalid_json, "malformed value of attribute '" + std::string(name) + "'");
        }
        if (!ok) {
            return false;
        }
    }
    if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) {
        return fail(err, reason::invalid_json, "trailing content after the event object");
    }
    if (!specversion.empty() && specversion != "1.0") {
        return fail(err, reason::unsupported_specversion,
                    "specversion \"" + specversion + "\" is not supported (only \"1.0\")");
    }
    if (out.id.empty()) return fail(err, reason::missing_id, "attribute 'id' is missing or empty");
    if (out.source.empty()) return fail(err, reason::missing_source, "attribute 'source' is missing or empty");
    if (out.type.empty()) return fail(err, reason::missing_type, "attribute 'type' is missing or empty");
    if (out.sequence && out.subject.empty()) {
        return fail(err, reason::invalid_sequence, "attribute 'sequence' needs a 'subject' (the stream it counts)");
    }
    return true;
}

}  // namespace idem
