#pragma once

// A cereal input archive over simdjson, for decoding event payloads.
//
//   idem::json_input_archive archive{R"({"order_id":"o-1","amount":250})"};
//   line_added event;
//   event.serialize(archive);    // the payload object is the archive's root
//
// It reads what cereal::JSONInputArchive reads, the same way: fields by name from the
// current object (the next one if its name matches, else the first with that name, so
// order does not matter and unknown fields are ignored), unnamed values (cereal's
// value0, value1 ...) in document order, arrays for sequences and a SizeTag's size.
// The differences, all stricter or wider, never silently different:
// - every integer width is range-checked (cereal truncates 8- and 16-bit values);
// - std::map / std::unordered_map with string keys also read a JSON object {"k":v}
//   besides cereal's [{"key":k,"value":v}];
// - std::optional reads an absent field or null as nullopt and any other value as the
//   value, besides cereal's {"nullopt":b,"data":v};
// - long long, unsigned long long and long double (which cereal writes as strings)
//   read a JSON number as well as a string holding one;
// - strings keep an escaped NUL; NaN/Infinity literals and integers beyond 64 bits
//   are not JSON, and are rejected.
//
// Every failure throws cereal::Exception whose what() names the field by its path
// ("legs[2].qty") and the cause ("expected an integer from 0 to 255, got 300").
// The value access is non-template code in json_archive.cpp; the templates here only
// route cereal's types to it.

#include <cereal/archives/json.hpp>
#include <cereal/cereal.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>

namespace idem {

/// A cereal input archive reading one JSON document parsed with simdjson.
///
/// The archive borrows a parser kept per thread (a nested archive on the same thread
/// gets one of its own), so archives on different threads never share state. An
/// archive must be used and destroyed on the thread that created it.
class json_input_archive : public cereal::InputArchive<json_input_archive>, public cereal::traits::TextArchive {
public:
    /// Parses json; throws cereal::Exception if it is not valid JSON, or neither an object nor an array.
    explicit json_input_archive(std::string_view json);
    ~json_input_archive();
    json_input_archive(const json_input_archive&) = delete;
    json_input_archive& operator=(const json_input_archive&) = delete;

    /// Names the field the next read or start_node() takes (null: the next value in order).
    void set_next_name(const char* name) noexcept { next_name_ = name; }
    /// Enters the next value, which must be an object or an array.
    void start_node();
    /// Leaves the innermost node entered and moves past it.
    void finish_node();
    /// Returns the number of values of the innermost node; throws unless it is an array.
    std::size_t node_size();
    /// Returns whether the innermost node is an object.
    bool node_is_object() const noexcept;
    /// Sets key to the name of the next value of the innermost object; returns false at its end.
    bool next_key(std::string_view& key) const noexcept;

    /// Reads the next value as a boolean.
    bool read_bool();
    /// Reads the next value as an integer in [min, max] (text_ok: or a string holding one).
    std::int64_t read_int(std::int64_t min, std::int64_t max, bool text_ok = false);
    /// Reads the next value as an integer in [0, max] (text_ok: or a string holding one).
    std::uint64_t read_uint(std::uint64_t max, bool text_ok = false);
    /// Reads the next value as a number.
    double read_double();
    /// Reads the next value as a number, or a string holding one.
    long double read_long_double();
    /// Reads the next value as a string, valid while the archive lives.
    std::string_view read_string();
    /// Reads the next value as null.
    void read_null();

    /// How the next value stands for a std::optional.
    enum class optional_form : std::uint8_t {
        empty,    ///< absent or null (consumed)
        value,    ///< a value, to be read next
        wrapped,  ///< cereal's {"nullopt":false,"data":v}: entered, "data" to be read, then finish_node()
    };
    /// Looks at the next value as a std::optional.
    optional_form next_optional();

    /// Reads an arithmetic value.
    template <class T>
    void load_value(T& value) {
        if constexpr (std::is_same_v<T, bool>) {
            value = read_bool();
        } else if constexpr (std::is_integral_v<T>) {
            // cereal writes long long and unsigned long long as strings where int64_t is long.
            constexpr bool fixed_width = std::is_same_v<T, std::int64_t> || std::is_same_v<T, std::uint64_t>;
            constexpr bool long_long = std::is_same_v<T, long long> || std::is_same_v<T, unsigned long long>;
            constexpr bool text_ok = long_long && !fixed_width;
            if constexpr (std::is_signed_v<T>) {
                value = static_cast<T>(read_int(std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), text_ok));
            } else {
                value = static_cast<T>(read_uint(std::numeric_limits<T>::max(), text_ok));
            }
        } else if constexpr (std::is_same_v<T, long double>) {
            value = read_long_double();
        } else {
            value = static_cast<T>(read_double());
        }
    }

    // cereal::JSONInputArchive's names, so code written against its node API reads this archive too.
    void setNextName(const char* name) noexcept { set_next_name(name); }
    void startNode() { start_node(); }
    void finishNode() { finish_node(); }
    void loadSize(cereal::size_type& size) { size = node_size(); }

    /// The parser and the stack of entered nodes (defined in json_archive.cpp).
    struct state;

private:
    state* state_ = nullptr;
    const char* next_name_ = nullptr;
};

