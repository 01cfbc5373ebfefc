#pragma once

// The HTTP source: CloudEvents over HTTP and signed webhooks applied through an engine, each
// request answered only after the commit holding its events is durable; row reads, Prometheus
// metrics and health checks on the same server.
//
//   idem::engine e{io.get_executor(), eo};
//   e.add(positions());
//   idem::http::server_options so;
//   so.listen = {boost::asio::ip::make_address("127.0.0.1"), 8080};
//   idem::http::server srv{io.get_executor(), e, so};   // binds and accepts
//   ...
//   srv.async_stop(token);  // in-flight requests answered, the rest refused
//
// Routes: POST /events (structured, binary and batched CloudEvents, or a signed webhook),
// GET /rows/{projection}/{key}[?min_commit=C], GET /changes[?since=C[.I]|oldest][&projection=P]
// (Server-Sent Events, docs/HTTP.md), GET /metrics, GET /healthz, GET /readyz.
// Answers: 200 with the outcomes after the durable commit (a duplicate too), 400 with the
// dead-letter reason (a retry of a dead-lettered message too: the first delivery's answer), 401 for a missing or wrong signature (nothing applied or stored), 413
// too large, 415 unknown content type, 429 with Retry-After at the server's in-flight limit,
// 503 with Retry-After while stopping or when the engine fails a commit. Needs the meson feature `http` (Boost.Beast, OpenSSL).

#include <idem/engine/engine.hpp>
#include <idem/sources/webhook_signature.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace idem::http {

/// How a webhook body that is not a CloudEvent becomes one: each attribute is a JSON pointer
/// into the body ("/data/object/id") or "header:NAME" (a request header); "" leaves it unset.
struct webhook_mapping {
    std::string source;   ///< the CloudEvents source of the wrapped events (a fixed text)
    std::string type;     ///< e.g. "header:X-GitHub-Event" or "/type"
    std::string subject;  ///< e.g. "/repository/full_name" or "/data/object/id"
    std::string id;       ///< e.g. "/id"; "" takes the message id (webhook-id, X-GitHub-Delivery)
};

/// One configured webhook sender.
struct webhook_secret {
    std::string name;                   ///< names the sender in messages and its inbox transport
    signature_scheme scheme = signature_scheme::standard_webhooks;
    std::vector<std::string> keys;      ///< raw key bytes (key_from_secret); several for rotation
    std::chrono::seconds tolerance{300};  ///< Standard Webhooks and Stripe: how far the timestamp may be from now
    /// Set: bodies are wrapped as CloudEvents by it; unset: bodies must be CloudEvents themselves.
    std::optional<webhook_mapping> mapping{};
};

/// Reads a webhook secret file: "key = value" lines, '#' comments. Keys: scheme
/// (standard-webhooks, github, stripe), secret (one or more: rotation), tolerance (5m),
/// source, type, subject, id (the mapping; any of them set makes one). The name is the file's
/// stem. Throws errc::invalid_argument naming the file, the line and the cause.
webhook_secret read_webhook_secret(const std::string& path);

/// How long a webhook sender retries, which the inbox retention must exceed: Standard Webhooks'
/// schedule spans about 3.2 days and Stripe's 3 days.
redelivery_bound webhook_redelivery_bound();

/// The PEM files of a TLS server.
struct tls_files {
    std::string certificate_chain;  ///< the server's certificate, then its intermediates
    std::string private_key;
};

