// The HTTP server: Beast connections, each on its own strand of the embedder's executor, so
// that with several threads running it connections are parsed, their signatures checked,
// their events prepared and their answers written in parallel; the accept loop keeps to a
// strand of its own. A POST's events are submitted to the engine and its answer is written
// from the engine's completions (bound to the connection's strand), which run only after the
// commit holding them is durable; so an answer never runs ahead of the disk. Every read has a
// deadline (a slow client is cut off), the parser bounds the header and the body, and a
// graceful stop answers what is in flight before it closes.

#include <idem/sources/http.hpp>

#include "answers.hpp"
#include "change_stream.hpp"
#include "ingest.hpp"

#include <idem/storage/error.hpp>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <atomic>
#include <mutex>
#include <charconv>
#include <optional>
#include <type_traits>
#include <unordered_map>

namespace idem::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

// A connection as the server sees it (plain or TLS): told to stop when the server stops.
class connection {
public:
    virtual ~connection() = default;
    virtual void stop() = 0;
};

using tls_stream = beast::ssl_stream<beast::tcp_stream>;

enum answer_class : std::size_t { ok_2xx, bad_400, unauthorized_401, too_large, not_found, unavailable };

answer_class class_of(unsigned status) {
    if (status < 300) return ok_2xx;
    if (status == 400) return bad_400;
    if (status == 401) return unauthorized_401;
    if (status == 413 || status == 431) return too_large;
    if (status == 503) return unavailable;
    return not_found;
}

// The process or the system is out of descriptors (or of the memory a socket needs).
bool out_of_descriptors(const beast::error_code& ec) {
    return ec == asio::error::no_descriptors || ec == boost::system::errc::too_many_files_open_in_system ||
           ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
}

bool parse_u64(std::string_view text, std::uint64_t& out) {
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc{} && end == text.data() + text.size() && !text.empty();
}

}  // namespace

struct server::impl : std::enable_shared_from_this<impl> {
    impl(asio::any_io_executor ex, engine& e, server_options options)
        : executor(ex), strand(asio::make_strand(ex)), eng(e), o(std::move(options)), acceptor(strand),
          accept_backoff(strand) {}

    asio::any_io_executor executor;  // each connection gets a strand of it
    asio::strand<asio::any_io_executor> strand;  // the acceptor's
    engine& eng;
    server_options o;
    tcp::acceptor acceptor;
    tcp::endpoint bound;
    std::optional<asio::ssl::context> tls;  // set before the first accept, then only read

    asio::steady_timer accept_backoff;  // out of descriptors: the wait before the next accept
    std::uint64_t next_session = 0;  // on the acceptor's strand
    bool starved = false;            // on the acceptor's strand: accepts failing for want of descriptors
    std::atomic<bool> stopping{false};

    // A connection leaves the table from its destructor, on whichever thread dropped it last.
    std::mutex m;
    std::unordered_map<std::uint64_t, std::weak_ptr<connection>> sessions;
    std::vector<std::pair<asio::any_completion_handler<void(std::error_code)>, asio::any_io_executor>> stopped;

    // Read by stats() from any thread.
    std::array<std::atomic<std::uint64_t>, 6> answers{};
    std::atomic<std::uint64_t> connections{0};
    std::atomic<std::uint64_t> refused{0};
    std::atomic<std::uint64_t> timeouts{0};
    std::atomic<std::uint64_t> in_flight{0};
    std::atomic<std::uint64_t> accept_failures{0};

    void accept();
    void back_off(const beast::error_code& ec);
    void closed(std::uint64_t id);
    void finish_stop_if_done(std::unique_lock<std::mutex>& lock);
    void stop_sessions();
    std::string metrics() const;
};

