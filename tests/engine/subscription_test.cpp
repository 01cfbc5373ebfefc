// Subscriptions follow the change feed of a running engine: every entry of every commit, in
// order, each once, only once its commit is durable; resumable from a stored position in a new
// engine; ended by pruning (changes_pruned, naming the oldest commit kept), cancel, destruction
// or stop; and async_wait_commit for read-your-writes. The follower's end state is compared with
// a reference the test computes from the events it submitted, and with the rows.

#include <idem/engine/engine.hpp>
#include <idem/engine/subscription.hpp>
#include <idem/storage/error.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

namespace asio = boost::asio;
using namespace idem_test;
using namespace std::chrono_literals;

namespace {

const std::error_code aborted = std::make_error_code(std::errc::operation_canceled);

// Follows a subscription with callbacks on its own io_context: applies each entry to its own
// map of rows, and records what it saw violated. Handlers never assert (they run on io threads).
class follower {
public:
    follower(idem::engine& e, idem::subscription sub, const commit_gate* gate = nullptr)
        : e_(e), sub_(std::move(sub)), gate_(gate), p_(totals_by_order().changes()) {}

    void start(asio::io_context& io) {
        std::scoped_lock lock{m_};  // async_next never completes inline: no handler takes m_ meanwhile
        if (stopping_) return;
        sub_.async_next(asio::bind_executor(io, [this, &io](std::error_code ec, std::vector<idem::change> batch) {
            on_next(io, ec, std::move(batch));
        }));
    }
    /// Waits until an entry of commit `commit` or later was seen (at most `patience`).
    bool wait_for(std::uint64_t commit) {
        std::unique_lock lock{m_};
        return cv_.wait_for(lock, patience, [&] { return seen_.commit >= commit || end_; });
    }
    /// Waits until async_next completed with an error.
    bool wait_end() {
        std::unique_lock lock{m_};
        return cv_.wait_for(lock, patience, [&] { return end_.has_value(); });
    }
    idem::subscription& sub() { return sub_; }
    /// Stops following: the outstanding async_next ends, and none follows it (a failed REQUIRE
    /// then unwinds without waiting on an io_context that still has the operation's work).
    void stop() {
        {
            std::scoped_lock lock{m_};
            stopping_ = true;
        }
        sub_.cancel();
    }
    std::map<std::string, row_summary> rows() const {
        std::scoped_lock lock{m_};
        return rows_;
    }
    std::vector<idem::change_position> positions() const {
        std::scoped_lock lock{m_};
        return positions_;
    }
    std::optional<std::error_code> end() const {
        std::scoped_lock lock{m_};
        return end_;
    }
    std::string violations() const {
        std::scoped_lock lock{m_};
        return violations_;
    }

private:
    void on_next(asio::io_context& io, std::error_code ec, std::vector<idem::change> batch) {
        std::unique_lock lock{m_};
        if (ec) {
            end_ = ec;
            cv_.notify_all();
            return;
        }
        if (batch.empty()) violations_ += "an empty completion\n";
        if (!batch.empty() && batch.front().position.commit <= seen_.commit && !positions_.empty()) {
            violations_ += "commit " + std::to_string(batch.front().position.commit) + " split or repeated\n";
        }
        const auto durable = e_.durable_commit();
        for (const auto& c : batch) {
            if (c.position <= seen_ && !positions_.empty()) {
                violations_ += c.position.to_string() + " after " + seen_.to_string() + "\n";
            }
            if (c.position.commit > durable) {
                violations_ += c.position.to_string() + " delivered at durable commit " + std::to_string(durable) + "\n";
            }
            if (gate_ && !gate_->returned(c.position.commit)) {
                violations_ += c.position.to_string() + " delivered before its commit returned\n";
            }
            seen_ = c.position;
            positions_.push_back(c.position);
            if (c.kind != idem::change_kind::row) continue;
            auto state = idem::state_of(p_, c);
            rows_[c.key] = row_summary{state.total, state.lines, c.version, state.sequences};
        }
        if (sub_.position() != seen_) violations_ += "position() is not the last entry delivered\n";
        cv_.notify_all();
        lock.unlock();
        start(io);
    }

