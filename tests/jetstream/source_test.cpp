// The JetStream source in process, against a real nats-server started per test (random ports,
// its own store): acks leave only after the commit that recorded the outcome is visible and
// durable; a commit that keeps failing naks until MaxDeliver and then stops the run instead
// of losing the message silently; a batch slower than AckWait is kept in progress, so nothing
// is delivered twice; a stream recreated under a checkpoint is refused.

#include <idem/engine/engine.hpp>
#include <idem/projections/store_hooks.hpp>
#include <idem/sources/jetstream.hpp>

#include "../projections/fixtures.hpp"
#include "nats_fixture.hpp"

#include <doctest/doctest.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <nats/nats.h>

#include <algorithm>
#include <filesystem>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace asio = boost::asio;
using namespace idem_test;
using namespace std::chrono_literals;

namespace {

// An io_context run by one thread for the engine's completions.
struct completions {
    asio::io_context io;
    asio::executor_work_guard<asio::io_context::executor_type> guard = asio::make_work_guard(io);
    std::thread thread{[this] { io.run(); }};
    ~completions() {
        guard.reset();
        thread.join();
    }
};

idem::jetstream::source_options source_options(const nats_server& s, const std::string& stream) {
    idem::jetstream::source_options o;
    o.servers = {s.url()};
    o.stream = stream;
    o.consumer = "test";
    o.until_caught_up = true;
    o.fetch_wait = 200ms;
    return o;
}

// Publishes n line events over a few orders and returns their reference.
reference publish_lines(publisher& p, int n, int first = 0) {
    reference ref;
    for (int i = first; i < first + n; ++i) {
        const auto order = "o" + std::to_string(i % 7);
        p.publish(line("ev-" + std::to_string(i), order, i).to_json(), "m-" + std::to_string(i));
        ref.add(order, i);
    }
    return ref;
}

}  // namespace