namespace {

// One connection; Stream is beast::tcp_stream or tls_stream.
template <class Stream>
class session : public connection,
                public detail::event_sink,
                public std::enable_shared_from_this<session<Stream>> {
    static constexpr bool is_tls = std::is_same_v<Stream, tls_stream>;

public:
    // strand is the one the socket was accepted on (its executor).
    template <class... StreamArgs>
    session(std::shared_ptr<server::impl> srv, std::uint64_t id, asio::strand<asio::any_io_executor> strand,
            StreamArgs&&... args)
        : srv_(std::move(srv)), strand_(std::move(strand)), stream_(std::forward<StreamArgs>(args)...), id_(id) {}
    ~session() override { srv_->closed(id_); }

    // Runs on the connection's strand: every handler of the connection does.
    void start() {
        asio::dispatch(strand_, [self = this->shared_from_this()] { self->begin(); });
    }

    // Stopping: an idle connection is closed now, a busy one after its answer, a stream of
    // changes after a last event saying why.
    void stop() override {
        asio::dispatch(strand_, [self = this->shared_from_this()] {
            if (self->changes_) return self->changes_->end("the server is stopping");
            if (!self->busy_) self->close();
        });
    }

    void write_events(std::string_view bytes, std::function<void(std::error_code)> done) override {
        asio::async_write(stream_, asio::buffer(bytes.data(), bytes.size()),
                          [self = this->shared_from_this(), done = std::move(done)](beast::error_code ec, std::size_t) {
                              done(ec);
                          });
    }
    void close_events() override { close(); }

private:
    using response = bhttp::response<bhttp::string_body>;

    void begin() {
        if constexpr (is_tls) {
            // The handshake shares the request's deadline: a client that never finishes it is cut off too.
            lowest().expires_after(srv_->o.read_timeout);
            stream_.async_handshake(asio::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
                if (ec) {
                    if (ec == beast::error::timeout) ++self->srv_->timeouts;
                    return self->close();
                }
                self->read();
            });
        } else {
            read();
        }
    }

    void read() {
        parser_.emplace();
        parser_->body_limit(srv_->o.max_body);
        parser_->header_limit(static_cast<std::uint32_t>(srv_->o.max_header));
        if (answered_ && buffer_.size() == 0) {
            // Between kept-alive requests: idle_timeout for the next one to begin; once its first
            // bytes are here, read_timeout for the whole of it, as for a first request.
            lowest().expires_after(srv_->o.idle_timeout);
            stream_.async_read_some(buffer_.prepare(4096), [self = this->shared_from_this()](beast::error_code ec,
                                                                                            std::size_t n) {
                if (ec) {
                    if (ec == beast::error::timeout) ++self->srv_->timeouts;
                    return self->close();
                }
                self->buffer_.commit(n);
                self->read_request();
            });
            return;
        }
        read_request();
    }

    void read_request() {
        lowest().expires_after(srv_->o.read_timeout);
        bhttp::async_read_header(stream_, buffer_, *parser_, [self = this->shared_from_this()](beast::error_code ec,
                                                                                               std::size_t) {
            self->on_header(ec);
        });
    }

    // A client that asked to be told before it sends the body (curl does past 1 KiB) is told
    // now: the header passed its limits, and a body over max_body was refused with it.
    void on_header(beast::error_code ec) {
        if (ec) return on_read(ec);
        if (!parser_->is_done() && beast::iequals(parser_->get()[bhttp::field::expect], "100-continue") &&
            !srv_->stopping) {
            continue_ = {bhttp::status::continue_, 11};
            bhttp::async_write(stream_, continue_, [self = this->shared_from_this()](beast::error_code wec,
                                                                                     std::size_t) {
                if (wec) return self->close();
                self->read_body();
            });
            return;
        }
        read_body();
    }

