// jetstream_bench: idem consuming a file-backed JetStream stream with durability::full, against
// the two consumers that bound it, in one run:
//
//   bare      fetch + ack, nothing stored: the rate the broker and the client library allow,
//             the limit for any consumer
//   textbook  the textbook idempotent consumer on raw LMDB (bench/compare/compare_lmdb.cpp's
//             schema) fed by the same fetch loop: per message, a processed-ids check and a
//             read-modify-write of the order row; a synced commit every 1000 messages, then
//             the acks of those 1000
//   idem      idem::jetstream::source over an idem::engine (durability::full), the order-totals
//             projection (jetstream_bench_idem.cpp; built when bench/meson.build's
//             jetstream_source_ready is true)
//
//   jetstream_bench [--messages N] [--aggregates A] [--quick] [--only bare|textbook|idem]
//                   [--max-ack-pending P] [--fetch-batch B] [--idem-max-delay-us U] [--runs R] [--seed S] [--dir D]
//
// The bench starts its own nats-server (random port, store in its temporary directory) and
// publishes the workload once: bench/workload.hpp's order lines, 10% of them copies of earlier
// events re-published under a NEW Nats-Msg-Id, so the stream holds them and the consumer must
// recognise the event (its CloudEvents source + id); 1% of the events are also published twice
// in a row under the SAME id, which the stream's duplicate window drops. Each contender then
// consumes the whole stream through its own durable pull consumer, one after the other. Both
// contenders that keep rows must end with the reference totals of the distinct events.

#include "jetstream_bench.hpp"

#include <idem/storage/envelope.hpp>

#include <fcntl.h>
#include <lmdb.h>
#include <simdjson.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

extern char** environ;

[[noreturn]] void idem_bench::usage(const char* why) {
    std::fprintf(stderr,
                 "jetstream_bench: %s\n"
                 "usage: jetstream_bench [--messages N] [--aggregates A] [--quick] [--only bare|textbook|idem]\n"
                 "                       [--max-ack-pending P] [--fetch-batch B] [--idem-max-delay-us U] [--runs R] [--seed S] [--dir D]\n"
                 "       jetstream_bench --nats URLS --stream S [--runs R] [--fetch-batch B] [--max-ack-pending P]\n"
                 "                       the bare fetch+ack rate of an existing stream (a cluster's, say): each run\n"
                 "                       consumes all of it through a durable of its own\n"
                 "  --messages N         messages in the stream (default 1,000,000; --quick 50,000)\n"
                 "  --aggregates A       orders (default 100,000; --quick 5,000)\n"
                 "  --only NAME          run one contender\n"
                 "  --max-ack-pending P  each consumer's MaxAckPending (default 4096)\n"
                 "  --fetch-batch B      messages per fetch at most (default 500)\n"
                 "  --idem-max-delay-us U  idem's engine max_delay: a busy writer waits up to U us to fill a batch (default 0)\n"
                 "  --runs R             run the contenders R times, interleaved; the table shows each one's\n"
                 "                       median run (default 1)\n"
                 "  --dir D              where the server's store and the contenders' stores go\n"
                 "                       (default: a temporary directory, removed at the end)\n"
                 "Needs nats-server on the PATH.\n",
                 why);
    std::exit(2);
}

namespace {

using namespace idem_bench;
using namespace idem_bench::js;

constexpr const char* stream_name = "BENCH";
constexpr const char* subject = "bench.orders";
constexpr double republished_share = 0.10;  // copies of earlier events under a new Nats-Msg-Id
constexpr std::size_t same_id_every = 100;  // every 100th event is also published again under its id
constexpr std::uint64_t textbook_per_txn = 1000;

struct bench_options {
    std::size_t messages = 1'000'000;
    std::size_t aggregates = 100'000;
    std::string only{};
    std::int64_t max_ack_pending = 4096;
    int fetch_batch = 500;
    std::int64_t idem_max_delay_us = 0;
    std::uint64_t seed = 42;
    std::size_t runs = 1;
    std::filesystem::path dir{};
    std::string nats{};    // an existing server or cluster (--nats): only the bare rate of its stream
    std::string stream{};  // that stream
};

bench_options parse_args(int argc, char** argv) {
    bench_options o;
    std::optional<std::size_t> messages;
    std::optional<std::size_t> aggregates;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--quick") {
            quick = true;
            continue;
        }
        if (arg == "--help" || arg == "-h") usage("idem on JetStream against bare fetch+ack and the textbook consumer");
        if (i + 1 >= argc) usage(("missing value for " + std::string(arg)).c_str());
        std::string_view value = argv[++i];
        if (arg == "--messages") {
            messages = parse_number<std::size_t>(arg, value);
        } else if (arg == "--aggregates") {
            aggregates = parse_number<std::size_t>(arg, value);
        } else if (arg == "--only") {
            o.only = std::string(value);
            if (o.only != "bare" && o.only != "textbook" && o.only != "idem")
                usage("--only takes bare, textbook or idem");
        } else if (arg == "--max-ack-pending") {
            o.max_ack_pending = parse_number<std::int64_t>(arg, value);
        } else if (arg == "--fetch-batch") {
            o.fetch_batch = parse_number<int>(arg, value);
        } else if (arg == "--idem-max-delay-us") {
            o.idem_max_delay_us = parse_number<std::int64_t>(arg, value);
        } else if (arg == "--runs") {
            o.runs = parse_number<std::size_t>(arg, value);
            if (o.runs == 0) usage("--runs must be positive");
        } else if (arg == "--seed") {
            o.seed = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--dir") {
            o.dir = std::string(value);
        } else if (arg == "--nats") {
            o.nats = std::string(value);
        } else if (arg == "--stream") {
            o.stream = std::string(value);
        } else {
            usage(("unknown option " + std::string(arg)).c_str());
        }
    }
    // Explicit sizes win over --quick wherever they appear on the line.
    if (quick) {
        o.messages = 50'000;
        o.aggregates = 5'000;
    }
    if (messages) o.messages = *messages;
    if (aggregates) o.aggregates = *aggregates;
    if (o.messages < 10 || o.aggregates == 0) usage("--messages must be at least 10 and --aggregates positive");
    if (o.fetch_batch <= 0 || o.max_ack_pending < o.fetch_batch) usage("need 0 < --fetch-batch <= --max-ack-pending");
    if (o.nats.empty() != o.stream.empty()) usage("--nats and --stream go together");
    return o;
}

