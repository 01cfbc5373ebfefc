// Stream sequences: parking events that skip ahead, releasing them in order when the gap
// fills (in the same batch or a later one), stale sequences, gap policies, and streams
// whose events include types no projection handles.

#include <idem/projections/store.hpp>

#include "fixtures.hpp"

#include <idem/projections/store_hooks.hpp>

#include <idem/projections/layout.hpp>
#include <idem/storage/lmdb.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;

namespace {

constexpr const char* streams = "order-streams";

// Event n of order-1's stream: id "o1-<n>", amount n * 10.
idem::envelope nth(std::uint64_t n, const std::string& order = "order-1") {
    return line(order + "-" + std::to_string(n), order, static_cast<std::int64_t>(n) * 10, n);
}

// The row of a stream that applied exactly the sequences given, in that order.
row_summary applied_in_order(std::initializer_list<std::uint64_t> sequences) {
    reference ref;
    for (auto n : sequences) ref.add("order-1", static_cast<std::int64_t>(n) * 10, n);
    return ref.rows["order-1"];
}

row_summary stream_row(const idem::snapshot& snap, const std::string& key = "order-1") {
    auto rows = dump(snap, streams);
    auto it = rows.find(key);
    return it == rows.end() ? row_summary{} : it->second;
}

// Applies sequences 1..3 of order-1.
void first_three(idem::store& store) {
    auto outcomes = store.apply(std::vector{deliver(nth(1)), deliver(nth(2)), deliver(nth(3))});
    for (const auto& o : outcomes) REQUIRE(o.kind == outcome_kind::applied);
    REQUIRE(stream_row(store.read()) == applied_in_order({1, 2, 3}));
}

}  // namespace

TEST_SUITE("sequences") {

TEST_CASE("an event ahead of its stream is parked until the gap fills, then applied in order") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    first_three(store);
    const auto commit_before = store.read().commit();

    SUBCASE("the gap fills in a later batch") {
        auto o5 = store.apply(deliver(nth(5), "m-5"));
        CHECK(o5.kind == outcome_kind::parked);
        auto between = store.read();
        CHECK(between.consumer(consumer).parked() == 1);
        CHECK(stream_row(between) == applied_in_order({1, 2, 3}));
        CHECK(between.commit() == o5.commit);

        auto o4 = store.apply(deliver(nth(4), "m-4"));
        CHECK(o4.kind == outcome_kind::applied);
        CHECK(o4.commit == o5.commit + 1);
        // The snapshot taken between the batches still sees the stream at 3.
        CHECK(stream_row(between) == applied_in_order({1, 2, 3}));
        CHECK(store.read().consumer(consumer).stats().released == 1);
    }
    SUBCASE("the gap fills in the same batch") {
        auto outcomes = store.apply(std::vector{deliver(nth(5), "m-5"), deliver(nth(4), "m-4")});
        REQUIRE(outcomes.size() == 2);
        CHECK(outcomes[0].kind == outcome_kind::parked);
        CHECK(outcomes[1].kind == outcome_kind::applied);
        CHECK(outcomes[0].commit == commit_before + 1);
        CHECK(outcomes[1].commit == commit_before + 1);
        CHECK(store.read().commit() == commit_before + 1);
    }
    SUBCASE("several parked events are released by one") {
        CHECK(store.apply(deliver(nth(7))).kind == outcome_kind::parked);
        auto outcomes = store.apply(std::vector{deliver(nth(5)), deliver(nth(6))});
        CHECK(outcomes[0].kind == outcome_kind::parked);
        CHECK(outcomes[1].kind == outcome_kind::parked);
        CHECK(store.read().consumer(consumer).parked() == 3);
        CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3}));
        CHECK(store.apply(deliver(nth(4))).kind == outcome_kind::applied);
        auto snap = store.read();
        CHECK(stream_row(snap) == applied_in_order({1, 2, 3, 4, 5, 6, 7}));
        CHECK(snap.consumer(consumer).parked() == 0);
        CHECK(snap.consumer(consumer).stats().released == 3);
        auto row = snap.get<order_total>(streams, "order-1");
        REQUIRE(row);
        CHECK(row->highest_sequence == 7);
        return;
    }

    auto snap = store.read();
    CHECK(snap.consumer(consumer).parked() == 0);
    CHECK(stream_row(snap) == applied_in_order({1, 2, 3, 4, 5}));
    auto row = snap.get<order_total>(streams, "order-1");
    REQUIRE(row);
    CHECK(row->highest_sequence == 5);

    // Stale sequences are duplicates: a different event at position 2, and 5 republished.
    CHECK(store.apply(deliver(line("other-event", "order-1", 999, 2), "m-stale")).kind ==
          outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(nth(5), "m-5-republished")).kind == outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(nth(5), "m-5")).kind == outcome_kind::duplicate_message);
    CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3, 4, 5}));
}

