// compare_idem: idem's variants of the side-by-side comparison (see compare.hpp).
//
//   live-1, live-16, live-256   the engine (one writer, group commit), durability::full,
//                               that many closed-loop submitters sharing one log reader
//   live-256-retention          live-256 with a 2-second inbox retention window: the inbox
//                               size after the run (a redelivery later than the window is
//                               caught by the row's contributing set, as duplicate_event)
//   apply-1000                  the synchronous store::apply, 1000 deliveries per
//                               transaction, durability::full: idem batched exactly as the
//                               textbook peers are
//   rebuild-binary, rebuild-jsonl  idem::rebuild from the binary log / from JSON Lines
//   consume-binary, consume-jsonl  idem::consume (`idem consume --log`) of the same logs into
//                               an empty store: the live path, durability::full, batches of
//                               the library's default size
//   hot-row                     the apply cost of a row with many contributors against
//                               a row with 10 (a figure, not the workload)

#include "compare.hpp"

#include <idem/sources/consume.hpp>
#include <idem/sources/rebuild.hpp>
#include <idem/engine.hpp>
#include <idem/idem.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <optional>
#include <span>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

namespace {

namespace asio = boost::asio;
using namespace idem_compare;
using idem_bench::clock_type;

constexpr const char* consumer = "order-projector";

double seconds_since(clock_type::time_point start) {
    return std::chrono::duration<double>(clock_type::now() - start).count();
}

std::uint64_t file_size_or_zero(const std::filesystem::path& p) {
    std::error_code ec;
    auto size = std::filesystem::file_size(p, ec);
    return ec ? 0 : size;
}

// --- live ------------------------------------------------------------------------

struct live_state {
    live_state(const std::filesystem::path& log, std::uint64_t max) : reader(log), limit(max) {}

    idem::log_reader reader;
    idem::log_record record;
    std::uint64_t limit = 0;
    std::uint64_t submitted = 0;
    std::uint64_t applied = 0;
    std::uint64_t duplicates = 0;
    std::uint64_t other = 0;
    bool event_duplicates = false;  // duplicate_event counts as a duplicate (inbox retention on)
    std::error_code failure;

