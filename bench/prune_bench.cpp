// How much pruning a large inbox delays live batches: an inbox of N expired ids (default
// 1M) is pruned by the engine's writer while K submitters (default 16) keep applying new
// events with full durability; the same load without retention, in the same run and the
// same environment, is the baseline. Prints the worst and p99 acknowledgement latency and
// commit time of both phases, and the prune steps' times.
//
//   prune_bench [--ids N] [--submitters K] [--dir DIR]

#include "workload.hpp"

#include <idem/engine.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

namespace idem_bench {

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr, "prune_bench: %s\nusage: prune_bench [--ids N] [--submitters K] [--dir DIR]\n", why);
    std::exit(2);
}

}  // namespace idem_bench

namespace {

using namespace idem_bench;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr std::uint64_t t0_ns = 1'800'000'000'000'000'000ull;

struct phase_result {
    std::size_t messages = 0;
    double seconds = 0;
    double ack_p99_ms = 0;
    double ack_max_ms = 0;
    idem::engine_stats stats;
};

/// Runs k closed-loop submitters of fresh events until done() says so.
phase_result live_load(const std::filesystem::path& dir, std::size_t k, bool retention, std::size_t first_id,
                       const std::function<bool(const idem::engine&)>& done) {
    boost::asio::io_context io;
    auto guard = boost::asio::make_work_guard(io);
    std::thread io_thread([&] { io.run(); });
    idem::engine_options o;
    o.store.path = dir;
    o.store.consumer = "bench";
    o.store.sync = idem::durability::full;
    o.store.retention.now = [] { return t0_ns + 600'000'000'000ull; };  // ten minutes after the fill
    if (retention) {
        o.store.retention.inbox_retention = 1min;
        o.prune_interval = 1ms;
    }
    phase_result r;
    {
        idem::engine e{io.get_executor(), o};
        e.add(order_totals_projection());
        std::atomic<bool> stop{false};
        std::atomic<std::size_t> next{first_id};
        std::mutex m;
        std::vector<double> acks;
        std::vector<std::thread> submitters;
        const auto started = clock_type::now();
        for (std::size_t s = 0; s < k; ++s) {
            submitters.emplace_back([&] {
                std::vector<double> mine;
                while (!stop.load()) {
                    const auto i = next.fetch_add(1);
                    idem::envelope ev;
                    ev.id = "live-" + std::to_string(i);
                    ev.source = "/orders";
                    ev.type = "order.line_added";
                    ev.data = R"({"order_id":"order-)" + std::to_string(i % 100'000) + R"(","amount":1})";
                    const auto t = clock_type::now();
                    auto f = e.async_apply(idem::delivery{ev.to_json(), {}}, boost::asio::use_future);
                    auto [ec, outcome] = f.get();
                    if (ec) std::fprintf(stderr, "prune_bench: %s\n", ec.message().c_str());
                    mine.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t).count());
                }
                std::scoped_lock lock{m};
                acks.insert(acks.end(), mine.begin(), mine.end());
            });
        }
        while (!done(e)) std::this_thread::sleep_for(1ms);
        stop = true;
        for (auto& t : submitters) t.join();
        r.seconds = std::chrono::duration<double>(clock_type::now() - started).count();
        r.stats = e.stats();
        r.messages = acks.size();
        r.ack_p99_ms = percentile(acks, 0.99);
        r.ack_max_ms = percentile(acks, 1.0);
    }
    guard.reset();
    io_thread.join();
    return r;
}

void print(const char* name, const phase_result& r) {
    std::printf("%-22s %9s msgs %7.2f s  ack p99 %6.2f ms  max %6.2f ms  commit p50 %5.2f ms  p99 %5.2f ms  max %6.2f ms\n",
                name, with_commas(r.messages).c_str(), r.seconds, r.ack_p99_ms, r.ack_max_ms,
                r.stats.commit_seconds.p50 * 1e3, r.stats.commit_seconds.p99 * 1e3, r.stats.commit_seconds.max * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
    std::size_t ids = 1'000'000;
    std::size_t submitters = 16;
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("idem-prune-bench-" + std::to_string(::getpid()));
    for (int i = 1; i < argc; i += 2) {
        std::string_view name = argv[i];
        if (i + 1 >= argc) usage("missing value");
        if (name == "--ids") {
            ids = parse_number<std::size_t>(name, argv[i + 1]);
        } else if (name == "--submitters") {
            submitters = parse_number<std::size_t>(name, argv[i + 1]);
        } else if (name == "--dir") {
            dir = std::filesystem::path(argv[i + 1]) / ("idem-prune-bench-" + std::to_string(::getpid()));
        } else {
            usage("unknown option");
        }
    }
    if (ids < 2 || submitters == 0) usage("--ids must be at least 2 and --submitters positive");
    std::filesystem::remove_all(dir);

    // The inbox to prune: ids distinct messages, all stamped at t0.
    {
        idem::store_options o;
        o.path = dir;
        o.consumer = "bench";
        o.sync = idem::durability::none;
        o.retention.now = [] { return t0_ns; };
        idem::store s{o};
        s.add(order_totals_projection());
        auto w = generate(ids, 100'000, 0.0, 42);
        const auto started = clock_type::now();
        for (std::size_t i = 0; i < w.deliveries.size(); i += 10'000) {
            auto n = std::min<std::size_t>(10'000, w.deliveries.size() - i);
            s.apply(std::span<const idem::delivery>(w.deliveries.data() + i, n));
        }
        std::printf("filled an inbox of %s ids in %.1f s\n", with_commas(s.inbox_size()).c_str(),
                    std::chrono::duration<double>(clock_type::now() - started).count());
    }

    // Baseline: the same load for as long as the prune will take (estimated by a first pass
    // that stops once the prune is done; the baseline then runs the same number of seconds).
    auto pruning = live_load(dir, submitters, true, 0, [&](const idem::engine& e) {
        return e.read().consumer("bench").stats().pruned_ids >= ids - 1;  // in batches and in separate steps
    });
    const auto prune_seconds = pruning.seconds;
    const auto baseline_until = clock_type::now() + std::chrono::duration<double>(std::max(prune_seconds, 2.0));
    auto baseline = live_load(dir, submitters, false, 1'000'000'000, [&](const idem::engine&) {
        return clock_type::now() >= baseline_until;
    });

    std::printf("\npruning %s ids while %zu submitters apply new events (durability full):\n",
                with_commas(ids).c_str(), submitters);
    print("baseline (no prune)", baseline);
    print("during the prune", pruning);
    const auto& p = pruning.stats.prune_seconds;
    std::printf("prune: %s ids in %.2f s: %s with the batches, %s in %s separate steps (step p50 %.2f ms, p99 %.2f ms, "
                "max %.2f ms)\n",
                with_commas(ids - 1).c_str(), prune_seconds, with_commas(ids - 1 - pruning.stats.pruned_ids).c_str(),
                with_commas(pruning.stats.pruned_ids).c_str(), with_commas(p.count).c_str(), p.p50 * 1e3, p.p99 * 1e3,
                p.max * 1e3);
    std::printf("worst ack delay added by pruning: %+.2f ms (max %.2f vs %.2f ms), p99 %+.2f ms; "
                "worst batch (commit) %.2f vs %.2f ms\n",
                pruning.ack_max_ms - baseline.ack_max_ms, pruning.ack_max_ms, baseline.ack_max_ms,
                pruning.ack_p99_ms - baseline.ack_p99_ms, pruning.stats.commit_seconds.max * 1e3,
                baseline.stats.commit_seconds.max * 1e3);
    std::filesystem::remove_all(dir);
    return 0;
}