TEST_CASE("a parked event republished or redelivered stays parked once") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    first_three(store);
    CHECK(store.apply(deliver(nth(5), "m-5")).kind == outcome_kind::parked);
    CHECK(store.apply(deliver(nth(5), "m-5")).kind == outcome_kind::duplicate_message);
    CHECK(store.apply(deliver(nth(5), "m-5-again")).kind == outcome_kind::duplicate_event);
    // A different event claiming position 5 conflicts with the parked one.
    auto conflict = store.apply(deliver(line("impostor", "order-1", 7, 5), "m-impostor"));
    CHECK(conflict.kind == outcome_kind::dead_lettered);
    CHECK(conflict.why == idem::reason::sequence_conflict);
    CHECK(store.read().consumer(consumer).parked() == 1);
    CHECK(store.apply(deliver(nth(4), "m-4")).kind == outcome_kind::applied);
    CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3, 4, 5}));
}

TEST_CASE("a parked event stored before its value carried the event id is matched and released as before") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    first_three(store);
    {
        // As the parked table held it: [message id] (length-prefixed), then the envelope.
        std::string old_value;
        idem::layout::put_str(old_value, "m-5");
        old_value += deliver(nth(5)).body;
        auto& env = *idem::detail::store_env(store);
        const auto table = env.table(idem::layout::parked_table(consumer));
        idem::write_txn txn{env};
        txn.put(table, idem::layout::parked_key("order-1", 5), old_value);
        txn.commit();
    }
    auto parked = store.read().consumer(consumer).parked_events();
    REQUIRE(parked.size() == 1);
    CHECK(parked[0].message_id == "m-5");
    CHECK(parked[0].body == deliver(nth(5)).body);
    CHECK(store.apply(deliver(nth(5), "m-5-again")).kind == outcome_kind::duplicate_event);
    auto conflict = store.apply(deliver(line("impostor", "order-1", 7, 5), "m-impostor"));
    CHECK(conflict.why == idem::reason::sequence_conflict);
    CHECK(store.apply(deliver(nth(4), "m-4")).kind == outcome_kind::applied);
    auto snap = store.read();
    CHECK(snap.consumer(consumer).parked() == 0);
    CHECK(snap.consumer(consumer).stats().released == 1);
    CHECK(stream_row(snap) == applied_in_order({1, 2, 3, 4, 5}));
}

