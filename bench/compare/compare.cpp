#include "compare.hpp"

#include <idem/storage/envelope.hpp>
#include <idem/storage/event_log.hpp>

#include <simdjson.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

std::string program_name = "compare";

}  // namespace

[[noreturn]] void idem_bench::usage(const char* why) {
    std::fprintf(stderr,
                 "%s: %s\n"
                 "usage: %s --variant NAME --log FILE [--jsonl FILE] --dir DIR [--limit K]\n"
                 "          [--contributors C] [--conninfo S] [--server-pid P]\n"
                 "       %s --list\n"
                 "Runs one variant of the side-by-side comparison and prints its result line (see tools/bench).\n",
                 program_name.c_str(), why, program_name.c_str(), program_name.c_str());
    std::exit(2);
}

namespace idem_compare {

namespace {

std::string state_fields(const idem_bench::summary& s) {
    return "rows=" + std::to_string(s.rows) + " sum_total=" + std::to_string(s.sum_total) +
           " sum_lines=" + std::to_string(s.sum_lines) + " digest=" + std::to_string(s.digest);
}

}  // namespace

int run_main(int argc, char** argv, std::string_view program, const std::vector<variant>& variants) {
    program_name = std::string(program);
    std::string name;
    run_options o;
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--list") {
            for (const auto& v : variants) std::printf("%s\n", v.name.c_str());
            return 0;
        }
        if (arg == "--help" || arg == "-h") idem_bench::usage("one variant of the side-by-side comparison");
        if (i + 1 >= argc) idem_bench::usage(("missing value for " + std::string(arg)).c_str());
        std::string_view value = argv[++i];
        if (arg == "--variant") {
            name = std::string(value);
        } else if (arg == "--log") {
            o.log = std::string(value);
        } else if (arg == "--jsonl") {
            o.jsonl = std::string(value);
        } else if (arg == "--dir") {
            o.dir = std::string(value);
        } else if (arg == "--limit") {
            o.limit = idem_bench::parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--contributors") {
            o.contributors = idem_bench::parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--conninfo") {
            o.conninfo = std::string(value);
        } else if (arg == "--server-pid") {
            o.server_pid = idem_bench::parse_number<int>(arg, value);
        } else {
            idem_bench::usage(("unknown option " + std::string(arg)).c_str());
        }
    }
    auto found = std::find_if(variants.begin(), variants.end(), [&](const variant& v) { return v.name == name; });
    if (found == variants.end()) idem_bench::usage(("no variant '" + name + "' (--list names them)").c_str());
    if (o.dir.empty()) idem_bench::usage("--dir is required");
    try {
        std::filesystem::create_directories(o.dir);
        run_result r = found->run(o);
        const auto rss = peak_rss_kb(static_cast<int>(::getpid())) + r.extra_rss_kb;
        // The whole process's CPU time (every thread, setup included): on a shared machine a
        // steadier measure of a CPU-bound variant's cost than its wall time.
        rusage usage{};
        ::getrusage(RUSAGE_SELF, &usage);
        const double cpu = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                           static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
        std::string line = "result variant=" + name + " limit=" + std::to_string(o.limit) +
                           " messages=" + std::to_string(r.messages) + " applied=" + std::to_string(r.applied) +
                           " duplicates=" + std::to_string(r.duplicates) + " seconds=" + idem_bench::fixed(r.seconds, 6) +
                           " write_bytes=" + std::to_string(r.write_bytes) + " wchar=" + std::to_string(r.wchar) +
                           " store_bytes=" + std::to_string(r.store_bytes) + " rss_kb=" + std::to_string(rss) +
                           " cpu_seconds=" + idem_bench::fixed(cpu, 3);
        if (r.has_state) line += " " + state_fields(r.state);
        for (const auto& [k, v] : r.figures) line += " " + k + "=" + v;
        std::printf("%s\n", line.c_str());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s %s: %s\n", program_name.c_str(), name.c_str(), e.what());
        return 1;
    }
}

// --- message_reader ------------------------------------------------------------------

struct message_reader::impl {
    impl(const std::filesystem::path& log, std::uint64_t max) : reader(log), limit(max) {}

    idem::log_reader reader;
    std::uint64_t limit;
    std::uint64_t read = 0;
    idem::log_record record;
    idem::envelope_parser parser;
    idem::envelope ev;
    idem::parse_error err;
    simdjson::ondemand::parser json;
    std::string padded;
};

message_reader::message_reader(const std::filesystem::path& log, std::uint64_t limit)
    : impl_(std::make_unique<impl>(log, limit)) {}

message_reader::~message_reader() = default;

bool message_reader::next(message& out) {
    auto& m = *impl_;
    if (m.limit != 0 && m.read == m.limit) return false;
    if (!m.reader.next(m.record)) return false;
    ++m.read;
    if (!m.parser.parse(m.record.body, m.ev, m.err)) {
        throw std::runtime_error("record " + std::to_string(m.record.line) + ": " + m.err.detail);
    }
    m.padded.reserve(m.ev.data.size() + simdjson::SIMDJSON_PADDING);
    m.padded.assign(m.ev.data);
    simdjson::padded_string_view view{m.padded.data(), m.padded.size(), m.padded.capacity()};
    simdjson::ondemand::document doc;
    std::string_view order_id;
    std::int64_t amount = 0;
    if (m.json.iterate(view).get(doc) != simdjson::SUCCESS ||
        doc["order_id"].get_string().get(order_id) != simdjson::SUCCESS ||
        doc["amount"].get_int64().get(amount) != simdjson::SUCCESS) {
        throw std::runtime_error("record " + std::to_string(m.record.line) + ": undecodable data");
    }
    out.message_id = m.ev.msgid;
    out.order_id = order_id;
    out.amount = amount;
    return true;
}

// --- /proc -------------------------------------------------------------------------

idem_bench::io_counters read_io_of(int pid) {
    std::ifstream in{"/proc/" + std::to_string(pid) + "/io"};
    idem_bench::io_counters c;
    std::string key;
    std::uint64_t value = 0;
    while (in >> key >> value) {
        if (key == "write_bytes:") c.write_bytes = value;
        if (key == "wchar:") c.wchar = value;
    }
    return c;
}

std::uint64_t peak_rss_kb(int pid) {
    std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
    std::string line;
    while (std::getline(in, line)) {
        if (line.starts_with("VmHWM:")) return std::strtoull(line.c_str() + 6, nullptr, 10);
    }
    return 0;
}

std::int64_t unix_ns() {
    return static_cast<std::int64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
}

}  // namespace idem_compare
