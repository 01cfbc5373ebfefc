// The watchdog (engine::health()): a writer held inside one commit, deliveries queued behind
// it, a source that fails or has input it does not deliver, and a gap that stays parked are
// each declared stalled past the threshold with their reason; an engine with nothing to do is
// idle however long it waits; the metrics say the same.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <chrono>
#include <string>
#include <thread>

namespace asio = boost::asio;
using namespace idem_test;
using namespace std::chrono_literals;

namespace {

constexpr auto threshold = 300ms;

// Polls health() until pred holds (at most `patience`); returns the last report.
template <class Pred>
idem::health_report wait_health(const idem::engine& e, Pred pred) {
    const auto until = std::chrono::steady_clock::now() + patience;
    auto r = e.health();
    while (!pred(r) && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(20ms);
        r = e.health();
    }
    return r;
}

bool is(const idem::health_report& r, idem::health_state s) { return r.state == s; }

}  // namespace

TEST_CASE("an engine with nothing to do stays idle past the threshold, with no lag") {
    temp_dir dir;
    asio::io_context io;
    io_threads runner{io, 1};
    auto o = engine_options(dir.env());
    o.stall_after = threshold;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());
    auto [ec, out] = e.async_apply(deliver(line("a", "order-1", 5), "m-a"), asio::use_future).get();
    REQUIRE(!ec);
    e.monitor().source("log", 0, "bytes");
    std::this_thread::sleep_for(3 * threshold);
    const auto r = e.health();
    CHECK(r.state == idem::health_state::idle);
    CHECK(r.reason.empty());
    CHECK(r.lag_seconds == 0);
    CHECK(r.last_commit == out.commit);
    CHECK(r.seconds_since_commit >= 0.3);
    CHECK(e.prometheus().find("idem_stalled{consumer=\"projector\"} 0") != std::string::npos);
}

TEST_CASE("a writer held inside one commit is stalled past the threshold, and recovers when it commits") {
    temp_dir dir;
    commit_gate gate;
    asio::io_context io;
    io_threads runner{io, 2};
    auto o = engine_options(dir.env());
    o.stall_after = threshold;
    gate.install(o);
    gate.hold(1);
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());
    auto first = e.async_apply(deliver(line("a", "order-1", 5), "m-a"), asio::use_future);
    REQUIRE(gate.wait_held());
    auto second = e.async_apply(deliver(line("b", "order-1", 7), "m-b"), asio::use_future);
    CHECK(!is(e.health(), idem::health_state::idle));
    const auto r = wait_health(e, [](const auto& h) { return is(h, idem::health_state::stalled); });
    REQUIRE(r.state == idem::health_state::stalled);
    CHECK(r.reason.find("the writer has been applying one batch of 1 deliveries") != std::string::npos);
    CHECK(r.queued == 2);
    CHECK(r.oldest_queued_seconds >= 0.3);
    const auto metrics = e.prometheus();
    CHECK(metrics.find("idem_stalled{consumer=\"projector\"} 1") != std::string::npos);
    CHECK(metrics.find("idem_oldest_queued_seconds{consumer=\"projector\"}") != std::string::npos);
    gate.open();
    CHECK(!std::get<0>(first.get()));
    CHECK(!std::get<0>(second.get()));
    const auto after = wait_health(e, [](const auto& h) { return is(h, idem::health_state::idle); });
    CHECK(after.state == idem::health_state::idle);
    CHECK(after.last_commit >= 2);
    // The histograms count every batch and every delivery.
    const auto s = e.stats();
    CHECK(s.commit_histogram.count == s.batches);
    CHECK(s.ack_histogram.count == 2);
    CHECK(e.prometheus().find("idem_ack_duration_seconds_bucket{consumer=\"projector\",le=\"+Inf\"} 2") !=
          std::string::npos);
}

TEST_CASE("a failing source, and input a source does not deliver, are stalled past the threshold; not before") {
    temp_dir dir;
    asio::io_context io;
    io_threads runner{io, 1};
    auto o = engine_options(dir.env());
    o.stall_after = threshold;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    SUBCASE("failing") {
        e.monitor().source("jetstream s/c", 0, "events", "disconnected from 'nats://127.0.0.1:4222'");
        CHECK(!is(e.health(), idem::health_state::stalled));
        const auto r = wait_health(e, [](const auto& h) { return is(h, idem::health_state::stalled); });
        REQUIRE(r.state == idem::health_state::stalled);
        CHECK(r.reason.find("source jetstream s/c has failed for") != std::string::npos);
        CHECK(r.reason.find("disconnected from") != std::string::npos);
        CHECK(r.failing_sources == 1);
        e.monitor().source("jetstream s/c", 0, "events");  // reachable again
        CHECK(is(e.health(), idem::health_state::idle));
    }
    SUBCASE("input waiting, nothing applied") {
        e.monitor().source("fills.jsonl", 4096, "bytes");
        auto r = e.health();
        CHECK(r.state == idem::health_state::running);
        CHECK(r.lag_bytes == 4096);
        r = wait_health(e, [](const auto& h) { return is(h, idem::health_state::stalled); });
        REQUIRE(r.state == idem::health_state::stalled);
        CHECK(r.reason.find("source fills.jsonl has 4096 bytes waiting, and nothing was applied for") != std::string::npos);
        // Progress (less waiting) restarts the clock.
        e.monitor().source("fills.jsonl", 1024, "bytes");
        CHECK(is(e.health(), idem::health_state::running));
    }
    SUBCASE("paused, by a source that takes the pause at its batch boundary") {
        e.monitor().pauses_at_boundaries();
        e.monitor().paused("upgrade");
        CHECK(!is(e.health(), idem::health_state::paused));  // a fetch in flight may still deliver
        e.monitor().pause_taken();
        CHECK(is(e.health(), idem::health_state::paused));
        e.monitor().paused(std::nullopt);
        e.monitor().paused("again");  // a new pause is taken anew
        CHECK(!is(e.health(), idem::health_state::paused));
    }
    SUBCASE("paused") {
        e.monitor().paused("disk swap");
        const auto r = e.health();
        CHECK(r.state == idem::health_state::paused);
        CHECK(r.reason == "paused by an operator: disk swap");
        CHECK(e.prometheus().find("idem_paused{consumer=\"projector\"} 1") != std::string::npos);
    }
}

TEST_CASE("a gap parked past the threshold is stalled, naming the stream and the sequence it waits for") {
    temp_dir dir;
    asio::io_context io;
    io_threads runner{io, 1};
    auto o = engine_options(dir.env());
    o.stall_after = threshold;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_subject());
    for (std::uint64_t seq : {1u, 2u, 4u}) {
        auto [ec, out] = e.async_apply(deliver(line("e" + std::to_string(seq), "order-9", 1, seq)), asio::use_future).get();
        REQUIRE(!ec);
    }
    auto r = e.health();
    CHECK(r.parked_streams == 1);
    CHECK(r.oldest_gap_stream == "order-9");
    r = wait_health(e, [](const auto& h) { return is(h, idem::health_state::stalled); });
    REQUIRE(r.state == idem::health_state::stalled);
    CHECK(r.reason.find("stream order-9 has had events parked behind a gap for") != std::string::npos);
    CHECK(r.reason.find("waiting for sequence 3") != std::string::npos);
    // The gap fills: not stalled any more.
    auto [ec, out] = e.async_apply(deliver(line("e3", "order-9", 1, 3)), asio::use_future).get();
    REQUIRE(!ec);
    r = e.health();
    CHECK(r.parked_streams == 0);
    CHECK(r.state == idem::health_state::idle);
}
