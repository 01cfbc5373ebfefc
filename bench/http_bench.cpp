// http_bench: the HTTP source under load. Signed single-event POSTs (Standard Webhooks), 10% of
// them a sender's retry of an earlier message (re-signed, answered duplicate_message), under
// durability::full, from closed-loop keep-alive connections (1, 16, 256), then an open loop at
// half the peak rate for its p99; beside it, the same deliveries through engine::async_apply
// in process (the limit without HTTP), with as many closed-loop submitters, and an open loop
// at the same half rate (the p99 floor without HTTP); the open loops take turns in --slices
// slices (default 5) so that the disk's slow and fast spells fall on each alike.
//
//   http_bench [--requests N] [--single N] [--connections LIST] [--threads LIST] [--half-seconds S]
//              [--slices K] [--dir D] [--quick]
//
// The server runs idem::http::server on an io_context run by --threads threads (default 1,2:
// each row once per count; `idem serve` runs 2); the client is this file's: one thread, raw
// sockets and epoll, every connection kept alive, the answer read whole (Content-Length)
// before the connection's next request. Latency is from the moment a request was due (closed
// loop: sent) to its answer's last byte. Every answer must be 200, applied or
// duplicate_message, and every event applied exactly once (exit 1 otherwise). Each row also
// gives the engine's own latency (ack: submitted to completed, so the HTTP latency less it is
// what HTTP adds), its commit time (apply + commit + fsync per batch) and batch size, and the
// bench starts by timing fdatasync of one 4 KiB page in --dir: a commit under durability::full
// syncs twice (LMDB syncs the data pages, then writes its meta page with O_DSYNC), so no
// answer comes sooner than two of those. Prints a Markdown table and the ratios.

#include <idem/examples/orders.hpp>
#include <idem/engine.hpp>
#include <idem/sources/http.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>

#include <openssl/hmac.h>
#include <openssl/evp.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
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
                 "usage: http_bench [--requests N] [--single N] [--connections LIST] [--threads LIST]"
                 " [--half-seconds S] [--slices K] [--dir D] [--quick]\n",
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
    double commit_p50_ms = 0;  // the engine's, per batch: apply + commit + fsync
    double commit_p99_ms = 0;
    double batch_p50 = 0;
    double ack_p50_ms = 0;  // the engine's, per delivery: submitted to completed (its share of the latency)
    double ack_p99_ms = 0;
    std::vector<double> lat;  // every request's, seconds, sorted
    double seconds = 0;
};

double quantile(std::vector<double>& v, double q) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

result summarize(std::vector<double>& lat, double seconds, const idem::engine& e) {
    result r;
    r.rate = static_cast<double>(lat.size()) / seconds;
    r.p50_ms = quantile(lat, 0.50) * 1e3;
    r.p99_ms = quantile(lat, 0.99) * 1e3;
    const auto st = e.stats();
    r.commit_p50_ms = st.commit_seconds.p50 * 1e3;
    r.commit_p99_ms = st.commit_seconds.p99 * 1e3;
    r.batch_p50 = st.batch_size.p50;
    r.ack_p50_ms = st.ack_seconds.p50 * 1e3;
    r.ack_p99_ms = st.ack_seconds.p99 * 1e3;
    r.lat = std::move(lat);
    r.seconds = seconds;
    return r;
}

