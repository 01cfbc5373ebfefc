#pragma once

// Shared helpers of the engine tests, on top of the projections tests' fixtures (temporary
// directories, order events, the row dump and the std::map reference): an io_context run
// by threads, a record of every completion, a workload of distinct events with
// redeliveries and republications, and a gate that holds or fails one commit.
//
// Completion handlers run on io threads, so they never assert: they record what they saw
// (and any violated property as text), and the test thread asserts once they are done.

#include <idem/engine/engine.hpp>
#include <idem/projections/store_hooks.hpp>

#include "../projections/fixtures.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace idem_test {

/// How long a test waits for something that must happen before it gives up (a safety net
/// against hangs, generous for sanitizer builds; no test relies on it for timing).
inline constexpr std::chrono::seconds patience{120};

/// Engine options over a test's environment: durability::none unless asked otherwise.
inline idem::engine_options engine_options(const std::filesystem::path& path,
                                           idem::durability sync = idem::durability::none) {
    idem::engine_options o;
    o.store = options(path, sync);
    return o;
}

/// Runs an io_context on n threads until stopped; join() (or the destructor) lets it run out of work first.
class io_threads {
public:
    io_threads(boost::asio::io_context& io, unsigned n) : guard_(boost::asio::make_work_guard(io)) {
        for (unsigned i = 0; i < n; ++i) threads_.emplace_back([&io] { io.run(); });
    }
    ~io_threads() { join(); }
    io_threads(const io_threads&) = delete;
    io_threads& operator=(const io_threads&) = delete;

    /// Releases the work guard and waits until every handler (and every tracked operation) is done.
    void join() {
        guard_.reset();
        for (auto& t : threads_) {
            if (t.joinable()) t.join();
        }
    }

private:
    boost::asio::executor_work_guard<boost::asio::io_context::executor_type> guard_;
    std::vector<std::thread> threads_;
};

/// Every completion of a test's deliveries, by delivery index, and the property violations
/// handlers observed. Thread-safe.
class completion_log {
public:
    explicit completion_log(std::size_t deliveries) : calls_(deliveries), errors_(deliveries), outcomes_(deliveries) {}

    /// Records the completion of delivery i.
    void record(std::size_t i, std::error_code ec, idem::outcome o) {
        std::scoped_lock lock{m_};
        ++calls_.at(i);
        errors_.at(i) = ec;
        outcomes_.at(i) = std::move(o);
        ++completed_;
        cv_.notify_all();
    }
    /// Records a property a handler saw violated.
    void violation(std::string what) {
        std::scoped_lock lock{m_};
        if (violations_.size() < 20) violations_.push_back(std::move(what));
        ++violation_count_;
    }
    /// Waits until n completions were recorded (at most `patience`); false if they were not.
    bool wait_for(std::size_t n) {
        std::unique_lock lock{m_};
        return cv_.wait_for(lock, patience, [&] { return completed_ >= n; });
    }
    /// Waits until every delivery completed at least once.
    bool wait_all() { return wait_for(calls_.size()); }

    std::size_t size() const { return calls_.size(); }
    std::size_t completed() const {
        std::scoped_lock lock{m_};
        return completed_;
    }
    /// The indices whose handler ran other than exactly once, as text ("" if none).
    std::string not_exactly_once() const {
        std::scoped_lock lock{m_};
        std::string out;
        std::size_t listed = 0;
        for (std::size_t i = 0; i < calls_.size(); ++i) {
            if (calls_[i] != 1 && listed++ < 10) out += " #" + std::to_string(i) + " ran " + std::to_string(calls_[i]);
        }
        return out;
    }
    /// The violations handlers recorded, as text ("" if none).
    std::string violations() const {
        std::scoped_lock lock{m_};
        std::string out;
        for (const auto& v : violations_) out += v + "\n";
        if (violation_count_ > violations_.size()) {
            out += "... " + std::to_string(violation_count_ - violations_.size()) + " more\n";
        }
        return out;
    }
    /// Completion i's error (read after the handlers are done).
    std::error_code error(std::size_t i) const {
        std::scoped_lock lock{m_};
        return errors_.at(i);
    }
    /// Completion i's outcome (read after the handlers are done).
    idem::outcome outcome(std::size_t i) const {
        std::scoped_lock lock{m_};
        return outcomes_.at(i);
    }

private:
    mutable std::mutex m_;
    std::condition_variable cv_;
    std::vector<unsigned> calls_;
    std::vector<std::error_code> errors_;
    std::vector<idem::outcome> outcomes_;
    std::size_t completed_ = 0;
    std::vector<std::string> violations_;
    std::size_t violation_count_ = 0;
};

