#include <idem/storage/event_log.hpp>

#include <idem/storage/canonical.hpp>
#include <idem/storage/envelope_record.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem {
namespace {

constexpr char file_magic[8] = {'I', 'D', 'E', 'M', 'L', 'O', 'G', '\0'};
constexpr std::size_t file_header = 16;
constexpr std::uint32_t file_version = 1;
// Header flag: each record's payload is u32 LE body length | body | the body's parsed envelope
// attributes (envelope_record.hpp; none when the body is not a valid envelope). Without it
// the payload is the body (logs written before the flag existed).
constexpr std::uint32_t flag_attributes = 1;
// Stored little-endian its first byte is 0xFF, which never occurs in UTF-8 text, so a
// resynchronizing scan seldom stops inside a payload.
constexpr std::uint32_t record_magic = 0xFE52D1FFu;
constexpr std::size_t record_header = 12;
constexpr std::size_t read_size = 4u << 20;
constexpr std::size_t write_size = 1u << 20;

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

int open_file(const std::filesystem::path& path, int flags, bool may_fail_absent = false) {
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

// Closes the descriptor it holds.
struct file_handle {
    int fd = -1;
    ~file_handle() {
        if (fd >= 0) ::close(fd);
    }
};

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
        throw_error(errc::format_mismatch, path.string() + ": unknown binary log flags " + hex(flags & ~flag_attributes));
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

}  // namespace

std::string_view to_string(log_format f) noexcept {
    switch (f) {
    case log_format::jsonl: return "jsonl";
    case log_format::binary: return "binary";
    }
    return "unknown";
}

log_format detect_log_format(const std::filesystem::path& path) {
    file_handle in{open_file(path, O_RDONLY)};
    char head[8];
    std::size_t n = read_fully(in.fd, head, sizeof head, 0, path);
    return starts_like_binary(head, n) ? log_format::binary : log_format::jsonl;
}

// ---- log_reader ------------------------------------------------------------------------

log_reader::log_reader(const std::filesystem::path& path, log_reader_options options)
    : path_(path), options_(options), fd_(open_file(path, O_RDONLY)) {
    try {
        capacity_ = read_size;
        buffer_ = std::make_unique_for_overwrite<char[]>(capacity_);
        cursor_ = options_.start;
        position_ = cursor_;
        number_ = options_.start_line;
        detect_format();
    } catch (...) {
        ::close(fd_);
        throw;
    }
}

// Decides the format from the first bytes; false while a follower cannot tell yet (no bytes,
// or fewer than a header that begin like one: a binary writer may be writing its header).
bool log_reader::detect_format() {
    std::size_t have = fill(0, file_header);
    const char* head = at(0);
    const bool header_so_far =
        have < file_header && std::memcmp(head, file_magic, std::min(have, sizeof file_magic)) == 0;
    if (options_.follow && header_so_far && options_.format != log_format::jsonl) return false;
    format_ = starts_like_binary(head, have) ? log_format::binary : log_format::jsonl;
    if (options_.format && *options_.format != format_) {
        throw_error(errc::invalid_argument, path_.string() + ": is a " + std::string(to_string(format_)) +
                                                " log, not " + std::string(to_string(*options_.format)));
    }
    if (format_ == log_format::binary) {
        attributed_ = (check_header(head, have, path_) & flag_attributes) != 0;
        if (options_.start == 0) {
            cursor_ = position_ = file_header;
        } else if (options_.start < file_header) {
            throw_error(errc::invalid_argument, path_.string() + ": start offset " + std::to_string(options_.start) +
                                                    " is inside the header");
        }
    }
    format_known_ = true;
    return true;
}

log_reader::~log_reader() {
    if (fd_ >= 0) ::close(fd_);
}

log_reader::log_reader(log_reader&& other) noexcept
    : path_(std::move(other.path_)),
      format_(other.format_),
      format_known_(other.format_known_),
      attributed_(other.attributed_),
      options_(other.options_),
      fd_(std::exchange(other.fd_, -1)),
      buffer_(std::move(other.buffer_)),
      capacity_(std::exchange(other.capacity_, 0)),
      buffer_offset_(other.buffer_offset_),
      buffered_(std::exchange(other.buffered_, 0)),
      cursor_(other.cursor_),
      scanned_(other.scanned_),
      number_(other.number_),
      position_(other.position_),
      skipped_(other.skipped_),
      torn_tail_(other.torn_tail_),
      torn_detail_(std::move(other.torn_detail_)) {}

log_reader& log_reader::operator=(log_reader&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        path_ = std::move(other.path_);
        format_ = other.format_;
        format_known_ = other.format_known_;
        attributed_ = other.attributed_;
        options_ = other.options_;
        fd_ = std::exchange(other.fd_, -1);
        buffer_ = std::move(other.buffer_);
        capacity_ = std::exchange(other.capacity_, 0);
        buffer_offset_ = other.buffer_offset_;
        buffered_ = std::exchange(other.buffered_, 0);
        cursor_ = other.cursor_;
        scanned_ = other.scanned_;
        number_ = other.number_;
        position_ = other.position_;
        skipped_ = other.skipped_;
        torn_tail_ = other.torn_tail_;
        torn_detail_ = std::move(other.torn_detail_);
    }
    return *this;
}

