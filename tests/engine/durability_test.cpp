// A completion is an acknowledgement: it may run only after the commit that recorded its
// delivery has returned and, as the durability mode defines it, is durable. The store's
// before_commit hook records every commit (and lingers in it, to widen the window an early
// completion would fall into); each handler checks that its commit's hook has returned, that
// a new snapshot sees the commit, and that the engine counts it as durable.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace asio = boost::asio;
using namespace idem_test;
using namespace std::chrono_literals;

namespace {

// What must hold whenever a delivery completes successfully.
void check_durable(const idem::engine& e, const commit_gate& gate, completion_log& log, std::size_t i,
                   const std::error_code& ec, const idem::outcome& o) {
    if (ec) return;
    const auto what = "#" + std::to_string(i) + " (commit " + std::to_string(o.commit) + ") completed ";
    if (!gate.returned(o.commit)) log.violation(what + "before before_commit returned");
    const auto stats = e.stats();
    if (stats.durable_commit < o.commit) {
        log.violation(what + "while the durable commit was " + std::to_string(stats.durable_commit));
    }
    if (stats.last_commit < o.commit) {
        log.violation(what + "while the last commit was " + std::to_string(stats.last_commit));
    }
    if (const auto seen = e.read().commit(); seen < o.commit) {
        log.violation(what + "while a new snapshot saw commit " + std::to_string(seen));
    }
}

asio::awaitable<void> await_each(idem::engine& e, const workload& w, std::vector<std::size_t> slice,
                                 const commit_gate& gate, completion_log& log) {
    for (auto i : slice) {
        idem::delivery d = w.deliveries[i];
        auto r = co_await e.async_apply(std::move(d), asio::use_awaitable);
        check_durable(e, gate, log, i, std::get<0>(r), std::get<1>(r));
        log.record(i, std::get<0>(r), std::move(std::get<1>(r)));
    }
}

}  // namespace

TEST_SUITE("engine durability") {

TEST_CASE("no completion runs before the commit that recorded it is durable") {
    auto sync = idem::durability::full;
    SUBCASE("full: each commit is synced before it returns") { sync = idem::durability::full; }
    SUBCASE("periodic: at most one commit, each synced, per interval") { sync = idem::durability::periodic; }
    SUBCASE("none: completions wait for the commit") { sync = idem::durability::none; }
    CAPTURE(static_cast<int>(sync));

    temp_dir dir;
    const auto w = make_workload(600, 12, 7, true);
    completion_log log{w.deliveries.size()};
    commit_gate gate;
    gate.linger(200us);
    asio::io_context io;
    io_threads runner{io, 2};
    auto o = engine_options(dir.env(), sync);
    o.max_delay = 100us;
    o.sync_interval = 3ms;
    gate.install(o);
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    // Three threads with callbacks and one coroutine, each over a quarter of the deliveries.
    std::vector<std::vector<std::size_t>> slices(4);
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) slices[i % slices.size()].push_back(i);
    std::vector<std::thread> threads;
    for (std::size_t s = 0; s < 3; ++s) {
        threads.emplace_back([&, s] {
            for (auto i : slices[s]) {
                e.async_apply(w.deliveries[i], [&, i](std::error_code ec, idem::outcome out) {
                    check_durable(e, gate, log, i, ec, out);
                    log.record(i, ec, std::move(out));
                });
            }
        });
    }
    asio::co_spawn(io, await_each(e, w, slices[3], gate, log), [&log](std::exception_ptr ex) {
        if (ex) log.violation("the submitting coroutine threw");
    });
    for (auto& t : threads) t.join();
    REQUIRE_MESSAGE(log.wait_all(), log.completed() << " of " << log.size() << " completed");

    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    CHECK_MESSAGE(log.violations().empty(), log.violations());
    const auto outcomes = exactly_one_applied(w, log);
    CHECK_MESSAGE(outcomes.empty(), outcomes);
    CHECK(dump(e.read(), "order-totals") == w.expected().rows);

    // Commits are numbered 1, 2, 3, ... in the order they are made, and every outcome names one.
    const auto calls = gate.calls();
    REQUIRE_FALSE(calls.empty());
    bool consecutive = true;
    for (std::size_t i = 0; i < calls.size(); ++i) consecutive = consecutive && calls[i] == i + 1;
    CHECK(consecutive);
    std::set<std::uint64_t> named;
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) named.insert(log.outcome(i).commit);
    CHECK(*named.begin() >= 1);
    CHECK(*named.rbegin() <= calls.size());

    const auto stats = e.stats();
    CHECK(stats.last_commit == calls.size());
    CHECK(stats.durable_commit == stats.last_commit);
    CHECK(stats.batches == calls.size());
    CHECK(stats.syncs == (sync == idem::durability::none ? 0 : stats.batches));
}

TEST_CASE("a flush completes after everything submitted before it is durable") {
    idem::durability sync = idem::durability::periodic;
    SUBCASE("periodic") { sync = idem::durability::periodic; }
    SUBCASE("full") { sync = idem::durability::full; }
    SUBCASE("none") { sync = idem::durability::none; }
    CAPTURE(static_cast<int>(sync));

    temp_dir dir;
    const auto w = make_workload(300, 8, 13, true);
    completion_log log{w.deliveries.size()};
    asio::io_context io;
    auto strand = asio::make_strand(io);
    std::size_t on_strand = 0;  // touched only on the strand
    std::uint64_t highest = 0;  // the highest commit a completion named; on the strand
    std::promise<std::tuple<std::error_code, std::size_t, std::uint64_t, idem::engine_stats>> flushed;
    io_threads runner{io, 2};
    auto o = engine_options(dir.env(), sync);
    o.sync_interval = 20ms;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    std::vector<std::thread> threads;
    for (std::size_t s = 0; s < 2; ++s) {
        threads.emplace_back([&, s] {
            for (std::size_t i = s; i < w.deliveries.size(); i += 2) {
                e.async_apply(w.deliveries[i], asio::bind_executor(strand, [&, i](std::error_code ec, idem::outcome out) {
                                  ++on_strand;
                                  highest = std::max(highest, out.commit);
                                  log.record(i, ec, std::move(out));
                              }));
            }
        });
    }
    for (auto& t : threads) t.join();
    // Bound to the same strand, the flush's completion runs after every completion posted before it.
    e.async_flush(asio::bind_executor(strand, [&](std::error_code ec) {
        flushed.set_value({ec, on_strand, highest, e.stats()});
    }));
    auto flush = flushed.get_future();
    REQUIRE(ready_in_time(flush));
    const auto [ec, completed, commit, stats] = flush.get();
    CHECK_FALSE(ec);
    CHECK(completed == w.deliveries.size());
    CHECK(stats.durable_commit >= commit);
    CHECK(stats.durable_commit == stats.last_commit);
    CHECK(stats.in_flight == 0);
    REQUIRE(log.wait_all());
    const auto outcomes = exactly_one_applied(w, log);
    CHECK_MESSAGE(outcomes.empty(), outcomes);
    CHECK(dump(e.read(), "order-totals") == w.expected().rows);
}

}  // TEST_SUITE
