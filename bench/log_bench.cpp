// log_bench: how fast event log files are read, JSON Lines beside binary.
//
// Writes N typical envelopes (~200 bytes: an order.filled with a small data object) to a
// JSONL and a binary log in a temporary directory, then reads each back three times with
// idem::log_reader and reports the median read throughput. The files are freshly written,
// so reads come from the page cache: this measures the reader, not the disk.
//
//   log_bench [--events N] [--dir DIR]

#include <idem/storage/event_log.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr, "log_bench: %s\nusage: log_bench [--events N] [--dir DIR]\n", why);
    std::exit(2);
}

std::string envelope(std::uint64_t i) {
    static const char* const accounts[] = {"acct-1", "acct-2", "acct-3", "acct-4"};
    static const char* const instruments[] = {"ES", "NQ", "CL", "GC", "ZN"};
    std::string account = accounts[i % 4];
    std::string instrument = instruments[i % 5];
    std::string n = std::to_string(i);
    return R"({"specversion":"1.0","id":"fill-)" + n + R"(","source":"/venue/x","type":"order.filled","subject":")" +
           account + "/" + instrument + R"(","time":"2026-12-02T10:00:00Z","data":{"account":")" + account +
           R"(","instrument":")" + instrument + R"(","side":")" + (i % 2 == 0 ? "buy" : "sell") +
           R"(","qty":)" + std::to_string(1 + i % 9) + R"(,"price":)" + std::to_string(501250 + i % 1000) +
           R"(,"exec_id":"x-)" + n + R"("}})";
}

double seconds_since(clock_type::time_point start) {
    return std::chrono::duration<double>(clock_type::now() - start).count();
}

struct result {
    double write_seconds = 0;
    double read_seconds = 0;  // median of 3
    std::uint64_t file_bytes = 0;
    std::uint64_t payload_bytes = 0;
};

result run(const fs::path& path, idem::log_format format, std::uint64_t events) {
    result r;
    auto start = clock_type::now();
    {
        idem::log_writer writer{path, format};
        for (std::uint64_t i = 0; i < events; ++i) writer.write(envelope(i));
        writer.flush();
    }
    r.write_seconds = seconds_since(start);
    r.file_bytes = fs::file_size(path);

    std::vector<double> times;
    for (int round = 0; round < 3; ++round) {
        start = clock_type::now();
        idem::log_reader reader{path};
        idem::log_record record;
        std::uint64_t count = 0;
        std::uint64_t bytes = 0;
        while (reader.next(record)) {
            ++count;
            bytes += record.body.size();
        }
        times.push_back(seconds_since(start));
        if (count != events || reader.torn_tail()) {
            std::fprintf(stderr, "log_bench: %s: read %llu of %llu records\n", path.c_str(),
                         static_cast<unsigned long long>(count), static_cast<unsigned long long>(events));
            std::exit(1);
        }
        r.payload_bytes = bytes;
    }
    std::sort(times.begin(), times.end());
    r.read_seconds = times[1];
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t events = 1'000'000;
    fs::path parent = fs::temp_directory_path();
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (i + 1 >= argc) usage("missing value");
        std::string_view value = argv[++i];
        if (arg == "--events") {
            auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), events);
            if (ec != std::errc{} || end != value.data() + value.size() || events == 0) usage("bad --events");
        } else if (arg == "--dir") {
            parent = value;
        } else {
            usage("unknown option");
        }
    }
    auto dir = parent / ("idem-log-bench-" + std::to_string(::getpid()));
    fs::create_directories(dir);

    auto jsonl = run(dir / "events.jsonl", idem::log_format::jsonl, events);
    auto binary = run(dir / "events.bin", idem::log_format::binary, events);
    fs::remove_all(dir);

    std::printf("log_bench: %llu envelopes, %.0f bytes each on average; reads from the page cache, median of 3\n\n",
                static_cast<unsigned long long>(events),
                static_cast<double>(jsonl.payload_bytes) / static_cast<double>(events));
    std::printf("%-8s %10s %14s %14s %12s\n", "format", "file MB", "write rec/s", "read rec/s", "read MB/s");
    for (auto [name, r] : {std::pair{"jsonl", jsonl}, std::pair{"binary", binary}}) {
        double mb = static_cast<double>(r.file_bytes) / 1e6;
        std::printf("%-8s %10.1f %14.0f %14.0f %12.0f\n", name, mb, static_cast<double>(events) / r.write_seconds,
                    static_cast<double>(events) / r.read_seconds, mb / r.read_seconds);
    }
    return 0;
}
