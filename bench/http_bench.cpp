// http_bench: the HTTP source under load. Signed single-event POSTs (Standard Webhooks), 10% of
// them a sender's retry of an earlier message (re-signed, answered duplicate_message), under
// durability::full, from closed-loop keep-alive connections (1, 16, 256), then an open loop at
// half the peak rate for its p99; beside it, the same deliveries through engine::async_apply
// in process (the limit without HTTP), with as many closed-loop submitters.
//
//   http_bench [--requests N] [--single N] [--connections LIST] [--half-seconds S] [--dir D] [--quick]
//
// The server runs idem::http::server on its own thread (as `idem serve` does); the client is
// this file's: one thread, raw sockets and epoll, every connection kept alive, the answer
// read whole (Content-Length) before the connection's next request. Latency is from the
// moment a request was due (closed loop: sent) to its answer's last byte. Every answer must be
// 200, applied or duplicate_message, and every event applied exactly once (exit 1 otherwise).
// Prints a Markdown table and the ratios.

#include <idem/examples/orders.hpp>
#include <idem/idem.hpp>
#include <idem/sources/http.hpp>

#include <boost/asio/io_context.hpp>

#include <openssl/hmac.h>
#include <openssl/evp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace asio = boost::asio;
using clock_type = std::chrono::steady_clock;

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr,
                 "http_bench: %s\n"
                 "usage: http_bench [--requests N] [--single N] [--connections LIST] [--half-seconds S] [--dir D]"
                 " [--quick]\n",
                 why);
    std::exit(2);
}

[[noreturn]] void fail(const std::string& why) {
    std::fprintf(stderr, "http_bench: %s\n", why.c_str());
    std::exit(1);
}

const std::string key = "bench signing key, 32 bytes long";  // a whsec_ secret's decoded bytes

std::string base64(const unsigned char* p, std::size_t n) {
    std::string out(4 * ((n + 2) / 3), '\0');
    EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), p, static_cast<int>(n));
    return out;
}

// One POST of the workload: its bytes (signed when generated), and what it must be answered.
struct request {
    std::string bytes;
    idem::delivery d;  // the same event for the in-process run
    std::size_t event = 0;  // which event of the workload: a retry shares its original's
};

// Every event must be applied exactly once, whichever of its requests got there first (a
// retry may be in flight together with its original); the others are duplicate_message.
void check_once(const std::vector<request>& reqs, const std::vector<int>& applied, const char* run) {
    for (const auto& r : reqs) {
        if (applied[r.event] != 1) {
            fail(std::string(run) + ": event " + r.d.message_id + " was applied " + std::to_string(applied[r.event]) +
                 " times");
        }
    }
}

std::vector<request> workload(std::size_t n, std::uint64_t seed, std::size_t first_id) {
    std::mt19937_64 rng{seed};
    std::vector<request> out;
    const auto now = std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
    std::size_t fresh = 0;
    while (out.size() < n) {
        const bool retry = fresh > 0 && rng() % 10 == 0;
        const auto i = first_id + (retry ? rng() % fresh : fresh++);
        const auto id = "m-" + std::to_string(i);
        const auto body = R"({"specversion":"1.0","id":")" + id +
                          R"(","source":"/bench","type":"order.line_added","dataschema":"urn:idem:example:order.line_added:2",)"
                          R"("data":{"order_id":"o-)" + std::to_string(i % 1000) + R"(","amount":{"minor":)" +
                          std::to_string(i % 97) + R"(,"currency":"EUR"}}})";
        const auto signed_text = id + "." + now + "." + body;
        unsigned char mac[32];
        unsigned len = 0;
        HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(signed_text.data()), signed_text.size(), mac, &len);
        request r;
        r.bytes = "POST /events HTTP/1.1\r\nHost: bench\r\nContent-Type: application/cloudevents+json\r\nwebhook-id: " +
                  id + "\r\nwebhook-timestamp: " + now + "\r\nwebhook-signature: v1," + base64(mac, len) +
                  "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        r.d.body = body;
        r.d.message_id = id;
        r.d.transport = "webhook:bench";
        r.event = i - first_id;
        out.push_back(std::move(r));
    }
    return out;
}

struct result {
    double rate = 0;
    double p50_ms = 0;
    double p99_ms = 0;
};

result summarize(std::vector<double>& lat, double seconds) {
    std::sort(lat.begin(), lat.end());
    auto at = [&](double q) { return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<std::size_t>(q * static_cast<double>(lat.size())))]; };
    return {static_cast<double>(lat.size()) / seconds, at(0.50) * 1e3, at(0.99) * 1e3};
}

