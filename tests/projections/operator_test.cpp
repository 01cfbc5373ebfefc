// Operator actions and diagnostics: redriving dead letters after a fix, releasing parked
// streams past their gaps (or dropping them), the audit of both, explaining an event however
// it was delivered, and dead letters of oversized envelopes. Real LMDB environments; rows
// are compared with references computed here.

#include <idem/projections/store.hpp>
#include <idem/projections/explain.hpp>

#include "fixtures.hpp"

#include <idem/storage/log_position.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;
using idem::reason;

namespace {

/// A switch a test flips to "fix" a handler.
using fault = std::shared_ptr<std::atomic<bool>>;

/// An order_total projection whose handler throws for amounts divisible by 7 while broken is set.
idem::projection<order_total> fragile(const fault& broken, std::string name = "order-totals",
                                      bool by_subject = false) {
    auto p = idem::projection<order_total>(std::move(name))
                 .on<line_added>([broken](order_total& t, const line_added& e, const idem::meta& m) {
                     if (broken->load() && e.amount % 7 == 0) throw std::runtime_error("amount divisible by 7");
                     add_line(t, e, m);
                 });
    if (!by_subject) p.key([](const line_added& e) { return e.order_id; });
    return p;
}

/// Positions keyed by account, with the fill's exec id as effect key.
idem::projection<position> positions() {
    return idem::projection<position>("positions")
        .on<fill>([](position& p, const fill& f) { p.qty += f.qty; })
        .key([](const fill& f) { return f.account; })
        .effect_key([](const fill& f) { return f.exec_id; });
}

/// The independent FNV-1a 64 of bytes.
std::uint64_t fnv1a(std::string_view bytes) {
    std::uint64_t h = 14695981039346656037ULL;
    for (char ch : bytes) {
        const auto c = static_cast<unsigned char>(ch);
        h ^= c;
        h *= 1099511628211ULL;
    }
    return h;
}

}  // namespace

