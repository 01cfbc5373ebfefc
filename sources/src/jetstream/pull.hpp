#pragma once

// Pulling from a JetStream pull consumer, and acknowledging what was pulled, without cnats'
// natsSubscription_Fetch and natsMsg_Ack. Before 3.5 (Debian 12 has 3.4.1) that Fetch writes
// past the end of its message array (nats.c PR 749): a fetch that starts with messages already
// pending counts toward a batch it has lowered by them, so it takes every message that comes
// until its timeout. Messages pending at a fetch's start are what a reconnect leaves (pull
// requests buffered while disconnected are sent together, each answered in full) or a link that
// was silent for a while; the overrun then corrupted the heap of a consumer whose broker
// connection was reset. Here a fetch never takes more than it was asked for: what is left stays
// pending for the next one.
//
// Each pull request replies to an inbox subject of its own, so a status that ends a request
// (404 no messages, 408 expired, 409) is told apart from one of an older request that came late.
// The messages are plain NATS messages of this subscription: they are acked by publishing to
// their reply subject (natsMsg_Ack needs a subscription made by cnats' JetStream functions).

#include "connection.hpp"

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace idem::jetstream::detail {

/// Messages fetched, destroyed with it unless taken out (set to null).
struct fetched_messages {
    std::vector<natsMsg*> msgs;
    fetched_messages() = default;
    fetched_messages(const fetched_messages&) = delete;
    fetched_messages& operator=(const fetched_messages&) = delete;
    ~fetched_messages() { clear(); }
    /// Destroys the messages still held.
    void clear() noexcept;
};

/// Pull requests to one consumer of one stream, on a subscription of its own.
class pull_fetcher {
public:
    /// Subscribes to an inbox of its own on c; throws errc::broker_failed.
    pull_fetcher(const connection& c, const std::string& stream, const std::string& consumer);
    ~pull_fetcher();
    pull_fetcher(const pull_fetcher&) = delete;
    pull_fetcher& operator=(const pull_fetcher&) = delete;

    /// Replaces out's messages with at most n of the consumer's, waiting at most wait for them.
    /// Messages already pending are handed out without a request. Returns NATS_OK when it has
    /// messages; when none came, NATS_NOT_FOUND if the server said so (404, 408), NATS_TIMEOUT if
    /// nothing answered within wait; else the failure: NATS_ERR for a
    /// status such as 409 (failure() says which), or cnats' status (a disconnect).
    natsStatus fetch(fetched_messages& out, int n, std::chrono::milliseconds wait);
    /// What the server answered to the last request that failed with NATS_ERR.
    const std::string& failure() const noexcept { return failure_; }

private:
    const connection& conn_;
    std::string next_subject_;  // $JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>
    std::string inbox_;         // requests reply to <inbox>.<request number>
    natsSubscription* sub_ = nullptr;
    std::uint64_t requests_ = 0;
    std::string failure_;
};

/// Acknowledges msg ("+ACK"); with sync, waits up to timeout for the server's confirmation.
natsStatus ack(const connection& c, natsMsg* msg, bool sync, std::chrono::milliseconds timeout);
/// Asks the server to deliver msg again after delay ("-NAK").
natsStatus nak(const connection& c, natsMsg* msg, std::chrono::milliseconds delay);
/// Tells the server msg is still being worked on ("+WPI"): its ack wait starts again.
natsStatus in_progress(const connection& c, natsMsg* msg);

}  // namespace idem::jetstream::detail
