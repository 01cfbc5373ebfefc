// Engine subscriptions and commit waits: the writer raises the durable commit after each commit
// (commit_watch::advance) and wakes those waiting on it; a subscription's attempt reads the
// feed on its handler's executor, never on the writer, so a slow reader costs the writer one post.

#include "commit_watch.hpp"

#include <idem/storage/error.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <iterator>
#include <optional>
#include <utility>

namespace idem {
namespace detail {
namespace {

std::error_code aborted() { return std::make_error_code(std::errc::operation_canceled); }

}  // namespace

// What a subscription holds, shared with the wake-ups posted for it. A wake-up carries the
// generation of the async_next it was made for: one outliving its operation (cancelled, or
// completed by another attempt) finds a newer generation and does nothing.
class subscription_state : public std::enable_shared_from_this<subscription_state> {
public:
    using next_handler = boost::asio::any_completion_handler<subscription::next_signature>;

    subscription_state(std::shared_ptr<commit_watch> watch, change_position after, std::size_t limit)
        : watch_(std::move(watch)), limit_(std::max<std::size_t>(limit, 1)), position_(after) {}

    void next(next_handler handler, engine::executor_type ex) {
        std::unique_lock lock{m_};
        if (handler_) {
            lock.unlock();
            boost::asio::post(ex, [h = std::move(handler)]() mutable {
                std::move(h)(make_error_code(errc::invalid_argument), std::vector<change>{});
            });
            return;
        }
        handler_.emplace(std::move(handler));
        ex_ = ex;
        const auto generation = ++generation_;
        lock.unlock();
        post_attempt(std::move(ex), generation);
    }

    void cancel() {
        std::unique_lock lock{m_};
        if (!handler_) return;
        auto h = std::move(*handler_);
        handler_.reset();
        auto ex = std::move(ex_);
        ++generation_;
        lock.unlock();
        boost::asio::post(ex, [h = std::move(h)]() mutable { std::move(h)(aborted(), std::vector<change>{}); });
    }

    // From the watch: a commit past the one the attempt `generation` saw is durable (or the engine stopped).
    void wake(std::uint64_t generation) {
        std::unique_lock lock{m_};
        if (generation != generation_ || !handler_) return;
        auto ex = ex_;
        lock.unlock();
        post_attempt(std::move(ex), generation);
    }

    change_position position() const {
        std::scoped_lock lock{m_};
        return position_;
    }
    std::string error_message() const {
        std::scoped_lock lock{m_};
        return error_;
    }

private:
    void post_attempt(engine::executor_type ex, std::uint64_t generation) {
        boost::asio::post(ex, [self = shared_from_this(), generation] { self->attempt(generation); });
    }

    // Runs on the handler's executor: reads what is durable after the position, and completes
    // with it, or sleeps until the writer makes the next commit durable.
    void attempt(std::uint64_t generation) {
        change_position from;
        {
            std::scoped_lock lock{m_};
            if (generation != generation_ || !handler_) return;
            from = position_;
        }
        auto found = watch_->read(from, limit_);
        std::unique_lock lock{m_};
        if (generation != generation_ || !handler_) return;
        if (found.ec || !found.changes.empty()) {
            if (found.ec) {
                error_ = std::move(found.message);
            } else {
                position_ = found.changes.back().position;
            }
            auto h = std::move(*handler_);
            handler_.reset();
            auto ex = std::move(ex_);  // the work it tracks ends once the handler has run
            ++generation_;
            lock.unlock();
            // This runs on the handler's executor already (posted there), never inside async_next.
            std::move(h)(found.ec, std::move(found.changes));
            return;
        }
        auto ex = ex_;
        lock.unlock();
        if (!watch_->wake_after(found.durable, shared_from_this(), generation)) post_attempt(std::move(ex), generation);
    }