TEST_SUITE("operator actions") {

TEST_CASE("a redrive after a fixed handler gives the rows of a clean run, and a second redrive applies nothing") {
    temp_dir dir;
    auto broken = std::make_shared<std::atomic<bool>>(true);
    idem::store store{options(dir.path() / "live")};
    store.add(fragile(broken));
    // 300 lines over 12 orders; every third under a transport id; amounts 1..300.
    std::vector<idem::delivery> all;
    reference ref;
    std::size_t failing = 0;
    for (int i = 1; i <= 300; ++i) {
        const auto order = "o" + std::to_string(i % 12);
        all.push_back(deliver(line("l" + std::to_string(i), order, i), i % 3 == 0 ? "t-" + std::to_string(i) : ""));
        ref.add(order, i);
        if (i % 7 == 0) ++failing;
    }
    for (std::size_t at = 0; at < all.size(); at += 64) {
        const auto n = std::min<std::size_t>(64, all.size() - at);
        store.apply(std::span<const idem::delivery>(all.data() + at, n));
    }
    auto dead = store.read().consumer(consumer).dead_letters();
    REQUIRE(dead.size() == failing);
    for (const auto& d : dead) CHECK(d.why == reason::handler_failed);
    CHECK(dump(store.read(), "order-totals") != ref.rows);

    broken->store(false);
    auto r = store.redrive({.why = reason::handler_failed, .note = "fixed the divisible-by-7 bug"});
    CHECK(r.applied == failing);
    CHECK(r.refused == 0);
    CHECK(r.commit != 0);
    CHECK(store.read().consumer(consumer).dead_letter_count() == 0);
    CHECK(dump(store.read(), "order-totals") == ref.rows);

    SUBCASE("a second redrive finds nothing and changes nothing") {
        const auto commit = store.read().commit();
        auto again = store.redrive({});
        CHECK(again.items.empty());
        CHECK(again.commit == 0);
        CHECK(store.read().commit() == commit);
        CHECK(dump(store.read(), "order-totals") == ref.rows);
    }
    SUBCASE("redelivering everything afterwards changes nothing") {
        for (const auto& o : store.apply(all)) CHECK(o.kind == outcome_kind::duplicate_message);
        CHECK(dump(store.read(), "order-totals") == ref.rows);
    }
    SUBCASE("a clean run of the same deliveries gives the same rows") {
        idem::store clean{options(dir.path() / "clean")};
        clean.add(fragile(broken));
        clean.apply(all);
        CHECK(dump(clean.read(), "order-totals") == dump(store.read(), "order-totals"));
    }
    auto audit = store.read().consumer(consumer).operator_actions();
    REQUIRE(audit.size() == 1);
    CHECK(audit[0].action == "redrive");
    CHECK(audit[0].sequences.size() == failing);
    CHECK(audit[0].note == "fixed the divisible-by-7 bug");
    CHECK(audit[0].commit == r.commit);
}

TEST_CASE("a dead letter whose event was applied since under another message id is not applied again") {
    temp_dir dir;
    auto broken = std::make_shared<std::atomic<bool>>(true);
    idem::store store{options(dir.env())};
    store.add(fragile(broken));
    const auto e = line("x1", "o1", 14);
    CHECK(store.apply(deliver(e, "t-1")).kind == outcome_kind::dead_lettered);
    broken->store(false);
    CHECK(store.apply(deliver(e, "t-2")).kind == outcome_kind::applied);  // the broker re-sent it
    auto r = store.redrive({.event_id = e.event_id()});
    REQUIRE(r.items.size() == 1);
    CHECK(r.items[0].result.kind == outcome_kind::duplicate_event);
    CHECK(store.read().consumer(consumer).dead_letter_count() == 0);
    reference ref;
    ref.add("o1", 14);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
}

TEST_CASE("a redrive that fails again leaves a dead letter with its new reason") {
    temp_dir dir;
    auto broken = std::make_shared<std::atomic<bool>>(true);
    const auto e = line("x1", "o1", 21);
    std::uint64_t first_position = 0;
    {
        auto o = options(dir.env());
        o.unknown_types = idem::unknown_type_policy::dead_letter;
        idem::store store{o};
        store.add(totals_by_subject("other"));  // handles line_added; order.created reaches nobody
        CHECK(store.apply(deliver(created("c1", "o1"), "t-1")).why == reason::unknown_type);
        first_position = store.read().consumer(consumer).dead_letters().at(0).position;
    }
    // A projection that handles order.created is added, but it is still broken.
    auto failing = idem::projection<order_total>("created")
                       .on<order_created>([broken](order_total&, const order_created&) {
                           if (broken->load()) throw std::runtime_error("not yet");
                       });
    idem::store store{options(dir.env())};
    store.add(totals_by_subject("other")).add(std::move(failing));
    auto r = store.redrive({.why = reason::unknown_type});
    REQUIRE(r.items.size() == 1);
    CHECK(r.items[0].result.kind == outcome_kind::dead_lettered);
    CHECK(r.items[0].result.why == reason::handler_failed);
    auto dead = store.read().consumer(consumer).dead_letters();
    REQUIRE(dead.size() == 1);
    CHECK(dead[0].why == reason::handler_failed);
    CHECK(dead[0].position > first_position);
    CHECK(dead[0].message_id == idem::transport_message_id("t-1"));
    broken->store(false);
    CHECK(store.redrive({.why = reason::handler_failed}).applied == 1);
    CHECK(store.read().consumer(consumer).dead_letter_count() == 0);
    (void)e;
}

TEST_CASE("a sequenced dead letter is refused unless out of order, then applied only to rows its stream has not passed") {
    temp_dir dir;
    auto broken = std::make_shared<std::atomic<bool>>(true);
    idem::store store{options(dir.env())};
    store.add(fragile(broken, "by-order")).add(fragile(broken, "by-stream", true));
    // Stream "s1" carries lines of order "o1": "by-order" rows are keyed by the payload,
    // "by-stream" rows by the stream.
    auto seq = [](std::uint64_t n, std::int64_t amount) {
        auto e = line("s1-" + std::to_string(n), "o1", amount, n);
        e.subject = "s1";
        return e;
    };
    CHECK(store.apply(deliver(seq(1, 1))).kind == outcome_kind::applied);
    CHECK(store.apply(deliver(seq(2, 7))).kind == outcome_kind::dead_lettered);  // the stream moves on
    CHECK(store.apply(deliver(seq(3, 3))).kind == outcome_kind::applied);
    broken->store(false);

    auto refused = store.redrive({});
    REQUIRE(refused.items.size() == 1);
    CHECK(refused.items[0].refused);
    CHECK(refused.commit == 0);
    CHECK(store.read().consumer(consumer).dead_letter_count() == 1);

    auto r = store.redrive({.out_of_order = true});
    REQUIRE(r.items.size() == 1);
    CHECK(r.items[0].result.kind == outcome_kind::applied);
    reference by_order, by_stream;
    by_order.add("o1", 1, 1);
    by_order.add("o1", 3, 3);
    by_order.add("o1", 7, 2);  // applied last, out of order
    by_stream.add("s1", 1, 1);
    by_stream.add("s1", 3, 3);  // its stream had passed 2: not applied
    CHECK(dump(store.read(), "by-order") == by_order.rows);
    CHECK(dump(store.read(), "by-stream") == by_stream.rows);
    // The stream itself is unchanged: 4 is next, 2 is a duplicate.
    CHECK(store.apply(deliver(seq(2, 7), "again")).kind == outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(seq(4, 4))).kind == outcome_kind::applied);
}

