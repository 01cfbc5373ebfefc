// Every completion token kind at once: callbacks, std::futures, deferred operations (launched
// with a callback, and co_awaited) and awaitables, from several threads and coroutines, over
// deliveries with redeliveries and republications. Each handler runs exactly once, on its
// associated executor and never inside async_apply, and the rows equal the reference of
// applying each distinct event once.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <future>
#include <stdexcept>
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

using result = std::tuple<std::error_code, idem::outcome>;

// Read-your-writes: once an outcome arrived, a snapshot includes the commit it names.
void check_visible(const idem::engine& e, completion_log& log, std::size_t i, const std::error_code& ec,
                   const idem::outcome& o) {
    if (ec) return;
    try {
        if (e.read(o.commit).commit() < o.commit) {
            log.violation("#" + std::to_string(i) + ": a snapshot after the outcome misses commit " +
                          std::to_string(o.commit));
        }
    } catch (const std::exception& ex) {
        log.violation("#" + std::to_string(i) + ": read(" + std::to_string(o.commit) + ") threw: " + ex.what());
    }
}

void record(const idem::engine& e, completion_log& log, std::size_t i, std::error_code ec, idem::outcome o) {
    check_visible(e, log, i, ec, o);
    log.record(i, ec, std::move(o));
}

// The submitting threads are not io threads: a handler running on one ran inside async_apply.
void check_not_inline(std::thread::id submitter, completion_log& log, std::size_t i) {
    if (std::this_thread::get_id() == submitter) log.violation("#" + std::to_string(i) + " completed inside async_apply");
}

void submit_callbacks(idem::engine& e, const workload& w, const std::vector<std::size_t>& slice,
                      completion_log& log) {
    const auto submitter = std::this_thread::get_id();
    for (auto i : slice) {
        e.async_apply(w.deliveries[i], [&e, &log, i, submitter](std::error_code ec, idem::outcome o) {
            check_not_inline(submitter, log, i);
            record(e, log, i, ec, std::move(o));
        });
    }
}

// Keeps up to 16 futures outstanding, so that one thread has several deliveries in flight.
void submit_futures(idem::engine& e, const workload& w, const std::vector<std::size_t>& slice,
                    completion_log& log) {
    std::vector<std::pair<std::size_t, std::future<result>>> pending;
    auto drain = [&] {
        for (auto& [i, f] : pending) {
            if (!ready_in_time(f)) {
                log.violation("#" + std::to_string(i) + ": its future never became ready");
                continue;
            }
            auto [ec, o] = f.get();
            record(e, log, i, ec, std::move(o));
        }
        pending.clear();
    };
    for (auto i : slice) {
        pending.emplace_back(i, e.async_apply(w.deliveries[i], asio::use_future));
        if (pending.size() == 16) drain();
    }
    drain();
}

// A deferred operation does nothing until launched: build a few, then launch them with callbacks.
void submit_deferred(idem::engine& e, const workload& w, const std::vector<std::size_t>& slice,
                     completion_log& log) {
    using operation = decltype(e.async_apply(std::declval<idem::delivery>(), asio::deferred));
    std::vector<std::pair<std::size_t, operation>> built;
    const auto submitter = std::this_thread::get_id();
    auto launch = [&] {
        for (auto& [i, op] : built) {
            std::move(op)([&e, &log, i = i, submitter](std::error_code ec, idem::outcome o) {
                check_not_inline(submitter, log, i);
                record(e, log, i, ec, std::move(o));
            });
        }
        built.clear();
    };
    for (auto i : slice) {
        built.emplace_back(i, e.async_apply(w.deliveries[i], asio::deferred));
        if (built.size() == 8) launch();
    }
    launch();
}

// One delivery at a time, co_awaited as an awaitable or as a deferred operation.
asio::awaitable<void> await_each(idem::engine& e, const workload& w, std::vector<std::size_t> slice,
                                 completion_log& log, bool deferred) {
    for (auto i : slice) {
        const auto& d = w.deliveries[i];
        result r;
        // Braced temporaries inside co_await, as users write them: GCC 12 destroyed an aggregate
        // temporary there twice (delivery has a constructor for this reason).
        if (deferred) {
            r = co_await e.async_apply(idem::delivery{d.body, d.message_id}, asio::deferred);
        } else {
            r = co_await e.async_apply(idem::delivery{d.body, d.message_id}, asio::use_awaitable);
        }
        record(e, log, i, std::get<0>(r), std::move(std::get<1>(r)));
    }
}