TEST_CASE("the gap policy decides what happens to an event ahead of its stream") {
    temp_dir dir;
    auto o = options(dir.env());

    SUBCASE("reject dead-letters it as sequence_gap") {
        o.gaps = idem::gap_policy::reject;
        idem::store store{o};
        store.add(totals_by_subject());
        first_three(store);
        auto o5 = store.apply(deliver(nth(5), "m-5"));
        CHECK(o5.kind == outcome_kind::dead_lettered);
        CHECK(o5.why == idem::reason::sequence_gap);
        auto snap = store.read();
        CHECK(snap.consumer(consumer).parked() == 0);
        CHECK(stream_row(snap) == applied_in_order({1, 2, 3}));
        auto letters = snap.consumer(consumer).dead_letters();
        REQUIRE(letters.size() == 1);
        CHECK(letters[0].why == idem::reason::sequence_gap);
        // 4 then applies normally, and 5 when it is delivered again.
        CHECK(store.apply(deliver(nth(4), "m-4")).kind == outcome_kind::applied);
        CHECK(store.apply(deliver(nth(5), "m-5-retry")).kind == outcome_kind::applied);
        CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3, 4, 5}));
    }
    SUBCASE("apply applies it at once, and the earlier sequence is then a duplicate") {
        o.gaps = idem::gap_policy::apply;
        idem::store store{o};
        store.add(totals_by_subject());
        first_three(store);
        CHECK(store.apply(deliver(nth(5), "m-5")).kind == outcome_kind::applied);
        CHECK(store.read().consumer(consumer).parked() == 0);
        CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3, 5}));
        CHECK(store.apply(deliver(nth(4), "m-4")).kind == outcome_kind::duplicate_event);
        CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3, 5}));
    }
}

TEST_CASE("events of types no projection handles still move their stream on") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());  // handles order.line_added only

    auto c1 = created("o1-created", "order-1", 1);
    auto l2 = line("o1-line-2", "order-1", 20, 2);
    auto l3 = line("o1-line-3", "order-1", 30, 3);
    auto c4 = created("o1-created-again", "order-1", 4);
    auto l5 = line("o1-line-5", "order-1", 50, 5);
    reference ref;
    ref.add("order-1", 20, 2);

    SUBCASE("in order, one per batch") {
        CHECK(store.apply(deliver(c1)).kind == outcome_kind::ignored);
        CHECK(store.apply(deliver(l2)).kind == outcome_kind::applied);
    }
    SUBCASE("the handled event first, one per batch") {
        CHECK(store.apply(deliver(l2)).kind == outcome_kind::parked);
        CHECK(store.apply(deliver(c1)).kind == outcome_kind::ignored);
    }
    SUBCASE("the handled event first, in one batch") {
        auto outcomes = store.apply(std::vector{deliver(l2), deliver(c1)});
        CHECK(outcomes[0].kind == outcome_kind::parked);
        CHECK(outcomes[1].kind == outcome_kind::ignored);
    }
    auto snap = store.read();
    CHECK(snap.consumer(consumer).parked() == 0);
    CHECK(dump(snap, streams) == ref.rows);

    // An unhandled event in the middle of the stream: 5 and 3 arrive before 4.
    CHECK(store.apply(deliver(l5)).kind == outcome_kind::parked);
    CHECK(store.apply(deliver(l3)).kind == outcome_kind::applied);
    CHECK(store.apply(deliver(c4)).kind == outcome_kind::ignored);
    ref.add("order-1", 30, 3);
    ref.add("order-1", 50, 5);
    snap = store.read();
    CHECK(snap.consumer(consumer).parked() == 0);
    CHECK(dump(snap, streams) == ref.rows);
}

TEST_CASE("a parked event survives closing and reopening the store") {
    temp_dir dir;
    {
        idem::store store{options(dir.env())};
        store.add(totals_by_subject());
        first_three(store);
        CHECK(store.apply(deliver(nth(5), "m-5")).kind == outcome_kind::parked);
    }
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    CHECK(store.read().consumer(consumer).parked() == 1);
    CHECK(store.apply(deliver(nth(5), "m-5")).kind == outcome_kind::duplicate_message);
    CHECK(store.apply(deliver(nth(4), "m-4")).kind == outcome_kind::applied);
    CHECK(store.read().consumer(consumer).parked() == 0);
    CHECK(stream_row(store.read()) == applied_in_order({1, 2, 3, 4, 5}));
}

}  // TEST_SUITE