    idem::engine& e_;
    idem::subscription sub_;
    const commit_gate* gate_;
    idem::projection<order_total> p_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    idem::change_position seen_{};
    std::vector<idem::change_position> positions_;
    std::map<std::string, row_summary> rows_;
    std::optional<std::error_code> end_;
    std::string violations_;
    bool stopping_ = false;
};

// Stops a follower when a scope ends, before the io_context threads declared ahead of it are joined.
struct stop_on_exit {
    follower& f;
    ~stop_on_exit() { f.stop(); }
};

// Totals and line counts only: the reference's versions count lines, the feed's may skip.
std::map<std::string, std::pair<std::int64_t, std::int64_t>> totals(const std::map<std::string, row_summary>& rows) {
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> out;
    for (const auto& [k, r] : rows) out[k] = {r.total, r.lines};
    return out;
}

idem::engine_options feed_options(const std::filesystem::path& dir, idem::durability sync = idem::durability::none) {
    auto o = engine_options(dir, sync);
    o.store.changes.max_age.reset();
    return o;
}

// Applies deliveries one at a time, each awaited: one commit each.
void apply_each(idem::engine& e, const std::vector<idem::delivery>& ds) {
    for (const auto& d : ds) {
        auto f = e.async_apply(d, asio::use_future);
        REQUIRE(ready_in_time(f));
        REQUIRE_FALSE(std::get<0>(f.get()));
    }
}

std::vector<idem::delivery> lines(const std::string& prefix, std::size_t n, std::size_t orders) {
    std::vector<idem::delivery> out;
    for (std::size_t i = 0; i < n; ++i) {
        out.push_back(deliver(line(prefix + std::to_string(i), "order-" + std::to_string(i % orders),
                                   static_cast<std::int64_t>(i + 1))));
    }
    return out;
}

}  // namespace

TEST_SUITE("engine subscriptions") {

TEST_CASE("a subscriber follows concurrent submitters: every entry once, in order, durable first") {
    auto sync = idem::durability::none;
    SUBCASE("durability none") { sync = idem::durability::none; }
    SUBCASE("durability periodic") { sync = idem::durability::periodic; }
    SUBCASE("durability full") { sync = idem::durability::full; }
    CAPTURE(static_cast<int>(sync));

    temp_dir dir;
    const auto w = make_workload(1200, 40, 11, true);
    completion_log log{w.deliveries.size()};
    commit_gate gate;
    auto o = feed_options(dir.path(), sync);
    o.sync_interval = 5ms;
    gate.install(o);
    gate.linger(100us);  // widens the window in which an early delivery would be seen

    asio::io_context submit_io;
    asio::io_context follow_io;
    std::optional<follower> f;
    {
        idem::engine e{submit_io.get_executor(), o};
        e.add(totals_by_order().changes());
        f.emplace(e, e.subscribe(), &gate);
        io_threads submitters_io{submit_io, 2};
        io_threads followers_io{follow_io, 1};
        f->start(follow_io);
        stop_on_exit stop_following{*f};

        std::vector<std::thread> submitters;
        constexpr std::size_t threads = 4;
        for (std::size_t t = 0; t < threads; ++t) {
            submitters.emplace_back([&, t] {
                for (std::size_t i = t; i < w.deliveries.size(); i += threads) {
                    e.async_apply(w.deliveries[i], [&log, i](std::error_code ec, idem::outcome out) {
                        log.record(i, ec, std::move(out));
                    });
                }
            });
        }
        for (auto& t : submitters) t.join();
        REQUIRE(log.wait_all());
        CHECK(exactly_one_applied(w, log) == "");

        const auto last = e.read().change_feed().last_commit;
        REQUIRE(last > 0);
        REQUIRE(f->wait_for(last));
        CHECK(f->violations() == "");
        CHECK_FALSE(f->end());

        // Against the test's own reference, then against the rows and the whole feed.
        CHECK(totals(f->rows()) == totals(w.expected().rows));
        const auto snap = e.read();
        CHECK(f->rows() == dump(snap, "order-totals"));
        std::vector<idem::change_position> all;
        for (const auto& c : snap.changes(0, SIZE_MAX)) all.push_back(c.position);
        CHECK(f->positions() == all);

        // The follower may be between a completion and its next async_next: stop() covers both
        // (cancel's own completion is checked where nothing races it, below).
        f->stop();
        followers_io.join();
        CHECK((!f->end() || *f->end() == aborted));
        submitters_io.join();
    }
}

TEST_CASE("a subscription resumes from a stored position in a new engine on the same store") {
    temp_dir dir;
    asio::io_context io;
    idem::change_position stored;
    std::vector<idem::change_position> first_run;
    std::map<std::string, row_summary> rows;
    const auto p = totals_by_order().changes();
    auto take = [&](const std::vector<idem::change>& batch) {
        for (const auto& c : batch) {
            first_run.push_back(c.position);
            auto state = idem::state_of(p, c);
            rows[c.key] = row_summary{state.total, state.lines, c.version, state.sequences};
        }
    };
    {
        io_threads threads{io, 1};
        idem::engine e{io.get_executor(), feed_options(dir.path())};
        e.add(totals_by_order().changes());
        apply_each(e, lines("a-", 30, 7));
        auto sub = e.subscribe(idem::change_position{0, UINT32_MAX}, 10);  // ten commits of one entry each
        auto f = sub.async_next(asio::use_future);
        REQUIRE(ready_in_time(f));
        auto [ec, batch] = f.get();
        REQUIRE_FALSE(ec);
        CHECK(batch.size() == 10);
        take(batch);
        stored = sub.position();
        CHECK(stored == batch.back().position);
    }
    // The first engine is gone (its subscription with it); a new one goes on numbering commits.
    idem::engine e{io.get_executor(), feed_options(dir.path())};
    e.add(totals_by_order().changes());
    io_threads threads{io, 1};
    apply_each(e, lines("b-", 20, 7));
    auto sub = e.subscribe(stored);
    const auto last = e.read().change_feed().last_commit;
    while (sub.position().commit < last) {
        auto f = sub.async_next(asio::use_future);
        REQUIRE(ready_in_time(f));
        auto [ec, batch] = f.get();
        REQUIRE_FALSE(ec);
        take(batch);
    }
    const auto snap = e.read();
    std::vector<idem::change_position> all;
    for (const auto& c : snap.changes(0, SIZE_MAX)) all.push_back(c.position);
    CHECK(first_run == all);  // nothing lost, nothing twice across the restart
    CHECK(rows == dump(snap, "order-totals"));
    reference ref;
    for (std::size_t i = 0; i < 30; ++i) ref.add("order-" + std::to_string(i % 7), static_cast<std::int64_t>(i + 1));
    for (std::size_t i = 0; i < 20; ++i) ref.add("order-" + std::to_string(i % 7), static_cast<std::int64_t>(i + 1));
    CHECK(totals(rows) == totals(ref.rows));

}

TEST_CASE("a subscription after an entry inside a commit starts with the rest of that commit") {
    temp_dir dir;
    asio::io_context io;
    io_threads threads{io, 1};
    commit_gate gate;
    auto o = feed_options(dir.path());
    gate.install(o);
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order().changes());
    // Commit 1 is held inside its transaction while three lines of other orders queue: they
    // make commit 2 together.
    gate.hold(1);
    auto first = e.async_apply(deliver(line("m-0", "order-0", 1)), asio::use_future);
    REQUIRE(gate.wait_held());
    std::vector<std::future<std::tuple<std::error_code, idem::outcome>>> queued;
    for (int i = 1; i <= 3; ++i) {
        queued.push_back(e.async_apply(deliver(line("m-" + std::to_string(i), "order-" + std::to_string(i), i)),
                                       asio::use_future));
    }
    std::this_thread::sleep_for(20ms);
    gate.open();
    REQUIRE(ready_in_time(first));
    for (auto& q : queued) {
        REQUIRE(ready_in_time(q));
        CHECK(std::get<1>(q.get()).commit == 2);
    }
    auto sub = e.subscribe(idem::change_position{2, 0});
    auto f = sub.async_next(asio::use_future);
    REQUIRE(ready_in_time(f));
    auto [ec, batch] = f.get();
    REQUIRE_FALSE(ec);
    REQUIRE(batch.size() == 2);
    CHECK(batch[0].position == idem::change_position{2, 1});
    CHECK(batch[1].position == idem::change_position{2, 2});
    CHECK(sub.position() == idem::change_position{2, 2});
}