/// Distinct order lines over a few orders, each delivered once or more: redelivered under the
/// same message id, or republished under a new one. The reference adds each distinct line once.
struct workload {
    std::vector<idem::delivery> deliveries;
    std::vector<std::size_t> event_of;  ///< delivery index -> distinct event index
    std::vector<std::string> order_of;  ///< distinct event index -> its order
    std::vector<std::int64_t> amount_of;
    std::size_t message_ids = 0;  ///< distinct message ids among the deliveries

    /// The reference of the events whose index passes keep (every event by default).
    reference expected(const std::function<bool(std::size_t event)>& keep = {}) const {
        reference ref;
        for (std::size_t e = 0; e < order_of.size(); ++e) {
            if (!keep || keep(e)) ref.add(order_of[e], amount_of[e]);
        }
        return ref;
    }
};

/// Builds a workload of `events` distinct lines over `orders` orders; with copies, about a fifth
/// are redelivered and an eighth republished; the deliveries are shuffled. Ids start with prefix.
inline workload make_workload(std::size_t events, std::size_t orders, std::uint64_t seed, bool copies,
                              const std::string& prefix = "line") {
    std::mt19937_64 rng{seed};
    auto pick = [&](std::size_t lo, std::size_t hi) { return std::uniform_int_distribution<std::size_t>{lo, hi}(rng); };
    workload w;
    for (std::size_t i = 0; i < events; ++i) {
        const auto order = "order-" + std::to_string(pick(0, orders - 1));
        const auto amount = static_cast<std::int64_t>(pick(1, 1000));
        const auto id = prefix + "-" + std::to_string(i);
        w.order_of.push_back(order);
        w.amount_of.push_back(amount);
        auto e = line(id, order, amount);
        w.deliveries.push_back(deliver(e, "msg-" + id));
        w.event_of.push_back(i);
        ++w.message_ids;
        if (copies && pick(0, 4) == 0) {
            w.deliveries.push_back(deliver(e, "msg-" + id));
            w.event_of.push_back(i);
        }
        if (copies && pick(0, 7) == 0) {
            w.deliveries.push_back(deliver(e, "msg-" + id + "-again"));
            w.event_of.push_back(i);
            ++w.message_ids;
        }
    }
    std::vector<std::size_t> permutation(w.deliveries.size());
    for (std::size_t i = 0; i < permutation.size(); ++i) permutation[i] = i;
    std::shuffle(permutation.begin(), permutation.end(), rng);
    workload shuffled = w;
    for (std::size_t i = 0; i < permutation.size(); ++i) {
        shuffled.deliveries[i] = w.deliveries[permutation[i]];
        shuffled.event_of[i] = w.event_of[permutation[i]];
    }
    return shuffled;
}

