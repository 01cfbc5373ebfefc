#include <idem/storage/envelope.hpp>

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

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
    case reason::missing_specversion: return "missing_specversion";
    case reason::future_event: return "future_event";
    case reason::transport_collision: return "transport_collision";
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

namespace {

constexpr char base64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void append_base64(std::string& out, std::string_view bytes) {
    std::size_t i = 0;
    auto at = [&](std::size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
    for (; i + 3 <= bytes.size(); i += 3) {
        const unsigned n = at(i) << 16 | at(i + 1) << 8 | at(i + 2);
        out.push_back(base64_alphabet[n >> 18]);
        out.push_back(base64_alphabet[(n >> 12) & 63]);
        out.push_back(base64_alphabet[(n >> 6) & 63]);
        out.push_back(base64_alphabet[n & 63]);
    }
    if (const auto rest = bytes.size() - i; rest != 0) {
        const unsigned n = at(i) << 16 | (rest == 2 ? at(i + 1) << 8 : 0u);
        out.push_back(base64_alphabet[n >> 18]);
        out.push_back(base64_alphabet[(n >> 12) & 63]);
        out.push_back(rest == 2 ? base64_alphabet[(n >> 6) & 63] : '=');
        out.push_back('=');
    }
}

// RFC 4648 base64 (standard alphabet). Padding may be left out (Java's decoder takes both);
// any other character, whitespace included, is an error.
bool decode_base64(std::string_view in, std::string& out) {
    static constexpr auto values = [] {
        std::array<signed char, 256> t{};
        t.fill(-1);
        for (int k = 0; k < 64; ++k) t[static_cast<unsigned char>(base64_alphabet[k])] = static_cast<signed char>(k);
        return t;
    }();
    std::size_t padding = 0;
    while (padding < 2 && padding < in.size() && in[in.size() - 1 - padding] == '=') ++padding;
    if (padding != 0 && in.size() % 4 != 0) return false;
    in.remove_suffix(padding);
    if (in.size() % 4 == 1) return false;
    out.clear();
    unsigned n = 0;
    int bits = 0;
    for (char c : in) {
        const auto v = values[static_cast<unsigned char>(c)];
        if (v < 0) return false;
        n = (n << 6) | static_cast<unsigned>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((n >> bits) & 0xFF));
        }
    }
    return true;
}

bool two_digits(std::string_view s, std::size_t at, int max, int& out) noexcept {
    if (at + 2 > s.size() || s[at] < '0' || s[at] > '9' || s[at + 1] < '0' || s[at + 1] > '9') return false;
    out = (s[at] - '0') * 10 + (s[at + 1] - '0');
    return out <= max;
}

char lower(char c) noexcept { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool ends_with_ci(std::string_view s, std::string_view suffix) noexcept {
    if (s.size() < suffix.size()) return false;
    s.remove_prefix(s.size() - suffix.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (lower(s[i]) != suffix[i]) return false;
    }
    return true;
}

}  // namespace

bool is_rfc3339_timestamp(std::string_view s) noexcept {
    // RFC 3339 section 5.6: full-date "T" full-time; 'T' and 'Z' may be lower case (its note).
    int year = 0, century = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
    if (!two_digits(s, 0, 99, century) || !two_digits(s, 2, 99, year) || s.size() < 20 || s[4] != '-' ||
        !two_digits(s, 5, 12, month) || s[7] != '-' || !two_digits(s, 8, 31, day) || (s[10] != 'T' && s[10] != 't') ||
        !two_digits(s, 11, 23, hour) || s[13] != ':' || !two_digits(s, 14, 59, minute) || s[16] != ':' ||
        !two_digits(s, 17, 60, second) || month == 0 || day == 0) {
        return false;
    }
    year += century * 100;
    static constexpr int month_days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (day > month_days[month - 1]) return false;
    if (month == 2 && day == 29 && !(year % 4 == 0 && (year % 100 != 0 || year % 400 == 0))) return false;
    std::size_t i = 19;
    if (s[i] == '.') {
        const auto from = ++i;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
        if (i == from) return false;
    }
    if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) return i + 1 == s.size();
    int offset_hour = 0, offset_minute = 0;
    return i < s.size() && (s[i] == '+' || s[i] == '-') && two_digits(s, i + 1, 23, offset_hour) &&
           i + 3 < s.size() && s[i + 3] == ':' && two_digits(s, i + 4, 59, offset_minute) && i + 6 == s.size();
}