namespace detail {

template <class T>
inline constexpr bool is_char_string = false;
template <class Traits, class Alloc>
inline constexpr bool is_char_string<std::basic_string<char, Traits, Alloc>> = true;

template <class T>
inline constexpr bool is_std_optional = false;
template <class T>
inline constexpr bool is_std_optional<std::optional<T>> = true;

/// Whether cereal gives T a node of its own in a JSON archive (as JSONInputArchive's prologue decides).
template <class T>
inline constexpr bool json_node_type =
    !std::is_arithmetic_v<T> && !is_std_optional<T> &&
    !cereal::traits::has_minimal_base_class_serialization<T, cereal::traits::has_minimal_input_serialization,
                                                          json_input_archive>::value &&
    !cereal::traits::has_minimal_input_serialization<T, json_input_archive>::value;

/// Reads a map from the node just entered: a JSON object {"k":v} (string keys), else cereal's array of key/value.
template <class Map>
void load_map(json_input_archive& ar, Map& map) {
    map.clear();
    using key_type = typename Map::key_type;
    if constexpr (is_char_string<key_type>) {
        if (ar.node_is_object()) {
            std::string_view key;
            while (ar.next_key(key)) {
                typename Map::mapped_type value{};
                ar(value);
                map.emplace(key_type(key), std::move(value));
            }
            return;
        }
    }
    cereal::size_type size = 0;
    ar(cereal::make_size_tag(size));
    for (cereal::size_type i = 0; i < size; ++i) {
        key_type key{};
        typename Map::mapped_type value{};
        ar(cereal::make_map_item(key, value));
        map.emplace(std::move(key), std::move(value));
    }
}

}  // namespace detail

// cereal's hooks for json_input_archive, found by argument-dependent lookup; they mirror
// JSONInputArchive's in cereal/archives/json.hpp.

template <class T>
void prologue(json_input_archive&, const cereal::NameValuePair<T>&) {}
template <class T>
void epilogue(json_input_archive&, const cereal::NameValuePair<T>&) {}
template <class T>
void prologue(json_input_archive&, const cereal::DeferredData<T>&) {}
template <class T>
void epilogue(json_input_archive&, const cereal::DeferredData<T>&) {}
template <class T>
void prologue(json_input_archive&, const cereal::SizeTag<T>&) {}
template <class T>
void epilogue(json_input_archive&, const cereal::SizeTag<T>&) {}
inline void prologue(json_input_archive&, const std::nullptr_t&) {}
inline void epilogue(json_input_archive&, const std::nullptr_t&) {}
template <class T, cereal::traits::EnableIf<std::is_arithmetic_v<T>> = cereal::traits::sfinae>
void prologue(json_input_archive&, const T&) {}
template <class T, cereal::traits::EnableIf<std::is_arithmetic_v<T>> = cereal::traits::sfinae>
void epilogue(json_input_archive&, const T&) {}
template <class Traits, class Alloc>
void prologue(json_input_archive&, const std::basic_string<char, Traits, Alloc>&) {}
template <class Traits, class Alloc>
void epilogue(json_input_archive&, const std::basic_string<char, Traits, Alloc>&) {}
template <class T>
void prologue(json_input_archive&, const std::optional<T>&) {}
template <class T>
void epilogue(json_input_archive&, const std::optional<T>&) {}
template <class T, cereal::traits::EnableIf<detail::json_node_type<T>> = cereal::traits::sfinae>
void prologue(json_input_archive& ar, const T&) {
    ar.start_node();
}
template <class T, cereal::traits::EnableIf<detail::json_node_type<T>> = cereal::traits::sfinae>
void epilogue(json_input_archive& ar, const T&) {
    ar.finish_node();
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, cereal::NameValuePair<T>& nvp) {
    ar.set_next_name(nvp.name);
    ar(nvp.value);
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, cereal::SizeTag<T>& tag) {
    tag.size = ar.node_size();
}
template <class T, cereal::traits::EnableIf<std::is_arithmetic_v<T>> = cereal::traits::sfinae>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, T& value) {
    ar.load_value(value);
}
inline void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, std::nullptr_t&) {
    ar.read_null();
}
template <class Traits, class Alloc>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, std::basic_string<char, Traits, Alloc>& value) {
    const std::string_view text = ar.read_string();
    value.assign(text.data(), text.size());
}
template <class T>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, std::optional<T>& value) {
    switch (ar.next_optional()) {
        case json_input_archive::optional_form::empty:
            value.reset();
            break;
        case json_input_archive::optional_form::value:
            ar(value.emplace());
            break;
        case json_input_archive::optional_form::wrapped:
            ar(cereal::make_nvp("data", value.emplace()));
            ar.finish_node();
            break;
    }
}
template <class K, class T, class C, class A>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, std::map<K, T, C, A>& map) {
    detail::load_map(ar, map);
}
template <class K, class T, class H, class E, class A>
void CEREAL_LOAD_FUNCTION_NAME(json_input_archive& ar, std::unordered_map<K, T, H, E, A>& map) {
    detail::load_map(ar, map);
}

}  // namespace idem

// load_minimal types (enums) look up the output archive that pairs with an input archive.
namespace cereal::traits::detail {
template <>
struct get_output_from_input<idem::json_input_archive> {
    using type = cereal::JSONOutputArchive;
};
}  // namespace cereal::traits::detail

CEREAL_REGISTER_ARCHIVE(idem::json_input_archive)