    void read_body() {
        bhttp::async_read(stream_, buffer_, *parser_,
                          [self = this->shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
    }

    void on_read(beast::error_code ec) {
        if (ec == bhttp::error::end_of_stream || ec == asio::error::operation_aborted) return close();
        if (ec == beast::error::timeout) {
            ++srv_->timeouts;
            return close();
        }
        if (ec == bhttp::error::body_limit) {
            return answer(413, error_body("the request body exceeds " + std::to_string(srv_->o.max_body) + " bytes"),
                          false);
        }
        if (ec == bhttp::error::header_limit) {
            return answer(431, error_body("the request headers exceed " + std::to_string(srv_->o.max_header) +
                                          " bytes"), false);
        }
        if (ec) return answer(400, error_body("the request is not HTTP/1.1: " + ec.message()), false);
        busy_ = true;
        try {
            route();
        } catch (const std::exception& e) {
            answer(500, error_body(e.what()), false);
        }
    }

    static std::string error_body(std::string_view text) { return detail::error_json(text); }

    void route() {
        const auto& req = parser_->get();
        const std::string_view target{req.target().data(), req.target().size()};
        const auto q = target.find('?');
        const auto path = target.substr(0, q);
        const auto query = q == std::string_view::npos ? std::string_view{} : target.substr(q + 1);
        if (srv_->stopping) return unavailable("the server is stopping");
        const bool get = req.method() == bhttp::verb::get;
        if (path == "/events") {
            if (req.method() != bhttp::verb::post) return answer(405, error_body("POST /events"), true);
            if (auto why = srv_->eng.monitor().pause_reason()) return unavailable("paused by an operator: " + *why);
            return ingest();
        }
        if (!get) return answer(405, error_body("only GET here"), true);
        if (path == "/healthz") return answer(200, "ok\n", true, "text/plain");
        if (path == "/readyz") return ready(detail::readiness(srv_->eng.health()));
        if (path == "/metrics") return answer(200, srv_->metrics(), true, "text/plain; version=0.0.4");
        if (path.starts_with("/rows/")) return read_row(path.substr(6), query);
        if (path == "/changes") return stream_changes(query);
        answer(404, error_body("no route " + std::string(path)), true);
    }

    // GET /changes: the connection becomes a stream (change_stream.cpp) until either side ends it.
    void stream_changes(std::string_view query) {
        const auto& req = parser_->get();
        const auto last_id = req["Last-Event-ID"];
        detail::change_request request;
        auto error = detail::parse_change_request(query, {last_id.data(), last_id.size()}, srv_->o.projections, request);
        if (!error.empty()) return answer(400, error_body(error), true);
        ++srv_->answers[ok_2xx];
        lowest().expires_never();  // the stall time bounds the writes; the reads below wait for the close
        // The kernel's buffer is bounded too, or it would absorb megabytes for a client that reads nothing.
        beast::error_code ignored;
        const auto sndbuf = std::min<std::size_t>(srv_->o.changes_buffer, 1 << 24);
        lowest().socket().set_option(asio::socket_base::send_buffer_size(static_cast<int>(sndbuf)), ignored);
        detail::change_stream_limits limits{srv_->o.changes_buffer, srv_->o.changes_stall, srv_->o.changes_ping};
        changes_ = std::make_shared<detail::change_stream>(strand_, srv_->eng, std::move(request), srv_->o.projections,
                                                           limits, this->shared_from_this());
        changes_->start();
        watch_peer();
    }

    // A client closing its end of a stream is seen by a read (what it sends is ignored).
    void watch_peer() {
        drain_.resize(4096);
        stream_.async_read_some(asio::buffer(drain_), [self = this->shared_from_this()](beast::error_code ec,
                                                                                       std::size_t) {
            if (ec) return self->changes_->close();
            self->watch_peer();
        });
    }

    void unavailable(std::string_view why) { refuse(bhttp::status::service_unavailable, why); }
    void ready(std::pair<unsigned, std::string> a) { answer(a.first, std::move(a.second), true, "text/plain"); }

    // 503 (stopping, or a commit not reached) or 429 (this server's own in-flight limit): the
    // sender is to retry after Retry-After; nothing of the request was submitted.
    void refuse(bhttp::status status, std::string_view why) {
        response r{status, 11};
        r.set(bhttp::field::retry_after, std::to_string(srv_->o.retry_after.count()));
        r.set(bhttp::field::content_type, "application/json");
        r.body() = error_body(why);
        send(std::move(r), !srv_->stopping);
    }

    void ingest() {
        const auto& req = parser_->get();
        detail::header_list h;
        for (const auto& f : req) {
            h.fields.emplace_back(std::string_view{f.name_string().data(), f.name_string().size()},
                                  std::string_view{f.value().data(), f.value().size()});
        }
        const auto now = std::chrono::duration_cast<std::chrono::seconds>(
            std::chrono::system_clock::now().time_since_epoch());
        auto in = detail::read_events(h, req.body(), srv_->o.webhooks, now);
        if (in.status != 0) return answer(in.status, error_body(in.error), true);
        const auto n = in.deliveries.size();
        if (n == 0) return answer(200, detail::outcomes_json({}, srv_->eng.durable_commit()), true);
        const auto limit = srv_->o.max_in_flight != 0 ? srv_->o.max_in_flight : srv_->eng.options().max_in_flight;
        // A batch larger than the limit still goes through alone, or it would be refused forever.
        // Counted before the check, so that connections checking at once cannot pass it together.
        const auto busy = srv_->in_flight.fetch_add(n);
        if (busy > 0 && busy + n > limit) {
            srv_->in_flight -= n;
            return refuse(bhttp::status::too_many_requests,
                          "this server has " + std::to_string(busy) + " events in flight, its limit is " +
                              std::to_string(limit));
        }
        batch_ = in.batch;
        results_.assign(n, {});
        pending_ = n;
        // The completions are bound to the server's executor, not to this connection's strand:
        // the engine's writer then hands a batch's completions over in one post (it groups
        // them by executor) and returns to committing; a server thread moves each onto its
        // connection's strand.
        for (std::size_t i = 0; i < n; ++i) {
            srv_->eng.async_apply(std::move(in.deliveries[i]),
                                  asio::bind_executor(srv_->executor, [self = this->shared_from_this(), i](
                                                                          std::error_code ec, outcome out) mutable {
                                      auto& strand = self->strand_;
                                      asio::dispatch(strand, [self = std::move(self), i, ec, out = std::move(out)]() mutable {
                                          self->on_applied(i, ec, std::move(out));
                                      });
                                  }));
        }
    }

    void on_applied(std::size_t i, std::error_code ec, outcome out) {
        results_[i] = {ec, std::move(out)};
        --srv_->in_flight;
        if (--pending_ > 0) return;
        bool failed = false;
        bool dead = false;
        for (const auto& r : results_) {
            failed |= bool(r.error);
            dead |= !r.error && detail::answered_as_dead_letter(r.result);
        }
        auto body = detail::outcomes_json(results_, srv_->eng.durable_commit());
        if (failed) {
            // Nothing of a failed batch was applied: the sender's retry is the recovery.
            response r{bhttp::status::service_unavailable, 11};
            r.set(bhttp::field::retry_after, std::to_string(srv_->o.retry_after.count()));
            r.set(bhttp::field::content_type, "application/json");
            r.body() = std::move(body);
            return send(std::move(r), !srv_->stopping);
        }
        answer(dead && !batch_ ? 400 : 200, std::move(body), true);
    }

    void read_row(std::string_view rest, std::string_view query) {
        const auto slash = rest.find('/');
        if (slash == std::string_view::npos) return answer(404, error_body("GET /rows/{projection}/{key}"), true);
        const auto name = detail::percent_decode(rest.substr(0, slash));
        const auto key = detail::percent_decode(rest.substr(slash + 1));
        const projection_base* p = nullptr;
        for (const auto& q : srv_->o.projections) {
            if (q->name() == name) p = q.get();
        }
        if (p == nullptr) return answer(404, error_body("no projection '" + name + "'"), true);
        std::uint64_t min_commit = 0;
        for (auto params = query; !params.empty();) {  // name=value pairs split at '&'; others are ignored
            const auto amp = params.find('&');
            const auto param = params.substr(0, amp);
            params = amp == std::string_view::npos ? std::string_view() : params.substr(amp + 1);
            if (!param.starts_with("min_commit=")) continue;
            const auto value = detail::percent_decode(param.substr(11));
            if (!parse_u64(value, min_commit)) {
                return answer(400, error_body("min_commit '" + value + "' is not a commit number"), true);
            }
        }
        const auto deadline = std::chrono::steady_clock::now() + srv_->o.min_commit_wait;
        wait_then_read(p, key, min_commit, deadline);
    }

    // Read-your-writes: waits (polling, briefly) until the durable commit reaches min_commit.
    void wait_then_read(const projection_base* p, std::string key, std::uint64_t min_commit,
                        std::chrono::steady_clock::time_point deadline) {
        if (srv_->eng.durable_commit() < min_commit) {
            if (std::chrono::steady_clock::now() >= deadline) {
                return unavailable("commit " + std::to_string(min_commit) + " is not durable yet");
            }
            timer_.emplace(stream_.get_executor(), std::chrono::milliseconds(5));
            timer_->async_wait([self = this->shared_from_this(), p, key = std::move(key), min_commit,
                                deadline](beast::error_code ec) mutable {
                if (ec) return self->close();
                self->wait_then_read(p, std::move(key), min_commit, deadline);
            });
            return;
        }
        auto snap = srv_->eng.read(min_commit);
        auto r = snap.raw_row(p->name(), key);
        if (!r) return answer(404, error_body("projection '" + p->name() + "' has no row '" + key + "'"), true);
        answer(200, detail::row_json(*p, *r), true);
    }

    void answer(unsigned status, std::string body, bool keep_alive, std::string_view type = "application/json") {
        response r{static_cast<bhttp::status>(status), 11};
        r.set(bhttp::field::content_type, type);
        r.body() = std::move(body);
        send(std::move(r), keep_alive && !srv_->stopping);
    }

    void send(response r, bool keep_alive) {
        const bool client_keep_alive = parser_ && parser_->is_header_done() && parser_->get().keep_alive();
        r.keep_alive(keep_alive && client_keep_alive);
        r.prepare_payload();
        ++srv_->answers[class_of(r.result_int())];
        res_ = std::move(r);
        lowest().expires_after(srv_->o.read_timeout);
        bhttp::async_write(stream_, res_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
            self->busy_ = false;
            self->answered_ = true;
            if (ec) return self->close();
            if (!self->res_.keep_alive() || self->srv_->stopping) return self->linger();
            self->read();
        });
    }

    beast::tcp_stream& lowest() { return beast::get_lowest_layer(stream_); }

    // Closes after the client has read the answer: closing a socket with unread request bytes
    // (a 413's body) resets the connection, and the client may lose the answer with it.
    void linger() {
        if constexpr (is_tls) {
            return close();  // no half-close under TLS: the answer is written, the client has it in flight
        }
        beast::error_code ignored;
        lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
        lowest().expires_after(std::chrono::seconds(2));
        drain_.resize(16 << 10);
        drain_more();
    }
    void drain_more() {
        lowest().async_read_some(asio::buffer(drain_), [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
            if (ec) return self->close();
            self->drain_more();
        });
    }

    void close() {
        beast::error_code ignored;
        lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
        lowest().socket().close(ignored);
    }

    std::shared_ptr<server::impl> srv_;
    // The connection's strand as its own type, for work handed over from other threads: a copy
    // of it shares the strand through a std::shared_ptr, where a copy of the stream's
    // any_io_executor would share a wrapper counted with fences, which ThreadSanitizer cannot
    // follow across threads.
    asio::strand<asio::any_io_executor> strand_;
    Stream stream_;
    std::uint64_t id_;
    beast::flat_buffer buffer_;
    std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
    response res_;
    bhttp::response<bhttp::empty_body> continue_;
    std::optional<asio::steady_timer> timer_;
    std::shared_ptr<detail::change_stream> changes_;  // set: the connection streams GET /changes
    std::vector<detail::event_result> results_;
    std::string drain_;
    std::size_t pending_ = 0;
    bool batch_ = false;
    bool busy_ = false;
    bool answered_ = false;
};

}  // namespace

