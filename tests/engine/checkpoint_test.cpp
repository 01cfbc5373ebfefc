// Checkpoints submitted with deliveries: each batch commits one per source in the transaction
// that applies its deliveries. A source that keeps the highest position (a broker, whose
// redeliveries come after newer messages) never moves back; a log's moves to the last one.

#include <idem/engine/engine.hpp>

#include "engine_fixtures.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <cstdint>
#include <future>
#include <string>
#include <tuple>
#include <vector>

namespace asio = boost::asio;
using namespace idem_test;

namespace {

// Applies line i of order o as the delivery at position, and waits for its outcome.
idem::outcome apply_at(idem::engine& e, int i, std::uint64_t position, bool keep_highest,
                       const std::string& source = "nats:S/C") {
    auto d = deliver(line("ev-" + std::to_string(i), "o" + std::to_string(i % 3), 1));
    auto [ec, o] = e.async_apply(std::move(d), idem::checkpoint{source, position, "created=1", keep_highest},
                                 asio::use_future)
                       .get();
    REQUIRE_FALSE(ec);
    return o;
}

}  // namespace

TEST_SUITE("engine checkpoints") {

TEST_CASE("a checkpoint that keeps the highest position never moves back") {
    temp_dir dir;
    asio::io_context io;
    io_threads threads{io, 1};
    {
        idem::engine e{io.get_executor(), engine_options(dir.path())};
        e.add(totals_by_order());
        apply_at(e, 1, 5, true);
        CHECK(e.read().checkpoint(consumer, "nats:S/C") == 5);
        apply_at(e, 2, 3, true);  // a redelivery of an older message
        CHECK(e.read().checkpoint(consumer, "nats:S/C") == 5);
        apply_at(e, 3, 9, true);
        CHECK(e.read().checkpoint(consumer, "nats:S/C") == 9);
        CHECK(e.read().checkpoint_value(consumer, "nats:S/C")->substr(8) == "created=1");
        // The stream created again: its positions start over and replace the old incarnation's.
        auto d = deliver(line("ev-new", "o1", 1));
        auto [ec, o] = e.async_apply(std::move(d), idem::checkpoint{"nats:S/C", 2, "created=2", true}, asio::use_future).get();
        REQUIRE_FALSE(ec);
        CHECK(o.kind == idem::outcome_kind::applied);
        CHECK(e.read().checkpoint(consumer, "nats:S/C") == 2);
        CHECK(e.read().checkpoint_value(consumer, "nats:S/C")->substr(8) == "created=2");
        apply_at(e, 6, 1, true);  // "created=1": an older incarnation's position replaces it again (last wins)

        apply_at(e, 4, 100, false, "log:/a");
        apply_at(e, 5, 40, false, "log:/a");  // a log read again from its start
        CHECK(e.read().checkpoint(consumer, "log:/a") == 40);
        CHECK(e.read().checkpoint(consumer, "nats:S/C") == 1);
        e.async_stop(asio::use_future).get();
    }
}

TEST_CASE("a batch of many deliveries commits each source's highest position once") {
    temp_dir dir;
    asio::io_context io;
    io_threads threads{io, 2};
    idem::engine_options o = engine_options(dir.path());
    o.max_batch = 64;
    idem::engine e{io.get_executor(), o};
    e.add(totals_by_order());
    // Positions out of order, as a broker delivers after redeliveries, from two sources.
    std::vector<std::uint64_t> positions;
    for (std::uint64_t p = 1; p <= 500; ++p) positions.push_back((p * 7919) % 500 + 1);
    std::vector<std::future<std::tuple<std::error_code, idem::outcome>>> done;
    for (std::size_t i = 0; i < positions.size(); ++i) {
        auto source = i % 2 == 0 ? std::string("nats:A/c") : std::string("nats:B/c");
        done.push_back(e.async_apply(deliver(line("e" + std::to_string(i), "o", 1)),
                                     idem::checkpoint{source, positions[i], {}, true}, asio::use_future));
    }
    std::uint64_t highest_a = 0;
    std::uint64_t highest_b = 0;
    for (std::size_t i = 0; i < positions.size(); ++i) {
        (i % 2 == 0 ? highest_a : highest_b) = std::max(i % 2 == 0 ? highest_a : highest_b, positions[i]);
    }
    for (auto& f : done) CHECK_FALSE(std::get<0>(f.get()));
    auto snap = e.read();
    CHECK(snap.checkpoint(consumer, "nats:A/c") == highest_a);
    CHECK(snap.checkpoint(consumer, "nats:B/c") == highest_b);
    CHECK(dump(snap, "order-totals").at("o").lines == 500);
    e.async_stop(asio::use_future).get();
}

}  // TEST_SUITE
