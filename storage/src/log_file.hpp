#pragma once
// Internal to the storage library: the event log's file format (its header and record framing)
// and the file I/O that the log's reader (event_log.cpp) and writer (log_writer.cpp) share.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <unistd.h>

namespace idem::log_file {

inline constexpr char file_magic[8] = {'I', 'D', 'E', 'M', 'L', 'O', 'G', '\0'};
inline constexpr std::size_t file_header = 16;
inline constexpr std::uint32_t file_version = 1;
// Header flag: each record's payload is u32 LE body length | body | the body's parsed envelope
// attributes (envelope_record.hpp; none when the body is not a valid envelope). Without it
// the payload is the body (logs written before the flag existed).
inline constexpr std::uint32_t flag_attributes = 1;
// Stored little-endian its first byte is 0xFF, which never occurs in UTF-8 text, so a
// resynchronizing scan seldom stops inside a payload.
inline constexpr std::uint32_t record_magic = 0xFE52D1FFu;
inline constexpr std::size_t record_header = 12;
inline constexpr std::size_t read_size = 4u << 20;
inline constexpr std::size_t write_size = 1u << 20;

// Closes the descriptor it holds.
struct file_handle {
    int fd = -1;
    ~file_handle() {
        if (fd >= 0) ::close(fd);
    }
};

/// Reads and writes a u32 little-endian.
std::uint32_t get_u32(const char* p) noexcept;
void put_u32(char* p, std::uint32_t v) noexcept;
/// Returns bytes as space-separated hex pairs ("49 44 ..."), and v as "0x%08x".
std::string hex_bytes(std::string_view bytes);
std::string hex(std::uint32_t v);
/// Throws std::system_error of errno error with what.
[[noreturn]] void throw_errno(int error, const std::string& what);
/// Opens path (O_CLOEXEC added, EINTR retried); with may_fail_absent a missing file gives -1.
int open_file(const std::filesystem::path& path, int flags, bool may_fail_absent = false);
/// Reads up to n bytes at offset (fewer only at the end of the file); throws naming path.
std::size_t read_fully(int fd, char* out, std::size_t n, std::uint64_t offset, const std::filesystem::path& path);
/// Writes all n bytes; throws naming path.
void write_all(int fd, const char* data, std::size_t n, const std::filesystem::path& path);
/// Returns the size of the open file; throws naming path.
std::uint64_t file_size(int fd, const std::filesystem::path& path);
/// Returns whether the first n bytes at p begin a binary log (a magic damaged in up to two bytes included).
bool starts_like_binary(const char* p, std::size_t n) noexcept;
/// Throws unless p holds a complete binary header this build reads; returns its flags.
std::uint32_t check_header(const char* p, std::size_t n, const std::filesystem::path& path);
/// Returns a binary log's header with flags.
std::array<char, file_header> binary_header(std::uint32_t flags) noexcept;
/// Returns whether s holds nothing but spaces, tabs and carriage returns.
bool is_blank(std::string_view s) noexcept;
/// Returns a record's CRC32C over its length bytes and payload.
std::uint32_t record_checksum(const char* length_bytes, std::string_view payload) noexcept;

}  // namespace idem::log_file
