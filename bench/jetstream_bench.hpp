#pragma once

// What jetstream_bench.cpp (the harness, the bare and textbook contenders) shares with
// jetstream_bench_idem.cpp (idem's contender, built only once the JetStream source is:
// bench/meson.build, jetstream_source_ready).

#include "workload.hpp"

#include <nats/nats.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace idem_bench::js {

/// Where a contender consumes from and keeps its store.
struct contender_context {
    std::string url;                    ///< the bench's own nats-server
    std::string stream;                 ///< holds the published workload
    std::string consumer;               ///< a durable of the contender's own, not yet created
    std::uint64_t stream_messages = 0;  ///< what the stream holds: the contender consumes all of it
    std::int64_t max_ack_pending = 0;
    int fetch_batch = 0;
    std::chrono::seconds ack_wait{30};
    std::chrono::microseconds idem_max_delay{0};  ///< idem's engine_options::max_delay (0: commit at once)
    std::filesystem::path dir;  ///< an empty directory for the contender's store
};

/// What one contender measured.
struct contender_result {
    std::string name;
    std::uint64_t messages = 0;  ///< deliveries consumed (and acked)
    double seconds = 0;          ///< first fetch to last ack flushed
    double ack_p50 = 0;          ///< seconds, fetch receipt to ack sent
    double ack_p99 = 0;
    std::string ack_note;           ///< how the ack latency was measured, if not per message here
    std::uint64_t store_bytes = 0;  ///< the store's files afterwards (0: stores nothing)
    std::uint64_t write_bytes = 0;  ///< /proc/self/io write_bytes over the run
    bool has_state = false;         ///< false: keeps no rows (bare)
    summary state{};                ///< the rows it ended with
    std::vector<std::pair<std::string, double>> phases{};  ///< where the time went: phase, seconds
    std::vector<std::string> notes{};                      ///< outcome counts and such, one line each
};

/// Runs idem (idem::jetstream::source over an engine with durability::full, the order-totals
/// projection) on the context's stream; defined in jetstream_bench_idem.cpp.
contender_result run_idem(const contender_context& c);

/// Returns the total size of the regular files under dir, LMDB's lock file excepted.
std::uint64_t store_size(const std::filesystem::path& dir);


}  // namespace idem_bench::js
