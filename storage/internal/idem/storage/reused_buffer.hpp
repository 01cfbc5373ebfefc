#pragma once

// Strings reused slot by slot (a log run's deliveries and prepared items, batch after batch)
// keep the capacity of the largest value they ever held. Over a long run every slot would come
// to hold the largest record seen through it; copying in with assign_reused instead lets a
// slot give a large buffer back before it takes a small value, so the slots hold what their
// current values need.

#include <cstddef>
#include <string>
#include <string_view>

namespace idem {

/// A reused string keeps a larger buffer than this only while its value needs it.
inline constexpr std::size_t reused_capacity_max = 64 * 1024;

/// Releases s's buffer if it is larger than reused_capacity_max and a value of size bytes
/// does not need it.
inline void release_unneeded(std::string& s, std::size_t size) {
    if (s.capacity() > reused_capacity_max && size <= reused_capacity_max) std::string().swap(s);
}

/// Copies from into to (see the file comment).
inline void assign_reused(std::string& to, std::string_view from) {
    release_unneeded(to, from.size());
    to.assign(from);
}

}  // namespace idem
