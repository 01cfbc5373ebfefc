// Reading and checking an envelope's CloudEvents attributes one by one
// (envelope_attributes.hpp).

#include "envelope_attributes.hpp"

#include <charconv>
#include <cstdio>
#include <cstring>

namespace idem::detail {

using simdjson::ondemand::json_type;

[[gnu::cold, gnu::noinline]] bool fail(parse_error& err, reason why, std::string detail) {
    err.why = why;
    err.detail = std::move(detail);
    return false;
}

[[gnu::cold, gnu::noinline]] bool fail(parse_error& err, reason why, std::string_view a, std::string_view b,
                                       std::string_view c) {
    err.why = why;
    err.detail.assign(a).append(b).append(c);
    return false;
}

[[gnu::cold, gnu::noinline]] bool fail_repeated_member(parse_error& err, const json_finding& found) {
    return fail(err, reason::invalid_field,
                "attribute 'data' names member " + quoted(found.name) + " twice (in data" + found.where + ")");
}

std::string quoted(std::string_view name) {
    std::string out = "'";
    out.append(name).push_back('\'');
    return out;
}

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

std::string label(std::string_view name, bool extension) {
    return (extension ? "extension attribute '" : "attribute '") + std::string(name) + "'";
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

}  // namespace idem::detail
