#pragma once

// What the programs of the side-by-side comparison share (tools/bench runs them).
//
// compare_gen writes the workload once as an event log (binary, and JSON Lines for the
// rebuild): N order.line_added envelopes over A orders, each with a UUID-like transport
// message id in `msgid`, a share of them redeliveries of an earlier message. Every other
// program runs one variant over that log in its own process, streaming it (so its peak
// RSS is its own), and prints one `result` line: throughput, the /proc/self/io deltas,
// store size, peak RSS, and the summary of the state it ended with (idem_bench::summarize
// of workload.hpp: row count, sums and a digest of "key=total,lines;" in key order), which
// tools/bench checks against the generator's reference.

#include "../workload.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem_compare {

/// Where a variant reads its workload and keeps its store.
struct run_options {
    std::filesystem::path log{};    ///< the workload, binary log
    std::filesystem::path jsonl{};  ///< the same, JSON Lines
    std::filesystem::path dir{};    ///< an empty directory for the variant's store
    std::uint64_t limit = 0;        ///< read only the first `limit` records (0: all)
    std::uint64_t contributors = 1'000'000;  ///< hot-row figure: contributors of the hot row
    std::string conninfo{};                  ///< PostgreSQL: libpq connection string
    int server_pid = 0;                      ///< PostgreSQL: the postmaster (its processes' writes count)
};

/// What one run of a variant measured.
struct run_result {
    std::uint64_t messages = 0;  ///< deliveries processed
    std::uint64_t applied = 0;
    std::uint64_t duplicates = 0;
    double seconds = 0;              ///< the timed loop
    std::uint64_t write_bytes = 0;   ///< /proc/<pid>/io write_bytes delta
    std::uint64_t wchar = 0;         ///< /proc/<pid>/io wchar delta
    std::uint64_t store_bytes = 0;   ///< the store's files afterwards (0: nothing persisted)
    std::uint64_t extra_rss_kb = 0;  ///< peak RSS of a server process serving this run
    bool has_state = true;           ///< false for figures that do not run the workload
    idem_bench::summary state{};
    std::vector<std::pair<std::string, std::string>> figures{};  ///< further name=value figures
};

/// One variant of a program.
struct variant {
    std::string name;
    std::function<run_result(const run_options&)> run;
};

/// Runs the variant named on the command line and prints its result line; returns the exit status.
int run_main(int argc, char** argv, std::string_view program, const std::vector<variant>& variants);

/// One message as a textbook consumer sees it: transport id and payload fields.
struct message {
    std::string_view message_id;  ///< the transport message id (views valid until the next read)
    std::string_view order_id;
    std::int64_t amount = 0;
};

/// Reads the workload log and decodes each record the way every peer does (idem's envelope
/// parser, the payload with simdjson), so the peers differ only in their stores.
class message_reader {
public:
    /// Opens the log; stops after limit records (0: none).
    message_reader(const std::filesystem::path& log, std::uint64_t limit);
    ~message_reader();
    message_reader(const message_reader&) = delete;
    message_reader& operator=(const message_reader&) = delete;

    /// Reads and decodes the next message; false at the end. Throws on a record it cannot decode.
    bool next(message& out);

    struct impl;

private:
    std::unique_ptr<impl> impl_;
};

/// Returns the current value of /proc/<pid>/io of a process as (write_bytes, wchar).
idem_bench::io_counters read_io_of(int pid);
/// Returns the peak resident set (VmHWM) of a process in KiB (0 if it is gone).
std::uint64_t peak_rss_kb(int pid);

/// Returns the Unix time in nanoseconds (the processed-at column of the textbook schemas).
std::int64_t unix_ns();

}  // namespace idem_compare