void server::impl::accept() {
    // The socket comes on a strand of its own: the connection's handlers run on it.
    auto strand_of_next = asio::make_strand(executor);
    acceptor.async_accept(strand_of_next, [self = this->shared_from_this(), strand_of_next](beast::error_code ec,
                                                                                           tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
        if (out_of_descriptors(ec)) return self->back_off(ec);
        if (self->starved) {
            self->starved = false;
            if (self->o.notice) self->o.notice("accepting connections again");
        }
        if (!ec) {
            std::unique_lock lock{self->m};
            if (self->stopping || self->sessions.size() >= self->o.max_connections) {
                lock.unlock();
                ++self->refused;
                beast::error_code ignored;
                socket.close(ignored);
            } else {
                beast::error_code ignored;
                socket.set_option(tcp::no_delay(true), ignored);  // an answer goes out at once
                const auto id = self->next_session++;
                ++self->connections;
                if (self->tls) {
                    auto s = std::make_shared<session<tls_stream>>(self, id, strand_of_next, std::move(socket),
                                                                  *self->tls);
                    self->sessions.emplace(id, s);
                    lock.unlock();
                    s->start();
                } else {
                    auto s = std::make_shared<session<beast::tcp_stream>>(self, id, strand_of_next, std::move(socket));
                    self->sessions.emplace(id, s);
                    lock.unlock();
                    s->start();
                }
            }
        }
        self->accept();
    });
}