std::uint64_t log_reader::size() const { return file_size(fd_, path_); }

file_identity log_reader::identity() const { return identity_of(fd_, path_); }

log_position log_reader::where() const { return position_in(fd_, path_, position_); }

bool log_reader::still_holds(const log_position& p) const {
    return size() >= p.offset && digest_matches(fd_, path_, p);
}

const char* log_reader::at(std::uint64_t offset) const noexcept {
    return buffer_.get() + static_cast<std::size_t>(offset - buffer_offset_);
}

void log_reader::fail_read(std::uint64_t offset, int error) const {
    throw_errno(error, path_.string() + ": read at offset " + std::to_string(offset) + " failed");
}

// Makes the buffer start at `from` (keeping what it already holds from there) and reads
// until it holds `want` bytes from `from` or the file ends; returns the bytes held from
// `from`. Reads are as large as the buffer allows, and always go back to the file (no
// EOF latching), so data appended meanwhile is seen.
std::size_t log_reader::fill(std::uint64_t from, std::size_t want) {
    const std::uint64_t buffered_end = buffer_offset_ + buffered_;
    if (from >= buffer_offset_ && from <= buffered_end) {
        auto have = static_cast<std::size_t>(buffered_end - from);
        if (have >= want) return have;
        auto skip = static_cast<std::size_t>(from - buffer_offset_);
        if (skip > 0) std::memmove(buffer_.get(), buffer_.get() + skip, have);
        buffered_ = have;
    } else {
        buffered_ = 0;
    }
    buffer_offset_ = from;
    if (want > capacity_) {
        // Doubling, but never far past the largest record, so a runaway line does not take 512 MiB.
        std::size_t grown = std::min(std::max(want, capacity_ * 2), std::max(want, std::size_t{max_log_record} + 64));
        auto bigger = std::make_unique_for_overwrite<char[]>(grown);
        std::memcpy(bigger.get(), buffer_.get(), buffered_);
        buffer_ = std::move(bigger);
        capacity_ = grown;
    }
    while (buffered_ < want) {
        auto got = ::pread(fd_, buffer_.get() + buffered_, capacity_ - buffered_,
                           static_cast<off_t>(buffer_offset_ + buffered_));
        if (got < 0) {
            if (errno == EINTR) continue;
            fail_read(buffer_offset_ + buffered_, errno);
        }
        if (got == 0) break;
        buffered_ += static_cast<std::size_t>(got);
    }
    return buffered_;
}

bool log_reader::next(log_record& out) {
    if (torn_tail_) return false;
    if (!format_known_ && !detect_format()) return false;
    return format_ == log_format::jsonl ? next_jsonl(out) : next_binary(out);
}

