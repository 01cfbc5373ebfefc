#pragma once

// What the writer tells the readers waiting on it: the last durable commit, raised after each
// commit, and who waits for it to pass a number (async_wait_commit, subscriptions with an
// async_next outstanding). Shared by the engine and its subscriptions, which may outlive it: a
// subscription reads the store only through read(), which the engine's shutdown waits out.

#include <idem/engine/engine.hpp>

#include <boost/asio/any_completion_handler.hpp>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace idem::detail {

class subscription_state;

class commit_watch {
public:
    using wait_handler = boost::asio::any_completion_handler<void(std::error_code)>;

    /// Watches s, whose commits up to durable are durable already (those of an earlier run).
    commit_watch(store& s, std::uint64_t durable) : store_(&s), durable_(durable) {}

    /// Raises the durable commit and wakes whoever waits for it (the writer, after a commit).
    void advance(std::uint64_t durable);
    /// Completes every wait with operation_aborted, now and from now on (engine stop).
    void stop();
    /// Stops, then waits until no read() runs: after it the store may go.
    void shutdown();

    /// Completes handler on ex once commit is durable (posted, even if it is already).
    void wait_commit(std::uint64_t commit, wait_handler handler, engine::executor_type ex);

    /// What read() found.
    struct batch {
        std::error_code ec;         // operation_aborted after stop, or the feed's error
        std::string message;        // the error's text
        std::vector<change> changes;
        std::uint64_t durable = 0;  // the durable commit the read stopped at
    };
    /// Reads the feed's whole commits after `after` that are durable, at most about limit entries.
    batch read(change_position after, std::size_t limit);
    /// Wakes sub (its attempt `generation`) once a commit past seen is durable; false, and no
    /// wake-up, if one already is or the watch has stopped (then the caller tries again now).
    bool wake_after(std::uint64_t seen, std::shared_ptr<subscription_state> sub, std::uint64_t generation);

private:
    struct commit_waiter {
        std::uint64_t commit;
        wait_handler handler;
        engine::executor_type ex;
    };
    struct sleeper {
        std::shared_ptr<subscription_state> sub;
        std::uint64_t generation;
    };
    void wake(std::vector<commit_waiter>& due, std::vector<sleeper>& sleepers, bool stopped);

    store* store_;
    std::mutex m_;
    std::condition_variable idle_;
    std::uint64_t durable_;
    bool stopped_ = false;
    std::size_t readers_ = 0;
    std::vector<commit_waiter> waiters_;
    std::vector<sleeper> sleepers_;
};

/// A new subscription's state: after `after`, at most about limit entries per completion.
std::shared_ptr<subscription_state> new_subscription(std::shared_ptr<commit_watch> watch, change_position after,
                                                     std::size_t limit);

}  // namespace idem::detail
