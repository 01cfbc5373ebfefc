// Fuzzes the event log readers: the input is written as a log file (binary when it starts
// with the binary header, JSON Lines otherwise) and read with skip_bad off and on, following
// and not. The readers may refuse a file (corrupt_log, format_mismatch) but never crash, hang
// or read out of bounds, every record they return is exactly the bytes the file holds there
// (for binary: magic, length and checksum right), and a torn tail is reported, never returned.

#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t record_magic = 0xFE52D1FFu;
constexpr std::size_t record_header = 12;

void require(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "event_log_fuzz: invariant broken: %s\n", what);
    std::abort();
}

std::uint32_t get_u32(const char* p) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    return static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
           static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24;
}

struct record {
    std::string body;
    std::uint64_t offset = 0;
    std::uint64_t end = 0;
    std::uint64_t line = 0;
    bool operator==(const record&) const = default;
};

struct result {
    std::vector<record> records;
    bool refused = false;  // the reader threw a corrupt_log / format_mismatch error
    std::optional<std::uint64_t> torn;
    std::uint64_t skipped = 0;
    idem::log_format format = idem::log_format::jsonl;
};

// Reads the whole file, checking every record against the bytes it was written from.
result read(const fs::path& path, std::string_view file, idem::log_reader_options options) {
    result out;
    try {
        idem::log_reader reader{path, options};
        out.format = reader.format();
        idem::log_record r;
        std::uint64_t previous_end = options.start;
        while (reader.next(r)) {
            require(r.offset >= previous_end && r.offset < r.end && r.end <= file.size(), "record outside the file");
            require(reader.position() == r.end, "position() is not the record's end");
            if (out.format == idem::log_format::binary) {
                // Header flag 1: the payload is the body's length, the body, then its attributes.
                const bool attributed = (static_cast<unsigned char>(file[12]) & 1) != 0;
                const std::size_t payload = (attributed ? 4 : 0) + r.body.size() + r.attributes.size();
                require(attributed || r.attributes.empty(), "attributes in a log without them");
                require(r.end - r.offset == record_header + payload, "binary record length");
                const char* p = file.data() + r.offset;
                require(get_u32(p) == record_magic, "binary record without its magic");
                require(get_u32(p + 4) == payload, "binary record length field");
                require(get_u32(p + 8) == idem::crc32c(std::string_view(p + record_header, payload),
                                                       idem::crc32c(std::string_view(p + 4, 4))),
                        "binary record with a wrong checksum");
                const char* body = p + record_header + (attributed ? 4 : 0);
                require(!attributed || get_u32(p + record_header) == r.body.size(), "binary record body length");
                require(std::string_view(body, r.body.size()) == r.body, "binary record body");
                require(std::string_view(body + r.body.size(), r.attributes.size()) == r.attributes,
                        "binary record attributes");
            } else {
                require(r.body.find('\n') == std::string_view::npos, "a JSON line holding a newline");
                require(file.substr(r.offset, r.body.size()) == r.body, "JSON line body");
                require(!r.body.empty(), "an empty JSON line returned");
            }
            out.records.push_back({std::string(r.body), r.offset, r.end, r.line});
            previous_end = r.end;
        }
        require(!reader.next(r), "next() after the end returned a record");
        out.torn = reader.torn_tail();
        out.skipped = reader.skipped();
        require(!options.follow || !out.torn, "a torn tail reported while following");
        require(!out.torn || (*out.torn >= reader.position() && *out.torn < file.size()),
                "torn tail outside the unread part of the file");
        require(out.torn.has_value() == !reader.torn_detail().empty(), "torn tail without a description");
        require(options.skip_bad || out.skipped == 0, "records skipped without skip_bad");
    } catch (const std::system_error& e) {
        require(e.code() == idem::errc::corrupt_log || e.code() == idem::errc::format_mismatch ||
                    e.code() == idem::errc::invalid_argument,
                "an unexpected error");
        require(std::strstr(e.what(), path.c_str()) != nullptr, "an error that does not name the file");
        out.refused = true;
    }
    return out;
}

bool is_prefix(const std::vector<record>& a, const std::vector<record>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

struct log_file {
    fs::path path;
    int fd = -1;
    log_file() {
        const char* shm = "/dev/shm";
        auto dir = fs::exists(shm) ? fs::path(shm) : fs::temp_directory_path();
        path = dir / ("idem-event-log-fuzz-" + std::to_string(::getpid()));
        fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        require(fd >= 0, "cannot create the log file");
    }
    ~log_file() {
        ::close(fd);
        ::unlink(path.c_str());
    }
    void write(std::string_view bytes) {
        require(::ftruncate(fd, 0) == 0, "ftruncate");
        require(::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()), "pwrite");
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static log_file file;
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    file.write(bytes);

    const auto strict = read(file.path, bytes, {});
    const auto lenient = read(file.path, bytes, {.skip_bad = true});
    const auto follow = read(file.path, bytes, {.follow = true});
    const auto follow_lenient = read(file.path, bytes, {.skip_bad = true, .follow = true});

    // Skipping changes nothing before the first bad record, and never refuses a readable header.
    require(is_prefix(strict.records, lenient.records), "skip_bad changed records before the damage");
    require(!strict.refused || strict.records.size() < lenient.records.size() || lenient.skipped > 0 ||
                lenient.refused || strict.format == idem::log_format::jsonl,
            "a strict refusal that skipping does not explain");
    require(!lenient.refused || strict.refused, "skip_bad refused what strict reading accepted");
    require(strict.refused || lenient.records == strict.records, "skip_bad changed an undamaged log");
    require(strict.refused || strict.torn == lenient.torn, "skip_bad changed the torn tail");

    // Following a file that does not grow returns the same records, less an unterminated last line.
    // A file shorter than a binary header that begins like one is a header still being written: a
    // follower waits for the rest (no records, no refusal) where a reader of a finished file refuses.
    constexpr std::string_view magic{"IDEMLOG\0", 8};
    const bool header_so_far = size < 16 && magic.starts_with(bytes.substr(0, std::min<std::size_t>(size, 8)));
    for (const auto* pair : {&strict, &lenient}) {
        const auto& f = pair == &strict ? follow : follow_lenient;
        if (header_so_far) {
            require(!f.refused && f.records.empty(), "a follower refused or read a header still being written");
            continue;
        }
        require(f.refused == pair->refused, "following changed whether the log is refused");
        require(is_prefix(f.records, pair->records) && pair->records.size() - f.records.size() <= 1,
                "following changed the records");
        if (f.records.size() < pair->records.size()) {
            require(pair->format == idem::log_format::jsonl && pair->records.back().end == bytes.size() &&
                        bytes.back() != '\n',
                    "following dropped a record that was complete");
        }
    }

    // A reader resumed at a record's end reads exactly the records after it.
    if (!strict.refused && !strict.records.empty()) {
        const auto& first = strict.records.front();
        const auto resumed = read(file.path, bytes, {.start = first.end, .start_line = first.line});
        require(!resumed.refused, "a resumed read refused the log");
        require(resumed.records.size() + 1 == strict.records.size() &&
                    std::equal(resumed.records.begin(), resumed.records.end(), strict.records.begin() + 1),
                "a resumed read returned other records");
        require(resumed.torn == strict.torn, "a resumed read found another torn tail");
    }
    return 0;
}
