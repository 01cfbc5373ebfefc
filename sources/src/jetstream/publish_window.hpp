#pragma once

// Publishing to a JetStream stream with a window of acks outstanding, shared by `idem publish`
// (log records) and `idem relay` (change feed entries): messages go out asynchronously, at most
// max_pending awaiting their ack; a publish that fails in transit or whose ack does not come
// within ack_timeout is sent again under the same Nats-Msg-Id (the stream's Duplicates window
// drops the retry of one that was in fact stored) until it is acked or retry_for has passed.
// What a message is stays the caller's: a tag of two numbers it names in errors (a log and its
// line; a commit and its index). Also here: connecting with retries, and setting up the stream.

#include "connection.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace idem::jetstream::detail {

struct msg_deleter {
    void operator()(natsMsg* m) const noexcept { natsMsg_Destroy(m); }
};
/// A message, owned until it is handed to cnats.
using msg_ptr = std::unique_ptr<natsMsg, msg_deleter>;

/// Which message a publish was, in the caller's terms, for the error that names it.
struct message_tag {
    std::uint64_t major = 0;  ///< a log's index; a commit
    std::uint64_t minor = 0;  ///< a line; an entry's index in its commit
};

/// How the window publishes.
struct window_options {
    std::size_t max_pending = 1024;               ///< publishes awaiting their ack at most
    std::chrono::milliseconds ack_timeout{5000};  ///< an ack not received within is a failed publish (retried)
    std::chrono::milliseconds retry_for{60000};   ///< how long a failing message is retried before giving up
};

/// What the window's acks said.
struct window_counts {
    std::uint64_t stored = 0;          ///< acked as stored
    std::uint64_t duplicates = 0;      ///< acked as dropped by the stream's Duplicates window
    std::uint64_t retries = 0;         ///< publishes sent again after a failure or a missing ack
    std::uint64_t first_sequence = 0;  ///< the lowest stream sequence stored (0: none)
    std::uint64_t last_sequence = 0;   ///< the highest stream sequence stored (0: none)
};

/// Publishes messages on a connection, a window of acks outstanding (see above).
class publish_window {
public:
    /// `where` names a message for errors ("orders.jsonl line 7"); c must outlive the window.
    publish_window(const connection& c, const window_options& o, std::function<std::string(const message_tag&)> where);
    ~publish_window();
    publish_window(const publish_window&) = delete;
    publish_window& operator=(const publish_window&) = delete;

    /// Sends msg asynchronously. Returns false, not sending it, when it exceeds the server's max
    /// payload (the caller counts and names it); failures in transit are retried by the window.
    bool send(msg_ptr msg, message_tag tag);
    /// Sends the messages that failed so far again, after a short pause (none: returns at once);
    /// throws errc::broker_failed once one has been failing longer than retry_for or was refused
    /// by the stream itself (a JetStream error code), naming it.
    void resend_failed();
    /// Returns whether a publish has failed and waits to be sent again.
    bool has_failures();
    /// Waits until every message sent has been acked, sending failed ones again meanwhile.
    void finish();
    /// Returns what the acks said so far.
    window_counts counts();
    /// Returns the server's max payload.
    std::int64_t max_payload() const noexcept { return max_payload_; }

private:
    struct origin;
    struct failure;
    struct state;
    class context;
    static void on_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure);
    bool send_from(msg_ptr msg, const origin& from);
    void resend(bool wait_first);
    void take_back_pending();
    [[noreturn]] void give_up(const failure& f, std::chrono::steady_clock::duration failing) const;

    window_options o_;
    std::function<std::string(const message_tag&)> where_;
    const connection& conn_;
    std::unique_ptr<state> st_;  // before the context: cnats' thread never sees it gone
    std::unique_ptr<context> js_;
    std::int64_t max_payload_ = 0;
    std::uint64_t retries_ = 0;
};

/// The stream a publisher writes to, as asked for.
struct stream_request {
    std::string stream;
    std::string pattern;  ///< the subject a new stream captures
    std::string sent;     ///< what the messages' subjects look like (an existing stream must capture it)
    int replicas = 1;
    std::optional<std::chrono::nanoseconds> duplicates_window{};  ///< a new stream's; unset: the server's
};

/// The stream as it is.
struct stream_setup {
    bool created = false;
    std::vector<std::string> subjects;
    std::chrono::nanoseconds duplicates_window{0};
    int replicas = 0;
};

/// Creates the stream if it is missing; checks that an existing one captures r.sent (else
/// errc::invalid_argument naming its subjects). A cluster still forming is waited for up to retry_for.
stream_setup set_up_stream(const connection& c, const stream_request& r, std::chrono::milliseconds retry_for);

/// Connects to servers ("URL[,URL...]" entries), waiting up to retry_for for servers that are
/// starting; errc::invalid_argument for no server.
std::unique_ptr<connection> connect_publisher(const std::vector<std::string>& servers, const std::string& name,
                                              std::chrono::milliseconds ack_timeout,
                                              std::chrono::milliseconds retry_for);

}  // namespace idem::jetstream::detail