TEST_CASE("a subscription behind the pruned feed ends with changes_pruned, naming the oldest commit kept") {
    temp_dir dir;
    asio::io_context io;
    io_threads threads{io, 1};
    auto o = feed_options(dir.path());
    o.store.changes.keep_commits = 3;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order().changes());
    apply_each(e, lines("p-", 12, 4));  // twelve commits of one entry each: commits 1-9 pruned
    const auto feed = e.read().change_feed();
    REQUIRE(feed.first_commit == 10);

    auto sub = e.subscribe(std::uint64_t{2});
    auto f = sub.async_next(asio::use_future);
    REQUIRE(ready_in_time(f));
    auto [ec, batch] = f.get();
    CHECK(ec == idem::errc::changes_pruned);
    CHECK(batch.empty());
    CHECK(sub.error_message().find("the oldest commit kept whole is 10") != std::string::npos);
    CHECK(sub.position() == idem::change_position{2, UINT32_MAX});

    // From a kept position the rest follows.
    auto kept = e.subscribe(std::uint64_t{9});
    auto g = kept.async_next(asio::use_future);
    REQUIRE(ready_in_time(g));
    auto [ec2, rest] = g.get();
    REQUIRE_FALSE(ec2);
    REQUIRE(rest.size() == 3);
    CHECK(rest.front().position == idem::change_position{10, 0});
}