    // The io_context runs on one thread: submitters take records in turn without a lock.
    bool take(idem::delivery& d) {
        if (limit != 0 && submitted == limit) return false;
        if (!reader.next(record)) return false;
        ++submitted;
        d.body.assign(record.body);
        d.message_id.clear();  // the envelope's msgid is the message id
        return true;
    }
};

asio::awaitable<void> submitter(idem::engine& engine, live_state& s) {
    for (;;) {
        idem::delivery d;
        if (!s.take(d)) co_return;
        // Named result, no structured binding over the co_await (GCC 12 coroutine bugs).
        auto result = co_await engine.async_apply(std::move(d), asio::use_awaitable);
        const auto& ec = std::get<0>(result);
        const auto& out = std::get<1>(result);
        if (ec) {
            s.failure = ec;
        } else if (out.kind == idem::outcome_kind::applied) {
            ++s.applied;
        } else if (out.kind == idem::outcome_kind::duplicate_message ||
                   (s.event_duplicates && out.kind == idem::outcome_kind::duplicate_event)) {
            ++s.duplicates;
        } else {
            ++s.other;
        }
    }
}

run_result run_live(const run_options& o, std::size_t submitters,
                    std::optional<std::chrono::seconds> retention = std::nullopt) {
    run_result r;
    const auto db = o.dir / "db";
    {
        asio::io_context io{1};
        idem::engine_options eo{.store = {.path = db, .consumer = consumer, .sync = idem::durability::full},
                                .max_batch = 4096,
                                .max_delay = std::chrono::microseconds(0),
                                .max_in_flight = 65536};
        if (retention) eo.store.retention.inbox_retention = *retention;
        idem::engine engine{io.get_executor(), std::move(eo)};
        engine.add(idem_bench::order_totals_projection());
        live_state s{o.log, o.limit};
        s.event_duplicates = retention.has_value();
        if (retention) r.figures.emplace_back("retention_s", std::to_string(retention->count()));

        const auto io_before = idem_bench::read_io();
        const auto start = clock_type::now();
        for (std::size_t k = 0; k < submitters; ++k) asio::co_spawn(io, submitter(engine, s), asio::detached);
        io.run();
        r.seconds = seconds_since(start);
        const auto io_after = idem_bench::read_io();
        if (s.failure) throw std::system_error(s.failure, "a delivery failed");
        if (s.other != 0) throw std::runtime_error(std::to_string(s.other) + " unexpected outcomes");
        r.write_bytes = io_after.write_bytes - io_before.write_bytes;
        r.wchar = io_after.wchar - io_before.wchar;
        r.messages = s.submitted;
        r.applied = s.applied;
        r.duplicates = s.duplicates;
        const auto snap = engine.read();
        r.state = idem_bench::read_summary(snap);
        r.figures.emplace_back("inbox_ids", std::to_string(snap.consumer(consumer).inbox_size()));
        const auto stats = engine.stats();
        r.figures.emplace_back("batch_p50", idem_bench::fixed(stats.batch_size.p50, 0));
        r.figures.emplace_back("syncs", std::to_string(stats.syncs));
        r.figures.emplace_back("commit_ms_p50", idem_bench::fixed(stats.commit_seconds.p50 * 1e3, 2));
    }
    r.store_bytes = file_size_or_zero(db / "data.mdb");
    return r;
}

// --- apply ---------------------------------------------------------------------

run_result run_apply(const run_options& o, std::size_t per_txn) {
    run_result r;
    const auto db = o.dir / "db";
    {
        idem::store store{{.path = db, .consumer = consumer, .sync = idem::durability::full}};
        store.add(idem_bench::order_totals_projection());
        idem::log_reader reader{o.log};
        idem::log_record record;
        std::vector<idem::delivery> batch(per_txn);

        const auto io_before = idem_bench::read_io();
        const auto start = clock_type::now();
        bool more = true;
        while (more) {
            std::size_t n = 0;
            while (n < per_txn && (o.limit == 0 || r.messages < o.limit) && (more = reader.next(record))) {
                batch[n++].body.assign(record.body);
                ++r.messages;
            }
            if (o.limit != 0 && r.messages == o.limit) more = false;
            if (n == 0) break;
            for (const auto& out : store.apply(std::span<const idem::delivery>{batch.data(), n})) {
                if (out.kind == idem::outcome_kind::applied) {
                    ++r.applied;
                } else if (out.kind == idem::outcome_kind::duplicate_message) {
                    ++r.duplicates;
                } else {
                    throw std::runtime_error(std::string("unexpected outcome ") + std::string(idem::to_string(out.kind)));
                }
            }
        }
        r.seconds = seconds_since(start);
        const auto io_after = idem_bench::read_io();
        r.write_bytes = io_after.write_bytes - io_before.write_bytes;
        r.wchar = io_after.wchar - io_before.wchar;
        const auto snap = store.read();
        r.state = idem_bench::read_summary(snap);
        r.figures.emplace_back("inbox_ids", std::to_string(snap.consumer(consumer).inbox_size()));
    }
    r.store_bytes = file_size_or_zero(db / "data.mdb");
    return r;
}

// --- rebuild and consume -------------------------------------------------------------

enum class log_path { rebuild, consume };

// A whole log through idem::rebuild (one bulk build, one sync) or idem::consume (the live
// path: each batch a durable commit with the log's position as its checkpoint).
run_result run_log(const run_options& o, const std::filesystem::path& log, log_path how) {
    if (o.limit != 0) throw std::runtime_error("rebuild and consume read whole logs (no --limit)");
    run_result r;
    const auto db = o.dir / "db";
    auto apply = [&](idem::log_run_options& lo) {
        lo.store.path = db;
        lo.store.consumer = consumer;
        lo.logs = {log};
        lo.setup = [](idem::store& s) { s.add(idem_bench::order_totals_projection()); };
    };
    const auto io_before = idem_bench::read_io();
    const auto start = clock_type::now();
    idem::log_run_result result;
    if (how == log_path::rebuild) {
        idem::rebuild_options ro;
        apply(ro);
        result = idem::rebuild(ro);
    } else {
        idem::consume_options co;
        apply(co);
        co.store.tuning.huge_index_pages = true;  // as `idem consume --log` does
        result = idem::consume(co);
        r.figures.emplace_back("syncs", std::to_string(result.stats.batches));  // a durable commit per batch
    }
    r.seconds = seconds_since(start);
    const auto io_after = idem_bench::read_io();
    r.write_bytes = io_after.write_bytes - io_before.write_bytes;
    r.wchar = io_after.wchar - io_before.wchar;
    r.messages = result.records;
    const auto& outcomes = result.stats.outcomes;
    r.applied = outcomes[static_cast<std::size_t>(idem::outcome_kind::applied)];
    r.duplicates = outcomes[static_cast<std::size_t>(idem::outcome_kind::duplicate_message)];
    {
        const auto snap = idem::snapshot::open(db);
        r.state = idem_bench::read_summary(snap);
        r.figures.emplace_back("inbox_ids", std::to_string(snap.consumer(consumer).inbox_size()));
    }
    r.store_bytes = file_size_or_zero(db / "data.mdb");
    return r;
}

// --- hot row -----------------------------------------------------------------------

std::string line(std::uint64_t i, const std::string& order) {
    idem::envelope e;
    e.id = "hot-" + std::to_string(i);
    e.source = "/orders";
    e.type = "order.line_added";
    e.data = R"({"order_id":")" + order + R"(","amount":1})";
    return e.to_json();
}

// Applies `count` new events to `order`, one transaction each (no fsync: the figure is
// the apply path's cost, not the disk's); returns microseconds per event.
double apply_one_by_one(idem::store& store, const std::string& order, std::uint64_t first, std::uint64_t count) {
    std::vector<idem::delivery> events;
    events.reserve(count);
    for (std::uint64_t i = 0; i < count; ++i) events.push_back({line(first + i, order), ""});
    const auto start = clock_type::now();
    for (const auto& d : events) {
        if (store.apply(d).kind != idem::outcome_kind::applied) throw std::runtime_error("hot-row: not applied");
    }
    return seconds_since(start) * 1e6 / static_cast<double>(count);
}

run_result run_hot_row(const run_options& o) {
    run_result r;
    r.has_state = false;
    idem::store store{{.path = o.dir / "db", .consumer = consumer, .sync = idem::durability::none}};
    store.add(idem_bench::order_totals_projection());
    // Fill: the hot row gets `contributors` events, the cold one 10, in large batches.
    std::uint64_t next = 0;
    const std::uint64_t batch = 10'000;
    for (std::uint64_t done = 0; done < o.contributors; done += batch) {
        std::vector<idem::delivery> fill;
        for (std::uint64_t i = done; i < std::min(o.contributors, done + batch); ++i) {
            fill.push_back({line(next++, "order-hot"), ""});
        }
        store.apply(fill);
    }
    for (int i = 0; i < 10; ++i) store.apply(idem::delivery{line(next++, "order-cold"), ""});

    const std::uint64_t measured = 10'000;
    // Interleaved halves, so drift of a shared machine hits both rows alike.
    double hot = 0;
    double cold = 0;
    for (int half = 0; half < 2; ++half) {
        hot += apply_one_by_one(store, "order-hot", next, measured / 2) / 2;
        next += measured / 2;
        cold += apply_one_by_one(store, "order-cold", next, measured / 2) / 2;
        next += measured / 2;
    }
    r.messages = 2 * measured;
    r.figures.emplace_back("hot_contributors", std::to_string(o.contributors));
    r.figures.emplace_back("hot_us_per_event", idem_bench::fixed(hot, 2));
    r.figures.emplace_back("cold_us_per_event", idem_bench::fixed(cold, 2));
    r.figures.emplace_back("hot_over_cold", idem_bench::fixed(hot / cold, 2));
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main(argc, argv, "compare_idem",
                    {
                        {"live-1", [](const run_options& o) { return run_live(o, 1); }},
                        {"live-16", [](const run_options& o) { return run_live(o, 16); }},
                        {"live-256", [](const run_options& o) { return run_live(o, 256); }},
                        {"live-256-retention",
                         [](const run_options& o) { return run_live(o, 256, std::chrono::seconds(2)); }},
                        {"apply-1000", [](const run_options& o) { return run_apply(o, 1000); }},
                        {"rebuild-binary", [](const run_options& o) { return run_log(o, o.log, log_path::rebuild); }},
                        {"rebuild-jsonl", [](const run_options& o) { return run_log(o, o.jsonl, log_path::rebuild); }},
                        {"consume-binary", [](const run_options& o) { return run_log(o, o.log, log_path::consume); }},
                        {"consume-jsonl", [](const run_options& o) { return run_log(o, o.jsonl, log_path::consume); }},
                        {"hot-row", run_hot_row},
                    });
}