enum class token_kind { callback, future, deferred, awaitable, awaited_deferred };

}  // namespace

TEST_SUITE("engine tokens") {

TEST_CASE("every token kind, from threads and coroutines at once, with duplicates, ends at the reference") {
    unsigned io_count = 2;
    SUBCASE("one io thread") { io_count = 1; }
    SUBCASE("two io threads") { io_count = 2; }
    CAPTURE(io_count);

    temp_dir dir;
    const auto w = make_workload(1200, 16, 42, true);
    completion_log log{w.deliveries.size()};
    asio::io_context io;
    io_threads runner{io, io_count};
    auto o = engine_options(dir.env());
    o.max_batch = 64;
    o.max_delay = 200us;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());

    // Two submitters of each kind; coroutines run on the io threads, the others on their own.
    const token_kind kinds[] = {token_kind::callback,  token_kind::callback,         token_kind::future,
                                token_kind::future,    token_kind::deferred,         token_kind::deferred,
                                token_kind::awaitable, token_kind::awaitable,        token_kind::awaited_deferred,
                                token_kind::awaited_deferred};
    std::vector<std::vector<std::size_t>> slices(std::size(kinds));
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) slices[i % slices.size()].push_back(i);
    std::vector<std::thread> threads;
    for (std::size_t s = 0; s < slices.size(); ++s) {
        switch (kinds[s]) {
        case token_kind::callback: threads.emplace_back([&, s] { submit_callbacks(e, w, slices[s], log); }); break;
        case token_kind::future: threads.emplace_back([&, s] { submit_futures(e, w, slices[s], log); }); break;
        case token_kind::deferred: threads.emplace_back([&, s] { submit_deferred(e, w, slices[s], log); }); break;
        case token_kind::awaitable:
        case token_kind::awaited_deferred:
            asio::co_spawn(io, await_each(e, w, slices[s], log, kinds[s] == token_kind::awaited_deferred),
                           [&log](std::exception_ptr ex) {
                               if (ex) log.violation("a submitting coroutine threw");
                           });
            break;
        }
    }
    for (auto& t : threads) t.join();
    REQUIRE_MESSAGE(log.wait_all(), log.completed() << " of " << log.size() << " completed");

    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    CHECK_MESSAGE(log.violations().empty(), log.violations());
    const auto outcomes = exactly_one_applied(w, log);
    CHECK_MESSAGE(outcomes.empty(), outcomes);
    {
        auto snap = e.read();
        CHECK(dump(snap, "order-totals") == w.expected().rows);
        CHECK(snap.consumer(consumer).inbox_size() == w.message_ids);
    }
    const auto stats = e.stats();
    std::uint64_t completed = 0;
    for (auto n : stats.outcomes) completed += n;
    CHECK(completed == w.deliveries.size());
    CHECK(stats.outcomes[static_cast<std::size_t>(idem::outcome_kind::applied)] == w.order_of.size());
    CHECK(stats.failed == 0);
    CHECK(stats.in_flight == 0);
    CHECK(stats.waiting == 0);
}

TEST_CASE("a completion runs on its associated executor, never inside async_apply") {
    temp_dir dir;
    const auto w = make_workload(200, 4, 3, true);
    completion_log log{w.deliveries.size()};
    asio::io_context handlers_io;  // runs the strand the bound handlers ask for
    asio::io_context engine_io;    // the engine's executor: handlers without one of their own run here
    auto strand = asio::make_strand(handlers_io);
    std::size_t on_strand = 0;  // touched only on the strand
    std::promise<std::pair<std::error_code, std::size_t>> flushed;
    io_threads handler_threads{handlers_io, 2};
    io_threads engine_threads{engine_io, 1};
    idem::engine e{engine_io.get_executor(), engine_options(dir.env())};
    e.add(totals_by_order());
    CHECK(e.get_executor() == idem::engine::executor_type(engine_io.get_executor()));

    // Submitting from the strand itself: a handler invoked inside async_apply would run there
    // and then, changing on_strand under the submitter's feet.
    asio::post(strand, [&] {
        for (std::size_t i = 0; i < w.deliveries.size(); i += 2) {
            const auto before = on_strand;
            e.async_apply(w.deliveries[i],
                          asio::bind_executor(strand, [&, i](std::error_code ec, idem::outcome o) {
                              if (!strand.running_in_this_thread()) log.violation("a bound handler ran off its strand");
                              ++on_strand;
                              log.record(i, ec, std::move(o));
                          }));
            if (on_strand != before) log.violation("a handler ran inside async_apply");
        }
        // Everything bound to the strand before the flush has run when the flush completes there.
        e.async_flush(asio::bind_executor(strand, [&](std::error_code ec) { flushed.set_value({ec, on_strand}); }));
    });
    for (std::size_t i = 1; i < w.deliveries.size(); i += 2) {
        e.async_apply(w.deliveries[i], [&, i](std::error_code ec, idem::outcome o) {
            if (!engine_io.get_executor().running_in_this_thread()) {
                log.violation("an unbound handler ran off the engine's executor");
            }
            log.record(i, ec, std::move(o));
        });
    }

    auto flush = flushed.get_future();
    REQUIRE(ready_in_time(flush));
    const auto [flush_error, seen] = flush.get();
    CHECK_FALSE(flush_error);
    CHECK(seen == (w.deliveries.size() + 1) / 2);
    REQUIRE(log.wait_all());
    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    CHECK_MESSAGE(log.violations().empty(), log.violations());
    const auto outcomes = exactly_one_applied(w, log);
    CHECK_MESSAGE(outcomes.empty(), outcomes);
    CHECK(dump(e.read(), "order-totals") == w.expected().rows);
}

