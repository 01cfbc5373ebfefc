// engine_bench: the asynchronous engine (one writer thread, group commit) under
// durability::full, over apply_bench's workload, driven by closed-loop submitters and by
// an open-loop generator.
//
//   engine_bench [--messages N] [--aggregates A] [--duplicates F] [--runs R] [--seed S]
//                [--submitters LIST] [--single-limit N] [--rate R] [--threads T]
//                [--dir D] [--quick]
//
// A submitter is a closed loop: it submits one delivery, waits for its completion, then
// submits the next. The submitters of a run share one cursor over the deliveries, so
// every message is submitted exactly once overall (a redelivery may be in flight together
// with its original). The open loop submits at a fixed rate from one timer without waiting
// for completions (the engine's max_in_flight bounds what it accepts); by default its rate
// is half the throughput measured with the most submitters. Ack latency is measured per
// delivery in this file, from just before async_apply to the completion handler. Every
// run must end with the reference totals of the distinct events (exit 1 otherwise). One
// line per run goes to stderr; the table of medians goes to stdout.

#include "workload.hpp"

#include <idem/engine.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

[[noreturn]] void idem_bench::usage(const char* why) {
    std::fprintf(stderr,
                 "engine_bench: %s\n"
                 "usage: engine_bench [--messages N] [--aggregates A] [--duplicates F] [--runs R] [--seed S]\n"
                 "                    [--submitters LIST] [--single-limit N] [--rate R] [--threads T]\n"
                 "                    [--dir D] [--quick]\n"
                 "  --submitters 1,16,256  closed-loop submitter counts, one configuration each\n"
                 "  --single-limit N       messages of the 1-submitter run (default 20000; 0: all)\n"
                 "  --rate R               open-loop msgs/s (default: half the rate with the most\n"
                 "                         submitters; 0: no open-loop run)\n"
                 "  --threads T            threads running the io_context (1 or 2, default 1)\n"
                 "  --max-delay-us D       engine max_delay: a busy writer lingers up to D us to fill a batch (default 0)\n",
                 why);
    std::exit(2);
}

namespace {

using namespace idem_bench;
namespace asio = boost::asio;

struct bench_options {
    std::size_t messages = 1'000'000;
    std::size_t aggregates = 100'000;
    double duplicates = 0.10;
    std::size_t runs = 1;
    std::uint64_t seed = 42;
    std::vector<std::size_t> submitters{1, 16, 256};
    std::size_t single_limit = 20'000;  // messages of the 1-submitter run; 0: no cap
    std::optional<double> rate{};       // open-loop rate; unset: half the top closed-loop rate; 0: none
    std::size_t threads = 1;
    std::filesystem::path dir{};
    std::size_t max_delay_us = 0;  // engine_options::max_delay
};

std::vector<std::size_t> parse_list(std::string_view name, std::string_view text) {
    std::vector<std::size_t> out;
    while (!text.empty()) {
        auto comma = text.find(',');
        auto n = parse_number<std::size_t>(name, text.substr(0, comma));
        if (n == 0) usage("submitter counts must be positive");
        out.push_back(n);
        text.remove_prefix(comma == std::string_view::npos ? text.size() : comma + 1);
    }
    return out;
}

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
        if (arg == "--help" || arg == "-h") usage("the async engine under concurrent submitters, durability::full");
        static constexpr std::array<std::string_view, 11> valued{
            "--messages",   "--aggregates",   "--duplicates", "--runs",    "--seed",        "--submitters",
            "--single-limit", "--rate",       "--threads",    "--dir",     "--max-delay-us"};
        if (std::find(valued.begin(), valued.end(), arg) == valued.end()) {
            usage(("unknown option " + std::string(arg)).c_str());
        }
        if (i + 1 >= argc) usage(("missing value for " + std::string(arg)).c_str());
        std::string_view value = argv[++i];
        if (arg == "--messages") {
            messages = parse_number<std::size_t>(arg, value);
        } else if (arg == "--aggregates") {
            aggregates = parse_number<std::size_t>(arg, value);
        } else if (arg == "--duplicates") {
            o.duplicates = parse_number<double>(arg, value);
        } else if (arg == "--runs") {
            o.runs = parse_number<std::size_t>(arg, value);
        } else if (arg == "--seed") {
            o.seed = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--submitters") {
            o.submitters = parse_list(arg, value);
        } else if (arg == "--single-limit") {
            o.single_limit = parse_number<std::size_t>(arg, value);
        } else if (arg == "--rate") {
            o.rate = parse_number<double>(arg, value);
            if (!(*o.rate >= 0.0 && std::isfinite(*o.rate))) usage("--rate must be a non-negative number");
        } else if (arg == "--threads") {
            o.threads = parse_number<std::size_t>(arg, value);
            if (o.threads != 1 && o.threads != 2) usage("--threads takes 1 or 2");
        } else if (arg == "--dir") {
            o.dir = std::string(value);
        } else if (arg == "--max-delay-us") {
            o.max_delay_us = parse_number<std::size_t>(arg, value);
        }
    }
    // Explicit sizes win over --quick wherever they appear on the line.
    if (quick) {
        o.messages = 100'000;
        o.aggregates = 10'000;
    }
    if (messages) o.messages = *messages;
    if (aggregates) o.aggregates = *aggregates;
    if (o.messages == 0 || o.aggregates == 0 || o.runs == 0) usage("sizes must be positive");
    if (!(o.duplicates >= 0.0 && o.duplicates < 1.0)) usage("--duplicates must be in [0, 1)");
    if (o.submitters.empty() && !(o.rate && *o.rate > 0)) usage("nothing to run: no submitters and no --rate");
    return o;
}

