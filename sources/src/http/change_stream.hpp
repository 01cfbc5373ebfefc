#pragma once

// GET /changes: the change feed as Server-Sent Events, driven by an engine subscription (woken
// by the writer after each durable commit). The stream holds at most a bounded number of bytes
// for its client and reads the feed no further until the client catches up; a client whose
// socket accepts nothing for the stall time is disconnected. No Beast here: the connection
// writes the bytes (event_sink).

#include <idem/engine/engine.hpp>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace idem::http::detail {

/// What a GET /changes asks for.
struct change_request {
    std::optional<change_position> after;  ///< unset: from now (the current commit)
    bool oldest = false;                   ///< since=oldest: from the oldest entry the feed keeps
    std::string projection;                ///< "": every projection's entries
};

/// Reads since=C[.I]|oldest and projection=P from the query and the Last-Event-ID header (which,
/// when present, wins over since: a reconnecting EventSource repeats the URL and adds it). Returns
/// the error text for a 400 ("" if none).
std::string parse_change_request(std::string_view query, std::string_view last_event_id,
                                 const std::vector<std::shared_ptr<const projection_base>>& projections,
                                 change_request& out);

/// How the connection writes a stream's bytes: one write at a time, done called on the
/// connection's strand with the write's error; close() closes the socket.
class event_sink {
public:
    virtual ~event_sink() = default;
    /// Writes bytes, which stay valid until done runs.
    virtual void write_events(std::string_view bytes, std::function<void(std::error_code)> done) = 0;
    /// Closes the connection (an outstanding write completes with an error).
    virtual void close_events() = 0;
};

/// A stream's bounds.
struct change_stream_limits {
    std::size_t max_buffered = 1 << 20;        ///< bytes held for the client at most (then the feed waits)
    std::chrono::milliseconds stall{10000};     ///< a write the client does not take within this closes it
    std::chrono::milliseconds ping{15000};      ///< a comment line this often, so that proxies keep the stream
};

/// One client's stream; every member runs on the connection's strand.
class change_stream : public std::enable_shared_from_this<change_stream> {
public:
    using strand_type = boost::asio::strand<boost::asio::any_io_executor>;

    change_stream(strand_type strand, engine& e, change_request request,
                  std::vector<std::shared_ptr<const projection_base>> projections, change_stream_limits limits,
                  std::shared_ptr<event_sink> sink);

    /// Writes the response head, then follows the feed.
    void start();
    /// Ends the stream with an `event: error` giving why (if the client takes it in time), then closes.
    void end(std::string_view why);
    /// Closes at once (the client went away).
    void close();

private:
    void read_next();
    void on_changes(std::error_code ec, std::vector<change> batch);
    void flush();
    void on_written(std::error_code ec);
    void arm_ping();
    bool has_room() const { return writing_.size() + queued_.size() < limits_.max_buffered; }

    strand_type strand_;
    engine& engine_;
    change_request request_;
    std::vector<std::shared_ptr<const projection_base>> projections_;
    change_stream_limits limits_;
    std::shared_ptr<event_sink> sink_;  // reset when closed: the connection then goes
    std::optional<subscription> sub_;
    std::string queued_;   // formatted, not yet handed to the socket
    std::string writing_;  // handed to the socket, not yet taken
    boost::asio::steady_timer ping_;
    boost::asio::steady_timer stall_;
    bool reading_ = false;
    bool ending_ = false;
    bool closed_ = false;
};

}  // namespace idem::http::detail
