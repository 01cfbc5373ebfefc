#pragma once

// Reading and checking an envelope's CloudEvents attributes one by one: Strings (no control
// characters or noncharacters), the sequence, extension names and values; and the parser's
// failure paths (envelope_attributes.cpp).

#include <idem/storage/envelope.hpp>

#include "json_members.hpp"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace idem::detail {

// The failure paths are cold and kept out of line, so the parse loop stays small enough for
// the compiler to inline simdjson's iteration into it.
/// Sets err and returns false.
[[gnu::cold, gnu::noinline]] bool fail(parse_error& err, reason why, std::string detail);
/// Sets err to why and the text a + b + c, and returns false.
[[gnu::cold, gnu::noinline]] bool fail(parse_error& err, reason why, std::string_view a, std::string_view b,
                                       std::string_view c = {});
/// Sets err for a `data` member named twice (valid JSON, but not a payload idem takes).
[[gnu::cold, gnu::noinline]] bool fail_repeated_member(parse_error& err, const json_finding& found);

/// Returns name in single quotes.
std::string quoted(std::string_view name);

/// Names the code point at s[at] as U+XXXX.
std::string code_point_at(std::string_view s, std::size_t at);
/// Names an attribute in a message; built only when there is something to report.
std::string label(std::string_view name, bool extension);

// The readers every envelope goes through are defined here, inline, so the parse loop keeps
// them in its own code as it did when they shared its file.

// Returns the offset of the first code point a CloudEvents String may not hold, or npos:
// a control character (U+0000-U+001F, U+007F-U+009F) or a Unicode noncharacter (U+FDD0-
// U+FDEF, U+xFFFE, U+xFFFF). The text is valid UTF-8 (the document was checked).
inline std::size_t find_disallowed(std::string_view s) noexcept {
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

// Reads a CloudEvents String: a JSON string without control characters or noncharacters.
// A null sets unset (the JSON format's unset attribute) and leaves out as it was. The
// common case, a string, is read first; the JSON type is looked at only when it is not one.
inline bool read_string(simdjson::ondemand::value value, std::string_view name, std::string_view& out, bool& unset,
                 parse_error& err, bool extension = false) {
    if (value.get_string().get(out) != simdjson::SUCCESS) {
        simdjson::ondemand::json_type type{};
        if (value.type().get(type) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_json, "malformed value of attribute " + quoted(name));
        }
        if (type == simdjson::ondemand::json_type::null) {
            if (trim_right(value.raw_json_token()) != "null") {
                return fail(err, reason::invalid_json, "malformed value of attribute " + quoted(name));
            }
            unset = true;
            return true;
        }
        if (type == simdjson::ondemand::json_type::string) {
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

inline bool read_string(simdjson::ondemand::value value, std::string_view name, std::string& out, bool& unset,
                 parse_error& err) {
    std::string_view s;
    if (!read_string(value, name, s, unset, err)) return false;
    if (!unset) out.assign(s);
    return true;
}

inline bool read_sequence(simdjson::ondemand::value value, std::optional<std::uint64_t>& out, parse_error& err) {
    simdjson::ondemand::json_type type{};
    if (value.type().get(type) != simdjson::SUCCESS) {
        return fail(err, reason::invalid_json, "attribute 'sequence' is not valid JSON");
    }
    std::uint64_t n = 0;
    if (type == simdjson::ondemand::json_type::null) {
        if (trim_right(value.raw_json_token()) == "null") return true;
        return fail(err, reason::invalid_json, "malformed value of attribute 'sequence'");
    }
    if (type == simdjson::ondemand::json_type::number) {
        if (value.get_uint64().get(n) != simdjson::SUCCESS) {
            const auto token = trim_right(value.raw_json_token());
            if (!token.empty() && token.find_first_not_of("0123456789") == std::string_view::npos) {
                return fail(err, reason::invalid_sequence, "attribute 'sequence' is ", token,
                            ", more than 18446744073709551615, the largest sequence");
            }
            return fail(err, reason::invalid_sequence, "attribute 'sequence' must be a positive integer");
        }
    } else if (type == simdjson::ondemand::json_type::string) {
        std::string_view s;
        if (value.get_string().get(s) != simdjson::SUCCESS) {
            return fail(err, reason::invalid_sequence, "attribute 'sequence' is not a valid string");
        }
        auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
        if (ec == std::errc::result_out_of_range && ptr == s.data() + s.size()) {
            return fail(err, reason::invalid_sequence, "attribute 'sequence' is \"", s,
                        "\", more than 18446744073709551615, the largest sequence");
        }
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

/// Returns whether name follows CloudEvents' naming convention (lower-case a-z and 0-9).
bool is_attribute_name(std::string_view name) noexcept;
/// Checks an extension's value: a CloudEvents String, Boolean or Integer (the caller handles null).
bool check_extension(simdjson::ondemand::value value, simdjson::ondemand::json_type type, std::string_view name,
                     parse_error& err);

}  // namespace idem::detail
