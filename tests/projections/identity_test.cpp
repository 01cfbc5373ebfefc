// Identity and time that cannot be fooled: transport ids count within their transport, one
// event stamped far ahead does not move the event-time horizon, and lateness outcomes do not
// depend on batch sizes or on when pruning ran.

#include "fixtures.hpp"

#include <idem/projections/explain.hpp>
#include <idem/projections/layout.hpp>

#include <idem/storage/envelope.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

using namespace idem_test;
using namespace std::chrono_literals;
using idem::outcome_kind;

namespace {

constexpr std::uint64_t second_ns = 1'000'000'000;
constexpr std::uint64_t start_ns = 1'764'662'400ull * second_ns;  // 2025-12-02T08:00:00Z

std::string rfc3339(std::uint64_t ns) {
    auto t = static_cast<std::time_t>(ns / second_ns);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<unsigned>(ns % second_ns / 1'000'000));
    return buf;
}

idem::delivery from(const idem::envelope& e, std::string transport, std::string message_id) {
    auto d = deliver(e, std::move(message_id));
    d.transport = std::move(transport);
    return d;
}

idem::store_options timed_options(const std::filesystem::path& dir, std::optional<std::chrono::nanoseconds> lateness) {
    auto o = options(dir);
    o.retention.clock = idem::retention_clock::event;
    o.retention.allowed_lateness = lateness;
    return o;
}

std::uint64_t dead_with(const idem::snapshot& snap, idem::reason why) {
    std::uint64_t n = 0;
    for (const auto& d : snap.consumer(consumer).dead_letters()) n += d.why == why ? 1 : 0;
    return n;
}

/// Two sources that each number their messages m-1, m-2, ...: sequenced order lines of their own orders.
struct two_sources {
    std::vector<idem::delivery> deliveries;
    reference ref;
    two_sources(const std::string& transport_a, const std::string& transport_b) {
        std::mt19937_64 rng{7};
        std::uint64_t msg[2] = {0, 0};
        std::uint64_t seq[2][5] = {};
        for (int i = 0; i < 200; ++i) {
            const auto s = static_cast<std::size_t>(rng() % 2);
            const auto order_index = static_cast<std::size_t>(rng() % 5);
            const std::string order = (s == 0 ? "a-" : "b-") + std::to_string(order_index);
            const auto sequence = ++seq[s][order_index];
            const auto amount = static_cast<std::int64_t>(rng() % 100 + 1);
            auto ev = line((s == 0 ? "a-line-" : "b-line-") + std::to_string(i), order, amount, sequence,
                           s == 0 ? "/shop-a" : "/shop-b");
            deliveries.push_back(from(ev, s == 0 ? transport_a : transport_b, "m-" + std::to_string(++msg[s])));
            ref.add(order, amount, sequence);
        }
    }
};

}  // namespace