TEST_SUITE("jetstream source") {

TEST_CASE("every ack leaves after the commit that recorded its outcome, and the rows match the reference") {
    temp_dir dir;
    nats_server server{dir.path() / "nats"};
    publisher pub{server.url(), "ORD"};
    auto ref = publish_lines(pub, 400);
    // The same events again under new message ids (a republish): the stream keeps both copies.
    for (int i = 0; i < 400; i += 5) pub.publish(line("ev-" + std::to_string(i), "o" + std::to_string(i % 7), i).to_json(), "again-" + std::to_string(i));

    completions c;
    auto so = source_options(server, "ORD");
    std::mutex m;
    std::vector<std::string> violations;
    std::vector<std::uint64_t> acked;
    idem::engine* running = nullptr;
    so.on_ack = [&](const idem::jetstream::ack_event& ev) {
        // The commit is visible to a reader and durable (durability full) before its ack.
        const auto visible = running->read().commit();
        std::scoped_lock lock{m};
        if (!ev.acked) violations.push_back("nak of " + std::to_string(ev.stream_sequence));
        if (ev.result.commit == 0 || visible < ev.result.commit || running->durable_commit() < ev.result.commit) {
            violations.push_back("ack of " + std::to_string(ev.stream_sequence) + " before its commit " +
                                 std::to_string(ev.result.commit));
        }
        acked.push_back(ev.stream_sequence);
    };
    idem::jetstream::source src{so};
    auto eo = idem::engine_options{};
    eo.store = options(dir.path() / "db", idem::durability::full);
    idem::engine e{c.io.get_executor(), eo};
    running = &e;
    e.add(totals_by_order());
    auto r = src.run(e);
    e.async_stop(asio::use_future).get();

    CHECK(violations.empty());
    CHECK(r.fetched == 480);
    CHECK(r.acked == 480);
    CHECK(r.outcomes[static_cast<std::size_t>(idem::outcome_kind::applied)] == 400);
    CHECK(r.outcomes[static_cast<std::size_t>(idem::outcome_kind::duplicate_event)] == 80);
    CHECK(r.last_sequence == 480);
    std::sort(acked.begin(), acked.end());
    CHECK(std::unique(acked.begin(), acked.end()) == acked.end());
    CHECK(dump(e.read(), "order-totals") == ref.rows);
    CHECK(e.read().checkpoint(consumer, idem::jetstream::checkpoint_source("ORD", "test")) == 480);
}

TEST_CASE("a commit that keeps failing is nak'd until MaxDeliver, then the run stops naming the message") {
    temp_dir dir;
    nats_server server{dir.path() / "nats"};
    publisher pub{server.url(), "ORD"};
    publish_lines(pub, 3);

    completions c;
    auto so = source_options(server, "ORD");
    so.settings.max_deliver = 3;
    so.settings.ack_wait = 5s;
    so.nak_delay = 100ms;
    std::atomic<int> naks{0};
    std::atomic<int> acks{0};
    so.on_ack = [&](const idem::jetstream::ack_event& ev) { ++(ev.acked ? acks : naks); };
    idem::jetstream::source src{so};
    auto eo = idem::engine_options{};
    eo.store = options(dir.path() / "db", idem::durability::full);
    idem::detail::set_before_commit(eo.store, [](std::uint64_t) {
        throw std::system_error(std::make_error_code(std::errc::io_error), "injected: the disk fails");
    });
    idem::engine e{c.io.get_executor(), eo};
    e.add(totals_by_order());
    try {
        src.run(e);
        FAIL("the run ended although no message could be committed");
    } catch (const std::system_error& err) {
        CHECK(err.code() == idem::errc::delivery_exhausted);
        // Each of the three is named: all of them failed on their last delivery.
        const std::string what = err.what();
        CHECK(what.find("3 messages of stream 'ORD' reached MaxDeliver 3 without a committed outcome") !=
              std::string::npos);
        for (const char* seq : {"sequence 1 ", "sequence 2 ", "sequence 3 "}) {
            CAPTURE(seq);
            CHECK(what.find(seq) != std::string::npos);
        }
    }
    // The stop is recorded beside the store, and a later run refuses to start until accepted.
    const auto record =
        idem::jetstream::exhausted_record(dir.path() / "db", idem::jetstream::checkpoint_source("ORD", so.consumer));
    CHECK(std::filesystem::exists(record));
    {
        idem::jetstream::source again{so};
        try {
            again.run(e);
            FAIL("a run started although the last one stopped on an exhausted message");
        } catch (const std::system_error& err) {
            CHECK(err.code() == idem::errc::delivery_exhausted);
            CHECK(std::string(err.what()).find(record.string()) != std::string::npos);
            CHECK(std::string(err.what()).find("--accept-exhausted") != std::string::npos);
        }
    }
    CHECK(std::filesystem::exists(record));
    e.async_stop(asio::use_future).get();
    CHECK(acks == 0);
    CHECK(naks >= 3);
    CHECK(e.read().commit() == 0);
}

TEST_CASE("a batch slower than AckWait is kept in progress: nothing is delivered twice") {
    temp_dir dir;
    nats_server server{dir.path() / "nats"};
    publisher pub{server.url(), "ORD"};
    auto ref = publish_lines(pub, 40);

    completions c;
    auto so = source_options(server, "ORD");
    so.settings.ack_wait = 1s;
    idem::jetstream::source src{so};
    auto eo = idem::engine_options{};
    eo.store = options(dir.path() / "db", idem::durability::full);
    eo.max_batch = 8;
    idem::engine e{c.io.get_executor(), eo};
    // 40 events x 60 ms: 2.4 s in the engine, more than twice the ack wait.
    e.add(idem::projection<order_total>("order-totals")
              .on<line_added>([](order_total& t, const line_added& ev, const idem::meta& meta) {
                  std::this_thread::sleep_for(60ms);
                  add_line(t, ev, meta);
              })
              .key([](const line_added& ev) { return ev.order_id; }));
    auto r = src.run(e);
    e.async_stop(asio::use_future).get();
    CHECK(r.redelivered == 0);
    CHECK(r.fetched == 40);
    CHECK(dump(e.read(), "order-totals") == ref.rows);
}

TEST_CASE("a stream deleted and created again under a checkpoint is refused, and accepted on request") {
    temp_dir dir;
    nats_server server{dir.path() / "nats"};
    publisher pub{server.url(), "ORD"};
    auto ref = publish_lines(pub, 20);
    const auto db = dir.path() / "db";
    auto consume = [&](bool accept) {
        completions c;
        auto so = source_options(server, "ORD");
        so.accept_stream_reset = accept;
        idem::jetstream::source src{so};
        auto eo = idem::engine_options{};
        eo.store = options(db, idem::durability::full);
        idem::engine e{c.io.get_executor(), eo};
        e.add(totals_by_order());
        try {
            src.run(e);
        } catch (...) {
            e.async_stop(asio::use_future).get();
            throw;
        }
        e.async_stop(asio::use_future).get();
        return dump(e.read(), "order-totals");
    };
    CHECK(consume(false) == ref.rows);
    pub.remove();
    pub.create();
    auto more = publish_lines(pub, 5, 100);  // sequences 1..5 again, other events
    try {
        consume(false);
        FAIL("a recreated stream was consumed");
    } catch (const std::system_error& err) {
        CHECK(err.code() == idem::errc::stream_changed);
        CHECK(std::string(err.what()).find("deleted and created again") != std::string::npos);
    }
    (void)more;
    auto rows = consume(true);
    std::int64_t lines = 0;
    for (const auto& [k, row] : rows) lines += row.lines;
    CHECK(lines == 25);
}

}  // TEST_SUITE
