#pragma once

// The JSON the commands print, written straight into a string: the writer places the commas
// and colons and escapes strings, so a command only says what it prints, in order.
//
//   json_writer w{out};
//   w.begin_object().field("records", 12).key("torn").begin_array().end_array().end_object();
//
// It checks nothing beyond comma placement: an unbalanced begin/end is the caller's bug.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::cli::detail {

class json_writer {
public:
    /// Writes into out, appending to what it holds.
    explicit json_writer(std::string& out) : out_(out) {}

    /// Opens an object (as a value: after a key, in an array, or at the top).
    json_writer& begin_object();
    /// Closes the innermost object.
    json_writer& end_object();
    /// Opens an array.
    json_writer& begin_array();
    /// Closes the innermost array.
    json_writer& end_array();
    /// Writes an object member's name; the next value is its value.
    json_writer& key(std::string_view k);

    /// Writes a string value, escaped.
    json_writer& value(std::string_view s);
    json_writer& value(const char* s) { return value(std::string_view(s)); }
    json_writer& value(const std::string& s) { return value(std::string_view(s)); }
    /// Writes a whole number.
    json_writer& value(std::uint64_t n);
    json_writer& value(unsigned n) { return value(std::uint64_t{n}); }
    json_writer& value(unsigned long long n) { return value(static_cast<std::uint64_t>(n)); }
    /// Writes true or false.
    json_writer& value(bool b);
    /// Writes null.
    json_writer& null();
    /// Writes a number with a fixed count of decimals ("%.3f").
    json_writer& fixed(double v, int decimals);
    /// Writes text that already is JSON (a projection's state, a compacted envelope).
    json_writer& raw(std::string_view json);
    /// Places the separator for a value and returns the string, for code that appends JSON itself.
    std::string& raw_value();

    /// Writes key, then value.
    template <class T>
    json_writer& field(std::string_view k, const T& v) {
        key(k);
        return value(v);
    }
    /// Writes key, then the string or null.
    json_writer& field(std::string_view k, const std::optional<std::string>& v);

private:
    void separate();

    std::string& out_;
    std::vector<bool> first_;  // per open container: nothing written in it yet
    bool after_key_ = false;
};

}  // namespace idem::cli::detail
