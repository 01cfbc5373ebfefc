// GET /changes as Server-Sent Events: a subscription's whole commits formatted as `id:`,
// `event: change`, `data:` lines. The feed is read only while the bytes held for the client are
// under the bound, so a slow client costs its own connection's memory and nothing else: the
// engine's writer wakes a stream only while it waits for commits, and never waits for one.

#include "change_stream.hpp"

#include "answers.hpp"
#include "ingest.hpp"

#include <boost/asio/bind_executor.hpp>

namespace idem::http::detail {

namespace asio = boost::asio;

std::string parse_change_request(std::string_view query, std::string_view last_event_id,
                                 const std::vector<std::shared_ptr<const projection_base>>& projections,
                                 change_request& out) {
    for (auto params = query; !params.empty();) {  // name=value pairs split at '&'; others are ignored
        const auto amp = params.find('&');
        const auto param = params.substr(0, amp);
        params = amp == std::string_view::npos ? std::string_view() : params.substr(amp + 1);
        if (param.starts_with("since=")) {
            const auto value = percent_decode(param.substr(6));
            if (value == "oldest") {
                out.oldest = true;
                out.after.reset();
                continue;
            }
            out.after = change_position::parse(value);
            out.oldest = false;
            if (!out.after) return "since '" + value + "' is not a commit (42), a position (42.3) or 'oldest'";
        } else if (param.starts_with("projection=")) {
            out.projection = percent_decode(param.substr(11));
            bool known = false;
            std::string names;
            for (const auto& p : projections) {
                known |= p->name() == out.projection;
                names += (names.empty() ? "" : ", ") + p->name();
            }
            if (!known) return "no projection '" + out.projection + "' (this server has: " + names + ")";
        }
    }
    if (!last_event_id.empty()) {
        auto at = change_position::parse(last_event_id);
        if (!at) return "Last-Event-ID '" + std::string(last_event_id) + "' is not a position (42.3)";
        out.after = at;
        out.oldest = false;
    }
    return {};
}

change_stream::change_stream(strand_type strand, engine& e, change_request request,
                             std::vector<std::shared_ptr<const projection_base>> projections,
                             change_stream_limits limits, std::shared_ptr<event_sink> sink)
    : strand_(std::move(strand)), engine_(e), request_(std::move(request)), projections_(std::move(projections)),
      limits_(limits), sink_(std::move(sink)), ping_(strand_), stall_(strand_) {}

void change_stream::start() {
    // Without since the stream starts at the current commit: a live view, as `tail -f` is; the
    // history is since=oldest (or `idem changes`).
    auto after = request_.after;
    if (!after) {
        auto snap = engine_.read();
        after = change_position{request_.oldest ? snap.change_feed().pruned_through : snap.commit(), UINT32_MAX};
    }
    sub_.emplace(engine_.subscribe(*after));
    // No length: the body ends when the connection closes (HTTP/1.1 with Connection: close).
    queued_ = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
              "Connection: close\r\nX-Accel-Buffering: no\r\n\r\n";
    queued_ += ": after " + after->to_string() + "\n\n";
    flush();
    arm_ping();
    read_next();
}

void change_stream::read_next() {
    if (ending_ || reading_ || !has_room()) return;  // full: on_written reads on once the client took some
    reading_ = true;
    sub_->async_next(asio::bind_executor(strand_, [self = shared_from_this()](std::error_code ec,
                                                                               std::vector<change> batch) {
        self->on_changes(ec, std::move(batch));
    }));
}

void change_stream::on_changes(std::error_code ec, std::vector<change> batch) {
    reading_ = false;
    if (ending_) return;
    if (ec) {
        if (ec == std::errc::operation_canceled) return end("the server is stopping");
        const auto text = sub_->error_message();
        return end(text.empty() ? ec.message() : text);
    }
    for (const auto& c : batch) {
        if (!request_.projection.empty() && c.projection != request_.projection) continue;
        const projection_base* p = nullptr;
        for (const auto& known : projections_) {
            if (known->name() == c.projection) p = known.get();
        }
        queued_ += "id: ";
        queued_ += c.position.to_string();
        queued_ += "\nevent: change\ndata: ";
        append_change_json(queued_, c, p);  // one line: JSON strings escape their newlines
        queued_ += "\n\n";
    }
    flush();
    read_next();
}

void change_stream::flush() {
    if (closed_ || !writing_.empty() || queued_.empty()) return;
    writing_.swap(queued_);
    queued_.clear();
    stall_.expires_after(limits_.stall);
    stall_.async_wait([self = shared_from_this()](std::error_code ec) {
        if (!ec) self->close();  // the client took nothing for the whole stall time
    });
    sink_->write_events(writing_, [self = shared_from_this()](std::error_code ec) { self->on_written(ec); });
}

void change_stream::on_written(std::error_code ec) {
    stall_.cancel();
    writing_.clear();
    if (ec) return close();
    if (ending_ && queued_.empty()) return close();
    flush();
    read_next();
}

void change_stream::arm_ping() {
    ping_.expires_after(limits_.ping);
    ping_.async_wait([self = shared_from_this()](std::error_code ec) {
        if (ec || self->ending_) return;
        // Held back when the client is behind: bytes for it are waiting anyway.
        if (self->writing_.empty() && self->queued_.empty()) {
            self->queued_ = ": ping\n\n";
            self->flush();
        }
        self->arm_ping();
    });
}

void change_stream::end(std::string_view why) {
    if (ending_ || closed_) return;
    ending_ = true;
    ping_.cancel();
    if (sub_) sub_->cancel();
    queued_ += "event: error\ndata: ";
    queued_ += error_json(why);
    queued_ += "\n\n";
    flush();  // the stall timer bounds how long the client may take to accept it
}

void change_stream::close() {
    if (closed_) return;
    closed_ = ending_ = true;
    ping_.cancel();
    stall_.cancel();
    if (sub_) sub_->cancel();
    if (auto sink = std::move(sink_)) sink->close_events();
}

}  // namespace idem::http::detail