double seconds_since(clock_type::time_point from) {
    return std::chrono::duration<double>(clock_type::now() - from).count();
}

// --- cnats -------------------------------------------------------------------------

void check_nats(natsStatus s, const std::string& what, jsErrCode js = static_cast<jsErrCode>(0)) {
    if (s == NATS_OK) return;
    std::string text = what + ": " + natsStatus_GetText(s);
    if (const char* last = nats_GetLastError(nullptr); last != nullptr && *last != '\0')
        text += " (" + std::string(last) + ")";
    if (js != 0) text += " [jetstream error " + std::to_string(static_cast<int>(js)) + "]";
    throw std::runtime_error(text);
}

// Owns what one connection needs. The publisher's async acks arrive on cnats' own thread and
// only count into atomics.
struct publish_acks {
    std::atomic<std::uint64_t> stored{0};
    std::atomic<std::uint64_t> duplicates{0};  // dropped by the stream's duplicate window
    std::atomic<std::uint64_t> failed{0};
};

void on_publish_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    auto& acks = *static_cast<publish_acks*>(closure);
    if (pa != nullptr && pa->Duplicate) {
        acks.duplicates.fetch_add(1, std::memory_order_relaxed);
    } else if (pa != nullptr) {
        acks.stored.fetch_add(1, std::memory_order_relaxed);
    } else if (pae != nullptr) {
        acks.failed.fetch_add(1, std::memory_order_relaxed);
    }
    natsMsg_Destroy(msg);
}

class nats_client {
public:
    explicit nats_client(const std::string& url, publish_acks* acks = nullptr) {
        check_nats(natsOptions_Create(&opts_), "natsOptions_Create");
        // One URL, or a cluster's list separated by commas.
        std::vector<std::string> parts;
        for (std::size_t at = 0; at <= url.size();) {
            const auto comma = std::min(url.find(',', at), url.size());
            parts.emplace_back(url.substr(at, comma - at));
            at = comma + 1;
        }
        std::vector<const char*> urls;
        for (const auto& u : parts) urls.push_back(u.c_str());
        check_nats(natsOptions_SetServers(opts_, urls.data(), static_cast<int>(urls.size())), "natsOptions_SetServers");
        check_nats(natsConnection_Connect(&nc_, opts_), "connect to " + url);
        jsOptions jo;
        jsOptions_Init(&jo);
        if (acks != nullptr) {
            // Bounded: a publisher that outruns the server stalls instead of queueing the workload.
            jo.PublishAsync.MaxPending = 8192;
            // cnats gives up on a full window after StallWait (200 ms by default) and drops the
            // message; a server writing back a large store pauses longer than that on a busy
            // machine, so wait as long as a publish may take instead.
            jo.PublishAsync.StallWait = 60'000;
            jo.PublishAsync.AckHandler = on_publish_ack;
            jo.PublishAsync.AckHandlerClosure = acks;
        }
        check_nats(natsConnection_JetStream(&js_, nc_, &jo), "natsConnection_JetStream");
    }
    ~nats_client() {
        jsCtx_Destroy(js_);
        natsConnection_Destroy(nc_);
        natsOptions_Destroy(opts_);
    }
    nats_client(const nats_client&) = delete;
    nats_client& operator=(const nats_client&) = delete;

    natsConnection* nc() const noexcept { return nc_; }
    jsCtx* js() const noexcept { return js_; }

