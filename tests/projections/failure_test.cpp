// Batches that cannot commit: an injected failure right before the commit, and a memory
// map that is full (growing when it may, failing with map_full when it may not). Either
// way nothing of the failed batch may remain, and the store must stay usable.

#include <idem/projections/store.hpp>
#include <idem/projections/store_hooks.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;

namespace {

// Everything a failed batch could have left behind.
struct observable {
    std::map<std::string, row_summary> totals;
    std::map<std::string, row_summary> streams;
    std::size_t inbox = 0;
    std::size_t inbox_in_memory = 0;
    std::optional<std::uint64_t> checkpoint;
    std::uint64_t commit = 0;
    std::size_t dead_letters = 0;
    std::size_t parked = 0;
    std::uint64_t batches = 0;
    bool operator==(const observable&) const = default;
};

observable observe(const idem::store& store) {
    auto snap = store.read();
    return observable{dump(snap, "order-totals"),
                      dump(snap, "order-streams"),
                      snap.consumer(consumer).inbox_size(),
                      store.inbox_size(),
                      snap.checkpoint(consumer, "log"),
                      snap.commit(),
                      snap.consumer(consumer).dead_letters().size(),
                      snap.consumer(consumer).parked(),
                      snap.consumer(consumer).stats().batches};
}

}  // namespace

TEST_SUITE("failures") {

TEST_CASE("a batch that fails to commit leaves nothing behind") {
    temp_dir dir;
    std::function<void()> failure;  // thrown from inside the transaction when set
    auto o = options(dir.env());
    idem::detail::set_before_commit(o, [&failure](std::uint64_t) {
        if (failure) failure();
    });
    idem::store store{o};
    store.add(totals_by_order());
    store.add(totals_by_subject());

    auto l1 = line("line-1", "order-1", 10, 1);
    auto l2 = line("line-2", "order-2", 5);
    REQUIRE(count(store.apply(std::vector{deliver(l1, "m-1"), deliver(l2, "m-2")}, idem::checkpoint{"log", 3}))
                [outcome_kind::applied] == 2);

    const std::vector<idem::delivery> batch{
        deliver(line("line-3", "order-1", 20, 2)),           // applies
        deliver(line("line-5", "order-1", 40, 4), "m-5"),    // parks (3 is missing)
        deliver(l1, "m-1"),                                   // redelivered
        idem::delivery{"{\"id\":", "m-bad"},                  // dead letter
        deliver(line("line-6", "order-3", 7), "m-6"),        // applies
        deliver(l2, "m-2-republished"),                       // republished
    };
    const idem::checkpoint at{"log", 9};
    const auto before = observe(store);

    SUBCASE("an exception of the caller's") {
        failure = [] { throw std::runtime_error("injected commit failure"); };
        CHECK_THROWS_AS(store.apply(batch, at), std::runtime_error);
    }
    SUBCASE("a storage error") {
        failure = [] { throw std::system_error(idem::make_error_code(idem::errc::storage_failed), "injected"); };
        CHECK_THROWS_AS(store.apply(batch, at), std::system_error);
    }
    SUBCASE("several failures in a row") {
        failure = [] { throw std::runtime_error("injected commit failure"); };
        for (int i = 0; i < 3; ++i) CHECK_THROWS_AS(store.apply(batch, at), std::runtime_error);
    }
    CHECK(observe(store) == before);

    // The same batch again, now committing: everything applies exactly once.
    failure = nullptr;
    auto outcomes = store.apply(batch, at);
    REQUIRE(outcomes.size() == batch.size());
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[1].kind == outcome_kind::parked);
    CHECK(outcomes[2].kind == outcome_kind::duplicate_message);
    CHECK(outcomes[3].kind == outcome_kind::dead_lettered);
    CHECK(outcomes[3].why == idem::reason::invalid_json);
    CHECK(outcomes[4].kind == outcome_kind::applied);
    CHECK(outcomes[5].kind == outcome_kind::duplicate_event);

    reference ref;
    ref.add("order-1", 10, 1);
    ref.add("order-2", 5);
    ref.add("order-1", 20, 2);
    ref.add("order-3", 7);
    auto after = observe(store);
    CHECK(after.totals == ref.rows);
    CHECK(after.inbox == before.inbox + 5);
    CHECK(after.inbox_in_memory == before.inbox_in_memory + 5);
    CHECK(after.checkpoint == 9);
    CHECK(after.commit == before.commit + 1);
    CHECK(after.dead_letters == 1);
    CHECK(after.parked == 1);
    CHECK(after.batches == before.batches + 1);

    // And once more: every message is now a duplicate.
    for (const auto& o2 : store.apply(batch, at)) CHECK(o2.kind == outcome_kind::duplicate_message);
    CHECK(observe(store).totals == ref.rows);
}