bool is_json_media_type(std::string_view media_type) noexcept {
    media_type = media_type.substr(0, media_type.find(';'));
    while (!media_type.empty() && (media_type.back() == ' ' || media_type.back() == '\t')) media_type.remove_suffix(1);
    const auto slash = media_type.find('/');
    if (slash == std::string_view::npos || slash == 0) return false;
    const auto subtype = media_type.substr(slash + 1);
    return ends_with_ci(subtype, "+json") || (subtype.size() == 4 && ends_with_ci(subtype, "json"));
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
    if (!datacontenttype.empty()) {
        out += ",\"datacontenttype\":";
        append_json_string(out, datacontenttype);
    }
    if (data_binary) {
        out += ",\"data_base64\":\"";
        append_base64(out, data);
        out.push_back('"');
    } else {
        out += ",\"data\":";
        out += data;
    }
    out.push_back('}');
    return out;
}

struct envelope_parser::impl {
    simdjson::ondemand::parser parser;
    std::string buffer;                   // input copy with simdjson's padding
    std::vector<std::string_view> names;  // member names of the objects being read, innermost last
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

// Returns the name given twice among names[from, end), or an empty optional.
std::optional<std::string_view> find_repeated(std::vector<std::string_view>& names, std::size_t from) {
    const auto first = names.begin() + static_cast<std::ptrdiff_t>(from);
    const auto count = names.size() - from;
    if (count < 2) return std::nullopt;
    if (count <= 8) {
        for (auto a = first; a != names.end(); ++a) {
            for (auto b = a + 1; b != names.end(); ++b) {
                if (*a == *b) return *a;
            }
        }
        return std::nullopt;
    }
    std::sort(first, names.end());
    if (auto at = std::adjacent_find(first, names.end()); at != names.end()) return *at;
    return std::nullopt;
}

enum class json_fault { none, malformed, repeated_name };

// What validate found wrong, for the message.
struct json_finding {
    std::string_view name;  // the member named twice
    std::string where;      // its object's path below the value, built on the way out (".a[2]")
};

// Reads a value to its end, checking all of it: the on-demand parser checks only what is
// read, so a value that is skipped (an extension, `data`) could hide `nul` or `1x2`. An
// object naming a member twice is refused too: which of the two a reader takes is up to
// the reader (RFC 8259 section 4), and idem's handlers would take the first.
json_fault validate(simdjson::ondemand::value value, std::vector<std::string_view>& names, json_finding& found) {
    json_type type{};
    if (value.type().get(type) != simdjson::SUCCESS) return json_fault::malformed;
    switch (type) {
    case json_type::object: {
        simdjson::ondemand::object o;
        if (value.get_object().get(o) != simdjson::SUCCESS) return json_fault::malformed;
        const auto from = names.size();
        for (auto field : o) {
            std::string_view key;
            if (field.unescaped_key().get(key) != simdjson::SUCCESS) return json_fault::malformed;
            simdjson::ondemand::value v;
            if (field.value().get(v) != simdjson::SUCCESS) return json_fault::malformed;
            if (const auto fault = validate(v, names, found); fault != json_fault::none) {
                if (fault == json_fault::repeated_name) {
                    std::string here = ".";
                    here.append(key).append(found.where);
                    found.where = std::move(here);
                }
                names.resize(from);
                return fault;
            }
            names.push_back(key);
        }
        const auto repeated = find_repeated(names, from);
        names.resize(from);
        if (repeated) {
            found.name = *repeated;
            found.where.clear();
            return json_fault::repeated_name;
        }
        return json_fault::none;
    }
    case json_type::array: {
        simdjson::ondemand::array a;
        if (value.get_array().get(a) != simdjson::SUCCESS) return json_fault::malformed;
        std::size_t index = 0;
        for (auto element : a) {
            simdjson::ondemand::value v;
            if (element.get(v) != simdjson::SUCCESS) return json_fault::malformed;
            if (const auto fault = validate(v, names, found); fault != json_fault::none) {
                if (fault == json_fault::repeated_name) found.where = "[" + std::to_string(index) + "]" + found.where;
                return fault;
            }
            ++index;
        }
        return json_fault::none;
    }
    case json_type::string: {
        std::string_view s;
        return value.get_string().get(s) == simdjson::SUCCESS ? json_fault::none : json_fault::malformed;
    }
    case json_type::number:
        return is_json_number(trim_right(value.raw_json_token())) ? json_fault::none : json_fault::malformed;
    case json_type::boolean: {
        const auto token = trim_right(value.raw_json_token());
        return token == "true" || token == "false" ? json_fault::none : json_fault::malformed;
    }
    case json_type::null:
        return trim_right(value.raw_json_token()) == "null" ? json_fault::none : json_fault::malformed;
    }
    return json_fault::malformed;
}

// The failure paths are cold and kept out of line, so the parse loop stays small enough for
// the compiler to inline simdjson's iteration into it.
[[gnu::cold, gnu::noinline]] bool fail(parse_error& err, reason why, std::string detail) {
    err.why = why;
    err.detail = std::move(detail);
    return false;
}

[[gnu::cold, gnu::noinline]] bool fail(parse_error& err, reason why, std::string_view a, std::string_view b,
                                       std::string_view c = {}) {
    err.why = why;
    err.detail.assign(a).append(b).append(c);
    return false;
}

std::string quoted(std::string_view name) {
    std::string out = "'";
    out.append(name).push_back('\'');
    return out;
}

// Returns the offset of the first code point a CloudEvents String may not hold, or npos:
// a control character (U+0000-U+001F, U+007F-U+009F) or a Unicode noncharacter (U+FDD0-
// U+FDEF, U+xFFFE, U+xFFFF). The text is valid UTF-8 (the document was checked).
std::size_t find_disallowed(std::string_view s) noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const auto n = s.size();
    // Eight bytes at a time while all are printable ASCII (0x20-0x7E), the common case.
    constexpr std::uint64_t ones = 0x0101010101010101ull;
    constexpr std::uint64_t highs = 0x8080808080808080ull;
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t w;
        std::memcpy(&w, p + i, 8);
        const std::uint64_t del = w ^ (0x7F * ones);
        if (((w | ((w - 0x20 * ones) & ~w) | ((del - ones) & ~del)) & highs) != 0) break;
    }
    for (; i < n; ++i) {
        const unsigned char c = p[i];
        if (c >= 0x20 && c < 0x7F) continue;
        if (c < 0x20 || c == 0x7F) return i;
        if (c == 0xC2 && i + 1 < n && p[i + 1] <= 0x9F) return i;
        if (c == 0xEF && i + 2 < n &&
            ((p[i + 1] == 0xB7 && p[i + 2] >= 0x90 && p[i + 2] <= 0xAF) || (p[i + 1] == 0xBF && p[i + 2] >= 0xBE))) {
            return i;
        }
        if (c >= 0xF0 && i + 3 < n && (p[i + 1] & 0x0F) == 0x0F && p[i + 2] == 0xBF && p[i + 3] >= 0xBE) return i;
    }
    return std::string_view::npos;
}

