// The engine's writer prunes on its own schedule, between batches, without blocking
// submissions, and never drops an effect that a redelivery after the prune could double.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <atomic>
#include <chrono>
#include <thread>

namespace asio = boost::asio;
using namespace idem_test;
using namespace std::chrono_literals;

TEST_CASE("the writer prunes expired ids between batches; a redelivery after the prune is still a duplicate") {
    temp_dir dir;
    asio::io_context io;
    io_threads threads{io, 1};
    std::atomic<std::uint64_t> now{1'800'000'000'000'000'000ull};
    auto o = engine_options(dir.path());
    o.store.retention.inbox_retention = 10min;
    o.store.retention.now = [&] { return now.load(); };
    o.prune_interval = 5ms;
    o.prune_step = idem::prune_limits{7, std::chrono::milliseconds(50), {}};
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    auto apply = [&](const idem::envelope& ev) {
        auto f = e.async_apply(deliver(ev), asio::use_future);
        REQUIRE(f.wait_for(patience) == std::future_status::ready);
        auto [ec, outcome] = f.get();
        REQUIRE_FALSE(ec);
        return outcome;
    };
    for (int i = 0; i < 40; ++i) REQUIRE(apply(line("p" + std::to_string(i), "o1", 1)).kind == idem::outcome_kind::applied);
    now += (11 * 60) * 1'000'000'000ull;  // every id is now 11 minutes old
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (e.stats().pruned_ids < 39 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    auto stats = e.stats();
    CHECK(stats.pruned_ids == 39);  // all but the last entry, in steps of at most 7
    CHECK(stats.prune_seconds.count >= 6);
    CHECK(e.read().consumer(consumer).inbox_size() == 1);
    // Read before the next batch: that batch prunes the entry kept so far, now no longer the last.
    CHECK(e.prometheus().find("idem_pruned_total{consumer=\"projector\",table=\"inbox\"} 39") != std::string::npos);
    // Redelivered after its id expired: judged by the contributing set.
    CHECK(apply(line("p3", "o1", 1)).kind == idem::outcome_kind::duplicate_event);
    CHECK(e.read().get<order_total>("order-totals", "o1")->state.total == 40);
    auto stop = e.async_stop(asio::use_future);
    REQUIRE(stop.wait_for(patience) == std::future_status::ready);
}

TEST_CASE("an engine without retention never prunes, and one with a too-short retention does not start") {
    temp_dir dir;
    asio::io_context io;
    auto o = engine_options(dir.path());
    o.store.retention.inbox_retention = 1min;
    o.store.retention.source = idem::redelivery_bound{5min, "AckWait 1m x MaxDeliver 5"};
    CHECK_THROWS_WITH_AS(idem::engine(io.get_executor(), o),
                         doctest::Contains("shorter than the source's redelivery bound of 5m"), std::system_error);
}