TEST_CASE("a full map grows and the batch is retried") {
    std::size_t initial = 0;
    SUBCASE("32 KiB") { initial = std::size_t{32} << 10; }
    SUBCASE("64 KiB") { initial = std::size_t{64} << 10; }
    SUBCASE("256 KiB") { initial = std::size_t{256} << 10; }
    CAPTURE(initial);

    temp_dir dir;
    auto o = options(dir.env());
    o.tuning.map_size = initial;
    std::unique_ptr<idem::store> store;
    try {
        store = std::make_unique<idem::store>(o);
        store->add(totals_by_order());
    } catch (const std::system_error& e) {
        FAIL("opening a store with a map of " << initial << " bytes threw: " << std::string(e.what()));
    }

    // 3,000 distinct lines over 40 orders, 10% redelivered, in batches of 400.
    std::mt19937_64 rng{7};
    reference ref;
    std::vector<idem::delivery> batch;
    std::size_t batches = 0;
    auto flush = [&] {
        try {
            store->apply(batch);
        } catch (const std::system_error& e) {
            FAIL("batch " << batches << " of " << batch.size() << " threw: " << std::string(e.what()) << " (map "
                          << idem::detail::store_env(*store)->map_size() << " bytes)");
        }
        ++batches;
        batch.clear();
    };
    for (int i = 0; i < 3000; ++i) {
        auto order = "order-" + std::to_string(rng() % 40);
        auto amount = static_cast<std::int64_t>(rng() % 1000) + 1;
        auto d = deliver(line("line-" + std::to_string(i), order, amount), "msg-" + std::to_string(i));
        ref.add(order, amount);
        if (rng() % 10 == 0) batch.push_back(d);
        batch.push_back(std::move(d));
        if (batch.size() >= 400) flush();
    }
    flush();
    CHECK(dump(store->read(), "order-totals") == ref.rows);
    CHECK(store->inbox_size() == 3000);
    CHECK(idem::detail::store_env(*store)->map_size() > initial);
}

TEST_CASE("a map that may not grow fails the batch with map_full and keeps nothing of it") {
    temp_dir dir;
    auto o = options(dir.env());
    o.tuning.map_size = std::size_t{256} << 10;
    o.tuning.max_map_size = o.tuning.map_size;
    idem::store store{o};
    store.add(totals_by_order());

    reference ref;
    std::vector<idem::delivery> small;
    for (int i = 0; i < 10; ++i) {
        small.push_back(deliver(line("small-" + std::to_string(i), "order-1", i + 1)));
        ref.add("order-1", i + 1);
    }
    REQUIRE(count(store.apply(small))[outcome_kind::applied] == small.size());
    const auto rows_before = dump(store.read(), "order-totals");
    REQUIRE(rows_before == ref.rows);
    const auto commit_before = store.read().commit();
    const auto inbox_before = store.inbox_size();

    // Far more than 256 KiB: 5,000 distinct rows, contributors and inbox entries.
    std::vector<idem::delivery> big;
    for (int i = 0; i < 5000; ++i) {
        big.push_back(deliver(line("a-rather-long-event-id-to-fill-pages-" + std::to_string(i),
                                   "order-" + std::to_string(i), 1),
                              "a-rather-long-message-id-" + std::to_string(i)));
    }
    bool threw = false;
    try {
        store.apply(big);
    } catch (const std::system_error& e) {
        threw = true;
        INFO("what: " << std::string(e.what()) << ", code: " << e.code().category().name() << " " << e.code().value());
        CHECK(e.code() == idem::errc::map_full);
        CHECK(e.code().default_error_condition() ==
              idem::make_error_code(idem::errc::map_full).default_error_condition());
    }
    CHECK(threw);
    CHECK(idem::detail::store_env(store)->map_size() == o.tuning.map_size);

    auto snap = store.read();
    CHECK(dump(snap, "order-totals") == rows_before);
    CHECK(snap.commit() == commit_before);
    CHECK(snap.consumer(consumer).inbox_size() == inbox_before);
    CHECK(store.inbox_size() == inbox_before);

    // A small batch still fits afterwards; the big batch's first events were not recorded.
    auto outcomes = store.apply(std::vector{big[0], big[1], deliver(line("small-10", "order-1", 11))});
    for (const auto& oc : outcomes) CHECK(oc.kind == outcome_kind::applied);
    ref.add("order-0", 1);
    ref.add("order-1", 11);
    ref.add("order-1", 1);  // big[1] is order-1's
    CHECK(dump(store.read(), "order-totals") == ref.rows);
}

TEST_CASE("a closed fence refuses every commit and keeps nothing of it") {
    temp_dir dir;
    bool lease_held = true;
    auto o = options(dir.env());
    o.fence = [&lease_held] {
        if (!lease_held) idem::throw_error(idem::errc::lease_lost, "partition 0: the lease may have expired");
    };
    idem::store store{o};
    store.add(totals_by_order());
    store.add(totals_by_subject());
    REQUIRE(store.apply(deliver(line("line-1", "order-1", 10, 1), "m-1")).kind == outcome_kind::applied);
    const auto before = observe(store);

    lease_held = false;
    const std::vector<idem::delivery> batch{deliver(line("line-2", "order-1", 20, 2), "m-2"),
                                            deliver(line("line-3", "order-2", 5), "m-3")};
    for (int i = 0; i < 2; ++i) {
        try {
            store.apply(batch, idem::checkpoint{"log", 7});
            FAIL("a commit passed a closed fence");
        } catch (const std::system_error& e) {
            CHECK(e.code() == idem::make_error_code(idem::errc::lease_lost));
            CHECK(std::string(e.what()).find("partition 0") != std::string::npos);
        }
    }
    CHECK(observe(store) == before);

    lease_held = true;  // the lease taken again: the same batch applies once
    auto outcomes = store.apply(batch, idem::checkpoint{"log", 7});
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[1].kind == outcome_kind::applied);
    reference ref;
    ref.add("order-1", 10, 1);
    ref.add("order-1", 20, 2);
    ref.add("order-2", 5);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
}

}  // TEST_SUITE
