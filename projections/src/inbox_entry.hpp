#pragma once

// The value of a consumer's inbox entry ("inbox/<consumer>", an id_log with 3 extra words):
// [stamp u64 LE][content fingerprint u64 LE][commit << 8 | outcome u64 LE][event-id hash u64 LE]
// [message id]. The writer stages it through id_log; readers decode it here, in one place.

#include <idem/projections/store.hpp>
#include <idem/storage/codec.hpp>

#include <cstdint>
#include <optional>
#include <string_view>

namespace idem::detail {

/// The extra words of an inbox entry besides its stamp.
inline constexpr std::size_t inbox_extra_words = 3;
/// Bytes before the message id.
inline constexpr std::size_t inbox_header = 8 * (1 + inbox_extra_words);

/// Packs the commit number and outcome of the first delivery into one word.
inline std::uint64_t inbox_word(std::uint64_t commit, outcome_kind k) { return commit << 8 | static_cast<std::uint64_t>(k); }

/// One decoded inbox value.
struct inbox_entry {
    snapshot::inbox_record record;
    std::string_view message_id;
};

/// Decodes a stored inbox value; nullopt if it is too short to be one.
inline std::optional<inbox_entry> decode_inbox_entry(std::string_view v) {
    if (v.size() < inbox_header) return std::nullopt;
    inbox_entry e;
    e.record.stamp = codec::get_u64_le(v);
    e.record.fingerprint = codec::get_u64_le(v.substr(8));
    const auto word = codec::get_u64_le(v.substr(16));
    e.record.commit = word >> 8;
    e.record.outcome = static_cast<outcome_kind>(word & 0xff);
    e.message_id = v.substr(inbox_header);
    return e;
}

}  // namespace idem::detail
