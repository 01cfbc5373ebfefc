#include <idem/storage/event_log.hpp>

#include "log_file.hpp"

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

using namespace log_file;

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

std::optional<log_position> log_reader::try_where() const { return try_position_in(fd_, path_, position_); }

log_check log_reader::check(const log_position& p) const { return check_open_log(fd_, path_, p); }

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

}  // namespace idem