// Runs of one kind in slices, taken as one: latencies pooled; the engine's figures are the
// median over the slices (its distributions are per engine).
result pooled(const std::vector<result>& slices) {
    result r;
    std::vector<double> c50, c99, b50, a50, a99;
    for (const auto& s : slices) {
        a50.push_back(s.ack_p50_ms);
        a99.push_back(s.ack_p99_ms);
        r.lat.insert(r.lat.end(), s.lat.begin(), s.lat.end());
        r.seconds += s.seconds;
        c50.push_back(s.commit_p50_ms);
        c99.push_back(s.commit_p99_ms);
        b50.push_back(s.batch_p50);
    }
    r.rate = static_cast<double>(r.lat.size()) / r.seconds;
    r.p50_ms = quantile(r.lat, 0.50) * 1e3;
    r.p99_ms = quantile(r.lat, 0.99) * 1e3;
    r.commit_p50_ms = quantile(c50, 0.5);
    r.commit_p99_ms = quantile(c99, 0.5);
    r.batch_p50 = quantile(b50, 0.5);
    r.ack_p50_ms = quantile(a50, 0.5);
    r.ack_p99_ms = quantile(a99, 0.5);
    return r;
}

// fdatasync of one rewritten 4 KiB page in dir, count times: the samples in seconds.
std::vector<double> fsync_probe(const std::filesystem::path& dir, int count) {
    std::filesystem::create_directories(dir);
    const auto path = dir / "fsync-probe";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) fail("cannot create " + path.string());
    std::string page(4096, 'x');
    std::vector<double> lat;
    for (int i = 0; i < count; ++i) {
        if (::pwrite(fd, page.data(), page.size(), (i % 64) * 4096) != 4096) fail("cannot write " + path.string());
        const auto t0 = clock_type::now();
        if (::fdatasync(fd) != 0) fail("cannot fdatasync " + path.string());
        lat.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    ::close(fd);
    std::filesystem::remove(path);
    return lat;
}

// The engine and the server over a fresh store, the server's io_context on its own threads.
struct served {
    asio::io_context io;
    idem::engine e;
    std::optional<idem::http::server> srv;
    std::vector<std::thread> ts;

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
    served(const std::filesystem::path& dir, std::size_t threads) : e{io.get_executor(), engine_options(dir)} {
        e.add(idem::examples::order_totals());
        srv.emplace(io.get_executor(), e, server_options());
        for (std::size_t i = 0; i < threads; ++i) ts.emplace_back([this] { io.run(); });
    }
    ~served() {
        std::promise<void> done;
        srv->async_stop([&](std::error_code) { e.async_stop([&](std::error_code) { done.set_value(); }); });
        done.get_future().wait();
        io.stop();
        for (auto& t : ts) t.join();
    }
};

// The client: connections kept alive, one epoll thread. rate 0: closed loop; else requests are
// due at that rate and wait for a free connection (their latency counts the wait).
result run_http(const served& s, const std::vector<request>& reqs, std::size_t conns, double rate) {
    const auto port = s.srv->local_endpoint().port();
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
        // Sleeps until the next request is due, to the nanosecond (epoll_wait's milliseconds
        // would round a wait under 1 ms to 0 and spin, taking a core from the server).
        timespec timeout{};
        timespec* wait_for = nullptr;
        if (rate != 0 && next < reqs.size()) {
            const auto wait = std::max(clock_type::duration::zero(), due_of(next) - clock_type::now());
            const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(wait).count();
            timeout.tv_sec = ns / 1'000'000'000;
            timeout.tv_nsec = ns % 1'000'000'000;
            wait_for = &timeout;
        }
        const int n = epoll_pwait2(ep, evs, 256, wait_for, nullptr);
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
    return summarize(lat, seconds, s.e);
}

