#pragma once

// Reading a JSON value to its end with simdjson's on-demand parser and checking all of it:
// its grammar (the on-demand parser checks only what is read) and that no object names a
// member twice. The envelope parser walks `data` and extension values with it
// (json_members.cpp).

#include <simdjson.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::detail {

/// Returns s without the JSON whitespace at its end (a raw token keeps what follows it).
inline std::string_view trim_right(std::string_view s) noexcept {
    while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' || s.back() == '\t')) {
        s.remove_suffix(1);
    }
    return s;
}

/// Returns whether s follows RFC 8259's number grammar (any magnitude).
bool is_json_number(std::string_view s) noexcept;

/// Returns the name given twice among names[from, end), or an empty optional; may reorder them.
std::optional<std::string_view> find_repeated(std::vector<std::string_view>& names, std::size_t from);

enum class json_fault { none, malformed, repeated_name, too_deep };

/// How deep validate reads: objects and arrays nested deeper are refused (too_deep). Below
/// simdjson's depth bound (1024) by what may enclose `data` (the event, a batch's array), so
/// that no parser is walked past it (a debug build of simdjson asserts there); it also bounds
/// validate's recursion, so a line of brackets cannot exhaust the stack.
inline constexpr std::size_t max_json_depth = 1000;

// What validate found wrong, for the message.
struct json_finding {
    std::string_view name;  // the member named twice
    std::string where;      // its object's path below the value, built on the way out (".a[2]")
};

/// Reads value to its end, checking all of it, at most max_json_depth levels deep; names is
/// scratch space (the member names of the objects being read, innermost last).
json_fault validate(simdjson::ondemand::value value, std::vector<std::string_view>& names, json_finding& found);

/// Returns whether text is one JSON value that idem takes as `data` (valid, no member named
/// twice); buffer and names are scratch space. Used on the bytes of `data_base64`.
bool is_json_data(simdjson::ondemand::parser& parser, std::string& buffer, std::string_view text,
                  std::vector<std::string_view>& names);

}  // namespace idem::detail