bool log_reader::next_jsonl(log_record& out) {
    for (;;) {
        std::size_t have = fill(cursor_, static_cast<std::size_t>(scanned_) + 1);
        const char* base = at(cursor_);
        std::size_t length = 0;
        std::size_t consumed = 0;
        if (have <= scanned_) {
            // Nothing new. A last line without its newline is a torn tail, the same as a binary
            // record cut short (a writer may still be adding to it; following, it just waits).
            if (have == 0 || options_.follow || is_blank(std::string_view(base, have))) return false;
            torn_tail_ = cursor_;
            torn_detail_ = "line " + std::to_string(number_ + 1) + " at offset " + std::to_string(cursor_) + ": " +
                           std::to_string(have) + " bytes without a newline at the end of the file";
            return false;
        } else {
            const auto* newline = static_cast<const char*>(
                std::memchr(base + scanned_, '\n', have - static_cast<std::size_t>(scanned_)));
            if (newline == nullptr) {
                scanned_ = have;
                if (have > std::size_t{max_log_record} + 1) {
                    throw_error(errc::corrupt_log, path_.string() + ": line " + std::to_string(number_ + 1) +
                                                       " at offset " + std::to_string(cursor_) +
                                                       ": longer than the record limit of " +
                                                       std::to_string(max_log_record) + " bytes");
                }
                continue;
            }
            length = static_cast<std::size_t>(newline - base);
            consumed = length + 1;
        }
        std::string_view body(base, length);
        const std::uint64_t offset = cursor_;
        cursor_ += consumed;
        scanned_ = 0;
        ++number_;
        if (!body.empty() && body.back() == '\r') body.remove_suffix(1);
        if (is_blank(body)) continue;
        position_ = cursor_;
        out.body = body;
        out.attributes = {};
        out.offset = offset;
        out.end = cursor_;
        out.line = number_;
        return true;
    }
}

bool log_reader::next_binary(log_record& out) {
    for (;;) {
        const std::uint64_t offset = cursor_;
        std::size_t have = fill(offset, record_header);
        if (have == 0) return false;
        std::string cause;
        std::size_t needed = 0;  // set when the record was cut short: the bytes it needs
        if (have < record_header) {
            needed = record_header;
            cause = "only " + std::to_string(have) + " of " + std::to_string(record_header) +
                    " record header bytes present";
        } else {
            const char* p = at(offset);
            auto magic = get_u32(p);
            auto length = get_u32(p + 4);
            if (magic != record_magic) {
                cause = "bad record magic " + hex(magic);
            } else if (length > max_log_record) {
                cause = "header says " + std::to_string(length) + " bytes, more than the record limit of " +
                        std::to_string(max_log_record);
            } else {
                have = fill(offset, record_header + length);
                p = at(offset);
                if (have < record_header + length) {
                    needed = record_header + length;
                    cause = "header says " + std::to_string(length) + " bytes, " +
                            std::to_string(have - record_header) + " present";
                } else {
                    std::string_view payload(p + record_header, length);
                    auto stored = get_u32(p + 8);
                    auto computed = record_checksum(p + 4, payload);
                    const auto body_length = attributed_ && length >= 4 ? get_u32(payload.data()) : 0;
                    if (stored != computed) {
                        cause = "checksum mismatch (stored " + hex(stored) + ", computed " + hex(computed) + ")";
                    } else if (attributed_ && (length < 4 || body_length > length - 4)) {
                        cause = "body length " + std::to_string(body_length) + " does not fit the record's " +
                                std::to_string(length) + " bytes";
                    } else {
                        cursor_ = offset + record_header + length;
                        position_ = cursor_;
                        if (attributed_) {
                            out.body = payload.substr(4, body_length);
                            out.attributes = payload.substr(4 + body_length);
                        } else {
                            out.body = payload;
                            out.attributes = {};
                        }
                        out.offset = offset;
                        out.end = cursor_;
                        out.line = ++number_;
                        return true;
                    }
                }
            }
        }
        auto next_good = resync(offset + 1);
        if (next_good && needed > 0 && fill(offset, needed) >= needed) {
            continue;  // the rest arrived while we looked past it (a writer is appending): read it afresh
        }
        if (!next_good) {
            // Nothing valid follows: what a crash mid-append leaves (or, following, a record being written).
            if (!options_.follow) {
                torn_tail_ = offset;
                torn_detail_ = "record at offset " + std::to_string(offset) + ": " + cause;
            }
            return false;
        }
        if (!options_.skip_bad) {
            throw_error(errc::corrupt_log, path_.string() + ": corrupt record at offset " + std::to_string(offset) +
                                               ": " + cause + " (next valid record at offset " +
                                               std::to_string(*next_good) + ")");
        }
        ++skipped_;
        cursor_ = *next_good;
    }
}