// --- one run ---------------------------------------------------------------------

// Outcome counts, bumped by completion handlers on any io thread.
struct tally {
    std::atomic<std::size_t> applied{0};
    std::atomic<std::size_t> duplicates{0};
    std::atomic<std::size_t> other{0};   // outcomes that should not happen with this workload
    std::atomic<std::size_t> failed{0};  // completed with an error

    void count(std::error_code ec, const idem::outcome& out) {
        if (ec) {
            failed.fetch_add(1, std::memory_order_relaxed);
        } else if (out.kind == idem::outcome_kind::applied) {
            applied.fetch_add(1, std::memory_order_relaxed);
        } else if (out.kind == idem::outcome_kind::duplicate_message) {
            duplicates.fetch_add(1, std::memory_order_relaxed);
        } else {
            other.fetch_add(1, std::memory_order_relaxed);
        }
    }
};

double seconds_between(clock_type::time_point from, clock_type::time_point to) {
    return std::chrono::duration<double>(to - from).count();
}

struct run_result {
    std::size_t messages = 0;
    double seconds = 0;
    std::uint64_t written = 0;      // write_bytes delta over the run
    std::uint64_t handed = 0;       // wchar delta over the run
    std::optional<std::uint64_t> device;  // bytes the store's block device wrote over the run (none on tmpfs)
    std::uint64_t store_bytes = 0;  // data.mdb size afterwards
    double ack_p50 = 0;             // seconds, over every delivery of the run
    double ack_p99 = 0;
    double ack_max = 0;
    double lag_max = 0;          // open loop: how late the generator submitted against its schedule
    idem::engine_stats stats{};  // the engine's, taken after the last completion
    std::size_t applied = 0;
    std::size_t duplicates = 0;
    std::size_t other = 0;
    std::size_t failed = 0;
    summary got;
};

// A closed-loop submitter: takes the next unsubmitted delivery, submits it, waits.
asio::awaitable<void> submitter(idem::engine& engine, std::span<const idem::delivery> all,
                                std::atomic<std::size_t>& next, std::vector<double>& acks, tally& t) {
    for (;;) {
        const std::size_t i = next.fetch_add(1, std::memory_order_relaxed);
        if (i >= all.size()) co_return;
        idem::delivery d = all[i];
        const auto sent = clock_type::now();
        auto result = co_await engine.async_apply(std::move(d), asio::use_awaitable);
        acks[i] = seconds_between(sent, clock_type::now());
        t.count(std::get<0>(result), std::get<1>(result));
    }
}

// The open loop: one timer submits message i at start + i / rate, never waiting for
// completions. A late wake-up submits everything that has come due since.
class generator {
public:
    generator(asio::io_context& io, idem::engine& engine, std::span<const idem::delivery> all, double rate,
              std::vector<double>& acks, tally& t)
        : timer_(io), engine_(engine), all_(all), rate_(rate), acks_(acks), tally_(t) {}