/// Checks the outcomes of a workload whose deliveries all completed without error: each
/// distinct event was applied by exactly one of its deliveries, the others were duplicates.
/// Returns the problems as text ("" if none).
inline std::string exactly_one_applied(const workload& w, const completion_log& log) {
    std::vector<unsigned> applied(w.order_of.size());
    std::string out;
    for (std::size_t i = 0; i < w.deliveries.size(); ++i) {
        const auto o = log.outcome(i);
        if (log.error(i)) {
            out += " #" + std::to_string(i) + " failed: " + log.error(i).message() + ";";
        } else if (o.kind == idem::outcome_kind::applied) {
            ++applied[w.event_of[i]];
        } else if (o.kind != idem::outcome_kind::duplicate_message && o.kind != idem::outcome_kind::duplicate_event) {
            out += " #" + std::to_string(i) + " was " + std::string(idem::to_string(o.kind)) + ";";
        }
    }
    for (std::size_t e = 0; e < applied.size(); ++e) {
        if (applied[e] != 1) out += " event " + std::to_string(e) + " applied " + std::to_string(applied[e]) + "x;";
    }
    return out;
}

/// Records every commit the store makes, and can hold one commit inside its transaction
/// until released, or fail one once. Install with install(options); it must outlive the engine.
class commit_gate {
public:
    /// Makes the store call this gate right before each commit.
    void install(idem::engine_options& o) {
        idem::detail::set_before_commit(o.store, [this](std::uint64_t commit) { before_commit(commit); });
    }
    /// Holds the commit numbered `commit` inside its transaction until open() is called.
    void hold(std::uint64_t commit) {
        std::scoped_lock lock{m_};
        hold_at_ = commit;
        held_ = false;
        open_ = false;
    }
    /// Waits until the held commit is inside its transaction (at most `patience`).
    bool wait_held() {
        std::unique_lock lock{m_};
        return cv_.wait_for(lock, patience, [&] { return held_; });
    }
    /// Lets the held commit go on.
    void open() {
        std::scoped_lock lock{m_};
        open_ = true;
        cv_.notify_all();
    }
    /// Makes the commit numbered `commit` throw what `thrower` throws, once.
    void fail(std::uint64_t commit, std::function<void()> thrower) {
        std::scoped_lock lock{m_};
        fail_at_ = commit;
        thrower_ = std::move(thrower);
    }
    /// Whether the before_commit call for `commit` ran to its end (the commit itself follows it).
    bool returned(std::uint64_t commit) const {
        std::scoped_lock lock{m_};
        return returned_.contains(commit);
    }
    /// Every commit number before_commit was called with, in call order (a failed commit's number repeats).
    std::vector<std::uint64_t> calls() const {
        std::scoped_lock lock{m_};
        return calls_;
    }
    /// Makes every commit linger inside its transaction for d (to widen the window in which an
    /// early completion would be caught).
    void linger(std::chrono::microseconds d) {
        std::scoped_lock lock{m_};
        linger_ = d;
    }

private:
    void before_commit(std::uint64_t commit) {
        std::function<void()> thrower;
        std::chrono::microseconds linger{0};
        {
            std::unique_lock lock{m_};
            calls_.push_back(commit);
            if (hold_at_ == commit) {
                hold_at_.reset();
                held_ = true;
                cv_.notify_all();
                cv_.wait(lock, [&] { return open_; });
            }
            if (fail_at_ == commit) {
                fail_at_.reset();
                thrower = std::move(thrower_);
            }
            linger = linger_;
        }
        if (thrower) thrower();
        if (linger.count() > 0) std::this_thread::sleep_for(linger);
        std::scoped_lock lock{m_};
        returned_.insert(commit);
    }

    mutable std::mutex m_;
    std::condition_variable cv_;
    std::vector<std::uint64_t> calls_;
    std::set<std::uint64_t> returned_;
    std::optional<std::uint64_t> hold_at_;
    bool held_ = false;
    bool open_ = false;
    std::optional<std::uint64_t> fail_at_;
    std::function<void()> thrower_;
    std::chrono::microseconds linger_{0};
};

/// Waits for a std::future-like object at most `patience`; false if it is not ready.
template <class Future>
bool ready_in_time(Future& f) {
    return f.wait_for(patience) == std::future_status::ready;
}

}  // namespace idem_test