// Returns the offset of the first record at or after `from` whose magic, length and checksum
// are all right, if the file holds one.
std::optional<std::uint64_t> log_reader::resync(std::uint64_t from) {
    std::uint64_t pos = from;
    for (;;) {
        std::size_t have = fill(pos, 1);
        if (have == 0) return std::nullopt;
        const char* base = at(pos);
        const auto* hit = static_cast<const char*>(std::memchr(base, 0xFF, have));
        if (hit == nullptr) {
            pos += have;
            continue;
        }
        const std::uint64_t candidate = pos + static_cast<std::uint64_t>(hit - base);
        pos = candidate + 1;
        if (fill(candidate, record_header) < record_header) continue;
        const char* p = at(candidate);
        auto length = get_u32(p + 4);
        if (get_u32(p) != record_magic || length > max_log_record) continue;
        if (fill(candidate, record_header + length) < record_header + length) continue;
        p = at(candidate);
        if (get_u32(p + 8) == record_checksum(p + 4, std::string_view(p + record_header, length))) return candidate;
    }
}

// ---- log_writer ------------------------------------------------------------------------

log_writer::log_writer(const std::filesystem::path& path, log_format format, bool append)
    : path_(path), format_(format), buffer_(std::make_unique_for_overwrite<char[]>(write_size)) {
    if (append) {
        fd_ = open_file(path_, O_WRONLY | O_APPEND, true);
        if (fd_ >= 0) {
            try {
                prepare_append();
            } catch (...) {
                ::close(std::exchange(fd_, -1));
                throw;
            }
            return;
        }
    }
    create();
}

void log_writer::prepare_append() {
    auto size = file_size(fd_, path_);
    if (size == 0) {
        if (format_ == log_format::binary) write_all(fd_, binary_header(flag_attributes).data(), file_header, path_);
        attributed_ = format_ == log_format::binary;
        return;
    }
    file_handle in{open_file(path_, O_RDONLY)};
    char head[file_header];
    std::size_t n = read_fully(in.fd, head, sizeof head, 0, path_);
    char last = '\n';
    read_fully(in.fd, &last, 1, size - 1, path_);
    bool binary = starts_like_binary(head, n);
    if (format_ == log_format::binary) {
        if (!binary) {
            throw_error(errc::format_mismatch,
                        path_.string() + ": not a binary event log; cannot append binary records");
        }
        attributed_ = (check_header(head, n, path_) & flag_attributes) != 0;  // records as the file has them
        // Cut a torn last record (a writer that crashed mid-append) before appending: after it,
        // it would read as corruption in the middle of the log instead of a torn tail.
        log_reader scan{path_};
        log_record r;
        while (scan.next(r)) {
        }
        if (auto torn = scan.torn_tail()) {
            if (::ftruncate(fd_, static_cast<off_t>(*torn)) != 0) {
                throw std::system_error(errno, std::system_category(),
                                        path_.string() + ": cannot cut the torn record at offset " + std::to_string(*torn));
            }
        }
    } else {
        if (binary) {
            throw_error(errc::format_mismatch, path_.string() + ": a binary event log; cannot append JSON lines");
        }
        // End a torn last line, so it stays a record of its own instead of merging with ours.
        if (last != '\n') write_all(fd_, "\n", 1, path_);
    }
}

void log_writer::create() {
    if (format_ == log_format::jsonl) {
        fd_ = open_file(path_, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND);
    } else {
        // Written aside and renamed, so no reader ever sees the file without its header.
        auto temporary = path_;
        temporary += ".tmp-" + std::to_string(::getpid());
        file_handle out{open_file(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND)};
        try {
            write_all(out.fd, binary_header(flag_attributes).data(), file_header, temporary);
            if (::rename(temporary.c_str(), path_.c_str()) != 0) {
                throw_errno(errno, path_.string() + ": cannot rename " + temporary.string() + " to it");
            }
        } catch (...) {
            ::unlink(temporary.c_str());
            throw;
        }
        fd_ = std::exchange(out.fd, -1);
        attributed_ = true;
    }
    sync_directory_ = true;
}

// Parses each body written to a binary log for the attributes its record carries.
struct log_writer::attribute_maker {
    envelope_parser parser;
    envelope ev;
    parse_error err;
    std::string payload;
};

log_writer::~log_writer() {
    if (fd_ < 0) return;
    try {
        if (!failed_) flush();
    } catch (...) {
        // a destructor must not throw; the caller that needs to know calls flush() or sync()
    }
    ::close(fd_);
}

log_writer::log_writer(log_writer&& other) noexcept
    : path_(std::move(other.path_)),
      format_(other.format_),
      fd_(std::exchange(other.fd_, -1)),
      buffer_(std::move(other.buffer_)),
      buffered_(std::exchange(other.buffered_, 0)),
      records_(other.records_),
      attributed_(other.attributed_),
      attributes_(std::move(other.attributes_)),
      sync_directory_(other.sync_directory_),
      failed_(other.failed_) {}