    void start() {
        start_ = clock_type::now();
        tick();
    }
    double lag_max() const { return lag_max_; }

private:
    clock_type::time_point due(std::size_t i) const {
        return start_ + std::chrono::duration_cast<clock_type::duration>(
                            std::chrono::duration<double>(static_cast<double>(i) / rate_));
    }

    void tick() {
        const auto now = clock_type::now();
        while (sent_ < all_.size() && due(sent_) <= now) {
            lag_max_ = std::max(lag_max_, seconds_between(due(sent_), now));
            submit(sent_++);
        }
        if (sent_ == all_.size()) return;
        timer_.expires_at(due(sent_));
        timer_.async_wait([this](const boost::system::error_code&) { tick(); });
    }

    void submit(std::size_t i) {
        idem::delivery d = all_[i];
        const auto sent = clock_type::now();
        engine_.async_apply(std::move(d), [this, i, sent](std::error_code ec, idem::outcome out) {
            acks_[i] = seconds_between(sent, clock_type::now());
            tally_.count(ec, out);
        });
    }

    asio::steady_timer timer_;
    idem::engine& engine_;
    std::span<const idem::delivery> all_;
    double rate_;
    std::vector<double>& acks_;
    tally& tally_;
    clock_type::time_point start_{};
    std::size_t sent_ = 0;
    double lag_max_ = 0;
};

// submitters > 0: that many closed loops; otherwise the open loop at rate msgs/s.
run_result run_once(const workload& w, const bench_options& o, const std::filesystem::path& dir, std::size_t submitters,
                    double rate) {
    run_result r;
    r.messages = w.deliveries.size();
    {
        asio::io_context io{static_cast<int>(o.threads)};
        idem::engine engine{
            io.get_executor(),
            idem::engine_options{.store = {.path = dir, .consumer = "bench", .sync = idem::durability::full},
                                 .max_batch = 4096,
                                 .max_delay = std::chrono::microseconds(o.max_delay_us),
                                 .max_in_flight = 65536}};
        engine.add(order_totals_projection());

        const std::span<const idem::delivery> all{w.deliveries};
        std::vector<double> acks(all.size(), 0.0);
        tally t;
        std::atomic<std::size_t> next{0};
        std::optional<generator> open;

        const auto io_before = read_io();
        const auto device_before = device_bytes_written(dir);
        const auto start = clock_type::now();
        if (submitters > 0) {
            for (std::size_t k = 0; k < submitters; ++k) {
                asio::co_spawn(io, submitter(engine, all, next, acks, t), asio::detached);
            }
        } else {
            open.emplace(io, engine, all, rate, acks, t);
            open->start();
        }
        std::optional<std::thread> second;
        if (o.threads == 2) second.emplace([&io] { io.run(); });
        io.run();
        if (second) second->join();
        r.seconds = seconds_between(start, clock_type::now());
        const auto io_after = read_io();
        r.written = io_after.write_bytes - io_before.write_bytes;
        r.handed = io_after.wchar - io_before.wchar;
        if (const auto device_after = device_bytes_written(dir); device_before && device_after) {
            r.device = *device_after - *device_before;
        }

        r.stats = engine.stats();
        r.applied = t.applied.load();
        r.duplicates = t.duplicates.load();
        r.other = t.other.load();
        r.failed = t.failed.load();
        if (open) r.lag_max = open->lag_max();
        r.ack_max = acks.empty() ? 0 : *std::max_element(acks.begin(), acks.end());
        r.ack_p50 = percentile(acks, 0.50);
        r.ack_p99 = percentile(acks, 0.99);
        r.got = read_summary(engine.read());
    }
    r.store_bytes = std::filesystem::file_size(dir / "data.mdb");
    return r;
}

// --- report ----------------------------------------------------------------------

