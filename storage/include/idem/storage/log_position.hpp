#pragma once

// A position in an event log file that knows which file it is in: the byte offset, the
// file's identity (device and inode) and a digest of the bytes just before the offset. A
// consumer stores it as its checkpoint and checks it on resume, so a rotated, truncated or
// replaced log is noticed instead of being read at an offset that means nothing there.
//
// Stored value (little-endian), the offset first so an offset-only reader still reads it:
//     u64 offset | u8 version (1) | u8 flags | u64 device | u64 inode | u32 digest length | u32 digest
// flags bit 0 (finished): the file was read to its end after its path came to name another
// file (a rotation); the consumer moves on to the file now at the path. The digest is
// CRC32C of the up to 4 KiB before the offset. An 8-byte value (written before identities
// were stored) decodes as an offset without an identity.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// Returns the checkpoint source name of a log file: "log:" and its absolute, normalized path.
/// Its checkpoint value is a log_position.
std::string log_source(const std::filesystem::path& log);

/// Returns the path a log's checkpoint source name holds, or nullopt for a source that is not a log.
std::optional<std::string_view> log_source_path(std::string_view source) noexcept;

/// Which file: its device and inode.
struct file_identity {
    std::uint64_t device = 0;
    std::uint64_t inode = 0;
    bool operator==(const file_identity&) const = default;
};

/// The bytes before an offset that a log position's digest covers, at most.
inline constexpr std::uint32_t log_digest_span = 4096;

/// A checkpoint in a log file.
struct log_position {
    std::uint64_t offset = 0;
    std::optional<file_identity> file{};  ///< absent: an offset-only checkpoint of an older version
    std::uint32_t digest_length = 0;      ///< bytes before offset the digest covers
    std::uint32_t digest = 0;             ///< CRC32C of those bytes
    bool finished = false;                ///< read to its end after its path moved on to another file
};

/// Encodes a log position as a checkpoint value.
std::string encode_log_position(const log_position& p);

/// Decodes a checkpoint value; throws errc::corrupt_record on a value of unknown shape.
log_position decode_log_position(std::string_view value);

/// Returns the identity of an open file; throws naming path if it cannot be stat'ed.
file_identity identity_of(int fd, const std::filesystem::path& path);

/// Returns the identity of the file at path, or nullopt if there is none.
std::optional<file_identity> try_identity_of(const std::filesystem::path& path);

/// Returns the position at offset in an open file: its identity and the digest of the bytes before offset.
log_position position_in(int fd, const std::filesystem::path& path, std::uint64_t offset);

/// Returns the position at offset in an open file, or nullopt if the file is shorter than offset.
std::optional<log_position> try_position_in(int fd, const std::filesystem::path& path, std::uint64_t offset);

/// Returns whether the open file holds, before p.offset, the bytes p's digest was taken over.
bool digest_matches(int fd, const std::filesystem::path& path, const log_position& p);

/// What a log's path holds now, measured against a checkpoint.
enum class log_state {
    ok,         ///< the checkpoint's file, unchanged up to the offset (or the same content, copied)
    rotated,    ///< the path names a new file; the checkpoint's file is still beside it, or was finished
    truncated,  ///< the checkpoint's file is shorter than the offset (copytruncate)
    replaced,   ///< the bytes before the offset are not the ones consumed (rewritten, or another file)
    missing,    ///< nothing at the path, and the checkpoint's file is not beside it
};

/// Returns the name of a state ("ok", "rotated", ...).
std::string_view to_string(log_state s) noexcept;

/// The outcome of checking a checkpoint against the file system.
struct log_check {
    log_state state = log_state::ok;
    std::optional<std::filesystem::path> old_file{};  ///< rotated: where the checkpoint's file is now, if still there
    std::uint64_t old_size = 0;                       ///< rotated: that file's size
    /// rotated: files beside it that look like later rotations of the log (oldest first); when
    /// there are any, reading the path's file next would skip them (detail says so).
    std::vector<std::filesystem::path> later_rotations{};
    std::uint64_t size = 0;                           ///< the size of the file at the path (0 if none)
    /// Bytes still to read: ok, the rest of the file; rotated, the rest of the old file plus the new
    /// one; truncated or replaced, the whole file at the path (what reading it again would read).
    std::uint64_t lag_bytes = 0;
    std::string detail{};                             ///< what happened, for a message; empty when ok
};

/// Checks a checkpoint of the log at path against the files now there.
///
/// Same file: ok, truncated (size < offset) or replaced (digest mismatch). Another file at the
/// path: rotated if the checkpoint's file is in path's directory (and unchanged up to the
/// offset; else truncated or replaced, naming it; later_rotations lists files that look
/// like rotations after it) or was finished; else ok if the new file
/// holds the same bytes before the offset (a copy), replaced if not. An offset-only checkpoint
/// is checked by size alone. Throws std::system_error naming the file on an I/O failure.
log_check check_log_position(const std::filesystem::path& path, const log_position& at);

/// Checks a position in the open file fd (named path in the detail), wherever that file is now:
/// ok, truncated (shorter than at.offset) or replaced (the digest differs), with the detail
/// check_log_position gives. lag_bytes is not set.
log_check check_open_log(int fd, const std::filesystem::path& path, const log_position& at);

}  // namespace idem