// The engine and the server over a fresh store, the server's io_context on its own thread.
struct served {
    asio::io_context io;
    idem::engine e;
    std::optional<idem::http::server> srv;
    std::thread t;

    static idem::engine_options engine_options(const std::filesystem::path& dir) {
        idem::engine_options eo;
        eo.store.path = dir;
        eo.store.sync = idem::durability::full;
        eo.max_in_flight = 65536;
        return eo;
    }
    static idem::http::server_options server_options() {
        idem::http::server_options so;
        idem::http::webhook_secret w;
        w.name = "bench";
        w.keys = {key};
        so.webhooks.push_back(w);
        so.max_in_flight = 65536;
        so.max_connections = 1024;
        return so;
    }
    explicit served(const std::filesystem::path& dir) : e{io.get_executor(), engine_options(dir)} {
        e.add(idem::examples::order_totals());
        srv.emplace(io.get_executor(), e, server_options());
        t = std::thread([this] { io.run(); });
    }
    ~served() {
        std::promise<void> done;
        srv->async_stop([&](std::error_code) { e.async_stop([&](std::error_code) { done.set_value(); }); });
        done.get_future().wait();
        io.stop();
        t.join();
    }
};

// The client: connections kept alive, one epoll thread. rate 0: closed loop; else requests are
// due at that rate and wait for a free connection (their latency counts the wait).
result run_http(std::uint16_t port, const std::vector<request>& reqs, std::size_t conns, double rate) {
    struct conn {
        int fd = -1;
        std::size_t req = 0;
        std::size_t sent = 0;
        bool busy = false;
        clock_type::time_point due;
        std::string in;
    };
    std::vector<conn> cs(conns);
    const int ep = epoll_create1(0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_port = htons(port);
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (std::size_t i = 0; i < conns; ++i) {
        cs[i].fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(cs[i].fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(cs[i].fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) fail("cannot connect");
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = i;
        epoll_ctl(ep, EPOLL_CTL_ADD, cs[i].fd, &ev);
    }
    std::vector<double> lat;
    lat.reserve(reqs.size());
    std::vector<int> applied(reqs.size());
    std::size_t next = 0, done = 0;
    const auto start = clock_type::now();
    auto due_of = [&](std::size_t k) {
        return rate == 0 ? clock_type::now()
                         : start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(static_cast<double>(k) / rate));
    };
    auto send_on = [&](conn& c) {
        c.req = next++;
        c.due = due_of(c.req);
        c.busy = true;
        const auto& b = reqs[c.req].bytes;
        // A request is a few hundred bytes: the socket buffer takes it whole.
        if (::send(c.fd, b.data(), b.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(b.size())) fail("short send");
    };
    auto feed = [&] {
        for (auto& c : cs) {
            if (next == reqs.size()) return;
            if (c.busy) continue;
            if (rate != 0 && due_of(next) > clock_type::now()) return;
            send_on(c);
        }
    };
    feed();
    char buf[65536];
    epoll_event evs[256];
    while (done < reqs.size()) {
        int timeout = -1;
        if (rate != 0 && next < reqs.size()) {
            const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(due_of(next) - clock_type::now());
            timeout = static_cast<int>(std::max<long>(0, wait.count()));
        }
        const int n = epoll_wait(ep, evs, 256, timeout);
        for (int k = 0; k < n; ++k) {
            auto& c = cs[evs[k].data.u64];
            const auto got = ::recv(c.fd, buf, sizeof buf, 0);
            if (got <= 0) fail("the server closed a connection");
            c.in.append(buf, static_cast<std::size_t>(got));
            const auto end = c.in.find("\r\n\r\n");
            if (end == std::string::npos) continue;
            const auto cl = c.in.find("Content-Length: ");
            if (cl == std::string::npos || cl > end) fail("an answer without Content-Length");
            const auto length = std::strtoull(c.in.c_str() + cl + 16, nullptr, 10);
            if (c.in.size() < end + 4 + length) continue;
            lat.push_back(std::chrono::duration<double>(clock_type::now() - c.due).count());
            const bool was_applied = c.in.find("\"applied\"") != std::string::npos;
            const bool ok = c.in.starts_with("HTTP/1.1 200") &&
                            (was_applied || c.in.find("duplicate_message") != std::string::npos);
            if (!ok) fail("request " + std::to_string(c.req) + " was answered: " + c.in);
            applied[reqs[c.req].event] += was_applied ? 1 : 0;
            c.in.clear();
            c.busy = false;
            ++done;
        }
        feed();
    }
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    for (auto& c : cs) ::close(c.fd);
    ::close(ep);
    check_once(reqs, applied, "HTTP");
    return summarize(lat, seconds);
}

// The same deliveries through engine::async_apply, closed loop, as many submitters.
result run_in_process(const std::filesystem::path& dir, const std::vector<request>& reqs, std::size_t submitters) {
    asio::io_context io;
    idem::engine e{io.get_executor(), served::engine_options(dir)};
    e.add(idem::examples::order_totals());
    std::vector<double> lat(reqs.size());
    std::size_t next = 0, finished = 0;
    std::atomic<std::size_t> wrong{0};
    std::vector<int> applied(reqs.size());
    const auto start = clock_type::now();
    std::function<void()> submit = [&] {
        if (next == reqs.size()) return;
        const auto i = next++;
        const auto t0 = clock_type::now();
        e.async_apply(reqs[i].d, [&, i, t0](std::error_code ec, idem::outcome out) {
            lat[i] = std::chrono::duration<double>(clock_type::now() - t0).count();
            if (ec || (out.kind != idem::outcome_kind::applied && out.kind != idem::outcome_kind::duplicate_message)) {
                ++wrong;
            }
            applied[reqs[i].event] += out.kind == idem::outcome_kind::applied ? 1 : 0;
            ++finished;
            submit();
        });
    };
    for (std::size_t s = 0; s < submitters; ++s) submit();
    while (finished < reqs.size()) io.run_one();
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    e.async_stop([](std::error_code) {});
    io.run();
    if (wrong != 0) fail(std::to_string(wrong.load()) + " in-process deliveries were neither applied nor duplicates");
    check_once(reqs, applied, "in process");
    return summarize(lat, seconds);
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t requests = 20'000, single = 2'000;
    double half_seconds = 5;
    std::vector<std::size_t> connections{1, 16, 256};
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("idem-http-bench-" + std::to_string(getpid()));
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value for " + a).c_str());
            return argv[++i];
        };
        if (a == "--quick") {
            requests = 1'000, single = 100, half_seconds = 1;
        } else if (a == "--requests") {
            requests = std::stoul(value());
        } else if (a == "--single") {
            single = std::stoul(value());
        } else if (a == "--half-seconds") {
            half_seconds = std::stod(value());
        } else if (a == "--dir") {
            dir = value();
        } else if (a == "--connections") {
            connections.clear();
            std::string list = value();
            for (std::size_t p = 0; p <= list.size();) {
                const auto q = std::min(list.find(',', p), list.size());
                connections.push_back(std::stoul(list.substr(p, q - p)));
                p = q + 1;
            }
        } else {
            usage(("unknown option " + a).c_str());
        }
    }
    std::printf("| run | connections | requests | req/s | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|---:|\n");
    auto row = [](const char* run, std::size_t c, std::size_t n, const result& r) {
        std::printf("| %s | %zu | %zu | %.0f | %.2f | %.2f |\n", run, c, n, r.rate, r.p50_ms, r.p99_ms);
        std::fflush(stdout);
    };
    std::vector<std::pair<result, result>> pairs;
    double peak = 0;
    std::size_t run_no = 0, ids = 0;
    for (auto c : connections) {
        const auto n = c == 1 ? single : requests;
        const auto reqs = workload(n, 19 + c, ids);
        ids += n;
        result http;
        {
            served s{dir / ("http-" + std::to_string(run_no))};
            http = run_http(s.srv->local_endpoint().port(), reqs, c, 0);
        }
        const auto local = run_in_process(dir / ("local-" + std::to_string(run_no)), reqs, c);
        ++run_no;
        row("HTTP", c, n, http);
        row("in process", c, n, local);
        pairs.emplace_back(http, local);
        peak = std::max(peak, http.rate);
    }
    const auto top = connections.empty() ? 0 : *std::max_element(connections.begin(), connections.end());
    const auto half_n = std::max<std::size_t>(1, static_cast<std::size_t>(peak / 2 * half_seconds));
    const auto reqs = workload(half_n, 7, ids);
    result half;
    {
        served s{dir / "half"};
        half = run_http(s.srv->local_endpoint().port(), reqs, top, peak / 2);
    }
    std::printf("| HTTP, open loop at %.0f req/s | %zu | %zu | %.0f | %.2f | %.2f |\n", peak / 2, top, half_n,
                half.rate, half.p50_ms, half.p99_ms);
    std::printf("\n");
    for (std::size_t i = 0; i < connections.size(); ++i) {
        std::printf("HTTP / in process at %zu connections: %.2f\n", connections[i],
                    pairs[i].first.rate / pairs[i].second.rate);
    }
    std::printf("p99 at half the peak rate: %.2f ms (target <= 10 ms)\n", half.p99_ms);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return 0;
}