// The medians over the runs of one configuration.
struct config {
    std::size_t submitters = 0;  // 0: the open loop
    double rate = 0;             // open loop: the offered rate
    const workload* w = nullptr;
    bool capped = false;  // runs the smaller workload of --single-limit
    std::vector<double> rates{};
    std::vector<double> written_per_msg{};
    std::vector<double> handed_per_msg{};
    std::vector<double> device_per_msg{};  // empty where the store is on no block device
    std::vector<double> ack_p50{};
    std::vector<double> ack_p99{};
    std::vector<double> batch_p50{};
    std::vector<double> batch_p99{};

    std::string label() const {
        if (submitters == 0) return "open loop at " + with_commas(static_cast<std::uint64_t>(rate + 0.5)) + " msgs/s";
        std::string l = std::to_string(submitters);
        if (capped) {
            l += " (" + with_commas(w->deliveries.size()) + " msgs)";
        }
        return l;
    }
};

// Runs one configuration once, prints its line, checks it; false if it ended wrong.
bool measure(config& c, const bench_options& o, const std::filesystem::path& base, std::size_t run) {
    const workload& w = *c.w;
    const auto expected = reference(w);
    const auto redeliveries = w.deliveries.size() - w.distinct;
    const std::string name = c.submitters == 0 ? "open" : "s" + std::to_string(c.submitters);
    auto dir = base / (name + "-" + std::to_string(run + 1));
    std::filesystem::remove_all(dir);
    auto r = run_once(w, o, dir, c.submitters, c.rate);
    std::filesystem::remove_all(dir);

    const double n = static_cast<double>(r.messages);
    const double rate = n / r.seconds;
    const double written = static_cast<double>(r.written) / n;
    const double handed = static_cast<double>(r.handed) / n;
    const auto& s = r.stats;
    std::string who =
        c.submitters == 0 ? c.label() : std::to_string(c.submitters) + " submitter" + (c.submitters == 1 ? "" : "s");
    std::fprintf(stderr,
                 "[run %zu/%zu] %s: %s msgs in %s s = %s msgs/s; %s B written/msg (write_bytes), "
                 "%s B pwritten/msg (wchar); ack p50 %s ms, p99 %s ms, max %s ms; %s batches (mean %s), "
                 "batch p50 %s p99 %s, commit p50 %s ms p99 %s ms; store %s MiB; %zu applied, %zu duplicates",
                 run + 1, o.runs, who.c_str(), with_commas(r.messages).c_str(), fixed(r.seconds, 2).c_str(),
                 with_commas(static_cast<std::uint64_t>(rate)).c_str(), fixed(written, 0).c_str(),
                 fixed(handed, 0).c_str(), fixed(r.ack_p50 * 1e3, 2).c_str(), fixed(r.ack_p99 * 1e3, 2).c_str(),
                 fixed(r.ack_max * 1e3, 1).c_str(), with_commas(s.batches).c_str(),
                 fixed(s.batches == 0 ? 0 : n / static_cast<double>(s.batches), 1).c_str(),
                 fixed(s.batch_size.p50, 0).c_str(), fixed(s.batch_size.p99, 0).c_str(),
                 fixed(s.commit_seconds.p50 * 1e3, 2).c_str(), fixed(s.commit_seconds.p99 * 1e3, 2).c_str(),
                 fixed(static_cast<double>(r.store_bytes) / (1024.0 * 1024.0), 1).c_str(), r.applied, r.duplicates);
    if (r.device) {
        std::fprintf(stderr, "; %s B/msg reached the disk (device counter)",
                     fixed(static_cast<double>(*r.device) / n, 0).c_str());
    }
    if (c.submitters == 0) std::fprintf(stderr, "; generator late by %s ms at most", fixed(r.lag_max * 1e3, 2).c_str());
    std::fprintf(stderr, "\n");

    const auto& k = s.outcomes;
    const bool engine_agrees = k[static_cast<std::size_t>(idem::outcome_kind::applied)] == r.applied &&
                               k[static_cast<std::size_t>(idem::outcome_kind::duplicate_message)] == r.duplicates &&
                               s.failed == r.failed;
    if (r.got != expected || r.applied != w.distinct || r.duplicates != redeliveries || r.other != 0 || r.failed != 0 ||
        !engine_agrees) {
        std::fprintf(stderr,
                     "error: %s ended wrong\n  expected: %s; %zu applied, %zu duplicates\n"
                     "  got:      %s; %zu applied, %zu duplicates, %zu other outcomes, %zu errors%s\n",
                     who.c_str(), describe(expected).c_str(), w.distinct, redeliveries, describe(r.got).c_str(),
                     r.applied, r.duplicates, r.other, r.failed,
                     engine_agrees ? "" : "; the engine's outcome counters disagree with the completions");
        return false;
    }
    c.rates.push_back(rate);
    c.written_per_msg.push_back(written);
    c.handed_per_msg.push_back(handed);
    if (r.device) c.device_per_msg.push_back(static_cast<double>(*r.device) / n);
    c.ack_p50.push_back(r.ack_p50);
    c.ack_p99.push_back(r.ack_p99);
    c.batch_p50.push_back(s.batch_size.p50);
    c.batch_p99.push_back(s.batch_size.p99);
    return true;
}