// Names the code point at s[at] as U+XXXX.
std::string code_point_at(std::string_view s, std::size_t at) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + at;
    unsigned cp = p[0];
    if (cp >= 0xF0) {
        cp = (cp & 0x07u) << 18 | (p[1] & 0x3Fu) << 12 | (p[2] & 0x3Fu) << 6 | (p[3] & 0x3Fu);
    } else if (cp >= 0xE0) {
        cp = (cp & 0x0Fu) << 12 | (p[1] & 0x3Fu) << 6 | (p[2] & 0x3Fu);
    } else if (cp >= 0xC0) {
        cp = (cp & 0x1Fu) << 6 | (p[1] & 0x3Fu);
    }
    char text[16];
    std::snprintf(text, sizeof text, "U+%04X", cp);
    return text;
}

// Names an attribute in a message; built only when there is something to report.
std::string label(std::string_view name, bool extension) {
    return (extension ? "extension attribute '" : "attribute '") + std::string(name) + "'";
}

// Reads a CloudEvents String: a JSON string without control characters or noncharacters.
// A null sets unset (the JSON format's unset attribute) and leaves out as it was. The
// common case, a string, is read first; the JSON type is looked at only when it is not one.
bool read_string(simdjson::ondemand::value value, std::string_view name, std::string_view& out, bool& unset,
                 parse_error& err, bool extension = false) {
    if (value.get_string().get(out) != simdjson::SUCCESS) {
        json_type type{};
        if (value.type().get(type) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed value of attribute " + quoted(name));
        }
        if (type == json_type::null) {
            if (trim_right(value.raw_json_token()) != "null") {
                return fail(err, reason::invalid_json, "malformed value of attribute " + quoted(name));
            }
            unset = true;
            return true;
        }
        if (type == json_type::string) {
            return fail(err, reason::invalid_json, label(name, extension) + " is not a valid JSON string");
        }
        return fail(err, reason::invalid_field, label(name, extension) + " must be a string");
    }
    if (const auto at = find_disallowed(out); at != std::string_view::npos) {
        return fail(err, reason::invalid_field,
                    label(name, extension) + " holds " + code_point_at(out, at) + " at byte " + std::to_string(at) +
                        ", which a CloudEvents String may not hold (control characters, noncharacters)");
    }
    return true;
}