// The connection waiting in the listen queue stays there, and the next accept would fail at
// once again: a loop retrying at once would spin a core and starve the connections' handlers.
void server::impl::back_off(const beast::error_code& ec) {
    ++accept_failures;
    if (!starved) {
        starved = true;
        if (o.notice) {
            o.notice("cannot accept connections: " + ec.message() + " (" + std::to_string(connections.load()) +
                     " open); trying again every " + std::to_string(o.accept_backoff.count()) +
                     " ms until descriptors are free (raise the descriptor limit, or lower the connection limit)");
        }
    }
    accept_backoff.expires_after(o.accept_backoff);
    accept_backoff.async_wait([self = shared_from_this()](beast::error_code wec) {
        if (wec || !self->acceptor.is_open()) return;
        self->accept();
    });
}

void server::impl::closed(std::uint64_t id) {
    std::unique_lock lock{m};
    sessions.erase(id);
    --connections;
    finish_stop_if_done(lock);
}

void server::impl::finish_stop_if_done(std::unique_lock<std::mutex>&) {
    if (!stopping || !sessions.empty()) return;
    for (auto& [h, ex] : stopped) {
        asio::post(ex, [h = std::move(h)]() mutable { std::move(h)(std::error_code{}); });
    }
    stopped.clear();
}