TEST_CASE("release applies a stream's parked events past its gaps; drop dead-letters them; both are audited") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    auto nth = [](const std::string& order, std::uint64_t n) {
        auto e = line(order + "-" + std::to_string(n), order, static_cast<std::int64_t>(n) * 10, n);
        e.time = "2026-12-02T10:00:0" + std::to_string(n) + "Z";
        return e;
    };
    for (auto n : {1, 3, 4, 6}) store.apply(deliver(nth("order-1", static_cast<std::uint64_t>(n))));
    for (auto n : {2, 3}) store.apply(deliver(nth("order-2", static_cast<std::uint64_t>(n))));

    auto parked = store.read().consumer(consumer).parked_streams();
    REQUIRE(parked.size() == 2);
    CHECK(parked[0].subject == "order-1");
    CHECK(parked[0].highest == 1);
    CHECK(parked[0].sequences == std::vector<std::uint64_t>{3, 4, 6});
    CHECK(parked[0].missing == std::vector<idem::sequence_range>{{2, 2}, {5, 5}});
    CHECK(parked[1].subject == "order-2");
    CHECK(parked[1].missing == std::vector<idem::sequence_range>{{1, 1}});

    auto r = store.release("order-1", {.note = "2 and 5 were lost upstream"});
    CHECK(r.skipped == std::vector<idem::sequence_range>{{2, 2}, {5, 5}});
    CHECK(r.released == std::vector<std::uint64_t>{3, 4, 6});
    CHECK(r.highest_after == 6);
    reference ref;
    for (std::uint64_t n : {1u, 3u, 4u, 6u}) ref.add("order-1", static_cast<std::int64_t>(n) * 10, n);
    CHECK(dump(store.read(), "order-streams").at("order-1") == ref.rows.at("order-1"));
    CHECK(store.apply(deliver(nth("order-1", 2), "late")).kind == outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(nth("order-1", 7))).kind == outcome_kind::applied);

    auto d = store.release("order-2", {.drop = true, .note = "order-2 was cancelled"});
    CHECK(d.dropped == std::vector<std::uint64_t>{2, 3});
    CHECK(d.highest_after == 3);
    CHECK(dump(store.read(), "order-streams").count("order-2") == 0);
    auto dead = store.read().consumer(consumer).dead_letters();
    REQUIRE(dead.size() == 2);
    CHECK(dead[0].why == reason::released_dropped);
    CHECK(dead[1].why == reason::released_dropped);
    CHECK(store.apply(deliver(nth("order-2", 4))).kind == outcome_kind::applied);
    CHECK(store.read().consumer(consumer).parked_streams().empty());
    CHECK(store.read().consumer(consumer).parked() == 0);

    auto audit = store.read().consumer(consumer).operator_actions();
    REQUIRE(audit.size() == 2);
    CHECK(audit[0].action == "release");
    CHECK(audit[0].stream == "order-1");
    CHECK(audit[0].skipped == r.skipped);
    CHECK(audit[0].sequences == r.released);
    CHECK(audit[0].note == "2 and 5 were lost upstream");
    CHECK(audit[1].action == "release_drop");
    CHECK(audit[1].sequences == std::vector<std::uint64_t>{2, 3});

    CHECK_THROWS_AS(store.release("order-3"), std::system_error);
}

