#pragma once

// A dead-lettered delivery as a consumer keeps it.

#include <idem/projections/delivery.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace idem {

/// One dead-lettered delivery.
struct dead_letter {
    std::uint64_t position = 0;  ///< order in the dead-letter table
    reason why = reason::none;
    std::string detail;
    std::string message_id;
    std::string body;           ///< the envelope as received (only its first bytes when truncated)
    std::uint64_t time_ns = 0;  ///< when it was dead-lettered (Unix time, ns)
    std::uint64_t body_size = 0;    ///< the envelope's full size in bytes
    bool truncated = false;         ///< body holds only the first dead_letter_prefix bytes (a too_large envelope)
    std::uint64_t body_digest = 0;  ///< when truncated: body_digest() of the full envelope
    /// Where it was read, when the batch named a source: the checkpoint's source (a log's is
    /// "log:<path>", see log_source_path()), and in a log its line (1-based; 0: not known, as after
    /// a resume mid-file) and byte offset. Empty and 0 otherwise, and in records stored before
    /// dead letters kept their origin.
    std::string source{};
    std::uint64_t line = 0;
    std::uint64_t offset = 0;
};

/// A too_large envelope's dead letter keeps this many of its first bytes, its size and its digest.
inline constexpr std::size_t dead_letter_prefix = std::size_t{64} << 10;

/// Returns the 64-bit FNV-1a hash of bytes: the digest a truncated dead letter keeps of its envelope.
std::uint64_t body_digest(std::string_view bytes) noexcept;

}  // namespace idem
