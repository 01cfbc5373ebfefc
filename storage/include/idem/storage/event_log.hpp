#pragma once

// Event log files: the envelopes of a stream, one after another, in one of two formats.
//
// JSON Lines: one envelope JSON text per line. Blank lines are skipped; lines are not
// validated here (an invalid line is still a record, so the apply path can dead-letter it
// with a precise reason and nothing is lost).
//
// Binary: a 16-byte file header ("IDEMLOG\0", u32 LE format version 1, u32 LE flags), then
// records of
//     u32 LE record magic | u32 LE payload length | u32 LE CRC32C(length bytes + payload) | payload
// With flag 1 (every log this build creates) the payload is
//     u32 LE body length | body | the body's parsed envelope attributes (envelope_record.hpp)
// and without it (logs of earlier builds, appended to as they are) the payload is the body.
// The body is the envelope JSON text verbatim, so the formats convert losslessly and
// JSONL -> binary -> JSONL is byte-identical (for LF-terminated files without blank lines).
// The attributes (ids, type, subject, sequence, time, msgid, data, fingerprint) let a rebuild
// skip parsing the JSON; a build that reads no flag 1 refuses such a log by its flags.
//
// A crash mid-append leaves a torn tail: a last record cut short or failing its checksum
// with nothing valid after it, or a last JSON line without its newline. Readers report it
// (torn_tail()) instead of failing or applying it; a bad record followed by valid ones is
// corruption and fails (or is skipped, when asked).

#include <idem/storage/log_position.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

/// The two event log formats.
enum class log_format { jsonl, binary };

/// Returns the name of a format ("jsonl" / "binary").
std::string_view to_string(log_format f) noexcept;

/// Detects a file's format by its header (binary logs start with the magic); throws naming the file if unreadable.
log_format detect_log_format(const std::filesystem::path& path);

/// Extends the CRC32C (Castagnoli) checksum crc with data; crc32c("123456789") == 0xE3069283.
///
/// Uses the SSE4.2 crc32 instruction when the CPU has it, a slicing-by-8 table otherwise.
std::uint32_t crc32c(std::string_view data, std::uint32_t crc = 0) noexcept;

namespace detail {
/// Computes crc32c() with the portable table code only (the reference the hardware path is tested against).
std::uint32_t crc32c_portable(std::string_view data, std::uint32_t crc = 0) noexcept;
}  // namespace detail

/// The largest record either format accepts (256 MiB); a longer one is treated as corrupt.
inline constexpr std::uint32_t max_log_record = 256u << 20;

/// One record read from a log. body views into the reader's buffer: valid until the next call to next().
struct log_record {
    std::string_view body;     ///< the envelope JSON text exactly as stored (no trailing newline)
    /// Binary logs written with them: the body's parsed envelope attributes (envelope_record.hpp),
    /// to be read instead of parsing the body; empty for JSON Lines, older binary logs, and a
    /// body that is not a valid envelope.
    std::string_view attributes{};
    std::uint64_t offset = 0;  ///< byte offset of the record's start in the file
    std::uint64_t end = 0;     ///< byte offset just past the record (where a resumed read starts)
    std::uint64_t line = 0;    ///< 1-based line number (jsonl) or 1-based record number (binary)
};

/// How a log_reader reads.
struct log_reader_options {
    /// Byte offset to resume from: a previous record's `end`; 0 = start of file (for binary: just after the header).
    std::uint64_t start = 0;
    /// Binary: skip (and count) corrupt records in the middle instead of failing.
    bool skip_bad = false;
    /// The file may still be appended to: an incomplete last record is not returned (next() returns false;
    /// call next() again later to see newly appended data).
    bool follow = false;
    /// Line (jsonl) or record (binary) number of the record ending at `start`, so numbering continues after a resume.
    std::uint64_t start_line = 0;
    /// The format the file must have (errc::invalid_argument otherwise); unset: detected from its first bytes.
    ///
    /// Following, an empty file or one holding only the start of a binary header has no format
    /// yet: it is decided when enough bytes arrive (an expected jsonl is taken at once).
    std::optional<log_format> format{};
};

/// Reads JSON Lines or binary logs sequentially and fast (large buffered reads, no per-record allocation).
///
/// Not thread-safe; one reader per thread. Another process or thread may append to the file
/// while it is read (use options.follow to wait for records still being written).
class log_reader {
public:
    /// Opens path and detects its format; throws std::system_error naming the path and the cause.
    ///
    /// A binary log whose header is wrong or has another version is refused (errc::format_mismatch).
    explicit log_reader(const std::filesystem::path& path, log_reader_options options = {});
    ~log_reader();
    log_reader(log_reader&& other) noexcept;
    log_reader& operator=(log_reader&& other) noexcept;
    log_reader(const log_reader&) = delete;
    log_reader& operator=(const log_reader&) = delete;

    /// Returns the format detected (jsonl until format_known()).
    log_format format() const noexcept { return format_; }
    /// Returns whether the format is decided (only a follower of an empty or headerless file waits).
    bool format_known() const noexcept { return format_known_; }
    /// Returns the path the reader was opened with.
    const std::filesystem::path& path() const noexcept { return path_; }

    /// Reads the next record; false at end of data.
    ///
    /// Throws std::system_error (errc::corrupt_log) naming the file, the byte offset and the cause
    /// on a corrupt binary record followed by more data (unless skip_bad), or on a line longer
    /// than max_log_record; the system error of a failing read.
    bool next(log_record& out);

