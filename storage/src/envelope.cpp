// An envelope besides its parsing: the reasons' names, the event and message ids, and its
// JSON text (to_json, with the string escaping and the time and media-type checks it shares).
// Parsing is envelope_parser.cpp.

#include <idem/storage/envelope.hpp>
#include <idem/storage/event_id.hpp>

#include "base64.hpp"

#include <charconv>
#include <cstdint>
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
    case reason::upcast_failed: return "upcast_failed";
    }
    return "unknown";
}

std::vector<reason> dead_letter_reasons() {
    std::vector<reason> out;
    for (auto r = static_cast<int>(reason::invalid_json); r <= static_cast<int>(reason::upcast_failed); ++r) {
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
    std::string out;
    append_event_id(out, source, id);
    return out;
}

void append_event_id(std::string& out, std::string_view source, std::string_view id) {
    // Length-prefixing the source makes (source, id) -> text injective.
    char digits[20];
    const auto end = std::to_chars(digits, digits + sizeof digits, source.size()).ptr;
    out.append(digits, end);
    out.push_back(':');
    out.append(source);
    out.append(id);
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

std::optional<std::uint64_t> envelope::schema_version() const {
    std::string_view last = dataschema;
    if (auto at = last.find_last_of(":/"); at != std::string_view::npos) last.remove_prefix(at + 1);
    if (!last.empty() && (last.front() == 'v' || last.front() == 'V')) last.remove_prefix(1);
    if (last.empty() || last.find_first_not_of("0123456789") != std::string_view::npos) return 1;
    // The whole number or none: a version past 64 bits is not taken for a smaller one.
    std::uint64_t v = 0;
    for (char c : last) {
        const auto digit = static_cast<std::uint64_t>(c - '0');
        if (v > (UINT64_MAX - digit) / 10) return std::nullopt;
        v = v * 10 + digit;
    }
    if (v == 0) return std::nullopt;
    return v;
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
    if (!dataschema.empty()) {
        out += ",\"dataschema\":";
        append_json_string(out, dataschema);
    }
    if (data_binary) {
        out += ",\"data_base64\":\"";
        detail::append_base64(out, data);
        out.push_back('"');
    } else {
        out += ",\"data\":";
        out += data;
    }
    out.push_back('}');
    return out;
}

}  // namespace idem
