// The walk over a JSON value that checks all of it and finds a member named twice
// (json_members.hpp).

#include "json_members.hpp"

#include <algorithm>

namespace idem::detail {

using simdjson::ondemand::json_type;

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

namespace {

// Reads a value to its end, checking all of it: the on-demand parser checks only what is
// read, so a value that is skipped (an extension, `data`) could hide `nul` or `1x2`. An
// object naming a member twice is refused too: which of the two a reader takes is up to
// the reader (RFC 8259 section 4), and idem's handlers would take the first. depth: how
// many objects and arrays enclose value within the value validate was given.

json_fault validate_at(simdjson::ondemand::value value, std::vector<std::string_view>& names, json_finding& found,
                       std::size_t depth) {
    json_type type{};
    if (value.type().get(type) != simdjson::SUCCESS) return json_fault::malformed;
    if ((type == json_type::object || type == json_type::array) && depth == max_json_depth) return json_fault::too_deep;
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
            if (const auto fault = validate_at(v, names, found, depth + 1); fault != json_fault::none) {
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
            if (const auto fault = validate_at(v, names, found, depth + 1); fault != json_fault::none) {
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

}  // namespace

json_fault validate(simdjson::ondemand::value value, std::vector<std::string_view>& names, json_finding& found) {
    return validate_at(value, names, found, 0);
}

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

}  // namespace idem::detail
