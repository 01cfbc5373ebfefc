#pragma once

// Helpers shared by the example domains: overflow-checked arithmetic, and a
// std::map<std::string, std::int64_t> member that reads as a JSON object.

#include <cereal/archives/json.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/string.hpp>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace idem::examples::detail {

/// Returns a + b; throws std::overflow_error naming what overflowed.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const char* what) {
    std::int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) throw std::overflow_error(std::string(what) + " overflows 64 bits");
    return r;
}

/// Returns a - b; throws std::overflow_error naming what overflowed.
inline std::int64_t checked_sub(std::int64_t a, std::int64_t b, const char* what) {
    std::int64_t r = 0;
    if (__builtin_sub_overflow(a, b, &r)) throw std::overflow_error(std::string(what) + " overflows 64 bits");
    return r;
}

/// Returns a * b; throws std::overflow_error naming what overflowed.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const char* what) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) throw std::overflow_error(std::string(what) + " overflows 64 bits");
    return r;
}

/// Serializes a named string -> count map: as a JSON object {"name":count,...} in JSON
/// archives (what `idem get` prints), as cereal's usual map encoding in binary archives.
template <class Archive>
void counts_field(Archive& ar, const char* name, std::map<std::string, std::int64_t>& counts) {
    if constexpr (std::is_same_v<Archive, cereal::JSONOutputArchive>) {
        ar.setNextName(name);
        ar.startNode();
        for (auto& [key, count] : counts) ar(cereal::make_nvp(key.c_str(), count));
        ar.finishNode();
    } else if constexpr (std::is_same_v<Archive, cereal::JSONInputArchive>) {
        counts.clear();
        ar.setNextName(name);
        ar.startNode();
        while (const char* key = ar.getNodeName()) {
            std::int64_t count = 0;
            ar(count);
            counts.emplace(key, count);
        }
        ar.finishNode();
    } else {
        ar(cereal::make_nvp(name, counts));
    }
}

}  // namespace idem::examples::detail
