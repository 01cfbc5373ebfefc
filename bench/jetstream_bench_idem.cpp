// jetstream_bench's idem contender: idem::jetstream::source over an idem::engine with
// durability::full and the order-totals projection, on the stream the harness published.
// Built only when bench/meson.build's jetstream_source_ready is true (the source's
// implementation lives in sources/src/jetstream/); the harness calls it then.

#include "jetstream_bench.hpp"

#include <idem/engine.hpp>
#include <idem/sources/jetstream.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace idem_bench::js {

namespace {

namespace asio = boost::asio;

idem::jetstream::source_options source_options_for(const contender_context& c) {
    idem::jetstream::source_options so;
    so.servers = {c.url};
    so.stream = c.stream;
    so.consumer = c.consumer;
    so.settings.ack_wait = c.ack_wait;
    so.settings.max_ack_pending = c.max_ack_pending;
    so.fetch_batch = static_cast<std::size_t>(c.fetch_batch);
    // The stream is complete before the run starts: stop once its last message is committed.
    so.until_caught_up = true;
    return so;
}

idem::engine_options engine_options_for(const contender_context& c, const idem::jetstream::source& src) {
    idem::engine_options eo;
    eo.store.path = c.dir;
    eo.store.consumer = "bench";
    eo.store.sync = idem::durability::full;
    eo.store.retention.inbox_retention = std::chrono::hours(24);
    eo.store.retention.source = src.bound();
    // The whole MaxAckPending window may be in the engine at once (notes §7, backpressure).
    eo.max_in_flight = std::max<std::size_t>(eo.max_in_flight, static_cast<std::size_t>(c.max_ack_pending));
    eo.max_delay = c.idem_max_delay;
    return eo;
}

std::string outcome_counts(const idem::jetstream::source_result& r) {
    std::string text;
    for (std::size_t k = 0; k < idem::outcome_kinds; ++k) {
        if (r.outcomes[k] == 0) continue;
        if (!text.empty()) text += ", ";
        text += std::to_string(r.outcomes[k]) + " " + std::string(idem::to_string(static_cast<idem::outcome_kind>(k)));
    }
    return text;
}

}  // namespace

contender_result run_idem(const contender_context& c) {
    contender_result r;
    r.name = "idem (durability::full)";
    r.has_state = true;
    // The engine completes on this io_context; the source's run() blocks the calling thread.
    asio::io_context io;
    auto work = asio::make_work_guard(io);
    std::thread runner{[&io] { io.run(); }};
    try {
        idem::jetstream::source src{source_options_for(c)};
        std::optional<idem::engine> engine;
        engine.emplace(io.get_executor(), engine_options_for(c, src));
        engine->add(order_totals_projection());

        const auto io_before = read_io();
        const auto start = clock_type::now();
        const auto result = src.run(*engine);
        r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        r.write_bytes = read_io().write_bytes - io_before.write_bytes;
        r.messages = result.acked;

        const auto stats = engine->stats();
        r.ack_p50 = stats.ack_seconds.p50;
        r.ack_p99 = stats.ack_seconds.p99;
        r.ack_note =
            "engine.stats().ack_seconds, submission to completion (the ack is sent from the completion), over the "
            "engine's most recent samples";
        // The engine's own clocks; the rest is the source's fetch loop and the broker.
        const double commit_total = stats.commit_seconds.p50 * static_cast<double>(stats.batches);
        r.phases = {{"batch apply + commit + fsync (p50 x batches, approx.)", commit_total},
                    {"fetch, decode, submit, ack (the rest)", std::max(0.0, r.seconds - commit_total)}};
        r.notes.push_back(std::to_string(result.fetched) + " fetched, " + std::to_string(result.redelivered) +
                          " redelivered by the server, " + std::to_string(result.nakked) + " nak'd; " +
                          outcome_counts(result));
        r.notes.push_back(std::to_string(stats.batches) + " batches (p50 " + fixed(stats.batch_size.p50, 0) + ", p99 " +
                          fixed(stats.batch_size.p99, 0) + " deliveries), commit p50 " +
                          fixed(stats.commit_seconds.p50 * 1e3, 2) + " ms, p99 " +
                          fixed(stats.commit_seconds.p99 * 1e3, 2) + " ms; checkpoint " +
                          std::to_string(result.last_sequence) + " of " + std::to_string(c.stream_messages));
        if (result.last_sequence != c.stream_messages || result.nakked != 0) {
            throw std::runtime_error("idem: the run ended before the stream's last message was committed and acked");
        }
        // The same check as the textbook's: the rows against the reference (the harness compares).
        r.state = read_summary(engine->read());
        engine.reset();
    } catch (...) {
        work.reset();
        runner.join();
        throw;
    }
    work.reset();
    runner.join();
    r.store_bytes = store_size(c.dir);
    return r;
}

}  // namespace idem_bench::js
