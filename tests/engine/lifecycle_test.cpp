// Stopping and destroying an engine with work in flight. A stop completes everything
// submitted before it and cancels everything after it (operation_canceled); a submission
// racing the stop gets one or the other, and exactly the successful ones are stored.
// Destroying an engine without stopping it completes the work in flight (the handlers run
// when their io_context does, and never if it is destroyed unrun); either way the
// environment holds every accepted delivery exactly once.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <chrono>
#include <cstddef>
#include <future>
#include <optional>
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

const std::error_code canceled = std::make_error_code(std::errc::operation_canceled);

// Which distinct events of w a successful completion stored.
std::vector<bool> stored_events(const workload& w, const completion_log& log) {
    std::vector<bool> stored(w.order_of.size());
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) {
        if (!log.error(i)) stored[w.event_of[i]] = true;
    }
    return stored;
}

}  // namespace

TEST_SUITE("engine lifecycle") {

TEST_CASE("stop completes everything submitted before it and cancels everything after it") {
    std::size_t limit = 65536;
    SUBCASE("nothing held back") { limit = 65536; }
    SUBCASE("submissions held back by an in-flight limit of 4") { limit = 4; }
    CAPTURE(limit);

    constexpr std::size_t before = 300;  // [0, 300): submitted before the stop
    constexpr std::size_t racing = 300;  // [300, 600): submitted while the stop is requested
    constexpr std::size_t after = 300;   // [600, 900): submitted after the stop was requested
    temp_dir dir;
    const auto w = make_workload(before + racing + after, 16, 5, false);
    completion_log log{w.deliveries.size()};
    asio::io_context io;
    io_threads runner{io, 2};
    auto o = engine_options(dir.env());
    o.max_in_flight = limit;
    o.max_delay = 100us;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    // Handlers run on the io threads, never on a submitting thread: that would be inside async_apply.
    auto submit = [&](std::size_t from, std::size_t to) {
        const auto submitter = std::this_thread::get_id();
        for (std::size_t i = from; i < to; ++i) {
            e.async_apply(w.deliveries[i], [&log, i, submitter](std::error_code ec, idem::outcome out) {
                if (std::this_thread::get_id() == submitter) {
                    log.violation("#" + std::to_string(i) + " completed inside async_apply");
                }
                log.record(i, ec, std::move(out));
            });
        }
    };
    {
        std::thread a{submit, 0, before / 2};
        std::thread b{submit, before / 2, before};
        a.join();
        b.join();
    }
    std::future<std::error_code> stopped;
    {
        std::promise<void> started;
        std::thread a{[&] {
            submit(before, before + 20);
            started.set_value();
            submit(before + 20, before + racing / 2);
        }};
        std::thread b{submit, before + racing / 2, before + racing};
        started.get_future().wait();
        stopped = e.async_stop(asio::use_future);
        a.join();
        b.join();
    }
    // After the stop was requested: callbacks and futures alike are canceled, and so are a
    // flush and a second stop.
    std::vector<std::pair<std::size_t, std::future<std::tuple<std::error_code, idem::outcome>>>> futures;
    for (std::size_t i = before + racing; i < w.deliveries.size(); ++i) {
        if (i % 2 == 0) {
            submit(i, i + 1);
        } else {
            futures.emplace_back(i, e.async_apply(w.deliveries[i], asio::use_future));
        }
    }
    auto flush_after = e.async_flush(asio::use_future);
    auto stop_again = e.async_stop(asio::use_future);
    std::promise<std::error_code> flushed_inline;  // set only if the flush completed inside async_flush
    std::promise<std::error_code> flushed;
    {
        const auto submitter = std::this_thread::get_id();
        e.async_flush([&, submitter](std::error_code ec) {
            (std::this_thread::get_id() == submitter ? flushed_inline : flushed).set_value(ec);
        });
    }
    auto flush_callback = flushed.get_future();

    REQUIRE(ready_in_time(stopped));
    CHECK(stopped.get() == std::error_code{});
    REQUIRE(ready_in_time(flush_after));
    CHECK(flush_after.get() == canceled);
    REQUIRE(ready_in_time(stop_again));
    CHECK(stop_again.get() == canceled);
    REQUIRE(ready_in_time(flush_callback));
    CHECK(flush_callback.get() == canceled);
    for (auto& [i, f] : futures) {
        REQUIRE(ready_in_time(f));
        auto [ec, out] = f.get();
        log.record(i, ec, std::move(out));
    }
    REQUIRE_MESSAGE(log.wait_all(), log.completed() << " of " << log.size() << " completed");
    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    CHECK_MESSAGE(log.violations().empty(), log.violations());

    std::size_t before_ok = 0, racing_ok = 0, racing_canceled = 0, after_canceled = 0, other = 0;
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) {
        const auto ec = log.error(i);
        const bool applied = !ec && log.outcome(i).kind == idem::outcome_kind::applied;
        if (!applied && ec != canceled) {
            ++other;
        } else if (i < before) {
            if (applied) ++before_ok;
        } else if (i < before + racing) {
            if (applied) ++racing_ok;
            if (ec == canceled) ++racing_canceled;
        } else if (ec == canceled) {
            ++after_canceled;
        }
    }
    CHECK(before_ok == before);
    CHECK(racing_ok + racing_canceled == racing);
    CHECK(after_canceled == after);
    CHECK(other == 0);
    MESSAGE(racing_ok << " of the " << racing << " racing submissions were accepted before the stop");

    // Exactly the successful deliveries are stored; the engine still reads after the stop.
    const auto stored = stored_events(w, log);
    const auto stats = e.stats();
    auto snap = e.read();
    CHECK(dump(snap, "order-totals") == w.expected([&](std::size_t ev) { return stored[ev]; }).rows);
    CHECK(snap.consumer(consumer).inbox_size() == before_ok + racing_ok);
    CHECK(snap.commit() == stats.last_commit);
    CHECK(stats.in_flight == 0);
    CHECK(stats.waiting == 0);
    CHECK(stats.failed == 0);
}