// The same deliveries through engine::async_apply: closed loop with as many submitters (rate
// 0), or open loop at rate (each submitted when due, its latency counted from then).
result run_in_process(const std::filesystem::path& dir, const std::vector<request>& reqs, std::size_t submitters,
                      double rate) {
    asio::io_context io;
    idem::engine e{io.get_executor(), served::engine_options(dir)};
    e.add(idem::examples::order_totals());
    std::vector<double> lat(reqs.size());
    std::size_t next = 0, finished = 0;
    std::atomic<std::size_t> wrong{0};
    std::vector<int> applied(reqs.size());
    const auto start = clock_type::now();
    auto due_of = [&](std::size_t k) {
        return start + std::chrono::duration_cast<clock_type::duration>(
                           std::chrono::duration<double>(static_cast<double>(k) / rate));
    };
    std::function<void()> submit;
    auto apply = [&](std::size_t i, clock_type::time_point t0) {
        e.async_apply(reqs[i].d, [&, i, t0](std::error_code ec, idem::outcome out) {
            lat[i] = std::chrono::duration<double>(clock_type::now() - t0).count();
            if (ec || (out.kind != idem::outcome_kind::applied && out.kind != idem::outcome_kind::duplicate_message)) {
                ++wrong;
            }
            applied[reqs[i].event] += out.kind == idem::outcome_kind::applied ? 1 : 0;
            ++finished;
            if (rate == 0) submit();
        });
    };
    submit = [&] {
        if (next == reqs.size()) return;
        const auto i = next++;
        apply(i, clock_type::now());
    };
    asio::steady_timer timer{io};
    std::function<void()> tick = [&] {
        while (next < reqs.size() && due_of(next) <= clock_type::now()) {
            apply(next, due_of(next));
            ++next;
        }
        if (next == reqs.size()) return;
        timer.expires_at(due_of(next));
        timer.async_wait([&](boost::system::error_code) { tick(); });
    };
    if (rate == 0) {
        for (std::size_t s = 0; s < submitters; ++s) submit();
    } else {
        tick();
    }
    while (finished < reqs.size()) io.run_one();
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    auto r = summarize(lat, seconds, e);
    e.async_stop([](std::error_code) {});
    io.run();
    if (wrong != 0) fail(std::to_string(wrong.load()) + " in-process deliveries were neither applied nor duplicates");
    check_once(reqs, applied, "in process");
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t requests = 20'000, single = 2'000;
    double half_seconds = 5;
    std::size_t slices = 5;
    std::vector<std::size_t> connections{1, 16, 256};
    std::vector<std::size_t> threads{1, 2};
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("idem-http-bench-" + std::to_string(getpid()));
    auto list_of = [](const std::string& list) {
        std::vector<std::size_t> out;
        for (std::size_t p = 0; p <= list.size();) {
            const auto q = std::min(list.find(',', p), list.size());
            out.push_back(std::stoul(list.substr(p, q - p)));
            p = q + 1;
        }
        return out;
    };
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage(("missing value for " + a).c_str());
            return argv[++i];
        };
        if (a == "--quick") {
            requests = 1'000, single = 100, half_seconds = 1, slices = 2;
        } else if (a == "--requests") {
            requests = std::stoul(value());
        } else if (a == "--single") {
            single = std::stoul(value());
        } else if (a == "--half-seconds") {
            half_seconds = std::stod(value());
        } else if (a == "--slices") {
            slices = std::max<std::size_t>(1, std::stoul(value()));
        } else if (a == "--dir") {
            dir = value();
        } else if (a == "--connections") {
            connections = list_of(value());
        } else if (a == "--threads") {
            threads = list_of(value());
        } else {
            usage(("unknown option " + a).c_str());
        }
    }
    if (connections.empty() || threads.empty() || std::find(threads.begin(), threads.end(), 0) != threads.end()) {
        usage("--connections and --threads take positive numbers");
    }
    auto sync_ms = [](std::vector<double> v) { return std::make_pair(quantile(v, 0.5) * 1e3, quantile(v, 0.99) * 1e3); };
    const auto [sync_p50, sync_p99] = sync_ms(fsync_probe(dir, 200));
    std::printf("fdatasync of one 4 KiB page in %s: p50 %.2f ms, p99 %.2f ms\n\n", dir.c_str(), sync_p50, sync_p99);
    std::printf("| run | server threads | connections | requests | req/s | p50 ms | p99 ms | engine ack p50 ms "
                "| engine ack p99 ms | commit p50 ms | commit p99 ms | batch p50 |\n"
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    auto row = [](const std::string& run, std::size_t t, std::size_t c, std::size_t n, const result& r) {
        const auto ts = t == 0 ? std::string("-") : std::to_string(t);
        std::printf("| %s | %s | %zu | %zu | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f |\n", run.c_str(),
                    ts.c_str(), c, n, r.rate, r.p50_ms, r.p99_ms, r.ack_p50_ms, r.ack_p99_ms, r.commit_p50_ms,
                    r.commit_p99_ms, r.batch_p50);
        std::fflush(stdout);
    };
    struct ratio {
        std::size_t connections, threads;
        double value;
    };
    std::vector<ratio> ratios;
    double peak = 0;
    std::size_t run_no = 0, ids = 0;
    for (auto c : connections) {
        const auto n = c == 1 ? single : requests;
        const auto reqs = workload(n, 19 + c, ids);
        ids += n;
        std::vector<result> http;
        for (auto t : threads) {
            served s{dir / ("http-" + std::to_string(run_no++)), t};
            http.push_back(run_http(s, reqs, c, 0));
        }
        const auto local = run_in_process(dir / ("local-" + std::to_string(run_no++)), reqs, c, 0);
        for (std::size_t k = 0; k < threads.size(); ++k) {
            row("HTTP", threads[k], c, n, http[k]);
            ratios.push_back({c, threads[k], http[k].rate / local.rate});
            peak = std::max(peak, http[k].rate);
        }
        row("in process", 0, c, n, local);
    }
    const auto top = *std::max_element(connections.begin(), connections.end());
    // The open loops take turns in slices (HTTP with each thread count, then in process), so
    // that the disk's slow and fast spells, which come and go by the second here, fall on each
    // alike; each slice is a fresh store. fdatasync is timed between the rounds.
    const auto slice_n = std::max<std::size_t>(1, static_cast<std::size_t>(peak / 2 * half_seconds) / slices);
    const auto half_n = slice_n * slices;
    std::vector<std::vector<result>> http_slices(threads.size());
    std::vector<result> local_slices;
    std::vector<double> half_syncs;
    for (std::size_t round = 0; round < slices; ++round) {
        const auto reqs = workload(slice_n, 7 + round, ids);
        ids += slice_n;
        for (std::size_t k = 0; k < threads.size(); ++k) {
            served s{dir / ("half-" + std::to_string(round) + "-" + std::to_string(k)), threads[k]};
            http_slices[k].push_back(run_http(s, reqs, top, peak / 2));
        }
        local_slices.push_back(run_in_process(dir / ("half-local-" + std::to_string(round)), reqs, top, peak / 2));
        const auto probe = fsync_probe(dir, 50);
        half_syncs.insert(half_syncs.end(), probe.begin(), probe.end());
    }
    std::vector<result> half;
    for (const auto& h : http_slices) half.push_back(pooled(h));
    const auto half_local = pooled(local_slices);
    char label[64];
    std::snprintf(label, sizeof label, "open loop at %.0f req/s", peak / 2);
    for (std::size_t k = 0; k < threads.size(); ++k) row(std::string("HTTP, ") + label, threads[k], top, half_n, half[k]);
    row(std::string("in process, ") + label, 0, top, half_n, half_local);
    std::printf("\n");
    for (const auto& r : ratios) {
        std::printf("HTTP (%zu server threads) / in process at %zu connections: %.2f\n", r.threads, r.connections,
                    r.value);
    }
    for (std::size_t k = 0; k < threads.size(); ++k) {
        std::printf("p99 at half the peak rate, %zu server threads: %.2f ms (target <= 10 ms); in process: %.2f ms\n",
                    threads[k], half[k].p99_ms, half_local.p99_ms);
    }
    const auto [half_p50, half_p99] = sync_ms(half_syncs);
    std::printf("fdatasync of one 4 KiB page between the open-loop slices: p50 %.2f ms, p99 %.2f ms\n", half_p50,
                half_p99);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    return 0;
}
