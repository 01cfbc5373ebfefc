// The event log's file format and shared file I/O (log_file.hpp).

#include "log_file.hpp"

#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem::log_file {

std::uint32_t get_u32(const char* p) noexcept {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    return static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
           static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24;
}

void put_u32(char* p, std::uint32_t v) noexcept {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(static_cast<unsigned char>(v >> (8 * i)));
}

std::string hex_bytes(std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (char ch : bytes) {
        const auto c = static_cast<unsigned char>(ch);
        if (!out.empty()) out += ' ';
        out += digits[c >> 4];
        out += digits[c & 15];
    }
    return out;
}

std::string hex(std::uint32_t v) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", v);
    return text;
}

[[noreturn]] void throw_errno(int error, const std::string& what) {
    throw std::system_error(std::error_code(error, std::system_category()), what);
}

int open_file(const std::filesystem::path& path, int flags, bool may_fail_absent) {
    for (;;) {
        int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0666);
        if (fd >= 0) return fd;
        if (errno == EINTR) continue;
        if (may_fail_absent && errno == ENOENT) return -1;
        throw_errno(errno, path.string() + ": cannot open");
    }
}

// Reads up to n bytes at offset, fewer only at end of file; returns the count.
std::size_t read_fully(int fd, char* out, std::size_t n, std::uint64_t offset, const std::filesystem::path& path) {
    std::size_t done = 0;
    while (done < n) {
        auto got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            throw_errno(errno, path.string() + ": read at offset " + std::to_string(offset + done) + " failed");
        }
        if (got == 0) break;
        done += static_cast<std::size_t>(got);
    }
    return done;
}

void write_all(int fd, const char* data, std::size_t n, const std::filesystem::path& path) {
    while (n > 0) {
        auto done = ::write(fd, data, n);
        if (done < 0) {
            if (errno == EINTR) continue;
            throw_errno(errno, path.string() + ": write failed");
        }
        data += done;
        n -= static_cast<std::size_t>(done);
    }
}

std::uint64_t file_size(int fd, const std::filesystem::path& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno(errno, path.string() + ": cannot stat");
    return static_cast<std::uint64_t>(st.st_size);
}

bool starts_like_binary(const char* p, std::size_t n) noexcept {
    if (n >= 7 && std::memcmp(p, file_magic, 7) == 0) return true;
    // A binary header with a damaged magic (a flipped bit or two) is still a binary log, to be
    // refused as damaged: read as JSON Lines it would be garbage lines or one torn tail. No
    // JSON line begins with 6 of these 8 bytes.
    if (n < sizeof file_magic) return false;
    int same = 0;
    for (std::size_t i = 0; i < sizeof file_magic; ++i) same += p[i] == file_magic[i] ? 1 : 0;
    return same >= 6;
}

// Throws unless p holds a complete binary header this build reads; returns its flags.
std::uint32_t check_header(const char* p, std::size_t n, const std::filesystem::path& path) {
    if (n < file_header) {
        throw_error(errc::format_mismatch, path.string() + ": binary log header cut short (" + std::to_string(n) +
                                               " of " + std::to_string(file_header) + " bytes)");
    }
    if (std::memcmp(p, file_magic, sizeof file_magic) != 0) {
        throw_error(errc::format_mismatch, path.string() + ": bad binary log magic (its first 8 bytes are " +
                                               hex_bytes(std::string_view(p, sizeof file_magic)) +
                                               ", not IDEMLOG and a NUL): the header is damaged");
    }
    auto version = get_u32(p + 8);
    if (version != file_version) {
        throw_error(errc::format_mismatch, path.string() + ": binary log format version " + std::to_string(version) +
                                               "; this build reads version " + std::to_string(file_version));
    }
    auto flags = get_u32(p + 12);
    if ((flags & ~flag_attributes) != 0) {
        throw_error(errc::format_mismatch,
                    path.string() + ": unknown binary log flags " + hex(flags & ~flag_attributes));
    }
    return flags;
}

std::array<char, file_header> binary_header(std::uint32_t flags) noexcept {
    std::array<char, file_header> h{};
    std::memcpy(h.data(), file_magic, sizeof file_magic);
    put_u32(h.data() + 8, file_version);
    put_u32(h.data() + 12, flags);
    return h;
}

bool is_blank(std::string_view s) noexcept {
    for (char c : s) {
        if (c != ' ' && c != '\t' && c != '\r') return false;
    }
    return true;
}

std::uint32_t record_checksum(const char* length_bytes, std::string_view payload) noexcept {
    return crc32c(payload, crc32c(std::string_view(length_bytes, 4)));
}

}  // namespace idem::log_file