TEST_CASE("a completion handler that throws leaves run(); every other completion still runs, in order") {
    // Completions that share an executor are posted together; one that throws must not take
    // the others with it, nor let the flush's completion overtake them.
    temp_dir dir;
    const auto w = make_workload(64, 4, 5, false);
    completion_log log{w.deliveries.size()};
    asio::io_context io;
    auto guard = asio::make_work_guard(io);
    idem::engine e{io.get_executor(), engine_options(dir.env())};
    e.add(totals_by_order());
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) {
        e.async_apply(w.deliveries[i], [&, i](std::error_code ec, idem::outcome o) {
            log.record(i, ec, std::move(o));
            if (i == 3 || i == 40) throw std::runtime_error("handler " + std::to_string(i) + " failed");
        });
    }
    std::size_t completed_at_flush = 0;
    e.async_flush([&](std::error_code) {
        completed_at_flush = log.completed();
        guard.reset();
    });
    std::vector<std::string> thrown;
    for (;;) {
        try {
            io.run();
            break;
        } catch (const std::runtime_error& ex) {
            thrown.push_back(ex.what());
            io.restart();
        }
    }
    CHECK(thrown == std::vector<std::string>{"handler 3 failed", "handler 40 failed"});
    CHECK(completed_at_flush == w.deliveries.size());
    CHECK(log.completed() == w.deliveries.size());
    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    CHECK(dump(e.read(), "order-totals") == w.expected().rows);
}

TEST_CASE("a handler may hold a snapshot while it calls stats() and submits the next delivery") {
    // Each completion reads the committed state and, with that snapshot still open, asks for
    // the engine's counters and submits the next delivery: read, stats and async_apply are
    // documented as callable from any thread, and nothing says a snapshot must be closed first.
    temp_dir dir;
    const auto w = make_workload(60, 4, 17, false);
    completion_log log{w.deliveries.size()};
    asio::io_context io;
    io_threads runner{io, 2};
    idem::engine e{io.get_executor(), engine_options(dir.env())};
    e.add(totals_by_order());

    std::function<void(std::size_t)> submit = [&](std::size_t i) {
        e.async_apply(w.deliveries[i], [&, i](std::error_code ec, idem::outcome o) {
            if (!ec) {
                const auto snap = e.read(o.commit);
                if (e.stats().last_commit < o.commit) log.violation("stats() behind a completed commit");
                if (i + 1 < w.deliveries.size()) submit(i + 1);
                if (snap.commit() < o.commit) log.violation("the snapshot misses the completed commit");
            }
            log.record(i, ec, std::move(o));
        });
    };
    submit(0);
    REQUIRE_MESSAGE(log.wait_all(), log.completed() << " of " << log.size() << " completed");
    CHECK_MESSAGE(log.not_exactly_once().empty(), log.not_exactly_once());
    CHECK_MESSAGE(log.violations().empty(), log.violations());
    const auto outcomes = exactly_one_applied(w, log);
    CHECK_MESSAGE(outcomes.empty(), outcomes);
    CHECK(dump(e.read(), "order-totals") == w.expected().rows);
}

}  // TEST_SUITE
