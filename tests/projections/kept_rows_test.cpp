// Rows and streams the live writer keeps decoded from one batch to the next: they must be
// exactly what the store holds, so they are dropped whenever something else may have written
// it since the commit they were kept at. Each case would give wrong rows with stale ones.

#include <idem/projections/store.hpp>
#include <idem/projections/layout.hpp>
#include <idem/projections/store_hooks.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/lmdb.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;

TEST_SUITE("kept rows") {

TEST_CASE("a second store on the same environment writes between two batches: the first reads its rows again") {
    temp_dir dir;
    idem::store first{options(dir.env())};
    first.add(totals_by_subject());
    idem::store second{options(dir.env())};
    second.add(totals_by_subject());

    REQUIRE(first.apply(deliver(line("line-1", "order-1", 10, 1))).kind == outcome_kind::applied);
    REQUIRE(second.apply(deliver(line("line-2", "order-1", 20, 2))).kind == outcome_kind::applied);
    // Kept as of line-1, order-1 would miss line-2 and take sequence 3 as a gap.
    CHECK(first.apply(deliver(line("line-3", "order-1", 30, 3))).kind == outcome_kind::applied);
    CHECK(first.apply(deliver(line("line-2", "order-1", 20, 2), "m-other")).kind == outcome_kind::duplicate_event);

    reference ref;
    ref.add("order-1", 10, 1);
    ref.add("order-1", 20, 2);
    ref.add("order-1", 30, 3);
    CHECK(dump(first.read(), "order-streams") == ref.rows);
}

TEST_CASE("an operator action between two batches: the next batch starts from what it changed") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());

    REQUIRE(store.apply(deliver(line("line-1", "order-1", 10, 1))).kind == outcome_kind::applied);
    REQUIRE(store.apply(deliver(line("line-3", "order-1", 30, 3))).kind == outcome_kind::parked);
    // The operator gives up on sequence 2: line-3 is applied and the stream is at 3.
    store.release("order-1");
    CHECK(store.apply(deliver(line("line-4", "order-1", 40, 4))).kind == outcome_kind::applied);

    reference ref;
    ref.add("order-1", 10, 1);
    ref.add("order-1", 30, 3);
    ref.add("order-1", 40, 4);
    CHECK(dump(store.read(), "order-streams") == ref.rows);
    CHECK(store.read().consumer(consumer).parked() == 0);
}

TEST_CASE("a batch that fails after its handlers ran leaves nothing in the kept rows") {
    temp_dir dir;
    bool fail = false;
    auto o = options(dir.env());
    o.fence = [&fail] {
        if (fail) throw std::runtime_error("injected: the commit is refused");
    };
    idem::store store{o};
    store.add(totals_by_subject());

    REQUIRE(store.apply(deliver(line("line-1", "order-1", 10, 1))).kind == outcome_kind::applied);
    fail = true;
    CHECK_THROWS_AS(store.apply(deliver(line("line-2", "order-1", 20, 2))), std::runtime_error);
    fail = false;
    // Kept as the failed batch left them, order-1 would hold line-2 and call this a duplicate.
    CHECK(store.apply(deliver(line("line-2", "order-1", 20, 2))).kind == outcome_kind::applied);

    reference ref;
    ref.add("order-1", 10, 1);
    ref.add("order-1", 20, 2);
    CHECK(dump(store.read(), "order-streams") == ref.rows);
}

TEST_CASE("events parked in one batch are released by a later one, kept or read again after a reopen") {
    bool reopen = false;
    SUBCASE("the same store throughout") { reopen = false; }
    SUBCASE("a new store object between the batches") { reopen = true; }
    temp_dir dir;
    std::optional<idem::store> store;
    auto open = [&] {
        store.reset();
        store.emplace(options(dir.env()));
        store->add(totals_by_subject());
    };
    open();
    REQUIRE(store->apply(deliver(line("a-1", "order-a", 1, 1))).kind == outcome_kind::applied);
    REQUIRE(store->apply(deliver(line("a-3", "order-a", 3, 3))).kind == outcome_kind::parked);
    REQUIRE(store->apply(deliver(line("b-2", "order-b", 20, 2))).kind == outcome_kind::parked);
    if (reopen) open();
    // order-b's successor of 1 arrives with order-a's gap filled: both streams release.
    const std::vector<idem::delivery> batch{deliver(line("b-1", "order-b", 10, 1)), deliver(line("a-2", "order-a", 2, 2))};
    for (const auto& o : store->apply(batch)) CHECK(o.kind == outcome_kind::applied);
    CHECK(store->apply(deliver(line("a-4", "order-a", 4, 4))).kind == outcome_kind::applied);

    reference ref;
    for (std::uint64_t s = 1; s <= 4; ++s) ref.add("order-a", static_cast<std::int64_t>(s), s);
    ref.add("order-b", 10, 1);
    ref.add("order-b", 20, 2);
    CHECK(dump(store->read(), "order-streams") == ref.rows);
    CHECK(store->read().consumer(consumer).parked() == 0);
    CHECK(store->read().consumer(consumer).stats().released == 2);
}

TEST_CASE("a stream written into the table behind the writer's back is read, not assumed absent") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    // Unsequenced: the streams table stays empty, so the writer knows every stream in it.
    REQUIRE(store.apply(deliver(line("line-0", "order-1", 1))).kind == outcome_kind::applied);
    {
        std::string highest;
        idem::codec::put_u64_le(highest, 5);
        auto& env = *idem::detail::store_env(store);
        idem::write_txn txn{env};
        txn.put(env.table(idem::layout::streams_table(consumer)), "order-1", highest);
        txn.commit();
    }
    // The table no longer holds what the writer kept: order-1 is at 5, so 3 was applied before.
    CHECK(store.apply(deliver(line("line-3", "order-1", 30, 3))).kind == outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(line("line-6", "order-1", 60, 6))).kind == outcome_kind::applied);
}

}  // TEST_SUITE