    /// After next() returned false: if the file ends in an incomplete record (a crash mid-append,
    /// or a last line without its newline), its offset; never in follow mode (there it is just
    /// "not yet complete").
    std::optional<std::uint64_t> torn_tail() const noexcept { return torn_tail_; }
    /// Describes the torn tail ("record at offset N: header says 412 bytes, 97 present"); empty if none.
    const std::string& torn_detail() const noexcept { return torn_detail_; }
    /// Returns the number of corrupt records skipped (skip_bad).
    std::uint64_t skipped() const noexcept { return skipped_; }
    /// Returns the offset just past the last record returned (where a resumed read starts).
    std::uint64_t position() const noexcept { return position_; }
    /// Returns the current file size (for progress bars).
    std::uint64_t size() const;
    /// Returns the identity of the open file (which may no longer be at path()).
    file_identity identity() const;
    /// Returns position() with the open file's identity and the digest of the bytes before it.
    log_position where() const;
    /// Returns where(), or nullopt if the open file is now shorter than position() (cut under the reader).
    std::optional<log_position> try_where() const;
    /// Returns whether the open file still holds p's bytes (not truncated below p.offset, nor rewritten before it).
    bool still_holds(const log_position& p) const;
    /// Checks the open file against p, a position in it: ok, truncated or replaced (check_open_log).
    log_check check(const log_position& p) const;

private:
    bool detect_format();
    bool next_jsonl(log_record& out);
    bool next_binary(log_record& out);
    std::size_t fill(std::uint64_t from, std::size_t want);
    const char* at(std::uint64_t offset) const noexcept;
    std::optional<std::uint64_t> resync(std::uint64_t from);
    [[noreturn]] void fail_read(std::uint64_t offset, int error) const;

    std::filesystem::path path_;
    log_format format_ = log_format::jsonl;
    bool format_known_ = false;
    bool attributed_ = false;  // binary records carry the body's length, then its attributes after it
    log_reader_options options_;
    int fd_ = -1;
    std::unique_ptr<char[]> buffer_;
    std::size_t capacity_ = 0;
    std::uint64_t buffer_offset_ = 0;  // file offset of buffer_[0]
    std::size_t buffered_ = 0;         // valid bytes in buffer_
    std::uint64_t cursor_ = 0;         // file offset of the next record
    std::uint64_t scanned_ = 0;        // jsonl: bytes from cursor_ already searched for a newline
    std::uint64_t number_ = 0;         // lines (jsonl) or records (binary) passed so far
    std::uint64_t position_ = 0;
    std::uint64_t skipped_ = 0;
    std::optional<std::uint64_t> torn_tail_;
    std::string torn_detail_;
};

/// Appends records to a log file (creates it with the header for binary).
///
/// flush() makes them visible to readers; sync() fsyncs.
///
/// A new binary log appears with its header already in place (written to a temporary file
/// and renamed), so a following reader never sees a headerless file. Appending to a JSONL
/// file whose last line has no newline (a torn line) first ends that line, so the torn line
/// stays a record of its own. Appending to a file of the other format is refused
/// (errc::format_mismatch). Not thread-safe.
class log_writer {
public:
    /// Opens path for writing; append = false replaces any existing file.
    log_writer(const std::filesystem::path& path, log_format format, bool append = false);
    ~log_writer();  ///< flushes, never throws
    log_writer(log_writer&& other) noexcept;
    log_writer& operator=(log_writer&& other) = delete;
    log_writer(const log_writer&) = delete;
    log_writer& operator=(const log_writer&) = delete;

    /// Appends one envelope JSON text (buffered).
    ///
    /// Throws errc::invalid_argument naming the file and record if body cannot be stored so that
    /// it reads back unchanged: for jsonl a raw newline, a trailing "\r", or a blank body; for
    /// both a body longer than max_log_record.
    void write(std::string_view body);
    /// Writes the buffered records to the file, making them visible to readers.
    void flush();
    /// Flushes, then makes the file durable (fdatasync; the directory too after creating it).
    void sync();

    /// Returns the format being written.
    log_format format() const noexcept { return format_; }
    /// Returns the path being written.
    const std::filesystem::path& path() const noexcept { return path_; }
    /// Returns the number of records written through this writer.
    std::uint64_t records() const noexcept { return records_; }

private:
    void prepare_append();
    void create();
    void append(const char* data, std::size_t size);

    std::filesystem::path path_;
    log_format format_;
    int fd_ = -1;
    std::unique_ptr<char[]> buffer_;
    std::size_t buffered_ = 0;
    std::uint64_t records_ = 0;
    struct attribute_maker;
    bool attributed_ = false;  // binary records carry the body's parsed attributes (a new file; an old one's as it has them)
    std::unique_ptr<attribute_maker> attributes_;
    bool sync_directory_ = false;  // the file was created: its directory entry must be made durable too
    bool failed_ = false;          // a write failed part way: refuse more, a torn tail must stay a tail
};

/// What convert_log did.
struct convert_result {
    std::uint64_t records = 0;               ///< records written
    std::uint64_t skipped = 0;               ///< corrupt records skipped (skip_bad)
    std::optional<std::uint64_t> torn_tail;  ///< offset of a torn tail in the input, not copied
    std::string torn_detail;                 ///< its description
};

/// Converts a log to another format losslessly; returns the number of records.
///
/// A torn tail is reported in the result, not copied.
///
/// The output is replaced, then synced. Throws like log_reader::next() and log_writer::write(),
/// and errc::invalid_argument if in and out are the same file.
convert_result convert_log(const std::filesystem::path& in, const std::filesystem::path& out, log_format to,
                           bool skip_bad = false);

}  // namespace idem