bool read_string(simdjson::ondemand::value value, std::string_view name, std::string& out, bool& unset,
                 parse_error& err) {
    std::string_view s;
    if (!read_string(value, name, s, unset, err)) return false;
    if (!unset) out.assign(s);
    return true;
}

bool read_sequence(simdjson::ondemand::value value, std::optional<std::uint64_t>& out, parse_error& err) {
    json_type type{};
    if (value.type().get(type) != simdjson::SUCCESS) {
        return fail(err, reason::invalid_json, "attribute 'sequence' is not valid JSON");
    }
    std::uint64_t n = 0;
    if (type == json_type::null) {
        if (trim_right(value.raw_json_token()) == "null") return true;
        return fail(err, reason::invalid_json, "malformed value of attribute 'sequence'");
    }
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

// Valid JSON (RFC 8259 only says names SHOULD be unique), but not a payload idem takes.
[[gnu::cold, gnu::noinline]] bool fail_repeated_member(parse_error& err, const json_finding& found) {
    return fail(err, reason::invalid_field,
                "attribute 'data' names member " + quoted(found.name) + " twice (in data" + found.where + ")");
}

bool is_attribute_name(std::string_view name) noexcept {
    // CloudEvents 1.0 "Naming Conventions": lower-case ASCII letters and digits, at least one.
    // "SHOULD NOT exceed 20 characters" is advice to producers, so longer names are taken.
    if (name.empty()) return false;
    for (char c : name) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
    }
    return true;
}

// An extension's value is a CloudEvents String, Boolean or Integer (a JSON string, boolean,
// or number without fraction or exponent in the 32-bit range); the caller handles null.
bool check_extension(simdjson::ondemand::value value, json_type type, std::string_view name, parse_error& err) {
    switch (type) {
    case json_type::string: {
        std::string_view s;
        bool unset = false;
        return read_string(value, name, s, unset, err, true);
    }
    case json_type::boolean: {
        const auto token = trim_right(value.raw_json_token());
        if (token == "true" || token == "false") return true;
        return fail(err, reason::invalid_json, "malformed value of attribute " + quoted(name));
    }
    case json_type::number: {
        const auto token = trim_right(value.raw_json_token());
        if (!is_json_number(token)) {
            return fail(err, reason::invalid_json, "malformed value of attribute " + quoted(name));
        }
        std::int64_t n = 0;
        const bool integer = token.find_first_of(".eE") == std::string_view::npos;
        const auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), n);
        if (!integer || ec != std::errc{} || ptr != token.data() + token.size() || n < INT32_MIN || n > INT32_MAX) {
            return fail(err, reason::invalid_field,
                        label(name, true) + " must be an Integer from -2147483648 to 2147483647, got " + std::string(token));
        }
        return true;
    }
    default:
        return fail(err, reason::invalid_field, label(name, true) + " must be a string, a boolean or an integer");
    }
}

// Bits of the attributes idem reads, to refuse one given twice.
enum attribute_bit : unsigned {
    bit_id = 1u << 0,
    bit_source = 1u << 1,
    bit_type = 1u << 2,
    bit_subject = 1u << 3,
    bit_time = 1u << 4,
    bit_msgid = 1u << 5,
    bit_specversion = 1u << 6,
    bit_sequence = 1u << 7,
    bit_data = 1u << 8,
    bit_data_base64 = 1u << 9,
    bit_datacontenttype = 1u << 10,
    bit_dataschema = 1u << 11,
};

