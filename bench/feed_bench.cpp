// Commit-to-subscriber latency of the change feed in process: an engine (durability full) takes
// order lines from closed-loop submitters while a subscriber on another thread follows the
// feed; for every entry it receives, the time since its commit began (change::time_ns, taken
// as the batch started, so the figure includes apply, commit and fsync) and since the
// submitter's completion of the same commit (the moment a source would acknowledge).
//
//   feed_bench DIR [--messages N] [--aggregates A] [--submitters S]
//
// DIR must be new or empty (on disk: tmpfs has no fsync to wait for).

#include "workload.hpp"

#include <idem/engine/engine.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>

namespace asio = boost::asio;
using namespace idem_bench;

namespace idem_bench {
[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr, "feed_bench: %s\nusage: feed_bench DIR [--messages N] [--aggregates A] [--submitters S]\n", why);
    std::exit(2);
}
}  // namespace idem_bench

namespace {

std::uint64_t wall_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

// When each commit's first submission completed (the acknowledgement), by commit.
struct acks {
    std::mutex mutex;
    std::unordered_map<std::uint64_t, std::uint64_t> first;
    void record(std::uint64_t commit, std::uint64_t at) {
        std::scoped_lock lock{mutex};
        first.try_emplace(commit, at);
    }
};

asio::awaitable<void> submit(idem::engine& engine, std::span<const idem::delivery> all, std::atomic<std::size_t>& next,
                             acks& acked) {
    for (;;) {
        const auto i = next.fetch_add(1);
        if (i >= all.size()) co_return;
        auto [ec, o] = co_await engine.async_apply(all[i], asio::use_awaitable);
        if (ec) throw std::system_error(ec, "apply");
        acked.record(o.commit, wall_ns());
    }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) usage("no DIR");
    const std::filesystem::path dir = argv[1];
    std::size_t messages = 200'000, aggregates = 10'000, submitters = 64;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string_view name = argv[i];
        if (name == "--messages") messages = parse_number<std::size_t>(name, argv[i + 1]);
        else if (name == "--aggregates") aggregates = parse_number<std::size_t>(name, argv[i + 1]);
        else if (name == "--submitters") submitters = parse_number<std::size_t>(name, argv[i + 1]);
        else usage(("unknown option " + std::string(name)).c_str());
    }
    if (std::filesystem::exists(dir) && !std::filesystem::is_empty(dir)) usage("DIR must be new or empty");
    const auto w = generate(messages, aggregates, 0.1, 7);

    asio::io_context io;
    idem::engine_options eo;
    eo.store = {.path = dir, .consumer = "bench"};
    idem::engine engine{io.get_executor(), eo};
    engine.add(order_totals_projection().changes());

    // The subscriber: its own thread and io_context, as an application pushing changes out would have.
    asio::io_context follower;
    auto sub = engine.subscribe();
    std::vector<double> since_commit_ms, since_ack_ms;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> received;  // commit, when
    std::size_t entries = 0;
    std::atomic<bool> done{false};
    std::atomic<std::uint64_t> followed{0};  // the last commit the subscriber received
    asio::co_spawn(
        follower,
        [&]() -> asio::awaitable<void> {
            while (!done.load()) {
                auto [ec, batch] = co_await sub.async_next(asio::use_awaitable);
                if (ec) co_return;
                const auto now = wall_ns();
                for (const auto& c : batch) {
                    since_commit_ms.push_back(static_cast<double>(now - c.time_ns) / 1e6);
                    ++entries;
                }
                if (batch.empty()) continue;
                received.emplace_back(batch.back().position.commit, now);
                followed = batch.back().position.commit;
            }
        },
        asio::detached);
    std::thread follower_thread{[&] { follower.run(); }};

    acks acked;
    std::atomic<std::size_t> next{0};
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < submitters; ++s) asio::co_spawn(io, submit(engine, w.deliveries, next, acked), asio::detached);
    io.run();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Let the subscriber catch up with the last commit, then stop it.
    const auto last = engine.read().change_feed().last_commit;
    while (followed.load() < last) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    done = true;
    sub.cancel();
    follower_thread.join();
    for (const auto& [commit, at] : received) {
        auto it = acked.first.find(commit);
        if (it != acked.first.end()) since_ack_ms.push_back(static_cast<double>(static_cast<std::int64_t>(at - it->second)) / 1e6);
    }
    std::printf("%zu messages, %zu submitters, durability full: %.0f msgs/s, %zu feed entries in %zu deliveries\n",
                w.deliveries.size(), submitters, static_cast<double>(w.deliveries.size()) / secs, entries, received.size());
    std::printf("commit start -> subscriber: p50 %s ms, p99 %s ms\n", fixed(percentile(since_commit_ms, 0.5), 3).c_str(),
                fixed(percentile(since_commit_ms, 0.99), 3).c_str());
    std::printf("submitter's completion -> subscriber (same commit): p50 %s ms, p99 %s ms\n",
                fixed(percentile(since_ack_ms, 0.5), 3).c_str(), fixed(percentile(since_ack_ms, 0.99), 3).c_str());
    const auto got = read_summary(engine.read());
    if (!(got == reference(w))) {
        std::fprintf(stderr, "feed_bench: the rows differ from the reference\n");
        return 1;
    }
    return 0;
}