void print_row(const config& c) {
    const std::string device = c.device_per_msg.size() == c.rates.size() && !c.rates.empty()
                                   ? with_commas(static_cast<std::uint64_t>(median(c.device_per_msg) + 0.5))
                                   : std::string("n/a");
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.label().c_str(),
                with_commas(static_cast<std::uint64_t>(median(c.rates))).c_str(),
                with_commas(static_cast<std::uint64_t>(median(c.written_per_msg) + 0.5)).c_str(),
                with_commas(static_cast<std::uint64_t>(median(c.handed_per_msg) + 0.5)).c_str(), device.c_str(),
                fixed(median(c.ack_p50) * 1e3, 2).c_str(), fixed(median(c.ack_p99) * 1e3, 2).c_str(),
                fixed(median(c.batch_p50), 0).c_str(), fixed(median(c.batch_p99), 0).c_str());
}

const char* verdict(bool met) {
    return met ? "met" : "MISSED";
}

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse_args(argc, argv);
    const bool own_dir = o.dir.empty();
    const auto base =
        own_dir ? std::filesystem::temp_directory_path() / ("idem-engine-bench-" + std::to_string(::getpid())) : o.dir;
    try {
        std::fprintf(stderr, "generating %s messages over %s aggregates (seed %llu)...\n",
                     with_commas(o.messages).c_str(), with_commas(o.aggregates).c_str(),
                     static_cast<unsigned long long>(o.seed));
        const auto w = generate(o.messages, o.aggregates, o.duplicates, o.seed);
        // The 1-submitter run pays one fsync per message: it gets a smaller workload of the
        // same shape (same aggregates, duplicate rate and seed) unless --single-limit 0.
        std::optional<workload> single;
        const bool capped = o.single_limit != 0 && o.single_limit < o.messages &&
                            std::find(o.submitters.begin(), o.submitters.end(), std::size_t{1}) != o.submitters.end();
        if (capped) single = generate(o.single_limit, o.aggregates, o.duplicates, o.seed);

        std::vector<config> closed;
        for (auto n : o.submitters) {
            const bool small = n == 1 && single.has_value();
            closed.push_back({.submitters = n, .w = small ? &*single : &w, .capped = small});
        }
        for (std::size_t run = 0; run < o.runs; ++run) {
            for (auto& c : closed) {
                if (!measure(c, o, base, run)) {
                    if (own_dir) std::filesystem::remove_all(base);
                    return 1;
                }
            }
        }

        // The open loop at the given rate, or at half the rate of the most submitters.
        const config* top = nullptr;
        for (const auto& c : closed) {
            if (top == nullptr || c.submitters > top->submitters) top = &c;
        }
        std::optional<config> open;
        const double rate = o.rate ? *o.rate : (top != nullptr ? median(top->rates) / 2 : 0.0);
        if (rate > 0) {
            open = config{.submitters = 0, .rate = rate, .w = &w};
            for (std::size_t run = 0; run < o.runs; ++run) {
                if (!measure(*open, o, base, run)) {
                    if (own_dir) std::filesystem::remove_all(base);
                    return 1;
                }
            }
        }
        if (own_dir) std::filesystem::remove_all(base);

        const auto redeliveries = o.messages - w.distinct;
        std::printf(
            "engine_bench: %s messages (%s distinct + %s redeliveries) over %s aggregates, "
            "durability::full, max_batch 4096, max_in_flight 65536, %zu io thread%s, %zu run%s, seed %llu\n\n",
            with_commas(o.messages).c_str(), with_commas(w.distinct).c_str(), with_commas(redeliveries).c_str(),
            with_commas(o.aggregates).c_str(), o.threads, o.threads == 1 ? "" : "s", o.runs, o.runs == 1 ? "" : "s",
            static_cast<unsigned long long>(o.seed));
        std::printf(
            "| submitters | msgs/s | write_bytes/msg | wchar/msg | disk/msg | ack p50 ms | ack p99 ms | batch p50 "
            "| batch p99 |\n");
        std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (const auto& c : closed) print_row(c);
        if (open) print_row(*open);
        std::printf("\n");
        if (o.runs > 1) std::printf("every figure is the median over %zu runs\n", o.runs);
        if (single) {
            std::printf(
                "1 submitter: a %s-message workload of the same shape (%s distinct + %s redeliveries), "
                "capped by --single-limit (0 runs all %s)\n",
                with_commas(single->deliveries.size()).c_str(), with_commas(single->distinct).c_str(),
                with_commas(single->deliveries.size() - single->distinct).c_str(), with_commas(o.messages).c_str());
        }
        if (open) {
            std::printf(
                "open loop: one timer submits %s msgs/s (%s) without waiting for completions; "
                "msgs/s is what it achieved\n",
                with_commas(static_cast<std::uint64_t>(rate + 0.5)).c_str(),
                o.rate ? "--rate" : ("half the " + std::to_string(top->submitters) + "-submitter rate").c_str());
        }
        std::printf(
            "ack: from just before async_apply to the completion handler, every delivery; "
            "batch: engine.stats().batch_size over the last 16,384 batches\n");
        std::printf(
            "bytes/msg: /proc/self/io deltas over the run divided by messages: write_bytes counts whole "
            "page-cache folios dirtied (large folios inflate it), wchar the bytes LMDB passed to pwrite; "
            "disk: the store's block device's sectors written over the run (/sys/dev/block/.../stat: the file "
            "system's journal included, and any other writer on the machine; n/a off a block device)\n");
        std::printf("every run ended with the reference totals of its workload; %s messages: %s\n",
                    with_commas(o.messages).c_str(), describe(reference(w)).c_str());

        // The targets (2-core machine), where the configurations needed were run.
        const config* at256 = nullptr;
        for (const auto& c : closed) {
            if (c.submitters == 256) at256 = &c;
        }
        std::printf("\ntargets:\n");
        if (at256 != nullptr) {
            const double r256 = median(at256->rates);
            std::printf("- >= 150,000 msgs/s at 256 submitters: %s msgs/s, %s\n",
                        with_commas(static_cast<std::uint64_t>(r256)).c_str(), verdict(r256 >= 150'000));
            const double wb = median(at256->written_per_msg);
            const double wc = median(at256->handed_per_msg);
            std::string disk = "n/a (not on a block device)";
            if (at256->device_per_msg.size() == at256->rates.size() && !at256->rates.empty()) {
                const double d = median(at256->device_per_msg);
                disk = with_commas(static_cast<std::uint64_t>(d + 0.5)) + " B " + verdict(d <= 2000);
            }
            std::printf(
                "- <= 2 KB (2,000 B) written/msg at 256 submitters: reached the disk %s; write_bytes %s B %s, "
                "wchar %s B %s\n",
                disk.c_str(), with_commas(static_cast<std::uint64_t>(wb + 0.5)).c_str(), verdict(wb <= 2000),
                with_commas(static_cast<std::uint64_t>(wc + 0.5)).c_str(), verdict(wc <= 2000));
        } else {
            std::printf("- throughput and bytes targets: not evaluated (no 256-submitter run)\n");
        }
        if (open) {
            const double p99 = median(open->ack_p99) * 1e3;
            std::printf("- ack p99 <= 10 ms at %s msgs/s offered: %s ms, %s\n",
                        with_commas(static_cast<std::uint64_t>(rate + 0.5)).c_str(), fixed(p99, 2).c_str(),
                        verdict(p99 <= 10.0));
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "engine_bench: %s\n", e.what());
        if (own_dir) std::filesystem::remove_all(base);
        return 1;
    }
}