TEST_SUITE("identity") {

TEST_CASE("two transports that both number their messages m-1, m-2, ... keep every event") {
    temp_dir dir;
    idem::store store{options(dir.path())};
    store.add(totals_by_order());

    SUBCASE("named transports: the ids never meet") {
        two_sources log{"shop-a", "shop-b"};
        for (std::size_t i = 0; i < log.deliveries.size(); i += 30) {
            auto end = std::min(log.deliveries.size(), i + 30);
            store.apply(std::span<const idem::delivery>(log.deliveries.data() + i, end - i));
        }
        auto snap = store.read();
        CHECK(dump(snap, "order-totals") == log.ref.rows);
        CHECK(snap.consumer(consumer).parked() == 0);
        CHECK(snap.consumer(consumer).stats().id_conflicts == 0);
        CHECK(snap.consumer(consumer).stats().transport_collisions == 0);
        CHECK(snap.consumer(consumer).dead_letter_count() == 0);
        // A redelivery within its transport is still a duplicate message.
        for (const auto& o : store.apply(log.deliveries)) CHECK(o.kind == outcome_kind::duplicate_message);
        CHECK(dump(store.read(), "order-totals") == log.ref.rows);
    }
    SUBCASE("one unnamed transport carrying both: collisions are reported, no event is lost or stalled") {
        two_sources log{"", ""};
        for (std::size_t i = 0; i < log.deliveries.size(); i += 30) {
            auto end = std::min(log.deliveries.size(), i + 30);
            store.apply(std::span<const idem::delivery>(log.deliveries.data() + i, end - i));
        }
        auto snap = store.read();
        CHECK(dump(snap, "order-totals") == log.ref.rows);
        CHECK(snap.consumer(consumer).parked() == 0);
        CHECK(snap.consumer(consumer).stats().id_conflicts == 0);
        CHECK(snap.consumer(consumer).dead_letter_count() == 0);
        const auto collided = snap.consumer(consumer).stats().transport_collisions;
        CHECK(collided > 50);
        auto records = snap.consumer(consumer).collisions();
        REQUIRE(records.size() == collided);
        CHECK(records[0].why == idem::reason::transport_collision);
        CHECK(records[0].detail.find("first used in commit") != std::string::npos);
        CHECK(records[0].detail.find(": applied") != std::string::npos);
        // Everything again: every event is known by its sequence, nothing applies twice.
        store.apply(log.deliveries);
        CHECK(dump(store.read(), "order-totals") == log.ref.rows);
    }
}

TEST_CASE("transport and id are length-prefixed in the inbox key: no two pairs alias") {
    CHECK(idem::transport_message_id("ab", "c") != idem::transport_message_id("a", "bc"));
    CHECK(idem::transport_message_id("", "m-1") == idem::transport_message_id("m-1"));
    CHECK(idem::transport_message_id("x", "m-1") != idem::transport_message_id("m-1"));
    temp_dir dir;
    idem::store store{options(dir.path())};
    store.add(totals_by_order());
    auto outcomes = store.apply(std::vector{from(line("l-1", "o1", 1), "ab", "c"), from(line("l-2", "o1", 2), "a", "bc"),
                                            from(line("l-3", "o1", 4), "a", "b:c")});
    for (const auto& o : outcomes) CHECK(o.kind == outcome_kind::applied);
    CHECK(store.read().consumer(consumer).stats().transport_collisions == 0);
    CHECK(store.read().get<order_total>("order-totals", "o1")->state.total == 7);
}

TEST_CASE("an inbox entry's words keep their stored layout: [fingerprint][commit:56 reason:5 outcome:3][event mark]") {
    // The numbers on disk, not the enums' names: an entry an older idem wrote must read the same.
    constexpr std::uint64_t dead_lettered = 4;
    constexpr std::uint64_t id_conflict = 18;
    constexpr std::uint64_t commit = 0x00ABCDEF012345ull;
    SUBCASE("a dead-lettered first delivery keeps its reason") {
        const idem::layout::inbox_first first{0x1122334455667788ull, commit, outcome_kind::dead_lettered,
                                              idem::reason::id_conflict, 0x99};
        const auto words = idem::layout::encode_inbox_first(first);
        CHECK(words[0] == 0x1122334455667788ull);
        CHECK(words[1] == (commit << 8 | id_conflict << 3 | dead_lettered));
        CHECK(words[2] == 0x99);
        const auto back = idem::layout::decode_inbox_first(words);
        CHECK(back.fingerprint == first.fingerprint);
        CHECK(back.commit == commit);
        CHECK(back.outcome == outcome_kind::dead_lettered);
        CHECK(back.why == idem::reason::id_conflict);
        CHECK(back.event_mark == 0x99);
    }
    SUBCASE("any other outcome keeps no reason") {
        const auto words = idem::layout::encode_inbox_first({7, commit, outcome_kind::parked, idem::reason::id_conflict, 1});
        CHECK(words[1] == (commit << 8 | 3));
        CHECK(idem::layout::decode_inbox_first(words).why == idem::reason::none);
    }
    SUBCASE("the key kinds: an event's own id, a transport id of either kind") {
        const auto ev = line("l-1", "o1", 1);
        CHECK(idem::layout::is_event_key(ev.message_id()));
        CHECK(!idem::layout::is_transport_key(ev.message_id()));
        for (const auto& key : {idem::transport_message_id("m-1"), idem::transport_message_id("orders", "m-1")}) {
            CHECK(idem::layout::is_transport_key(key));
            CHECK(!idem::layout::is_event_key(key));
        }
    }
}

TEST_CASE("the same event id with other content stays an id_conflict, under a transport id too") {
    temp_dir dir;
    idem::store store{options(dir.path())};
    store.add(totals_by_order());
    auto ev = line("l-1", "o1", 5, 1);
    REQUIRE(store.apply(from(ev, "broker", "m-1")).kind == outcome_kind::applied);
    auto changed = ev;
    changed.data = R"({"order_id":"o1","amount":500})";
    auto o = store.apply(from(changed, "broker", "m-1"));
    CHECK(o.why == idem::reason::id_conflict);
    CHECK(store.read().consumer(consumer).stats().transport_collisions == 0);
    // The stream went on: sequence 2 is applied, not parked.
    CHECK(store.apply(from(line("l-2", "o1", 1, 2), "broker", "m-2")).kind == outcome_kind::applied);
    CHECK(store.read().get<order_total>("order-totals", "o1")->state.total == 6);
}

TEST_CASE("an event id delivered again with other content under another message id is an id_conflict") {
    // The producer's identity of the event is (source, id), whatever transport carried it.
    auto body = [](std::string_view msgid, std::string_view order, std::int64_t amount) {
        std::string out = R"({"specversion":"1.0","id":"e-1","source":"/s","type":"order.line_added")";
        if (!msgid.empty()) out += R"(,"msgid":")" + std::string(msgid) + "\"";
        return out + R"(,"data":{"order_id":")" + std::string(order) + R"(","amount":)" + std::to_string(amount) + "}}";
    };
    struct variant {
        const char* name;
        std::string first, second;
    };
    for (const auto& v : {variant{"two message ids", body("m-1", "o-1", 100), body("m-2", "o-2", 500)},
                          variant{"a message id, then none", body("m-1", "o-1", 100), body("", "o-2", 500)},
                          variant{"no message id, then one", body("", "o-1", 100), body("m-2", "o-2", 500)}}) {
        for (const bool one_batch : {false, true}) {
            CAPTURE(v.name);
            CAPTURE(one_batch);
            temp_dir dir;
            idem::store store{options(dir.path())};
            store.add(totals_by_order());
            const std::vector<idem::delivery> both{{v.first, {}}, {v.second, {}}};
            std::vector<idem::outcome> outcomes;
            if (one_batch) {
                outcomes = store.apply(both);
            } else {
                for (const auto& d : both) outcomes.push_back(store.apply(d));
            }
            CHECK(outcomes[0].kind == outcome_kind::applied);
            CHECK(outcomes[1].kind == outcome_kind::dead_lettered);
            CHECK(outcomes[1].why == idem::reason::id_conflict);
            reference ref;
            ref.add("o-1", 100);  // the first effect stands
            auto snap = store.read();
            CHECK(dump(snap, "order-totals") == ref.rows);
            CHECK(snap.consumer(consumer).stats().id_conflicts == 1);
            auto x = idem::explain(snap, consumer, {.source = "/s", .id = "e-1"});
            CHECK(x.answer == "applied");
            CHECK(x.id_conflicts == 1);
            // Redeliveries change nothing, and the same content under yet another message id is
            // the duplicate event it was before.
            for (const auto& o : store.apply(both)) CHECK(o.kind != outcome_kind::applied);
            CHECK(store.apply(idem::delivery{body("m-3", "o-1", 100), {}}).kind == outcome_kind::duplicate_event);
            CHECK(store.apply(idem::delivery{body("m-4", "o-3", 7), {}}).why == idem::reason::id_conflict);
            CHECK(dump(store.read(), "order-totals") == ref.rows);
        }
    }
}

