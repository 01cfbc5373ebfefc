// Backpressure: with max_in_flight 8, 10,000 submissions made at once are held back outside
// the writer's queue; the engine never has more than 8 accepted and uncompleted, no batch
// holds more than 8, and all 10,000 complete. The first commit is held inside its
// transaction until every submission was made, so the held-back state is observed exactly.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace asio = boost::asio;
using namespace idem_test;

namespace {

// The largest values of the engine's gauges seen in samples, from any thread.
struct gauges {
    std::atomic<std::size_t> in_flight{0};
    std::atomic<std::size_t> queue_depth{0};
    std::atomic<std::size_t> waiting{0};
    std::atomic<std::size_t> samples{0};

    void sample(const idem::engine& e) {
        const auto s = e.stats();
        raise(in_flight, s.in_flight);
        raise(queue_depth, s.queue_depth);
        raise(waiting, s.waiting);
        ++samples;
    }
    static void raise(std::atomic<std::size_t>& max, std::size_t v) {
        auto seen = max.load();
        while (v > seen && !max.compare_exchange_weak(seen, v)) {
        }
    }
};

}  // namespace

TEST_SUITE("engine backpressure") {

TEST_CASE("with at most 8 in flight, 10,000 submissions all complete and the engine holds no more than 8") {
    constexpr std::size_t limit = 8;
    constexpr std::size_t submissions = 10'000;
    temp_dir dir;
    const auto w = make_workload(submissions, 32, 11, false);
    REQUIRE(w.deliveries.size() == submissions);
    completion_log log{submissions};
    gauges seen;
    commit_gate gate;
    asio::io_context io;
    io_threads runner{io, 2};
    auto o = engine_options(dir.env());
    o.max_in_flight = limit;
    gate.install(o);
    gate.hold(1);
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    std::vector<std::thread> threads;
    for (std::size_t s = 0; s < 2; ++s) {
        threads.emplace_back([&, s] {
            for (std::size_t i = s; i < submissions; i += 2) {
                e.async_apply(w.deliveries[i], [&, i](std::error_code ec, idem::outcome out) {
                    log.record(i, ec, std::move(out));
                    if (i % 8 == 0) seen.sample(e);  // stats() sorts its sample windows: not on every completion
                });
                if (i % 500 < 2) seen.sample(e);
            }
        });
    }
    for (auto& t : threads) t.join();

    // Every submission has been made while the first commit is still inside its transaction:
    // exactly `limit` are accepted, the rest wait outside the writer's queue.
    REQUIRE(gate.wait_held());
    const auto held = e.stats();
    CHECK(held.in_flight == limit);
    CHECK(held.queue_depth <= limit);
    CHECK(held.waiting == submissions - limit);
    CHECK(log.completed() == 0);
    gate.open();

    REQUIRE_MESSAGE(log.wait_all(), log.completed() << " of " << submissions << " completed");
    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    const auto outcomes = exactly_one_applied(w, log);
    CHECK_MESSAGE(outcomes.empty(), outcomes);
    CHECK(seen.samples.load() > submissions / 8);
    CHECK(seen.in_flight.load() <= limit);
    CHECK(seen.queue_depth.load() <= limit);
    CHECK(seen.waiting.load() <= submissions - limit);

    // Independently of the gauges: no commit recorded more than `limit` deliveries.
    std::map<std::uint64_t, std::size_t> per_commit;
    for (std::size_t i = 0; i < submissions; ++i) ++per_commit[log.outcome(i).commit];
    std::size_t largest = 0;
    for (const auto& [commit, n] : per_commit) largest = std::max(largest, n);
    CHECK(largest <= limit);
    CHECK(per_commit.size() >= submissions / limit);

    const auto stats = e.stats();
    CHECK(stats.batch_size.max <= static_cast<double>(limit));
    CHECK(stats.in_flight == 0);
    CHECK(stats.waiting == 0);
    CHECK(stats.queue_depth == 0);
    CHECK(stats.failed == 0);
    auto snap = e.read();
    CHECK(dump(snap, "order-totals") == w.expected().rows);
    CHECK(snap.consumer(consumer).inbox_size() == submissions);
}

}  // TEST_SUITE
