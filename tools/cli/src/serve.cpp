// `serve`: the HTTP source over the engine, on an io_context run by --threads threads (default
// 2: connections are parsed, checked and answered in parallel, each on its own strand, while
// the engine's writer thread commits). It prints the address it listens on as its first line
// of standard output; Ctrl-C or SIGTERM stops gracefully (the requests in
// flight are answered after their commit, the rest refused), then the engine stops.

#include "commands.hpp"
#include "health_file.hpp"
#include "pause_file.hpp"
#include "options.hpp"

#include <idem/engine/engine.hpp>
#include <idem/sources/http.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>

#include <sys/resource.h>

#include <csignal>
#include <cstdio>
#include <thread>
#include <vector>

namespace idem::cli::detail {

namespace {

boost::asio::ip::tcp::endpoint listen_option(const arguments& a) {
    const auto v = a.required("listen");
    const auto colon = v.rfind(':');
    if (colon == std::string::npos) throw usage_error("option '--listen': '" + v + "' is not HOST:PORT");
    auto host = v.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    boost::system::error_code ec;
    auto address = boost::asio::ip::make_address(host, ec);
    if (ec) throw usage_error("option '--listen': '" + host + "' is not an IP address");
    const auto port = v.substr(colon + 1);
    unsigned long n = 0;
    try {
        std::size_t used = 0;
        n = std::stoul(port, &used);
        if (used != port.size() || n > 65535) throw std::out_of_range("port");
    } catch (const std::exception&) {
        throw usage_error("option '--listen': '" + port + "' is not a port (0-65535)");
    }
    return {address, static_cast<unsigned short>(n)};
}

// Descriptors the process keeps besides its connections: standard streams, the store's files
// and lock, the event loop's, the signal pipe, and one a refused connection holds briefly.
constexpr std::size_t reserved_descriptors = 32;

// Caps max_connections by the descriptor limit (ulimit -n): past it accept() fails (EMFILE) and
// connections queue unanswered. Says so when it caps.
std::size_t connections_within_descriptor_limit(const tool_context& t, std::size_t asked) {
    rlimit lim{};
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return asked;
    const auto limit = static_cast<std::size_t>(lim.rlim_cur);
    if (limit <= reserved_descriptors) {
        throw usage_error("the descriptor limit (ulimit -n) is " + std::to_string(limit) + ": serve needs more than " +
                          std::to_string(reserved_descriptors) + " (for its own files, then one per connection)");
    }
    if (asked <= limit - reserved_descriptors) return asked;
    const auto capped = limit - reserved_descriptors;
    std::fprintf(stderr, "%s serve: --max-connections %zu capped to %zu: the descriptor limit (ulimit -n) is %zu, %zu of them kept for the store and the server\n",
                 t.name.c_str(), asked, capped, limit, reserved_descriptors);
    return capped;
}

std::chrono::milliseconds millis_option(const arguments& a, std::string_view name, std::chrono::milliseconds fallback) {
    auto d = duration_option(a, name);
    if (!d) return fallback;
    if (*d <= std::chrono::nanoseconds(0)) throw usage_error("option '--" + std::string(name) + "' must be positive");
    return std::chrono::duration_cast<std::chrono::milliseconds>(*d);
}

int serve(const tool_context& t, const arguments& a) {
    http::server_options so;
    so.listen = listen_option(a);
    for (const auto& f : a.all("webhook-secret-file")) {
        try {
            so.webhooks.push_back(http::read_webhook_secret(f));
        } catch (const std::system_error& e) {
            throw usage_error(std::string("option '--webhook-secret-file': ") + e.what());
        }
    }
    so.projections = t.projections;
    const auto cert = a.get("tls-cert");
    const auto key = a.get("tls-key");
    if (cert.has_value() != key.has_value()) throw usage_error("options '--tls-cert' and '--tls-key' go together");
    if (cert) so.tls = http::tls_files{*cert, *key};
    so.max_body = static_cast<std::size_t>(a.positive("max-body", so.max_body));
    so.max_connections =
        connections_within_descriptor_limit(t, static_cast<std::size_t>(a.positive("max-connections", so.max_connections)));
    so.notice = [name = t.name](std::string_view line) {
        std::fprintf(stderr, "%s serve: %.*s\n", name.c_str(), static_cast<int>(line.size()), line.data());
    };
    so.max_in_flight = static_cast<std::size_t>(a.positive("max-in-flight", 65536));
    so.read_timeout = millis_option(a, "read-timeout", so.read_timeout);
    so.idle_timeout = millis_option(a, "idle-timeout", so.idle_timeout);
    so.changes_buffer = static_cast<std::size_t>(a.positive("changes-buffer", so.changes_buffer));
    so.changes_stall = millis_option(a, "changes-stall", so.changes_stall);
    so.changes_ping = millis_option(a, "changes-ping", so.changes_ping);
    const auto threads = static_cast<std::size_t>(a.positive("threads", 2));

    const std::filesystem::path db = a.required("db");
    engine_options eo;
    eo.store = t.store_for(db);
    eo.store.sync = durability_from(a);
    retention_from(a, eo.store);
    eo.store.retention.clock = retention_clock::wall;  // senders retry in wall time
    if (!eo.store.retention.inbox_retention) eo.store.retention.inbox_retention = std::chrono::hours(24 * 4);
    eo.store.retention.source = http::webhook_redelivery_bound();  // a shorter inbox retention is refused
    eo.max_in_flight = std::max(eo.max_in_flight, so.max_in_flight);
    eo.stall_after = stall_after_from(a);
    for (const auto& w : so.webhooks) {
        // A signed request replayed within its tolerance must still find its message id in the inbox.
        if (w.scheme != http::signature_scheme::github && *eo.store.retention.inbox_retention <= w.tolerance) {
            throw usage_error("webhook sender '" + w.name + "': its tolerance (" + std::to_string(w.tolerance.count()) +
                              " s) must be shorter than --inbox-retention, or a request replayed within it would be "
                              "a new message once the inbox has forgotten the first");
        }
    }

    boost::asio::io_context io;
    engine e{io.get_executor(), eo};
    e.add_projections(t.setup);
    http::server srv{io.get_executor(), e, so};
    health_file health{db, [&e] { return e.health(); }};
    pause_watch paused{db, e.monitor(), record_pauses_in(e)};
    const auto at = srv.local_endpoint();
    std::printf("{\"listening\":\"%s:%u\"}\n", at.address().to_string().c_str(), unsigned(at.port()));
    std::fflush(stdout);

    boost::asio::signal_set signals{io, SIGINT, SIGTERM};
    signals.async_wait([&](const boost::system::error_code& ec, int) {
        if (ec) return;
        std::fprintf(stderr, "%s serve: stopping: answering the requests in flight\n", t.name.c_str());
        srv.async_stop([&](std::error_code) {
            e.async_stop([&](std::error_code) { io.stop(); });
        });
    });
    std::vector<std::thread> more;
    for (std::size_t i = 1; i < threads; ++i) more.emplace_back([&io] { io.run(); });
    io.run();
    for (auto& th : more) th.join();
    const auto st = srv.stats();
    std::fprintf(stderr, "%s serve: stopped; %llu answers 2xx, %llu timeouts\n", t.name.c_str(),
                 static_cast<unsigned long long>(st.answers[0]), static_cast<unsigned long long>(st.timeouts));
    return 0;
}

}  // namespace

command serve_command(context_fn t) {
    return command{
        "serve",
        "serve POST /events (CloudEvents, signed webhooks; answered after the durable commit), GET /rows, "
        "GET /changes?since=C[.I]|oldest&projection=P (the change feed as Server-Sent Events: id C.I, event change, "
        "data as `idem changes`; Last-Event-ID resumes and wins over since; without either, from the current "
        "commit), /metrics, /healthz, /readyz",
        {db_option,
         {"listen", "HOST:PORT", "the address to listen on (port 0: any free port, printed on stdout)", true},
         {"tls-cert", "F", "serve HTTPS with this PEM certificate chain (with --tls-key)"},
         {"tls-key", "F", "the PEM private key of --tls-cert"},
         {"webhook-secret-file", "F",
          "a webhook sender (scheme, secrets, mapping: see docs/HTTP.md); with any, every POST must be signed", false,
          true},
         {"durability", "full|periodic|none", "fsync policy (default full: answered after the fsync)"},
         {"inbox-retention", "D", "keep message ids for D (default 4d: longer than the senders' ~3.2-day retries)"},
         {"max-body", "BYTES", "request body at most (default 1048576; 413 past it)"},
         {"max-connections", "N", "open connections at most (default 256)"},
         {"max-in-flight", "N", "events submitted and not answered at most (default 65536; 429 past it)"},
         {"read-timeout", "D", "a whole request must arrive within D (default 10s; slow clients are cut off)"},
         {"idle-timeout", "D", "a kept-alive connection waits D for its next request (default 30s)"},
         {"changes-buffer", "BYTES",
          "GET /changes: bytes held for a client at most; past it its stream waits for it (default 1048576)"},
         {"changes-stall", "D", "GET /changes: a client that takes no bytes for D is disconnected (default 10s)"},
         {"changes-ping", "D", "GET /changes: a ': ping' comment on an idle stream every D (default 15s)"},
         {"threads", "N", "threads serving connections (default 2; the engine's writer has its own)"},
         change_retention_option, change_keep_option, no_change_feed_option, stall_after_option},
        [t](const arguments& a) { return serve(t(), a); }};
}

}  // namespace idem::cli::detail
