#pragma once

// A connection to NATS with its JetStream context, owned: the one place that turns cnats
// status codes into idem errors and a `--nats` server list into cnats options. The JetStream
// source and the publisher both use it; neither calls nats_Close (an embedding application
// may use cnats itself): the application does, through close_nats_library() (the CLI does
// at the end of its NATS commands).

#include <nats/nats.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace idem::jetstream::detail {

/// Splits "URL[,URL...]" into its URLs; throws errc::invalid_argument for an empty list or entry.
std::vector<std::string> split_servers(std::string_view list);

/// A broker failure that passes once the broker is reachable again or its cluster has formed
/// (transient()): what a run rides out for a while (broker_watch) instead of stopping at once.
class broker_unreachable : public std::system_error {
public:
    using std::system_error::system_error;
};

/// Whether a failure passes with time: a timeout, no responders, no connection or a lost one,
/// JetStream temporarily unavailable or without a leader or the peers to place on (a cluster
/// that is forming or has lost its quorum).
bool transient(natsStatus s, jsErrCode js = static_cast<jsErrCode>(0)) noexcept;

/// Throws std::system_error(errc::broker_failed) naming what and the cnats status, its last
/// error text and, if non-zero, the JetStream error code; broker_unreachable if transient().
[[noreturn]] void throw_nats(natsStatus s, const std::string& what, jsErrCode js = static_cast<jsErrCode>(0));

/// Throws as throw_nats if s is not NATS_OK.
inline void check_nats(natsStatus s, const std::string& what, jsErrCode js = static_cast<jsErrCode>(0)) {
    if (s != NATS_OK) throw_nats(s, what, js);
}

/// Connection events seen on cnats' own callback thread (counted; read from any thread).
struct connection_events {
    std::atomic<std::uint64_t> disconnects{0};
    std::atomic<std::uint64_t> reconnects{0};
    std::atomic<std::uint64_t> async_errors{0};
    std::atomic<bool> closed{false};
};

/// A connection and its JetStream context. Reconnects forever (a broker restarting is waited
/// for, not fatal); the first connect fails at once if no server answers.
class connection {
public:
    /// Connects to servers (nats://host:port); name is the client name the server shows.
    /// request_timeout bounds JetStream API requests (stream and consumer info, AckSync).
    connection(const std::vector<std::string>& servers, const std::string& name,
               std::chrono::milliseconds request_timeout = std::chrono::seconds(5));
    ~connection();
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    natsConnection* nc() const noexcept { return nc_; }
    jsCtx* js() const noexcept { return js_; }
    const connection_events& events() const noexcept { return *events_; }
    /// The servers as given, for messages.
    const std::string& servers() const noexcept { return servers_text_; }

    /// Sends a PING and waits for its PONG: every message published (acks included) before it
    /// has been processed by the server. Throws on timeout.
    void flush(std::chrono::milliseconds timeout);
    /// Unsubscribes subs (null ones skipped) and destroys them once this connection's reader
    /// thread can no longer be handing them a message: cnats before 3.6.1 (Debian 12 has 3.4.1)
    /// looks a message's subscription up, lets go of its lock and only then locks the
    /// subscription, so destroying it in between is a use-after-free (nats.c issue 637). One
    /// flush after the unsubscribes has the reader thread past every message the server sent
    /// before they reached it; while disconnected the reader thread hands out nothing, and the
    /// flush (which would wait for a reconnect) is skipped.
    void release(std::initializer_list<natsSubscription*> subs) const noexcept;

private:
    natsOptions* opts_ = nullptr;
    natsConnection* nc_ = nullptr;
    jsCtx* js_ = nullptr;
    std::unique_ptr<connection_events> events_;  // cnats' callbacks hold its address
    std::string servers_text_;
};

/// Stream information, owned.
using stream_info_ptr = std::unique_ptr<jsStreamInfo, decltype(&jsStreamInfo_Destroy)>;
/// Consumer information, owned.
using consumer_info_ptr = std::unique_ptr<jsConsumerInfo, decltype(&jsConsumerInfo_Destroy)>;

/// Returns the stream's information, or null if it does not exist; throws on other failures.
stream_info_ptr stream_info(const connection& c, const std::string& stream);
/// Returns the consumer's information, or null if it does not exist; throws on other failures.
consumer_info_ptr consumer_info(const connection& c, const std::string& stream, const std::string& consumer);

}  // namespace idem::jetstream::detail