TEST_CASE("cancel, destruction and the engine's stop end an outstanding async_next with operation_aborted") {
    temp_dir dir;
    asio::io_context io;
    io_threads threads{io, 1};
    idem::engine e{io.get_executor(), feed_options(dir.path())};
    e.add(totals_by_order().changes());
    apply_each(e, lines("x-", 2, 2));
    const auto now = e.read().commit();

    auto sub = e.subscribe(now);
    auto f = sub.async_next(asio::use_future);
    auto second = sub.async_next(asio::use_future);  // one outstanding at a time
    REQUIRE(ready_in_time(second));
    CHECK(std::get<0>(second.get()) == idem::errc::invalid_argument);
    CHECK(f.wait_for(50ms) == std::future_status::timeout);  // nothing new: it waits
    sub.cancel();
    REQUIRE(ready_in_time(f));
    CHECK(std::get<0>(f.get()) == aborted);

    // Cancelled, it waits again, and a commit after wakes it.
    auto again = sub.async_next(asio::use_future);
    apply_each(e, lines("y-", 1, 1));
    REQUIRE(ready_in_time(again));
    auto [ec, batch] = again.get();
    REQUIRE_FALSE(ec);
    REQUIRE(batch.size() == 1);
    CHECK(batch.front().position == idem::change_position{now + 1, 0});

    std::future<std::tuple<std::error_code, std::vector<idem::change>>> destroyed;
    {
        auto gone = e.subscribe(now + 1);
        destroyed = gone.async_next(asio::use_future);
    }
    REQUIRE(ready_in_time(destroyed));
    CHECK(std::get<0>(destroyed.get()) == aborted);

    auto pending = sub.async_next(asio::use_future);
    auto waiting_commit = e.async_wait_commit(now + 100, asio::use_future);
    auto stopped = e.async_stop(asio::use_future);
    REQUIRE(ready_in_time(stopped));
    REQUIRE(ready_in_time(pending));
    CHECK(std::get<0>(pending.get()) == aborted);
    REQUIRE(ready_in_time(waiting_commit));
    CHECK(waiting_commit.get() == aborted);
    auto after_stop = sub.async_next(asio::use_future);
    REQUIRE(ready_in_time(after_stop));
    CHECK(std::get<0>(after_stop.get()) == aborted);
}

TEST_CASE("async_wait_commit completes once the commit is durable, never from within the call") {
    temp_dir dir;
    asio::io_context io;
    idem::engine e{io.get_executor(), feed_options(dir.path(), idem::durability::periodic)};
    e.add(totals_by_order().changes());
    {
        io_threads threads{io, 1};
        apply_each(e, lines("w-", 3, 2));
    }
    io.restart();
    const auto now = e.read().commit();
    REQUIRE(now == 3);

    // Durable already: posted, so it runs only when the io_context runs.
    bool ran = false;
    std::error_code got = make_error_code(idem::errc::invalid_argument);
    e.async_wait_commit(now, [&](std::error_code ec) {
        ran = true;
        got = ec;
    });
    CHECK_FALSE(ran);
    io.run();
    CHECK(ran);
    CHECK_FALSE(got);
    io.restart();

    // A later commit: completes after it, and a snapshot taken then sees it.
    io_threads threads{io, 1};
    std::atomic<std::uint64_t> seen{0};
    std::atomic<std::uint64_t> durable{0};
    e.async_wait_commit(now + 1, [&](std::error_code ec) {
        if (!ec) {
            seen = e.read().commit();
            durable = e.durable_commit();
        }
    });
    std::this_thread::sleep_for(20ms);
    CHECK(seen.load() == 0);
    auto applied = e.async_apply(deliver(line("w-late", "order-0", 5)), asio::use_future);
    REQUIRE(ready_in_time(applied));
    const auto o = std::get<1>(applied.get());
    CHECK(o.commit == now + 1);
    auto waited = e.async_wait_commit(o.commit, asio::use_future);
    REQUIRE(ready_in_time(waited));
    CHECK_FALSE(waited.get());
    threads.join();
    CHECK(seen.load() >= now + 1);
    CHECK(durable.load() >= now + 1);
}

TEST_CASE("async_next works with use_awaitable") {
    temp_dir dir;
    asio::io_context io;
    idem::engine e{io.get_executor(), feed_options(dir.path())};
    e.add(totals_by_order().changes());
    {
        io_threads threads{io, 1};
        apply_each(e, lines("z-", 5, 2));
    }
    io.restart();
    std::vector<idem::change_position> got;
    std::error_code last;
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
            auto sub = e.subscribe(std::uint64_t{0}, 2);
            while (got.size() < 5) {
                auto [ec, batch] = co_await sub.async_next(asio::use_awaitable);
                last = ec;
                if (ec) co_return;
                for (const auto& c : batch) got.push_back(c.position);
            }
        },
        asio::detached);
    io.run();
    CHECK_FALSE(last);
    REQUIRE(got.size() == 5);
    for (std::uint64_t i = 0; i < 5; ++i) CHECK(got[i] == idem::change_position{i + 1, 0});
}

}  // TEST_SUITE