/// Options of an HTTP server.
struct server_options {
    boost::asio::ip::tcp::endpoint listen{boost::asio::ip::address_v4::loopback(), 0};  ///< port 0: any free port
    std::optional<tls_files> tls{};          ///< set: HTTPS only (TLS 1.2 and later)
    std::vector<webhook_secret> webhooks{};  ///< none: unsigned CloudEvents accepted; some: every POST must be signed
    /// The projections GET /rows reads (their names and JSON rendering).
    std::vector<std::shared_ptr<const projection_base>> projections{};
    std::size_t max_body = 1 << 20;          ///< bytes of a request body at most (413 past it)
    std::size_t max_header = 16 << 10;       ///< bytes of a request's headers at most (431 past it)
    std::size_t max_connections = 256;       ///< open connections at most; past it new ones are refused
    std::size_t max_in_flight = 0;           ///< events submitted and not answered at most (429 past it); 0: the engine's
    std::chrono::milliseconds read_timeout{10000};  ///< a whole request must arrive within (slow clients are cut off)
    std::chrono::milliseconds idle_timeout{30000};  ///< a kept-alive connection waits this long for the next request
    std::chrono::milliseconds min_commit_wait{1000};  ///< GET /rows?min_commit waits this long at most
    std::chrono::seconds retry_after{1};     ///< the Retry-After of a 429 or a 503
    /// GET /changes: bytes a stream holds for its client at most (and its socket's send buffer);
    /// past it the stream reads the feed no further until the client has taken some (the
    /// engine's writer never waits for it).
    std::size_t changes_buffer = 1 << 20;
    /// GET /changes: a client that takes none of its stream's bytes for this long is disconnected.
    std::chrono::milliseconds changes_stall{10000};
    /// GET /changes: an idle stream sends a comment line this often, so that proxies keep it open.
    std::chrono::milliseconds changes_ping{15000};
    /// Out of descriptors (EMFILE, ENFILE) the accept loop waits this long before it tries again,
    /// rather than spinning on the error; connections wait in the listen queue meanwhile.
    std::chrono::milliseconds accept_backoff{100};
    /// Called with a line for the operator's log: the accept loop ran out of descriptors (once
    /// per run of failures) and accepts again. Called on the accept loop's strand; unset: silent.
    std::function<void(std::string_view)> notice{};
};

/// Counters of a running server, by request.
struct server_stats {
    std::array<std::uint64_t, 6> answers{};  ///< answers by class: 2xx, 400, 401, 413/431, other 4xx (429 too), 503
    std::uint64_t connections = 0;           ///< open now
    std::uint64_t refused_connections = 0;   ///< past max_connections
    std::uint64_t timeouts = 0;              ///< connections cut off by read_timeout or idle_timeout
    std::uint64_t in_flight = 0;             ///< events submitted and not answered
    std::uint64_t accept_failures = 0;       ///< accepts that failed for want of descriptors (each one backed off)
};

/// An HTTP server over an engine, on the caller's executor.
///
/// Thread safety: each connection's handlers run on a strand of its own of the executor given
/// (the accept loop on another), so the executor may be run by several threads, which then
/// serve connections in parallel; its functions may be called from any thread. The engine must
/// outlive the server.
class server {
public:
    /// Loads the TLS files if any, binds options.listen and starts accepting. Throws
    /// std::system_error naming the file or the address.
    server(boost::asio::any_io_executor ex, engine& e, server_options options);
    /// Closes every connection without answering; call async_stop first for a graceful stop.
    ~server();
    server(const server&) = delete;
    server& operator=(const server&) = delete;

    /// Returns the address the server listens on (with the port chosen when 0 was asked).
    boost::asio::ip::tcp::endpoint local_endpoint() const;
    /// Returns the counters.
    server_stats stats() const;

    /// Stops gracefully: stops accepting, answers the requests whose events are in flight, refuses
    /// (503, Connection: close) requests that arrive meanwhile, closes idle connections; completes
    /// once every connection is closed. The handler is not invoked from within this function.
    template <boost::asio::completion_token_for<void(std::error_code)> CompletionToken>
    auto async_stop(CompletionToken&& token) {
        return boost::asio::async_initiate<CompletionToken, void(std::error_code)>(
            [this](auto handler) {
                auto ex = boost::asio::prefer(boost::asio::get_associated_executor(handler, executor_),
                                              boost::asio::execution::outstanding_work.tracked);
                stop(boost::asio::any_completion_handler<void(std::error_code)>(std::move(handler)), std::move(ex));
            },
            token);
    }

    struct impl;  ///< opaque: the implementation's state

private:
    void stop(boost::asio::any_completion_handler<void(std::error_code)> handler, boost::asio::any_io_executor ex);
    boost::asio::any_io_executor executor_;
    std::shared_ptr<impl> impl_;
};

}  // namespace idem::http
