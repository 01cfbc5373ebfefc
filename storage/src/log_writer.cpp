// The event log's writer, and conversion between the two formats (event_log.hpp).

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
                throw std::system_error(
                    errno, std::system_category(),
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