TEST_CASE("one source's events stamped 2099 never move the horizon; two sources agreeing do, and redrive takes back what was late") {
    const std::uint64_t wall = 1'796'000'000ull * second_ns;  // 2026-11-30
    const auto in_2099 = std::uint64_t{4'070'908'800} * second_ns;
    auto at = [](std::string id, std::string order, std::int64_t amount, std::uint64_t ns, std::string source) {
        auto e = line(std::move(id), order, amount, std::nullopt, std::move(source));
        e.time = rfc3339(ns);
        return deliver(e, "m-" + e.id);
    };
    auto open = [&](const std::filesystem::path& path) {
        auto o = timed_options(path, 10min);
        o.retention.max_future_skew = 24h;
        o.retention.future_confirmations = 3;
        o.retention.now = [wall] { return wall; };
        return o;
    };
    SUBCASE("one source: three 2099 events, then 2000 current ones") {
        for (const bool first : {false, true}) {  // the outliers after some current events, or before any
            CAPTURE(first);
            temp_dir dir;
            idem::store store{open(dir.path())};
            store.add(totals_by_order());
            std::vector<idem::delivery> log;
            reference ref;
            auto current = [&](std::size_t i) {
                const auto order = "o" + std::to_string(i % 13);
                const auto amount = static_cast<std::int64_t>(i % 97 + 1);
                ref.add(order, amount);
                log.push_back(at("c-" + std::to_string(i), order, amount, start_ns + i * second_ns, "/orders"));
            };
            if (!first) {
                for (std::size_t i = 0; i < 10; ++i) current(i);
            }
            for (std::uint64_t k = 0; k < 3; ++k) {
                log.push_back(at("bad-" + std::to_string(k), "o-future", 1000, in_2099 + k * second_ns, "/misconfigured"));
            }
            for (std::size_t i = first ? 0 : 10; i < 2000; ++i) current(i);
            for (std::size_t i = 0; i < log.size(); i += 100) {
                store.apply(std::span<const idem::delivery>(log.data() + i, std::min<std::size_t>(100, log.size() - i)));
            }
            auto snap = store.read();
            const auto stats = snap.consumer(consumer).stats();
            CHECK(stats.late_events == 0);
            CHECK(stats.future_events == 3);
            CHECK(dump(snap, "order-totals") == ref.rows);
            CHECK(snap.consumer(consumer).retention().event_time == start_ns + 1999 * second_ns);
        }
    }
    SUBCASE("two sources agreeing move it; the events then judged late are redriven once the operator decides") {
        temp_dir dir;
        idem::store store{open(dir.path())};
        store.add(totals_by_order());
        reference ref;
        std::vector<idem::delivery> log;
        for (std::size_t i = 0; i < 10; ++i) {
            log.push_back(at("c-" + std::to_string(i), "o1", 1, start_ns + i * second_ns, "/orders"));
            ref.add("o1", 1);
        }
        store.apply(log);
        auto outcomes = store.apply(std::vector{at("x-1", "o2", 10, in_2099, "/a"), at("x-2", "o2", 20, in_2099, "/a"),
                                                at("x-3", "o2", 40, in_2099 + second_ns, "/b")});
        CHECK(outcomes[0].why == idem::reason::future_event);
        CHECK(outcomes[0].detail.find("only events of two sources agreeing confirm a jump") != std::string::npos);
        CHECK(outcomes[1].why == idem::reason::future_event);
        CHECK(outcomes[2].kind == outcome_kind::applied);  // the second source confirms: the jump is taken
        ref.add("o2", 40);
        CHECK(store.read().consumer(consumer).retention().event_time == in_2099 + second_ns);
        // Current events are now late, new ones and a re-send of an applied one alike.
        std::vector<idem::delivery> late;
        for (std::size_t i = 10; i < 15; ++i) {
            late.push_back(at("c-" + std::to_string(i), "o1", 100, start_ns + i * second_ns, "/orders"));
            ref.add("o1", 100);
        }
        auto resent = at("c-5", "o1", 1, start_ns + 5 * second_ns, "/orders");
        resent.message_id = "m-resent";
        late.push_back(resent);
        for (const auto& o : store.apply(late)) CHECK(o.why == idem::reason::late_event);
        auto r = store.redrive({.why = idem::reason::late_event, .note = "the horizon was moved by bad clocks"});
        CHECK(r.applied == 5);
        CHECK(r.refused == 1);  // its time is below what was pruned: nothing proves it new
        REQUIRE(!r.items.empty());
        CHECK(r.items.back().refused);
        CHECK(r.items.back().result.detail.find("pruned its effect keys") != std::string::npos);
        CHECK(dump(store.read(), "order-totals") == ref.rows);
        auto again = store.redrive({.why = idem::reason::late_event});
        CHECK(again.applied == 0);
        CHECK(dump(store.read(), "order-totals") == ref.rows);
        // The way back: the clock set back (only back), a pending jump dropped, the floor kept.
        const auto floor = store.read().projection("order-totals").contributor_floor();
        CHECK(store.apply(at("y-1", "o3", 1, in_2099 + 3 * 86400 * second_ns, "/a")).why == idem::reason::future_event);
        CHECK(store.read().consumer(consumer).retention().jump_votes == 1);
        CHECK_THROWS_WITH_AS(store.set_event_time_back(in_2099 + 2 * second_ns, "no"),
                             doctest::Contains("it is only ever set back"), std::system_error);
        const auto back = store.set_event_time_back(start_ns + 14 * second_ns, "the clocks of /a and /b");
        CHECK(back.before == in_2099 + second_ns);
        CHECK(back.after == start_ns + 14 * second_ns);
        CHECK(back.dropped_votes == 1);
        const auto clock = store.read().consumer(consumer).retention();
        CHECK(clock.event_time == start_ns + 14 * second_ns);
        CHECK(clock.jump_votes == 0);
        CHECK(store.read().projection("order-totals").contributor_floor() == floor);
        // Current events are current again; one below the floor is still late.
        CHECK(store.apply(at("c-15", "o1", 100, start_ns + 15 * second_ns, "/orders")).kind == outcome_kind::applied);
        ref.add("o1", 100);
        CHECK(store.apply(at("c-0b", "o1", 1, start_ns, "/orders")).why == idem::reason::late_event);
        CHECK(dump(store.read(), "order-totals") == ref.rows);
        const auto audit = store.read().consumer(consumer).operator_actions();
        REQUIRE(audit.size() == 2);
        CHECK(audit[1].action == "event_clock");
        CHECK(audit[1].note == "the clocks of /a and /b");
    }
}

TEST_CASE("an event stamped far ahead does not move the event-time horizon") {
    // Unsequenced lines, one every 20 s for 2 hours; each re-sent (same event, new message id) 5
    // minutes later: inside a 10-minute lateness, so the copies are duplicates, never late.
    std::vector<idem::delivery> log;
    reference ref;
    std::vector<std::pair<std::uint64_t, idem::envelope>> timeline;
    for (std::uint64_t i = 0; i < 360; ++i) {
        auto ev = line("l-" + std::to_string(i), "o" + std::to_string(i % 7), static_cast<std::int64_t>(i + 1));
        ev.time = rfc3339(start_ns + i * 20 * second_ns);
        timeline.emplace_back(i * 20, ev);
        timeline.emplace_back(i * 20 + 300, ev);
        ref.add("o" + std::to_string(i % 7), static_cast<std::int64_t>(i + 1));
    }
    std::stable_sort(timeline.begin(), timeline.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::uint64_t m = 0;
    for (const auto& [at, ev] : timeline) log.push_back(from(ev, "src", "m-" + std::to_string(++m)));
    auto outlier = line("from-2099", "o-future", 1000);
    outlier.time = "2099-01-01T00:00:00Z";
    auto with_outlier = log;
    with_outlier.insert(with_outlier.begin() + 100, from(outlier, "src", "m-outlier"));

    auto run = [&](const std::vector<idem::delivery>& deliveries, std::uint64_t wall_ns, std::size_t batch) {
        temp_dir dir;
        auto o = timed_options(dir.path(), 10min);
        o.retention.now = [wall_ns] { return wall_ns; };
        idem::store store{o};
        store.add(totals_by_order());
        for (std::size_t i = 0; i < deliveries.size(); i += batch) {
            auto end = std::min(deliveries.size(), i + batch);
            store.apply(std::span<const idem::delivery>(deliveries.data() + i, end - i));
            while (store.prune().more) {
            }
        }
        auto snap = store.read();
        return std::tuple{dump(snap, "order-totals"), snap.consumer(consumer).stats(), dead_with(snap, idem::reason::future_event)};
    };
    const std::uint64_t now_2026 = 1'796'000'000ull * second_ns;
    const auto [plain_rows, plain_stats, plain_future] = run(log, now_2026, 50);
    CHECK(plain_rows == ref.rows);
    CHECK(plain_stats.late_events == 0);
    CHECK(plain_future == 0);
    for (std::uint64_t wall : {now_2026, start_ns, std::uint64_t{4'000'000'000} * second_ns}) {
        for (std::size_t batch : {std::size_t{1}, std::size_t{50}}) {
            CAPTURE(wall);
            CAPTURE(batch);
            const auto [rows, stats, future] = run(with_outlier, wall, batch);
            CHECK(rows == ref.rows);
            CHECK(stats.late_events == 0);
            CHECK(future == 1);
            CHECK(stats.future_events == 1);
        }
    }
}

TEST_CASE("an event stamped 1970-01-01T00:00:00Z sets the event clock: an outlier after it is still held") {
    for (std::size_t batch : {std::size_t{1}, std::size_t{3}}) {
        CAPTURE(batch);
        temp_dir dir;
        idem::store store{timed_options(dir.path(), 1h)};
        store.add(totals_by_order());
        auto at = [](std::string id, std::int64_t amount, const char* time) {
            auto ev = line(id, "o1", amount);
            ev.time = time;
            return from(ev, "src", "m-" + id);
        };
        const std::vector log{at("e1", 1, "1970-01-01T00:00:00Z"), at("e2", 2, "2099-01-01T00:00:00Z"),
                              at("e3", 4, "1970-01-01T00:10:00Z")};
        for (std::size_t i = 0; i < log.size(); i += batch) {
            store.apply(std::span<const idem::delivery>(log.data() + i, std::min(batch, log.size() - i)));
        }
        auto snap = store.read();
        CHECK(snap.get<order_total>("order-totals", "o1")->state.total == 5);
        CHECK(dead_with(snap, idem::reason::future_event) == 1);
        CHECK(snap.consumer(consumer).stats().late_events == 0);
    }
}

TEST_CASE("a jump forward confirmed by later events moves the clock; a sequenced future event still advances its stream") {
    temp_dir dir;
    auto o = timed_options(dir.path(), 1h);
    o.retention.max_future_skew = 24h;
    o.retention.future_confirmations = 3;
    idem::store store{o};
    store.add(totals_by_order());
    auto at = [](std::string id, std::string order, std::int64_t amount, std::uint64_t ns,
                 std::optional<std::uint64_t> seq = std::nullopt) {
        auto e = line(std::move(id), order, amount, seq);
        e.time = rfc3339(ns);
        return deliver(e);
    };
    const auto gap = start_ns + 72 * 3600 * second_ns;  // three days later
    auto outcomes = store.apply(std::vector{
        at("s-1", "s", 1, start_ns, 1), at("a", "o1", 1, start_ns + second_ns),
        at("s-2", "s", 2, start_ns + 30ull * 24 * 3600 * second_ns, 2),  // a bad clock, sequenced
        at("s-3", "s", 4, start_ns + 2 * second_ns, 3),                    // not parked behind it
        at("b", "o1", 10, gap), at("c", "o1", 100, gap + second_ns),      // ahead: not yet confirmed
        at("d", "o1", 1000, gap + 2 * second_ns),                          // the third: the jump is taken
        at("e", "o1", 10000, gap + 3 * second_ns),
        at("late", "o2", 1, start_ns + 3 * second_ns),                     // behind the moved horizon
    });
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[2].why == idem::reason::future_event);
    CHECK(outcomes[3].kind == outcome_kind::applied);
    CHECK(outcomes[4].why == idem::reason::future_event);
    CHECK(outcomes[5].why == idem::reason::future_event);
    CHECK(outcomes[6].kind == outcome_kind::applied);
    CHECK(outcomes[7].kind == outcome_kind::applied);
    CHECK(outcomes[8].why == idem::reason::late_event);
    auto snap = store.read();
    CHECK(snap.get<order_total>("order-totals", "s")->state.total == 5);
    CHECK(snap.get<order_total>("order-totals", "o1")->state.total == 11001);
    CHECK(snap.consumer(consumer).parked() == 0);
    CHECK(snap.consumer(consumer).retention().event_time == gap + 3 * second_ns);
}

TEST_CASE("one outlier re-sent under new message ids votes once for a jump") {
    temp_dir dir;
    idem::store store{timed_options(dir.path(), 1h)};
    store.add(totals_by_order());
    auto at = [](std::string id, std::int64_t amount, std::uint64_t ns) {
        auto e = line(std::move(id), "o1", amount);
        e.time = rfc3339(ns);
        return e;
    };
    const auto outlier = at("from-2099", 1000, std::uint64_t{4'070'908'800} * second_ns);  // 2099-01-01
    auto outcomes = store.apply(std::vector{
        from(at("a", 1, start_ns), "src", "m-1"), from(outlier, "src", "m-2"), from(outlier, "src", "m-3"),
        from(outlier, "src", "m-4"), from(outlier, "src", "m-5"), from(at("b", 10, start_ns + second_ns), "src", "m-6")});
    for (std::size_t i = 1; i <= 4; ++i) CHECK(outcomes[i].why == idem::reason::future_event);
    CHECK(outcomes[5].kind == outcome_kind::applied);
    CHECK(store.read().get<order_total>("order-totals", "o1")->state.total == 11);
    CHECK(store.read().consumer(consumer).retention().event_time == start_ns + second_ns);
}

TEST_CASE("lateness outcomes do not depend on batch size or on when pruning ran") {
    // Fills every 100 ms; 30% are re-sent by a drop copy (new event id, same exec_id, stamped
    // when re-sent: 0.1-2.5 s later), delivered in event-time order.
    std::vector<std::pair<std::uint64_t, idem::envelope>> timeline;
    std::mt19937_64 rng{11};
    std::map<std::string, std::int64_t> expected;
    for (std::uint64_t i = 0; i < 1500; ++i) {
        const auto account = "acct-" + std::to_string(rng() % 9);
        const auto qty = static_cast<std::int64_t>(rng() % 50 + 1);
        const auto t = start_ns + i * 100'000'000ull;
        auto ev = fill_event("f-" + std::to_string(i), account, "X-" + std::to_string(i), qty);
        ev.time = rfc3339(t);
        timeline.emplace_back(t, ev);
        expected[account] += qty;
        if (rng() % 10 < 3) {
            auto copy = fill_event("dc-" + std::to_string(i), account, "X-" + std::to_string(i), qty, "/dropcopy");
            const auto resent = t + (rng() % 25 + 1) * 100'000'000ull;
            copy.time = rfc3339(resent);
            timeline.emplace_back(resent, copy);
        }
    }
    std::stable_sort(timeline.begin(), timeline.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<idem::delivery> log;
    for (const auto& [t, ev] : timeline) log.push_back(deliver(ev));

    auto positions = [] {
        return idem::projection<position>("positions")
            .on<fill>([](position& p, const fill& f, const idem::meta&) { p.qty += f.qty; })
            .key([](const fill& f) { return f.account; })
            .effect_key([](const fill& f) { return f.exec_id; });
    };
    struct result {
        std::map<std::string, std::pair<std::int64_t, std::uint64_t>> rows;
        std::array<std::uint64_t, idem::outcome_kinds> outcomes{};
        std::uint64_t late = 0;
    };
    auto run = [&](std::chrono::nanoseconds lateness, std::size_t batch, bool bulk) {
        temp_dir dir;
        idem::store store{timed_options(dir.path(), lateness)};
        store.add(positions());
        if (bulk) store.begin_bulk(std::size_t{1} << 30);
        for (std::size_t i = 0; i < log.size(); i += batch) {
            auto end = std::min(log.size(), i + batch);
            store.apply(std::span<const idem::delivery>(log.data() + i, end - i));
        }
        if (bulk) store.end_bulk();
        result r;
        auto snap = store.read();
        snap.scan<position>("positions", [&](const idem::row<position>& row) {
            r.rows[row.key] = {row.state.qty, row.version};
        });
        r.outcomes = snap.consumer(consumer).stats().outcomes;
        r.late = snap.consumer(consumer).stats().late_events;
        return r;
    };
    for (auto lateness : {std::chrono::nanoseconds(0s), std::chrono::nanoseconds(1s), std::chrono::nanoseconds(3s)}) {
        CAPTURE(lateness.count());
        const auto rebuilt = run(lateness, 10'000, true);
        for (std::size_t batch : {std::size_t{1}, std::size_t{20}, std::size_t{1000}}) {
            CAPTURE(batch);
            const auto consumed = run(lateness, batch, false);
            CHECK(consumed.rows == rebuilt.rows);
            CHECK(consumed.outcomes == rebuilt.outcomes);
            CHECK(consumed.late == rebuilt.late);
        }
        // Shorter than the re-send delay, a copy whose original's entry the horizon passed is applied
        // again, the same in every run; a source that declares the delay is refused such a lateness.
        if (lateness >= 3s) {
            // Longer than the re-send delay: every copy is a duplicate, each fill counts once.
            std::map<std::string, std::int64_t> got;
            for (const auto& [k, v] : rebuilt.rows) got[k] = v.first;
            CHECK(got == expected);
        }
    }
}

TEST_CASE("an allowed lateness shorter than the source's declared re-send delay is refused at open") {
    temp_dir dir;
    auto o = timed_options(dir.path(), 1s);
    o.retention.resend_within = 2500ms;
    CHECK_THROWS_WITH_AS(idem::store{o}, doctest::Contains("re-send delay"), std::system_error);
    o.retention.allowed_lateness = 3s;
    CHECK_NOTHROW(idem::store{o});
}

}  // TEST_SUITE