void server::impl::stop_sessions() {
    // Copied first, outside the lock: a session dropped here leaves the table from its destructor.
    std::vector<std::shared_ptr<connection>> live;
    {
        std::scoped_lock lock{m};
        for (auto& [id, w] : sessions) {
            if (auto s = w.lock()) live.push_back(std::move(s));
        }
    }
    for (auto& s : live) s->stop();
}

std::string server::impl::metrics() const {
    detail::http_figures f;
    for (std::size_t i = 0; i < f.answers.size(); ++i) f.answers[i] = answers[i].load();
    f.connections = connections.load();
    f.refused = refused.load();
    f.accept_failures = accept_failures.load();
    f.timeouts = timeouts.load();
    f.in_flight = in_flight.load();
    return detail::metrics_text(eng, f);
}

server::server(asio::any_io_executor ex, engine& e, server_options options)
    : executor_(ex), impl_(std::make_shared<impl>(std::move(ex), e, std::move(options))) {
    auto& s = *impl_;
    const auto where = s.o.listen.address().to_string() + ":" + std::to_string(s.o.listen.port());
    beast::error_code ec;
    if (s.o.tls) {
        s.tls.emplace(asio::ssl::context::tls_server);
        s.tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                           asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                           asio::ssl::context::no_tlsv1_1);
        s.tls->use_certificate_chain_file(s.o.tls->certificate_chain, ec);
        if (ec) throw std::system_error(ec, "TLS certificate chain '" + s.o.tls->certificate_chain + "'");
        s.tls->use_private_key_file(s.o.tls->private_key, asio::ssl::context::pem, ec);
        if (ec) throw std::system_error(ec, "TLS private key '" + s.o.tls->private_key + "'");
    }
    s.acceptor.open(s.o.listen.protocol(), ec);
    if (!ec) s.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) s.acceptor.bind(s.o.listen, ec);
    if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw std::system_error(ec, "cannot listen on " + where);
    s.bound = s.acceptor.local_endpoint();
    asio::dispatch(s.strand, [self = impl_] { self->accept(); });
}

server::~server() {
    // Closing the acceptor ends the accept loop; sessions hold the state they need.
    asio::dispatch(impl_->strand, [self = impl_] {
        beast::error_code ignored;
        self->acceptor.close(ignored);
        self->accept_backoff.cancel();
        self->stop_sessions();
    });
}

tcp::endpoint server::local_endpoint() const { return impl_->bound; }

server_stats server::stats() const {
    server_stats st;
    for (std::size_t i = 0; i < st.answers.size(); ++i) st.answers[i] = impl_->answers[i].load();
    st.connections = impl_->connections.load();
    st.refused_connections = impl_->refused.load();
    st.timeouts = impl_->timeouts.load();
    st.in_flight = impl_->in_flight.load();
    st.accept_failures = impl_->accept_failures.load();
    return st;
}

void server::stop(asio::any_completion_handler<void(std::error_code)> handler, asio::any_io_executor ex) {
    asio::post(impl_->strand, [self = impl_, h = std::move(handler), ex = std::move(ex)]() mutable {
        beast::error_code ignored;
        self->acceptor.close(ignored);
        self->accept_backoff.cancel();
        {
            std::unique_lock lock{self->m};
            self->stopping = true;
            self->stopped.emplace_back(std::move(h), std::move(ex));
        }
        self->stop_sessions();
        std::unique_lock lock{self->m};
        self->finish_stop_if_done(lock);
    });
}

}  // namespace idem::http