    std::shared_ptr<commit_watch> watch_;
    const std::size_t limit_;
    mutable std::mutex m_;
    change_position position_;
    std::string error_;
    std::optional<next_handler> handler_;
    engine::executor_type ex_;  // the outstanding handler's, tracking work
    std::uint64_t generation_ = 0;
};

std::shared_ptr<subscription_state> new_subscription(std::shared_ptr<commit_watch> watch, change_position after,
                                                     std::size_t limit) {
    return std::make_shared<subscription_state>(std::move(watch), after, limit);
}

// --- the watch ------------------------------------------------------------------------------------

void commit_watch::advance(std::uint64_t durable) {
    std::vector<commit_waiter> due;
    std::vector<sleeper> sleepers;
    {
        std::scoped_lock lock{m_};
        if (durable <= durable_) return;
        durable_ = durable;
        // Every sleeper saw a durable commit below this one (wake_after refuses the others).
        sleepers.swap(sleepers_);
        auto first_due = std::partition(waiters_.begin(), waiters_.end(),
                                        [&](const commit_waiter& w) { return w.commit > durable_; });
        std::move(first_due, waiters_.end(), std::back_inserter(due));
        waiters_.erase(first_due, waiters_.end());
    }
    wake(due, sleepers, false);
}

void commit_watch::stop() {
    std::vector<commit_waiter> due;
    std::vector<sleeper> sleepers;
    {
        std::scoped_lock lock{m_};
        stopped_ = true;
        sleepers.swap(sleepers_);
        due.swap(waiters_);
    }
    wake(due, sleepers, true);
}

void commit_watch::shutdown() {
    stop();
    std::unique_lock lock{m_};
    idle_.wait(lock, [&] { return readers_ == 0; });
}

void commit_watch::wake(std::vector<commit_waiter>& due, std::vector<sleeper>& sleepers, bool stopped) {
    const auto ec = stopped ? aborted() : std::error_code{};
    for (auto& w : due) {
        boost::asio::post(w.ex, [h = std::move(w.handler), ec]() mutable { std::move(h)(ec); });
    }
    for (auto& s : sleepers) s.sub->wake(s.generation);
}

void commit_watch::wait_commit(std::uint64_t commit, wait_handler handler, engine::executor_type ex) {
    std::unique_lock lock{m_};
    if (commit > durable_ && !stopped_) {
        waiters_.push_back(commit_waiter{commit, std::move(handler), std::move(ex)});
        return;
    }
    const auto ec = commit > durable_ ? aborted() : std::error_code{};
    lock.unlock();
    boost::asio::post(ex, [h = std::move(handler), ec]() mutable { std::move(h)(ec); });
}

commit_watch::batch commit_watch::read(change_position after, std::size_t limit) {
    batch out;
    {
        std::scoped_lock lock{m_};
        if (stopped_) {
            out.ec = aborted();
            return out;
        }
        ++readers_;
        out.durable = durable_;
    }
    try {
        auto snap = store_->read();
        out.changes = snap.changes_after(after, limit);
        // A snapshot may see a commit the writer has not yet counted durable: it waits its turn.
        std::erase_if(out.changes, [&](const change& c) { return c.position.commit > out.durable; });
    } catch (const std::system_error& e) {
        out.ec = e.code();
        out.message = e.what();
        out.changes.clear();
    } catch (const std::exception& e) {
        out.ec = make_error_code(errc::storage_failed);
        out.message = e.what();
        out.changes.clear();
    }
    std::scoped_lock lock{m_};
    if (--readers_ == 0) idle_.notify_all();
    return out;
}

bool commit_watch::wake_after(std::uint64_t seen, std::shared_ptr<subscription_state> sub, std::uint64_t generation) {
    std::scoped_lock lock{m_};
    if (stopped_ || durable_ > seen) return false;
    sleepers_.push_back(sleeper{std::move(sub), generation});
    return true;
}

}  // namespace detail

// --- the public face --------------------------------------------------------------------------------

subscription::subscription(std::shared_ptr<detail::subscription_state> state, executor_type ex)
    : state_(std::move(state)), executor_(std::move(ex)) {}

subscription::subscription(subscription&&) noexcept = default;

subscription& subscription::operator=(subscription&& other) noexcept {
    if (this != &other) {
        if (state_) state_->cancel();
        state_ = std::move(other.state_);
        executor_ = other.executor_;
    }
    return *this;
}

subscription::~subscription() {
    if (state_) state_->cancel();
}

void subscription::next(boost::asio::any_completion_handler<next_signature> handler, executor_type ex) {
    state_->next(std::move(handler), std::move(ex));
}

change_position subscription::position() const { return state_->position(); }

std::string subscription::error_message() const { return state_->error_message(); }

void subscription::cancel() { state_->cancel(); }

}  // namespace idem