TEST_CASE("a released event is judged as a delivery is: its dead letter names no place of the batch that released it") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    auto broken = std::make_shared<std::atomic<bool>>(true);
    store.add(fragile(broken, "order-streams", true));
    auto nth = [](const std::string& order, std::uint64_t n, std::int64_t amount) {
        return line(order + "-" + std::to_string(n), order, amount, n);
    };
    REQUIRE(store.apply(deliver(nth("o1", 1, 10))).kind == outcome_kind::applied);
    REQUIRE(store.apply(deliver(nth("o1", 3, 21), "t-3")).kind == outcome_kind::parked);  // its handler throws

    // A batch read from a log: o1's sequence 2 (line 7) releases 3; another event (line 8) fails on its own.
    const auto log = dir.path() / "events.jsonl";
    auto second = deliver(nth("o1", 2, 20));
    second.line = 7;
    second.offset = 80;
    auto own = deliver(nth("o2", 1, 14));
    own.line = 8;
    own.offset = 95;
    auto outcomes = store.apply(std::vector{second, own}, idem::checkpoint{idem::log_source(log), 120});
    REQUIRE(outcomes.size() == 2);
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[1].kind == outcome_kind::dead_lettered);

    auto snap = store.read();
    const auto path = std::string(*idem::log_source_path(idem::log_source(log)));
    auto dead = snap.consumer(consumer).dead_letters();
    REQUIRE(dead.size() == 2);
    CHECK(dead[0].why == reason::handler_failed);
    CHECK(dead[0].message_id == idem::transport_message_id("", "t-3"));  // the id it was parked under
    CHECK(dead[0].body == deliver(nth("o1", 3, 21)).body);
    CHECK(dead[0].source.empty());  // released: read in an earlier batch, from no place of this one
    CHECK(dead[0].line == 0);
    CHECK(dead[0].detail.find("o1-3") != std::string::npos);
    CHECK(dead[1].why == reason::handler_failed);
    CHECK(dead[1].source == idem::log_source(log));
    CHECK(dead[1].line == 8);
    CHECK(dead[1].offset == 95);
    CHECK(idem::located_detail(dead[1]).starts_with(path + ":8 (byte offset 95): "));
    CHECK(outcomes[1].detail.starts_with(path + ":8 (byte offset 95): "));
    CHECK(snap.consumer(consumer).stats().released == 1);
    // Sequence 3 moved its stream on although it failed: 4 applies at once.
    CHECK(store.apply(deliver(nth("o1", 4, 40))).kind == outcome_kind::applied);
    reference ref;
    for (std::uint64_t n : {1u, 2u, 4u}) ref.add("o1", static_cast<std::int64_t>(n) * 10, n);
    CHECK(dump(store.read(), "order-streams").at("o1") == ref.rows.at("o1"));
}

TEST_CASE("a released event that its stream already applied under another sequence is applied once") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_subject());
    store.add(totals_by_order());
    CHECK(store.apply(deliver(line("o1-1", "o1", 10, 1))).kind == outcome_kind::applied);
    // The producer sends "moved" at sequence 3, then again at 2 (the position it meant).
    CHECK(store.apply(deliver(line("moved", "o1", 5, 3), "t-a")).kind == outcome_kind::parked);
    CHECK(store.apply(deliver(line("moved", "o1", 5, 2), "t-b")).kind == outcome_kind::applied);
    auto snap = store.read();
    CHECK(snap.consumer(consumer).parked() == 0);
    CHECK(snap.consumer(consumer).stats().released == 1);
    CHECK(snap.consumer(consumer).dead_letters().empty());
    reference by_stream;
    by_stream.add("o1", 10, 1);
    by_stream.add("o1", 5, 2);
    CHECK(dump(snap, "order-streams").at("o1") == by_stream.rows.at("o1"));
    reference by_order;
    by_order.add("o1", 10, 1);
    by_order.add("o1", 5, 2);
    CHECK(dump(snap, "order-totals").at("o1") == by_order.rows.at("o1"));
    CHECK(store.apply(deliver(line("o1-3", "o1", 30, 3))).kind == outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(line("o1-4", "o1", 40, 4))).kind == outcome_kind::applied);
}