    // A PING round trip: the server has processed every ack sent before it.
    void flush() const { check_nats(natsConnection_FlushTimeout(nc_, 10'000), "flush"); }

private:
    natsOptions* opts_ = nullptr;
    natsConnection* nc_ = nullptr;
    jsCtx* js_ = nullptr;
};

// --- the server --------------------------------------------------------------------

// nats-server with JetStream, its store under dir, on a port of its choosing (notes §8).
class nats_server {
public:
    explicit nats_server(const std::filesystem::path& dir) {
        std::filesystem::create_directories(dir / "store");
        const std::string store = (dir / "store").string();
        const std::string ports = dir.string();
        const std::string log = (dir / "server.log").string();
        std::vector<std::string> args{"nats-server",      "-js", "-sd", store, "-a", "127.0.0.1", "-p", "-1",
                                      "--ports_file_dir", ports, "-l",  log};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        // Its stdio goes to /dev/null: a server holding our pipes open would hang a caller
        // reading them (tools/bench's pipeline, a CI log collector).
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        for (int fd = 0; fd < 3; ++fd)
            posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
        const int rc = posix_spawnp(&pid_, "nats-server", &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0)
            throw std::runtime_error("cannot start nats-server (is it on the PATH?): " +
                                     std::string(std::strerror(rc)));
        url_ = wait_for_ports_file(dir / ("nats-server_" + std::to_string(pid_) + ".ports"));
    }
    ~nats_server() {
        ::kill(pid_, SIGTERM);
        int status = 0;
        ::waitpid(pid_, &status, 0);
    }
    nats_server(const nats_server&) = delete;
    nats_server& operator=(const nats_server&) = delete;

    const std::string& url() const noexcept { return url_; }

private:
    std::string wait_for_ports_file(const std::filesystem::path& file) {
        const auto start = clock_type::now();
        while (seconds_since(start) < 10) {
            std::ifstream in{file};
            std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
            // {"nats":["nats://127.0.0.1:44451"],...}
            if (auto at = text.find("nats://"); at != std::string::npos) {
                if (auto end = text.find('"', at); end != std::string::npos) return text.substr(at, end - at);
            }
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) throw std::runtime_error("nats-server exited at start");
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        throw std::runtime_error("nats-server wrote no ports file within 10 s");
    }

    pid_t pid_ = 0;
    std::string url_;
};

// --- the workload on the stream ----------------------------------------------------------

struct published {
    std::uint64_t stored = 0;       // messages the stream holds
    std::uint64_t republished = 0;  // of them, copies of earlier events under a new Nats-Msg-Id
    std::uint64_t dropped = 0;      // same-id copies the duplicate window dropped
    double seconds = 0;
};

// The stream, file storage; its duplicate window covers the whole publish.
void create_stream(jsCtx* js) {
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char* subjects[] = {subject};
    sc.Name = stream_name;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.Duplicates = std::int64_t{10} * 60 * 1'000'000'000;
    // JetStream may still be starting when the ports file appears: retry for a while.
    const auto start = clock_type::now();
    for (;;) {
        jsErrCode jerr = static_cast<jsErrCode>(0);
        natsStatus s = js_AddStream(nullptr, js, &sc, nullptr, &jerr);
        if (s == NATS_OK) return;
        if (seconds_since(start) > 10) check_nats(s, "js_AddStream", jerr);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
}

void publish_one(jsCtx* js, const std::string& body, const std::string& msg_id) {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = msg_id.c_str();
    check_nats(js_PublishAsync(js, subject, body.data(), static_cast<int>(body.size()), &po), "js_PublishAsync");
}

// The workload's redeliveries (same transport id in workload.hpp) become republished copies
// under a new Nats-Msg-Id; every same_id_every-th first publish is repeated under its own id.
published publish_workload(const std::string& url, const workload& w, std::uint64_t seed) {
    publish_acks acks;
    published p;
    {
        nats_client client{url, &acks};
        create_stream(client.js());
        std::mt19937_64 rng{seed ^ 0x9e3779b97f4a7c15u};
        std::unordered_set<std::string> seen;
        seen.reserve(w.distinct);
        std::uint64_t firsts = 0;
        const auto start = clock_type::now();
        for (const auto& d : w.deliveries) {
            if (seen.insert(d.message_id).second) {
                publish_one(client.js(), d.body, d.message_id);
                if (++firsts % same_id_every == 0) {
                    publish_one(client.js(), d.body, d.message_id);
                    ++p.dropped;
                }
            } else {
                publish_one(client.js(), d.body, uuid_text(rng));
                ++p.republished;
            }
        }
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = 60'000;
        check_nats(js_PublishAsyncComplete(client.js(), &po), "js_PublishAsyncComplete");
        p.seconds = seconds_since(start);
    }
    p.stored = w.deliveries.size();
    if (acks.failed != 0 || acks.stored != p.stored || acks.duplicates != p.dropped) {
        throw std::runtime_error("publish: " + std::to_string(acks.stored.load()) + " stored, " +
                                 std::to_string(acks.duplicates.load()) + " duplicates, " +
                                 std::to_string(acks.failed.load()) + " failed; expected " + std::to_string(p.stored) +
                                 " stored and " + std::to_string(p.dropped) + " duplicates");
    }
    return p;
}

// --- the fetch loop the baselines share ------------------------------------------------

// After a contender's last ack (sent on client's connection, or on one of its own that it has
// flushed): the consumer's ack floor is the stream's last message and nothing is pending, as the
// server sees it. Notes the figures in r; throws if they are not so.
void check_consumer_done(const nats_client& client, const contender_context& c, contender_result& r) {
    client.flush();
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    check_nats(js_GetConsumerInfo(&ci, client.js(), c.stream.c_str(), c.consumer.c_str(), nullptr, &jerr),
               "js_GetConsumerInfo", jerr);
    const bool ok = ci->AckFloor.Stream == c.stream_messages && ci->NumAckPending == 0 && ci->NumPending == 0;
    r.notes.push_back("consumer: ack floor " + std::to_string(ci->AckFloor.Stream) + " of " +
                      std::to_string(c.stream_messages) + ", " + std::to_string(ci->NumAckPending) + " ack pending, " +
                      std::to_string(ci->NumRedelivered) + " redelivered by the server");
    jsConsumerInfo_Destroy(ci);
    if (!ok) throw std::runtime_error(r.name + ": the consumer did not end with every message acked");
}

// A durable pull consumer of the contender's own: created here (DeliverAll, explicit ack),
// then bound, so unsubscribing never deletes it (notes §1).
class pull_consumer {
public:
    pull_consumer(const nats_client& client, const contender_context& c) : client_(client), c_(c) {
        jsConsumerConfig cc;
        jsConsumerConfig_Init(&cc);
        cc.Durable = c.consumer.c_str();
        cc.AckPolicy = js_AckExplicit;
        cc.DeliverPolicy = js_DeliverAll;
        cc.AckWait = std::chrono::duration_cast<std::chrono::nanoseconds>(c.ack_wait).count();
        cc.MaxAckPending = c.max_ack_pending;
        jsErrCode jerr = static_cast<jsErrCode>(0);
        check_nats(js_AddConsumer(nullptr, client.js(), c.stream.c_str(), &cc, nullptr, &jerr), "js_AddConsumer", jerr);
        jsSubOptions so;
        jsSubOptions_Init(&so);
        so.Stream = c.stream.c_str();
        so.Consumer = c.consumer.c_str();
        check_nats(js_PullSubscribe(&sub_, client.js(), nullptr, nullptr, nullptr, &so, &jerr), "js_PullSubscribe",
                   jerr);
    }
    ~pull_consumer() {
        natsSubscription_Unsubscribe(sub_);
        natsSubscription_Destroy(sub_);
    }
    pull_consumer(const pull_consumer&) = delete;
    pull_consumer& operator=(const pull_consumer&) = delete;

    // Up to n messages into list; false when none came (idle: timeout, or a stale 404/408 of an
    // earlier request, notes §1). Throws after 10 s without any message: the stream is consumed
    // past what the contender expected, or the server stopped delivering.
    bool fetch(natsMsgList& list, int n) {
        jsErrCode jerr = static_cast<jsErrCode>(0);
        natsStatus s = natsSubscription_Fetch(&list, sub_, n, 1000, &jerr);
        if (s == NATS_OK && list.Count > 0) {
            idle_since_.reset();
            return true;
        }
        if (s != NATS_OK && s != NATS_TIMEOUT && s != NATS_NOT_FOUND) check_nats(s, "natsSubscription_Fetch", jerr);
        if (!idle_since_) idle_since_ = clock_type::now();
        if (seconds_since(*idle_since_) > 10)
            throw std::runtime_error("no message for 10 s from consumer " + c_.consumer);
        return false;
    }

    // After the last ack: every ack reached the server, and the server saw all of them.
    void check_all_acked(contender_result& r) const { check_consumer_done(client_, c_, r); }

private:
    const nats_client& client_;
    const contender_context& c_;
    natsSubscription* sub_ = nullptr;
    std::optional<clock_type::time_point> idle_since_{};
};

// Time spent in named phases of a loop.
struct phase_clock {
    double fetch = 0;   // inside natsSubscription_Fetch: the broker's share
    double decode = 0;  // envelope + payload parsing
    double apply = 0;   // LMDB reads and puts
    double commit = 0;  // mdb_txn_commit, its fsync included
    double ack = 0;     // natsMsg_Ack calls and natsMsg_Destroy
};

std::vector<std::pair<std::string, double>> phases_of(const phase_clock& p, double total) {
    std::vector<std::pair<std::string, double>> out{{"fetch (waiting on the server)", p.fetch}};
    if (p.decode > 0) out.emplace_back("decode (envelope + payload)", p.decode);
    if (p.apply > 0) out.emplace_back("apply (LMDB get/put)", p.apply);
    if (p.commit > 0) out.emplace_back("commit + fsync", p.commit);
    out.emplace_back("ack", p.ack);
    const double rest = total - p.fetch - p.decode - p.apply - p.commit - p.ack;
    out.emplace_back("other (loop, clocks, final flush)", std::max(0.0, rest));
    return out;
}

// --- (a) bare --------------------------------------------------------------------------

contender_result run_bare(const contender_context& c) {
    contender_result r;
    r.name = "bare fetch+ack";
    nats_client client{c.url};
    pull_consumer consumer{client, c};
    std::vector<double> acks;
    acks.reserve(c.stream_messages);
    phase_clock p;
    const auto start = clock_type::now();
    while (r.messages < c.stream_messages) {
        natsMsgList list{};
        auto t0 = clock_type::now();
        const bool got = consumer.fetch(list, c.fetch_batch);
        const auto received = clock_type::now();
        p.fetch += std::chrono::duration<double>(received - t0).count();
        if (!got) continue;
        for (int i = 0; i < list.Count; ++i) {
            check_nats(natsMsg_Ack(list.Msgs[i], nullptr), "natsMsg_Ack");
            acks.push_back(seconds_since(received));
        }
        r.messages += static_cast<std::uint64_t>(list.Count);
        natsMsgList_Destroy(&list);
        p.ack += seconds_since(received);
    }
    client.flush();
    r.seconds = seconds_since(start);
    r.ack_p50 = percentile(acks, 0.50);
    r.ack_p99 = percentile(acks, 0.99);
    r.phases = phases_of(p, r.seconds);
    consumer.check_all_acked(r);
    return r;
}

// --- (b) textbook on raw LMDB --------------------------------------------------------

void check_mdb(int rc, const char* what) {
    if (rc != 0) throw std::runtime_error(std::string(what) + ": " + mdb_strerror(rc));
}

MDB_val as_val(std::string_view s) {
    return MDB_val{s.size(), const_cast<char*>(s.data())};
}

void put_i64(unsigned char* out, std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(u >> (8 * i));
}

std::int64_t get_i64(const unsigned char* in) {
    std::uint64_t u = 0;
    for (int i = 8; i-- > 0;) u = (u << 8) | in[i];
    return static_cast<std::int64_t>(u);
}

std::int64_t unix_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// compare_lmdb's schema: processed (id -> processed-at) and orders (order id -> total, lines,
// 16 bytes), every commit synced (LMDB's default). One difference: the processed id is the
// event's CloudEvents source + id, not the transport id, because a copy republished under a
// new Nats-Msg-Id must be recognised (the transport id alone would count it twice).
class textbook_store {
public:
    explicit textbook_store(const std::filesystem::path& dir) {
        std::filesystem::create_directories(dir);
        check_mdb(mdb_env_create(&env_), "mdb_env_create");
        check_mdb(mdb_env_set_maxdbs(env_, 2), "mdb_env_set_maxdbs");
        check_mdb(mdb_env_set_mapsize(env_, std::size_t{64} << 30), "mdb_env_set_mapsize");
        check_mdb(mdb_env_open(env_, dir.c_str(), MDB_NORDAHEAD, 0644), "mdb_env_open");
        begin();
        check_mdb(mdb_dbi_open(txn_, "processed", MDB_CREATE, &processed_), "open processed");
        check_mdb(mdb_dbi_open(txn_, "orders", MDB_CREATE, &orders_), "open orders");
        commit();
    }
    ~textbook_store() {
        if (txn_ != nullptr) mdb_txn_abort(txn_);
        mdb_env_close(env_);
    }
    textbook_store(const textbook_store&) = delete;
    textbook_store& operator=(const textbook_store&) = delete;

    // false: the event was processed before (nothing changed).
    bool apply(std::string_view event_id, std::string_view order_id, std::int64_t amount) {
        if (txn_ == nullptr) begin();
        MDB_val key = as_val(event_id);
        MDB_val time{time_bytes_.size(), time_bytes_.data()};
        int rc = mdb_put(txn_, processed_, &key, &time, MDB_NOOVERWRITE);
        if (rc == MDB_KEYEXIST) return false;
        check_mdb(rc, "put processed");
        MDB_val order = as_val(order_id);
        MDB_val row{};
        std::int64_t total = 0;
        std::int64_t lines = 0;
        rc = mdb_get(txn_, orders_, &order, &row);
        if (rc == 0) {
            total = get_i64(static_cast<const unsigned char*>(row.mv_data));
            lines = get_i64(static_cast<const unsigned char*>(row.mv_data) + 8);
        } else if (rc != MDB_NOTFOUND) {
            check_mdb(rc, "get order");
        }
        std::array<unsigned char, 16> bytes{};
        put_i64(bytes.data(), total + amount);
        put_i64(bytes.data() + 8, lines + 1);
        row = MDB_val{bytes.size(), bytes.data()};
        check_mdb(mdb_put(txn_, orders_, &order, &row, 0), "put order");
        return true;
    }

    void commit() {
        if (txn_ != nullptr) check_mdb(mdb_txn_commit(std::exchange(txn_, nullptr)), "mdb_txn_commit");
    }

    summary rows() {
        std::vector<std::pair<std::string, totals>> out;
        MDB_txn* txn = nullptr;
        check_mdb(mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn), "mdb_txn_begin");
        MDB_cursor* cur = nullptr;
        check_mdb(mdb_cursor_open(txn, orders_, &cur), "mdb_cursor_open");
        MDB_val k{};
        MDB_val v{};
        for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            const auto* bytes = static_cast<const unsigned char*>(v.mv_data);
            out.emplace_back(std::string(static_cast<const char*>(k.mv_data), k.mv_size),
                             totals{get_i64(bytes), get_i64(bytes + 8)});
        }
        mdb_cursor_close(cur);
        mdb_txn_abort(txn);
        return summarize(std::move(out));
    }

private:
    void begin() {
        check_mdb(mdb_txn_begin(env_, nullptr, 0, &txn_), "mdb_txn_begin");
        put_i64(time_bytes_.data(), unix_ns());
    }

    MDB_env* env_ = nullptr;
    MDB_txn* txn_ = nullptr;
    MDB_dbi processed_ = 0;
    MDB_dbi orders_ = 0;
    std::array<unsigned char, 8> time_bytes_{};
};

// Decodes a message the way compare's message_reader does: idem's envelope parser, the payload
// with simdjson, so the textbook consumer pays what every peer pays to read an event.
class order_line_decoder {
public:
    struct line {
        std::string_view order_id;
        std::int64_t amount = 0;
    };

    // The event's identity (source + id) into id; the payload's fields into out (views valid
    // until the next call).
    void decode(std::string_view body, std::string& id, line& out) {
        if (!parser_.parse(body, ev_, err_)) throw std::runtime_error("undecodable envelope: " + err_.detail);
        id.assign(ev_.source).append(1, '\n').append(ev_.id);
        padded_.reserve(ev_.data.size() + simdjson::SIMDJSON_PADDING);
        padded_.assign(ev_.data);
        simdjson::padded_string_view view{padded_.data(), padded_.size(), padded_.capacity()};
        simdjson::ondemand::document doc;
        if (json_.iterate(view).get(doc) != simdjson::SUCCESS ||
            doc["order_id"].get_string().get(out.order_id) != simdjson::SUCCESS ||
            doc["amount"].get_int64().get(out.amount) != simdjson::SUCCESS) {
            throw std::runtime_error("undecodable order line: " + ev_.data);
        }
    }

private:
    idem::envelope_parser parser_;
    idem::envelope ev_;
    idem::parse_error err_;
    simdjson::ondemand::parser json_;
    std::string padded_;
};

// Messages fetched and not yet acked (they wait for the commit that covers them).
struct held_message {
    natsMsg* msg;
    clock_type::time_point received;
};

contender_result run_textbook(const contender_context& c) {
    contender_result r;
    r.name = "textbook LMDB";
    r.has_state = true;
    nats_client client{c.url};
    pull_consumer consumer{client, c};
    textbook_store store{c.dir};
    order_line_decoder decoder;
    std::vector<held_message> held;
    std::vector<double> acks;
    acks.reserve(c.stream_messages);
    std::string id;
    order_line_decoder::line line;
    std::uint64_t applied = 0;
    std::uint64_t commits = 0;
    phase_clock p;

    // Commit, then ack what the commit covered: an ack never precedes the durable write.
    auto commit_and_ack = [&] {
        if (held.empty()) return;
        auto t0 = clock_type::now();
        store.commit();
        ++commits;
        auto t1 = clock_type::now();
        p.commit += std::chrono::duration<double>(t1 - t0).count();
        for (auto& h : held) {
            check_nats(natsMsg_Ack(h.msg, nullptr), "natsMsg_Ack");
            acks.push_back(std::chrono::duration<double>(clock_type::now() - h.received).count());
            natsMsg_Destroy(h.msg);
        }
        held.clear();
        p.ack += seconds_since(t1);
    };

    const auto io_before = read_io();
    const auto start = clock_type::now();
    while (r.messages < c.stream_messages) {
        // Never ask for more than MaxAckPending leaves room for: the server would hold the
        // request until it expires (notes §1).
        const auto room = c.max_ack_pending - static_cast<std::int64_t>(held.size());
        if (room <= 0) {
            commit_and_ack();
            continue;
        }
        natsMsgList list{};
        auto t0 = clock_type::now();
        const bool got = consumer.fetch(list, static_cast<int>(std::min<std::int64_t>(c.fetch_batch, room)));
        const auto received = clock_type::now();
        p.fetch += std::chrono::duration<double>(received - t0).count();
        if (!got) {
            commit_and_ack();  // idle: what is held would otherwise wait for messages that never come
            continue;
        }
        for (int i = 0; i < list.Count; ++i) {
            natsMsg* m = std::exchange(list.Msgs[i], nullptr);  // ours until acked
            auto d0 = clock_type::now();
            decoder.decode(std::string_view(natsMsg_GetData(m), static_cast<std::size_t>(natsMsg_GetDataLength(m))), id,
                           line);
            auto d1 = clock_type::now();
            if (store.apply(id, line.order_id, line.amount)) ++applied;
            p.decode += std::chrono::duration<double>(d1 - d0).count();
            p.apply += seconds_since(d1);
            held.push_back({m, received});
            if (held.size() == textbook_per_txn) commit_and_ack();
        }
        r.messages += static_cast<std::uint64_t>(list.Count);
        natsMsgList_Destroy(&list);
    }
    commit_and_ack();
    client.flush();
    r.seconds = seconds_since(start);
    r.write_bytes = read_io().write_bytes - io_before.write_bytes;
    r.ack_p50 = percentile(acks, 0.50);
    r.ack_p99 = percentile(acks, 0.99);
    r.phases = phases_of(p, r.seconds);
    r.notes.push_back(std::to_string(applied) + " applied, " + std::to_string(r.messages - applied) +
                      " duplicates (event seen before), " + std::to_string(commits) + " synced commits");
    consumer.check_all_acked(r);
    r.state = store.rows();
    r.store_bytes = store_size(c.dir);
    return r;
}

// --- report ----------------------------------------------------------------------------

double rate_of(const contender_result& r) {
    return static_cast<double>(r.messages) / r.seconds;
}

void print_detail(const contender_result& r) {
    std::fprintf(stderr, "%s: %s msgs in %s s = %s msgs/s; ack p50 %s ms, p99 %s ms\n", r.name.c_str(),
                 with_commas(r.messages).c_str(), fixed(r.seconds, 2).c_str(),
                 with_commas(static_cast<std::uint64_t>(rate_of(r))).c_str(), fixed(r.ack_p50 * 1e3, 2).c_str(),
                 fixed(r.ack_p99 * 1e3, 2).c_str());
    for (const auto& n : r.notes) std::fprintf(stderr, "  %s\n", n.c_str());
}

void print_table(const std::vector<contender_result>& results) {
    std::printf("| contender | msgs/s | ack p50 ms | ack p99 ms | store B/msg | write_bytes/msg |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
    for (const auto& r : results) {
        const double n = static_cast<double>(r.messages);
        std::printf("| %s | %s | %s | %s | %s | %s |\n", r.name.c_str(),
                    with_commas(static_cast<std::uint64_t>(rate_of(r))).c_str(), fixed(r.ack_p50 * 1e3, 2).c_str(),
                    fixed(r.ack_p99 * 1e3, 2).c_str(),
                    with_commas(static_cast<std::uint64_t>(static_cast<double>(r.store_bytes) / n + 0.5)).c_str(),
                    with_commas(static_cast<std::uint64_t>(static_cast<double>(r.write_bytes) / n + 0.5)).c_str());
    }
}

void print_phases(const std::vector<contender_result>& results) {
    std::printf("\nwhere the time goes:\n");
    for (const auto& r : results) {
        std::printf("- %s (%s s):", r.name.c_str(), fixed(r.seconds, 2).c_str());
        const char* sep = " ";
        for (const auto& [phase, s] : r.phases) {
            std::printf("%s%s %s s (%s%%)", sep, phase.c_str(), fixed(s, 2).c_str(),
                        fixed(100 * s / r.seconds, 0).c_str());
            sep = ", ";
        }
        std::printf("\n");
    }
}

const contender_result* find(const std::vector<contender_result>& results, std::string_view prefix) {
    for (const auto& r : results) {
        if (r.name.starts_with(prefix)) return &r;
    }
    return nullptr;
}

void print_targets(const std::vector<contender_result>& results) {
    const auto* bare = find(results, "bare");
    const auto* textbook = find(results, "textbook");
    const auto* idem = find(results, "idem");
    std::printf("\nratios and targets:\n");
    if (bare != nullptr && textbook != nullptr) {
        std::printf("- textbook / bare: %s\n", fixed(rate_of(*textbook) / rate_of(*bare), 2).c_str());
    }
    if (idem == nullptr) {
        std::printf("- idem: not measured (%s)\n",
#if IDEM_BENCH_JETSTREAM_SOURCE
                    "left out by --only"
#else
                    "pending: the JetStream source is not built yet; bench/meson.build, jetstream_source_ready"
#endif
        );
        return;
    }
    if (bare != nullptr) {
        const double q = rate_of(*idem) / rate_of(*bare);
        std::printf("- idem / bare: %s (target >= 0.50: %s)\n", fixed(q, 2).c_str(), q >= 0.5 ? "met" : "MISSED");
    }
    if (textbook != nullptr) {
        const double q = rate_of(*idem) / rate_of(*textbook);
        std::printf("- idem / textbook: %s (target >= 3: %s)\n", fixed(q, 2).c_str(), q >= 3 ? "met" : "MISSED");
    }
}

// The run with the median msgs/s (the lower of the middle two for an even count), whole: its
// latencies and phases belong to the same run as its rate.
contender_result median_run(std::vector<contender_result> of) {
    std::sort(of.begin(), of.end(), [](const auto& a, const auto& b) { return rate_of(a) < rate_of(b); });
    auto r = of[(of.size() - 1) / 2];
    if (of.size() > 1) {
        std::string all;
        for (const auto& x : of) all += (all.empty() ? "" : ", ") + with_commas(static_cast<std::uint64_t>(rate_of(x)));
        r.notes.push_back("msgs/s of the runs: " + all);
    }
    return r;
}

// The rows a contender ended with in each run against the reference; false if any differ.
bool check_state(const std::vector<contender_result>& of, const summary& expected) {
    if (of.empty() || !of.front().has_state) return true;
    const auto& name = of.front().name;
    const std::string runs = of.size() == 1 ? "" : " in all " + std::to_string(of.size()) + " runs";
    bool ok = true;
    for (std::size_t k = 0; k < of.size(); ++k) {
        if (of[k].state == expected) continue;
        std::printf("%s, run %zu: rows DIFFER from the reference\n  expected: %s\n  got:      %s\n", name.c_str(),
                    k + 1, describe(expected).c_str(), describe(of[k].state).c_str());
        ok = false;
    }
    if (ok) {
        std::printf("%s: rows equal the reference of the distinct events%s (%s)\n", name.c_str(), runs.c_str(),
                    describe(expected).c_str());
    }
    return ok;
}

bool wanted(const bench_options& o, std::string_view name) {
    return o.only.empty() || o.only == name;
}

// --nats URLS --stream S: the bare fetch+ack rate of a stream that exists already (group_bench.py
// measures its cluster's this way). Prints one line per run and the median.
int run_existing(const bench_options& o) {
    std::uint64_t messages = 0;
    {
        nats_client client{o.nats};
        jsStreamInfo* si = nullptr;
        jsErrCode jerr = static_cast<jsErrCode>(0);
        check_nats(js_GetStreamInfo(&si, client.js(), o.stream.c_str(), nullptr, &jerr), "js_GetStreamInfo " + o.stream,
                   jerr);
        messages = si->State.Msgs;
        jsStreamInfo_Destroy(si);
    }
    std::vector<double> rates;
    for (std::size_t run = 0; run < o.runs; ++run) {
        const contender_context c{.url = o.nats,
                                  .stream = o.stream,
                                  .consumer = "bare-" + std::to_string(::getpid()) + "-" + std::to_string(run + 1),
                                  .stream_messages = messages,
                                  .max_ack_pending = o.max_ack_pending,
                                  .fetch_batch = o.fetch_batch,
                                  .ack_wait = std::chrono::seconds(30),
                                  .idem_max_delay = {},
                                  .dir = {}};
        const auto r = run_bare(c);
        rates.push_back(static_cast<double>(r.messages) / r.seconds);
        std::printf("bare fetch+ack run %zu: %llu messages in %.2f s (%.0f msgs/s)\n", run + 1,
                    static_cast<unsigned long long>(r.messages), r.seconds, rates.back());
        nats_client client{o.nats};
        (void)js_DeleteConsumer(client.js(), o.stream.c_str(), c.consumer.c_str(), nullptr, nullptr);
    }
    std::sort(rates.begin(), rates.end());
    std::printf("bare fetch+ack median: %.0f msgs/s\n", rates[rates.size() / 2]);
    return 0;
}

int run(const bench_options& o, const std::filesystem::path& base) {
    std::fprintf(stderr, "generating %s messages over %s aggregates (seed %llu)...\n", with_commas(o.messages).c_str(),
                 with_commas(o.aggregates).c_str(), static_cast<unsigned long long>(o.seed));
    const auto w = generate(o.messages, o.aggregates, republished_share, o.seed);
    const auto expected = reference(w);

    nats_server server{base / "nats"};
    std::fprintf(stderr, "nats-server at %s; publishing...\n", server.url().c_str());
    const auto pub = publish_workload(server.url(), w, o.seed);
    std::fprintf(
        stderr,
        "published %s messages in %s s (%s msgs/s): %s republished under a new Nats-Msg-Id, %s same-id copies dropped "
        "by the stream\n",
        with_commas(pub.stored).c_str(), fixed(pub.seconds, 2).c_str(),
        with_commas(static_cast<std::uint64_t>(static_cast<double>(pub.stored + pub.dropped) / pub.seconds)).c_str(),
        with_commas(pub.republished).c_str(), with_commas(pub.dropped).c_str());

    auto context = [&](const std::string& name) {
        return contender_context{.url = server.url(),
                                 .stream = stream_name,
                                 .consumer = name,
                                 .stream_messages = pub.stored,
                                 .max_ack_pending = o.max_ack_pending,
                                 .fetch_batch = o.fetch_batch,
                                 .idem_max_delay = std::chrono::microseconds(o.idem_max_delay_us),
                                 .dir = base / name};
    };
    struct contender {
        std::string name;
        contender_result (*run)(const contender_context&);
    };
    std::vector<contender> chosen;
    if (wanted(o, "bare")) chosen.push_back({"bare", run_bare});
    if (wanted(o, "textbook")) chosen.push_back({"textbook", run_textbook});
#if IDEM_BENCH_JETSTREAM_SOURCE
    if (wanted(o, "idem")) chosen.push_back({"idem", run_idem});
#else
    if (o.only == "idem") std::fprintf(stderr, "idem: pending, the JetStream source is not built yet\n");
#endif
    // Runs interleave the contenders (bare, textbook, idem, bare, ...), so a slow spell of a
    // shared machine hits them alike; each run has a consumer and a store of its own.
    std::vector<std::vector<contender_result>> runs(chosen.size());
    for (std::size_t run = 0; run < o.runs; ++run) {
        for (std::size_t i = 0; i < chosen.size(); ++i) {
            const auto name = chosen[i].name + (o.runs > 1 ? "-" + std::to_string(run + 1) : "");
            std::fprintf(stderr, "running %s...\n", name.c_str());
            ::sync();  // the previous contender's writeback must not land in this one's run
            const auto c = context(name);
            auto r = chosen[i].run(c);
            if (chosen[i].name == "idem") {
                // The source flushed its acks before run() returned; the server must agree.
                nats_client client{server.url()};
                check_consumer_done(client, c, r);
            }
            print_detail(r);
            runs[i].push_back(std::move(r));
        }
    }
    std::vector<contender_result> results;
    for (auto& of : runs) results.push_back(median_run(of));

    std::printf(
        "jetstream_bench: %s messages in a file-backed stream (%s distinct events + %s republished under "
        "a new Nats-Msg-Id; %s same-id copies dropped at publish) over %s aggregates; MaxAckPending %lld, "
        "fetch batch %d, AckWait 30 s; %s, seed %llu\n\n",
        with_commas(pub.stored).c_str(), with_commas(w.distinct).c_str(), with_commas(pub.republished).c_str(),
        with_commas(pub.dropped).c_str(), with_commas(o.aggregates).c_str(), static_cast<long long>(o.max_ack_pending),
        o.fetch_batch,
        o.runs == 1 ? "one run each" : ("each row the run with the median msgs/s of " + std::to_string(o.runs)).c_str(),
        static_cast<unsigned long long>(o.seed));
    print_table(results);
    std::printf(
        "\nack: from the fetch returning the message to natsMsg_Ack (textbook: after the synced commit covering "
        "it); store: the LMDB files afterwards (lock file excepted); write_bytes: /proc/self/io over the run "
        "(this process only: the server's writes are not counted)\n");
    for (const auto& r : results) {
        if (!r.ack_note.empty()) std::printf("%s ack: %s\n", r.name.c_str(), r.ack_note.c_str());
        for (const auto& n : r.notes) {
            if (n.starts_with("msgs/s of the runs")) std::printf("%s %s\n", r.name.c_str(), n.c_str());
        }
    }
    print_phases(results);
    print_targets(results);
    std::printf("\n");
    bool ok = true;
    for (const auto& of : runs) ok = check_state(of, expected) && ok;
    return ok ? 0 : 1;
}

}  // namespace

namespace idem_bench::js {

std::uint64_t store_size(const std::filesystem::path& dir) {
    std::uint64_t bytes = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
        if (e.is_regular_file() && e.path().filename() != "lock.mdb") bytes += e.file_size();
    }
    return bytes;
}

}  // namespace idem_bench::js

int main(int argc, char** argv) {
    const auto o = parse_args(argc, argv);
    const bool own_dir = o.dir.empty();
    const auto base =
        own_dir ? std::filesystem::temp_directory_path() / ("idem-jetstream-bench-" + std::to_string(::getpid()))
                : o.dir;
    int rc = 1;
    try {
        std::filesystem::create_directories(base);
        rc = o.nats.empty() ? run(o, base) : run_existing(o);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "jetstream_bench: %s\n", e.what());
    }
    if (own_dir) std::filesystem::remove_all(base);
    return rc;
}