// Returns whether text is one JSON value that idem takes as `data` (valid, no member named
// twice); names is scratch space. Used on the bytes of `data_base64`.
bool is_json_data(simdjson::ondemand::parser& parser, std::string& buffer, std::string_view text,
                  std::vector<std::string_view>& names) {
    // Wrapped in an array: the on-demand parser does not hand out a scalar document as a value.
    buffer.assign("[");
    buffer.append(text);
    buffer.push_back(']');
    const auto length = buffer.size();
    buffer.append(simdjson::SIMDJSON_PADDING, '\0');
    simdjson::ondemand::document doc;
    simdjson::ondemand::array array;
    if (parser.iterate(buffer.data(), length, buffer.size()).get(doc) != simdjson::SUCCESS ||
        doc.get_array().get(array) != simdjson::SUCCESS) {
        return false;
    }
    std::size_t count = 0;
    json_finding found;
    for (auto element : array) {
        simdjson::ondemand::value v;
        if (++count > 1 || element.get(v) != simdjson::SUCCESS || validate(v, names, found) != json_fault::none) {
            return false;
        }
    }
    return count == 1 && doc.current_location().error() == simdjson::OUT_OF_BOUNDS;
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
    out.datacontenttype.clear();
    out.data.assign("null");
    out.data_binary = false;
    err.why = reason::none;
    err.detail.clear();
    // A UTF-8 byte order mark is not JSON (RFC 8259 section 8.1), but editors write one.
    if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
    auto& buf = impl_->buffer;
    buf.assign(text);
    buf.append(simdjson::SIMDJSON_PADDING, '\0');
    auto& names = impl_->names;
    names.clear();

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
            return fail(err, reason::invalid_field, "attribute '", name, "' appears twice");
        }
        seen |= bit;
        return true;
    };
    auto non_empty = [&](std::string_view name, std::string_view value) {
        return !value.empty() || fail(err, reason::invalid_field, "attribute '", name, "' must not be empty");
    };
    std::string_view specversion;
    std::string_view data_base64;
    std::string_view dataschema;
    for (auto field : object) {
        std::string_view name;
        if (field.unescaped_key().get(name) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed attribute name");
        }
        simdjson::ondemand::value value;
        if (field.value().get(value) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
        }
        // The JSON format reads an attribute's null as unset (read_string notes it); `data` is
        // the payload, where null is a value.
        bool unset = false;
        bool ok = true;
        if (name == "id") {
            ok = once(bit_id, name) && read_string(value, name, out.id, unset, err);
        } else if (name == "source") {
            ok = once(bit_source, name) && read_string(value, name, out.source, unset, err);
        } else if (name == "type") {
            ok = once(bit_type, name) && read_string(value, name, out.type, unset, err);
        } else if (name == "subject") {
            ok = once(bit_subject, name) && read_string(value, name, out.subject, unset, err) &&
                 (unset || non_empty(name, out.subject));
        } else if (name == "time") {
            ok = once(bit_time, name) && read_string(value, name, out.time, unset, err);
            if (ok && !unset && !is_rfc3339_timestamp(out.time)) {
                return fail(err, reason::invalid_field,
                            "attribute 'time' is not an RFC 3339 timestamp (like 2026-12-02T10:00:00Z): \"", out.time,
                            "\"");
            }
        } else if (name == "msgid") {
            ok = once(bit_msgid, name) && read_string(value, name, out.msgid, unset, err);
        } else if (name == "specversion") {
            ok = once(bit_specversion, name) && read_string(value, name, specversion, unset, err);
        } else if (name == "sequence") {
            ok = once(bit_sequence, name) && read_sequence(value, out.sequence, err);
        } else if (name == "datacontenttype") {
            ok = once(bit_datacontenttype, name) && read_string(value, name, out.datacontenttype, unset, err) &&
                 (unset || non_empty(name, out.datacontenttype));
        } else if (name == "dataschema") {
            ok = once(bit_dataschema, name) && read_string(value, name, dataschema, unset, err) &&
                 (unset || non_empty(name, dataschema));
            // An absolute URI starts with its scheme: a letter, then letters, digits, '+', '-', '.', then ':'.
            const auto colon = dataschema.find(':');
            if (ok && !unset &&
                (colon == std::string_view::npos || colon == 0 || !std::isalpha(static_cast<unsigned char>(dataschema[0])) ||
                 dataschema.substr(0, colon).find_first_not_of(
                     "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.") != std::string_view::npos)) {
                return fail(err, reason::invalid_field, "attribute 'dataschema' must be an absolute URI, got \"",
                            dataschema, "\"");
            }
        } else if (name == "data_base64") {
            // A member of the JSON format, not an attribute, so the naming rule does not apply to it.
            ok = once(bit_data_base64, name);
            if (ok && value.get_string().get(data_base64) != simdjson::SUCCESS) {
                data_base64 = {};
                json_type type{};
                if (value.type().get(type) != simdjson::SUCCESS || type != json_type::null ||
                    trim_right(value.raw_json_token()) != "null") {
                    return fail(err, reason::invalid_field, "attribute 'data_base64' must be a base64 string");
                }
            }
        } else if (name == "data") {
            ok = once(bit_data, name);
            json_type type{};
            if (ok && value.type().get(type) != simdjson::SUCCESS) {
                return fail(err, reason::invalid_json, "attribute 'data' is not valid JSON");
            }
            if (ok) {
                // A scalar is its token; an object or array runs from its first token to the one after it.
                const auto token = value.raw_json_token();
                const char* end = token.data() + token.size();
                json_finding found;
                const auto fault = validate(value, names, found);
                if (fault == json_fault::repeated_name) {
                    return fail_repeated_member(err, found);
                }
                if (fault != json_fault::none || ((type == json_type::object || type == json_type::array) &&
                                                  doc.current_location().get(end) != simdjson::SUCCESS)) {
                    return fail(err, reason::invalid_json, "attribute 'data' is not valid JSON");
                }
                out.data.assign(trim_right(std::string_view(token.data(), static_cast<std::size_t>(end - token.data()))));
            }
        } else {
            // An extension: idem ignores its value, but it must follow the CloudEvents rules.
            if (!is_attribute_name(name)) {
                return fail(err, reason::invalid_field, "extension attribute name '", name,
                            "' is not made of lower-case letters a-z and digits 0-9");
            }
            json_type type{};
            if (value.type().get(type) != simdjson::SUCCESS) {
                return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
            }
            unset = type == json_type::null;
            if (unset && trim_right(value.raw_json_token()) != "null") {
                return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
            }
            if (type == json_type::object || type == json_type::array) {
                json_finding found;
                if (validate(value, names, found) == json_fault::malformed) {
                    return fail(err, reason::invalid_json, "malformed value of attribute '", name, "'");
                }
            }
            ok = unset || check_extension(value, type, name, err);
            names.push_back(name);
        }
        if (!ok) {
            return false;
        }
    }
    if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) {
        return fail(err, reason::invalid_json, "trailing content after the event object");
    }
    if (const auto repeated = find_repeated(names, 0)) {
        return fail(err, reason::invalid_field, "attribute '", *repeated, "' appears twice");
    }
    if (specversion.data() != nullptr && specversion != "1.0") {
        return fail(err, reason::unsupported_specversion, "specversion \"", specversion,
                    "\" is not supported (only \"1.0\")");
    }
    if (out.id.empty()) return fail(err, reason::missing_id, "attribute 'id' is missing or empty");
    if (out.source.empty()) return fail(err, reason::missing_source, "attribute 'source' is missing or empty");
    if (out.type.empty()) return fail(err, reason::missing_type, "attribute 'type' is missing or empty");
    if (specversion.data() == nullptr) {
        return fail(err, reason::missing_specversion,
                    "attribute 'specversion' is missing (CloudEvents 1.0 requires \"specversion\":\"1.0\")");
    }
    if (out.sequence && out.subject.empty()) {
        return fail(err, reason::invalid_sequence, "attribute 'sequence' needs a 'subject' (the stream it counts)");
    }
    const bool binary = data_base64.data() != nullptr;  // present and not null
    if (binary && (seen & bit_data) != 0) {
        return fail(err, reason::invalid_field,
                    "members 'data' and 'data_base64' are mutually exclusive (the payload is one or the other)");
    }
    if (binary) {
        // Decoded here, after the loop: datacontenttype may come after data_base64, and the
        // document (whose buffer data_base64 points into) is not read again.
        if (!decode_base64(data_base64, out.data)) {
            return fail(err, reason::invalid_field, "attribute 'data_base64' is not valid base64 (RFC 4648)");
        }
        out.data_binary = !is_json_media_type(out.datacontenttype) ||
                          !is_json_data(impl_->parser, impl_->buffer, out.data, names);
        if (!out.data_binary) {
            // As `data` would be kept: the value's own text, without the whitespace around it.
            out.data.resize(trim_right(out.data).size());
            out.data.erase(0, out.data.find_first_not_of(" \t\r\n"));
        }
    }
    return true;
}

}  // namespace idem