TEST_CASE("explain finds an event however it was delivered, and computes effect keys per projection") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order()).add(positions());
    auto total = totals_by_order();
    auto pos = positions();
    auto snap = [&] { return store.read(); };

    SUBCASE("applied under a transport message id") {
        CHECK(store.apply(deliver(line("e1", "o1", 5), "t-1")).kind == outcome_kind::applied);
        auto x = idem::explain(snap(), consumer, {.source = "/orders", .id = "e1", .key = "o1", .projections = {&total}});
        CHECK(x.answer == "applied");
        CHECK(x.message_id == idem::transport_message_id("t-1"));
        REQUIRE(x.rows.size() == 1);
        CHECK(x.rows[0].holds == true);
        auto by_message = idem::explain(snap(), consumer, {.message = "t-1"});
        CHECK(by_message.answer == "applied");
        CHECK(idem::explain(snap(), consumer, {.source = "/orders", .id = "e2"}).answer == "never_seen");
    }
    SUBCASE("parked, with what it waits for") {
        CHECK(store.apply(deliver(line("e3", "o1", 5, 3), "t-3")).kind == outcome_kind::parked);
        auto x = idem::explain(snap(), consumer, {.source = "/orders", .id = "e3"});
        CHECK(x.answer == "parked");
        REQUIRE(x.parked);
        CHECK(x.parked->subject == "o1");
        CHECK(x.parked->sequence == 3);
        CHECK(x.parked->waiting_for == 1);
    }
    SUBCASE("an effect-keyed row: the effect key comes from the stored body") {
        CHECK(store.apply(deliver(fill_event("f1", "a1", "x-1", 5), "t-f1")).kind == outcome_kind::applied);
        // The same execution re-issued under a new event id, sequenced ahead of its stream: parked.
        auto reissued = fill_event("f2", "a1", "x-1", 5);
        reissued.sequence = 4;
        CHECK(store.apply(deliver(reissued)).kind == outcome_kind::parked);
        auto x = idem::explain(snap(), consumer, {.source = "/venue-a", .id = "f2", .key = "a1", .projections = {&pos}});
        REQUIRE(x.rows.size() == 1);
        CHECK(x.rows[0].effect_key == "x-1");
        CHECK(x.rows[0].holds == true);  // its execution is in the row already
        // Applied events keep no body: an effect-keyed projection cannot tell, and says so.
        auto applied = idem::explain(snap(), consumer, {.source = "/venue-a", .id = "f1", .key = "a1", .projections = {&pos}});
        CHECK(applied.answer == "applied");
        REQUIRE(applied.rows.size() == 1);
        CHECK_FALSE(applied.rows[0].holds.has_value());
        CHECK(applied.rows[0].note.find("cannot be computed") != std::string::npos);
    }
}

TEST_CASE("a too_large envelope's dead letter keeps a bounded prefix, its size and its digest") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    auto e = line("big", "o1", 1);
    e.data = R"({"order_id":"o1","amount":1,"pad":")" + std::string(2'000'000, 'x') + R"("})";
    const auto body = e.to_json();
    CHECK(store.apply(idem::delivery{body, "t-big"}).why == reason::too_large);
    CHECK(store.apply(idem::delivery{"{not json", "t-small"}).why == reason::invalid_json);
    auto dead = store.read().consumer(consumer).dead_letters();
    REQUIRE(dead.size() == 2);
    CHECK(dead[0].truncated);
    CHECK(dead[0].body.size() == idem::dead_letter_prefix);
    CHECK(dead[0].body == body.substr(0, idem::dead_letter_prefix));
    CHECK(dead[0].body_size == body.size());
    CHECK(dead[0].body_digest == fnv1a(body));
    CHECK_FALSE(dead[1].truncated);
    CHECK(dead[1].body == "{not json");
    CHECK(dead[1].body_size == 9);
    // A truncated body cannot be applied: a redrive refuses it and leaves it.
    auto r = store.redrive({.why = reason::too_large});
    REQUIRE(r.items.size() == 1);
    CHECK(r.items[0].refused);
    CHECK(store.read().consumer(consumer).dead_letter_count() == 2);
}

}  // TEST_SUITE