void log_writer::write(std::string_view body) {
    auto refuse = [&](const std::string& why) {
        throw_error(errc::invalid_argument,
                    path_.string() + ": record " + std::to_string(records_ + 1) + " cannot be written: " + why);
    };
    if (failed_) throw_error(errc::storage_failed, path_.string() + ": an earlier write to the log failed");
    // A record with attributes holds the body's length too: the payload, not the body, meets the limit.
    const std::size_t limit = format_ == log_format::binary && attributed_ ? max_log_record - 4 : max_log_record;
    if (body.size() > limit) {
        refuse(std::to_string(body.size()) + " bytes, more than the record limit of " + std::to_string(limit));
    }
    if (format_ == log_format::jsonl) {
        if (const void* newline = std::memchr(body.data(), '\n', body.size())) {
            refuse("raw newline at byte " + std::to_string(static_cast<const char*>(newline) - body.data()) +
                   " (JSON Lines holds one record per line)");
        }
        if (is_blank(body)) refuse("blank, and readers skip blank lines");
        if (body.back() == '\r') refuse("ends in a carriage return, which readers strip");
        append(body.data(), body.size());
        append("\n", 1);
    } else if (!attributed_) {
        char header[record_header];
        put_u32(header, record_magic);
        put_u32(header + 4, static_cast<std::uint32_t>(body.size()));
        put_u32(header + 8, record_checksum(header + 4, body));
        append(header, record_header);
        append(body.data(), body.size());
    } else {
        if (!attributes_) attributes_ = std::make_unique<attribute_maker>();
        auto& a = *attributes_;
        a.payload.clear();
        char length[4];
        put_u32(length, static_cast<std::uint32_t>(body.size()));
        a.payload.append(length, 4);
        a.payload.append(body);
        if (a.parser.parse(body, a.ev, a.err)) {
            encode_envelope_attributes(a.payload, body, a.ev, fingerprint(a.ev));
            // Past the record limit the body goes alone: the attributes are a cache, the body the content.
            if (a.payload.size() > max_log_record) a.payload.resize(4 + body.size());
        }
        char header[record_header];
        put_u32(header, record_magic);
        put_u32(header + 4, static_cast<std::uint32_t>(a.payload.size()));
        put_u32(header + 8, record_checksum(header + 4, a.payload));
        append(header, record_header);
        append(a.payload.data(), a.payload.size());
    }
    ++records_;
}

void log_writer::append(const char* data, std::size_t size) {
    if (buffered_ + size > write_size) flush();
    if (size > write_size) {
        try {
            write_all(fd_, data, size, path_);
        } catch (...) {
            failed_ = true;
            throw;
        }
        return;
    }
    std::memcpy(buffer_.get() + buffered_, data, size);
    buffered_ += size;
}

void log_writer::flush() {
    if (failed_) throw_error(errc::storage_failed, path_.string() + ": an earlier write to the log failed");
    if (buffered_ == 0) return;
    auto size = std::exchange(buffered_, 0);
    try {
        write_all(fd_, buffer_.get(), size, path_);
    } catch (...) {
        // Part of the buffer may be in the file: appending more would turn a torn tail into corruption.
        failed_ = true;
        throw;
    }
}

void log_writer::sync() {
    flush();
    if (::fdatasync(fd_) != 0) throw_errno(errno, path_.string() + ": fdatasync failed");
    if (sync_directory_) {
        auto directory = path_.parent_path();
        if (directory.empty()) directory = ".";
        file_handle dir{open_file(directory, O_RDONLY | O_DIRECTORY)};
        if (::fsync(dir.fd) != 0) throw_errno(errno, directory.string() + ": fsync failed");
        sync_directory_ = false;
    }
}

// ---- convert_log -----------------------------------------------------------------------

convert_result convert_log(const std::filesystem::path& in, const std::filesystem::path& out, log_format to,
                           bool skip_bad) {
    std::error_code ec;
    if (std::filesystem::equivalent(in, out, ec)) {
        throw_error(errc::invalid_argument, in.string() + ": cannot convert a log onto itself");
    }
    log_reader reader{in, {.skip_bad = skip_bad}};
    log_writer writer{out, to};
    log_record record;
    while (reader.next(record)) writer.write(record.body);
    writer.sync();
    return {writer.records(), reader.skipped(), reader.torn_tail(), reader.torn_detail()};
}

}  // namespace idem
