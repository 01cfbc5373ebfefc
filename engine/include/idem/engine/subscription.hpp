#pragma once

// Following the change feed of a running engine: each async_next completes with the next whole
// commits' entries once they are durable, woken by the engine's writer (no polling).

#include <idem/projections/changes.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/prefer.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace idem {

namespace detail {
class subscription_state;
}

/// A reader of an engine's change feed, from a position on (engine::subscribe).
///
/// It may outlive its engine: once the engine stops, async_next completes with
/// operation_canceled. Its members are not meant to be called concurrently, except cancel().
class subscription {
public:
    using executor_type = boost::asio::any_io_executor;
    /// The completion signature of async_next.
    using next_signature = void(std::error_code, std::vector<change>);

    subscription(subscription&&) noexcept;
    subscription& operator=(subscription&&) noexcept;
    subscription(const subscription&) = delete;
    subscription& operator=(const subscription&) = delete;
    /// Cancels an outstanding async_next (it completes with operation_canceled).
    ~subscription();

    /// Waits for the next durable commits after position() that have entries, and completes with
    /// their entries: whole commits, in commit order, at most about the subscription's limit
    /// (more only if one commit alone has more); then position() is the last entry's.
    /// The handler is never invoked from within this function; it runs on its associated
    /// executor (default: the engine's). Any completion token (callback, use_future, use_awaitable).
    /// Errors: errc::changes_pruned if the feed no longer holds the entries after position()
    /// (error_message() names the oldest commit kept); std::errc::operation_canceled (ECANCELED,
    /// Asio's operation_aborted) after cancel(), the subscription's destruction or the engine's
    /// stop; errc::invalid_argument if an async_next is outstanding already. With use_future
    /// and use_awaitable the result is a std::tuple<std::error_code, std::vector<change>>.
    template <boost::asio::completion_token_for<next_signature> CompletionToken>
    auto async_next(CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, next_signature>(
            [this](auto handler) {
                auto ex = boost::asio::prefer(boost::asio::get_associated_executor(handler, executor_),
                                              boost::asio::execution::outstanding_work.tracked);
                next(boost::asio::any_completion_handler<next_signature>(std::move(handler)), std::move(ex));
            },
            token);
    }

    /// Returns the position of the last entry delivered (the one subscribed after, before any):
    /// store it to subscribe after it later, in this process or another.
    change_position position() const;
    /// Returns the text of the last error async_next completed with ("" if none): for
    /// changes_pruned, the commits asked for and the oldest commit the feed keeps.
    std::string error_message() const;
    /// Completes an outstanding async_next with operation_canceled; a later one waits again.
    void cancel();
    /// Returns the executor completions default to (the engine's).
    const executor_type& get_executor() const noexcept { return executor_; }

private:
    friend class engine;
    subscription(std::shared_ptr<detail::subscription_state> state, executor_type ex);
    void next(boost::asio::any_completion_handler<next_signature> handler, executor_type ex);

    std::shared_ptr<detail::subscription_state> state_;
    executor_type executor_;
};

}  // namespace idem