TEST_CASE("destroying an engine without stopping it completes the work in flight") {
    enum class io_state { running, started_later, never_run };
    auto state = io_state::running;
    std::size_t limit = 65536;
    SUBCASE("while its io_context runs") { state = io_state::running; }
    SUBCASE("with submissions held back by an in-flight limit of 4") { limit = 4; }
    SUBCASE("before its io_context runs") { state = io_state::started_later; }
    SUBCASE("whose io_context is then destroyed unrun: no handler runs") { state = io_state::never_run; }
    CAPTURE(static_cast<int>(state));
    CAPTURE(limit);

    temp_dir dir;
    const auto w = make_workload(600, 12, 9, true);
    completion_log log{w.deliveries.size()};
    commit_gate gate;
    {
        asio::io_context io;
        std::optional<io_threads> runner;
        if (state == io_state::running) runner.emplace(io, 2);
        // The first commit stays inside its transaction until the destructor is about to run,
        // so all of the work is in flight when it does.
        std::promise<void> destroying;
        std::thread opener{[&] {
            destroying.get_future().wait();
            gate.open();
        }};
        {
            auto o = engine_options(dir.env());
            o.max_in_flight = limit;
            gate.install(o);
            gate.hold(1);
            idem::engine e{io.get_executor(), o};
            e.add(totals_by_order());
            std::vector<std::thread> threads;
            for (std::size_t s = 0; s < 2; ++s) {
                threads.emplace_back([&, s] {
                    for (std::size_t i = s; i < w.deliveries.size(); i += 2) {
                        e.async_apply(w.deliveries[i], [&log, i](std::error_code ec, idem::outcome out) {
                            log.record(i, ec, std::move(out));
                        });
                    }
                });
            }
            for (auto& t : threads) t.join();
            const bool held = gate.wait_held();
            CHECK(held);
            CHECK(log.completed() == 0);
            destroying.set_value();
        }  // destroyed with every submission in flight
        opener.join();
        if (state == io_state::started_later) runner.emplace(io, 2);
        if (state == io_state::never_run) {
            CHECK(log.completed() == 0);
        } else {
            REQUIRE_MESSAGE(log.wait_all(), log.completed() << " of " << log.size() << " completed");
            runner->join();
        }
    }  // the io_context goes, with the unrun handlers in the never_run case
    if (state == io_state::never_run) {
        CHECK(log.completed() == 0);
    } else {
        CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
        const auto outcomes = exactly_one_applied(w, log);
        CHECK_MESSAGE(outcomes.empty(), outcomes);
    }

    // Whether or not the handlers ran, the environment holds every delivery exactly once.
    idem::store reopened{options(dir.env())};
    auto snap = reopened.read();
    CHECK(dump(snap, "order-totals") == w.expected().rows);
    CHECK(snap.consumer(consumer).inbox_size() == w.message_ids);
}

}  // TEST_SUITE
