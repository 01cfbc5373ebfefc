// Retention: the inbox is pruned by age, contributing sets by the event-time horizon, and
// neither opens a double apply; an id redelivered with other content is a conflict.

#include "fixtures.hpp"

#include <idem/storage/canonical.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <random>

using namespace idem_test;
using namespace std::chrono_literals;

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

idem::envelope timed_line(const std::string& id, const std::string& order, std::int64_t amount, std::uint64_t at_ns,
                          std::optional<std::uint64_t> sequence = std::nullopt) {
    auto e = line(id, order, amount, sequence);
    e.time = rfc3339(at_ns);
    return e;
}

idem::store_options retention_options(const std::filesystem::path& dir, std::optional<std::chrono::nanoseconds> inbox,
                                      std::optional<std::chrono::nanoseconds> lateness) {
    auto o = options(dir);
    o.retention.clock = idem::retention_clock::event;
    o.retention.inbox_retention = inbox;
    o.retention.allowed_lateness = lateness;
    return o;
}

void prune_all(idem::store& s) {
    while (s.prune(idem::prune_limits{500, std::chrono::milliseconds(100), {}}).more) {
    }
}

/// Weeks of order lines, one every ~90 s of event time, each delivered once plus redeliveries:
/// some minutes later (inside a 1-hour inbox window), some two days later (far beyond it).
struct weeks_log {
    struct item {
        std::uint64_t deliver_at;
        idem::envelope ev;
    };
    std::vector<item> deliveries;
    reference expected;
    std::size_t late_redeliveries = 0;  // delivered after the event-time horizon of one day
    std::size_t events = 0;

    explicit weeks_log(std::uint32_t seed) {
        std::mt19937_64 rng{seed};
        const std::uint64_t span = 21 * 24 * 3600 * second_ns;
        for (std::uint64_t t = start_ns, n = 0; t < start_ns + span; t += 60 * second_ns + rng() % (60 * second_ns), ++n) {
            const auto order = "order-" + std::to_string(rng() % 50);
            const auto amount = static_cast<std::int64_t>(rng() % 1000) + 1;
            auto ev = timed_line("e" + std::to_string(n), order, amount, t);
            expected.add(order, amount);
            deliveries.push_back({t, ev});
            ++events;
            const auto dice = rng() % 100;
            if (dice < 10) deliveries.push_back({t + (1 + rng() % 30) * 60 * second_ns, ev});  // inside the window
            if (dice >= 95 && t + 3 * 24 * 3600 * second_ns < start_ns + span) {  // later events move the clock past it
                deliveries.push_back({t + 2 * 24 * 3600 * second_ns, ev});  // two days later
                ++late_redeliveries;
            }
        }
        std::stable_sort(deliveries.begin(), deliveries.end(),
                         [](const item& a, const item& b) { return a.deliver_at < b.deliver_at; });
    }
};

}  // namespace

TEST_CASE("a log spanning weeks with a 1-hour inbox: the inbox stays bounded by the window, nothing applies twice") {
    weeks_log log{7};
    temp_dir dir;
    idem::store s{retention_options(dir.path(), 1h, std::nullopt)};
    s.add(totals_by_order());
    std::vector<idem::delivery> batch;
    std::vector<std::uint64_t> times;  // event times of the batch's deliveries
    std::size_t max_inbox = 0;
    std::map<idem::outcome_kind, std::size_t> outcomes;
    // The model of the inbox: the stamps of the ids it holds, oldest first. An id is stamped
    // with the consumer's event time (the highest seen, its own included) when first recorded.
    std::deque<std::uint64_t> model;
    std::uint64_t event_time = 0;
    for (std::size_t i = 0; i < log.deliveries.size(); ++i) {
        batch.push_back(deliver(log.deliveries[i].ev));
        times.push_back(*idem::parse_event_time(log.deliveries[i].ev.time));
        if (batch.size() == 20 || i + 1 == log.deliveries.size()) {
            auto result = s.apply(batch);
            for (std::size_t k = 0; k < result.size(); ++k) {
                ++outcomes[result[k].kind];
                if (result[k].kind == idem::outcome_kind::duplicate_message) continue;
                event_time = std::max(event_time, times[k]);
                model.push_back(event_time);
            }
            batch.clear();
            times.clear();
            prune_all(s);
            const auto cutoff = event_time - 3600 * second_ns;
            while (model.size() > 1 && model.front() < cutoff) model.pop_front();
            REQUIRE(s.inbox_size() == model.size());
            REQUIRE(s.inbox_size() <= 150);  // an hour of ids (~40-60 events and late redeliveries), not weeks
            max_inbox = std::max(max_inbox, s.inbox_size());
        }
    }
    CHECK(dump(s.read(), "order-totals") == log.expected.rows);
    CHECK(outcomes[idem::outcome_kind::applied] == log.events);
    // Redeliveries inside the window are caught by the inbox, those beyond it by the contributing sets.
    CHECK(outcomes[idem::outcome_kind::duplicate_message] + outcomes[idem::outcome_kind::duplicate_event] ==
          log.deliveries.size() - log.events);
    CHECK(outcomes[idem::outcome_kind::duplicate_event] >= log.late_redeliveries);
    auto stats = s.read().consumer(consumer).stats();
    CHECK(stats.pruned_ids + s.inbox_size() == log.events + outcomes[idem::outcome_kind::duplicate_event]);
    MESSAGE("deliveries " << log.deliveries.size() << ", events " << log.events << ", largest inbox " << max_inbox
                          << ", pruned ids " << stats.pruned_ids);
    CHECK(max_inbox < log.events / 100);
}

TEST_CASE("an event-time horizon bounds the contributing sets; redeliveries past it are late, never applied twice") {
    weeks_log log{11};
    temp_dir dir;
    idem::store s{retention_options(dir.path(), 1h, 24h)};
    s.add(totals_by_order());
    std::map<idem::outcome_kind, std::size_t> outcomes;
    std::vector<idem::delivery> batch;
    std::size_t max_contributors = 0;
    for (std::size_t i = 0; i < log.deliveries.size(); ++i) {
        batch.push_back(deliver(log.deliveries[i].ev));
        if (batch.size() == 50 || i + 1 == log.deliveries.size()) {
            for (const auto& o : s.apply(batch)) ++outcomes[o.kind];
            batch.clear();
            prune_all(s);
            max_contributors = std::max(max_contributors, s.read().projection("order-totals").contributor_entries());
        }
    }
    CHECK(dump(s.read(), "order-totals") == log.expected.rows);
    auto stats = s.read().consumer(consumer).stats();
    CHECK(stats.late_events == log.late_redeliveries);
    CHECK(outcomes[idem::outcome_kind::dead_lettered] == log.late_redeliveries);
    // A day of events (~1,000 at one per ~90 s) and the batch in flight, not three weeks of them.
    CHECK(max_contributors < 1300);
    CHECK(stats.pruned_contributors > log.events / 2);
    for (const auto& d : s.read().consumer(consumer).dead_letters()) {
        CHECK(d.why == idem::reason::late_event);
        CHECK(d.detail.find("older than the horizon") != std::string::npos);
    }
}

TEST_CASE("late events: unsequenced ones past the horizon are rejected, sequenced ones proven new are applied") {
    temp_dir dir;
    idem::store s{retention_options(dir.path(), std::nullopt, 1h)};
    s.add(totals_by_order()).add(totals_by_subject());
    const auto t0 = start_ns;
    REQUIRE(s.apply(deliver(timed_line("a", "o1", 5, t0))).kind == idem::outcome_kind::applied);
    REQUIRE(s.apply(deliver(timed_line("b", "o1", 7, t0 + 3 * 3600 * second_ns))).kind == idem::outcome_kind::applied);

    SUBCASE("unsequenced, older than the horizon: late_event, nothing changes") {
        auto o = s.apply(deliver(timed_line("c", "o1", 100, t0 + 30 * 60 * second_ns)));
        CHECK(o.kind == idem::outcome_kind::dead_lettered);
        CHECK(o.why == idem::reason::late_event);
        CHECK(s.read().get<order_total>("order-totals", "o1")->state.total == 12);
        CHECK(s.read().consumer(consumer).stats().late_events == 1);
    }
    SUBCASE("unsequenced, inside the horizon: applied") {
        auto o = s.apply(deliver(timed_line("c", "o1", 100, t0 + 150 * 60 * second_ns)));
        CHECK(o.kind == idem::outcome_kind::applied);
        CHECK(s.read().get<order_total>("order-totals", "o1")->state.total == 112);
    }
    SUBCASE("sequenced and new, however old: applied") {
        auto o = s.apply(deliver(timed_line("s1", "o2", 9, t0 - 5 * 3600 * second_ns, 1)));
        CHECK(o.kind == idem::outcome_kind::applied);
        CHECK(s.read().get<order_total>("order-streams", "o2")->state.total == 9);
        // ...and its redelivery under a new message id is judged by the sequence: a duplicate.
        auto again = s.apply(deliver(timed_line("s1", "o2", 9, t0 - 5 * 3600 * second_ns, 1), "other-transport-id"));
        CHECK(again.kind == idem::outcome_kind::duplicate_event);
    }
    SUBCASE("unsequenced without a time, with a horizon set: late_event (nothing can prove it new)") {
        auto o = s.apply(deliver(line("n", "o1", 1)));
        CHECK(o.kind == idem::outcome_kind::dead_lettered);
        CHECK(o.why == idem::reason::late_event);
        CHECK(o.detail.find("no usable time") != std::string::npos);
    }
}

TEST_CASE("once contributing sets were pruned, the floor holds even if the horizon is switched off") {
    temp_dir dir;
    const auto t0 = start_ns;
    {
        idem::store s{retention_options(dir.path(), std::nullopt, 1h)};
        s.add(totals_by_order());
        s.apply(deliver(timed_line("a", "o1", 5, t0)));
        s.apply(deliver(timed_line("b", "o1", 7, t0 + 3 * 3600 * second_ns)));
        auto r = s.prune();
        REQUIRE(r.contributors == 1);  // "a" is past the horizon (the last entry is kept)
        CHECK(s.read().projection("order-totals").contributor_floor() == t0 + 1);
    }
    idem::store s{retention_options(dir.path(), std::nullopt, std::nullopt)};
    s.add(totals_by_order());
    // "a" again under a new message id: its effect key is gone, the floor still rejects it.
    auto o = s.apply(deliver(timed_line("a", "o1", 5, t0), "redelivered-a"));
    CHECK(o.why == idem::reason::late_event);
    CHECK(s.read().get<order_total>("order-totals", "o1")->state.total == 12);
}

TEST_CASE("same id, different content: id_conflict, the first effect stands; reformatted JSON is the same content") {
    temp_dir dir;
    idem::store s{options(dir.path())};
    s.add(totals_by_order());
    auto ev = line("x1", "o1", 5);
    REQUIRE(s.apply(deliver(ev)).kind == idem::outcome_kind::applied);

    // The same event reformatted: other member order, whitespace, escapes, number spelling.
    const std::string reformatted =
        "{ \"type\" : \"order.line_added\", \"data\": { \"amount\": 5.0, \"order_id\": \"\\u006f1\" },\n"
        "  \"subject\":\"o1\", \"id\":\"x1\", \"specversion\":\"1.0\", \"source\":\"/orders\" }";
    auto same = s.apply(idem::delivery{reformatted, {}});
    CHECK(same.kind == idem::outcome_kind::duplicate_message);

    auto changed = ev;
    changed.data = R"({"order_id":"o1","amount":500})";
    auto conflict = s.apply(deliver(changed));
    CHECK(conflict.kind == idem::outcome_kind::dead_lettered);
    CHECK(conflict.why == idem::reason::id_conflict);
    CHECK(conflict.detail.find("first processed in commit 1") != std::string::npos);
    CHECK(s.read().get<order_total>("order-totals", "o1")->state.total == 5);
    auto snap = s.read();
    CHECK(snap.consumer(consumer).stats().id_conflicts == 1);
    auto letters = snap.consumer(consumer).dead_letters();
    REQUIRE(letters.size() == 1);
    CHECK(letters[0].body.find("500") != std::string::npos);  // the conflicting version is kept

    // In one batch too: the second version of an id staged in the same batch.
    auto batch_outcomes = s.apply(std::vector<idem::delivery>{deliver(line("y1", "o2", 1)), deliver(line("y1", "o2", 2))});
    CHECK(batch_outcomes[0].kind == idem::outcome_kind::applied);
    CHECK(batch_outcomes[1].why == idem::reason::id_conflict);
    // A transport id reused for another event is a collision of the transport, not a conflict:
    // the other event is judged as a new message (identity_test.cpp covers it).
    REQUIRE(s.apply(deliver(line("z1", "o3", 1), "broker-7")).kind == idem::outcome_kind::applied);
    CHECK(s.apply(deliver(line("z2", "o3", 1), "broker-7")).kind == idem::outcome_kind::applied);
    CHECK(s.read().consumer(consumer).stats().id_conflicts == 2);
}

TEST_CASE("the inbox records what the first delivery of each id did, for `why`") {
    temp_dir dir;
    idem::store s{options(dir.path())};
    s.add(totals_by_order());
    s.apply(deliver(line("a", "o1", 5)));
    s.apply(deliver(line("b", "o1", 5), "t-b"));
    auto snap = s.read();
    auto a = snap.consumer(consumer).inbox_lookup(line("a", "o1", 5).message_id());
    REQUIRE(a);
    CHECK(a->commit == 1);
    CHECK(a->outcome == idem::outcome_kind::applied);
    CHECK(a->fingerprint == idem::fingerprint(line("a", "o1", 5)));
    auto b = snap.consumer(consumer).inbox_lookup(idem::transport_message_id("t-b"));
    REQUIRE(b);
    CHECK(b->commit == 2);
    CHECK_FALSE(snap.consumer(consumer).inbox_lookup(line("zz", "o1", 5).message_id()));
}

TEST_CASE("a retention shorter than the source's redelivery bound is refused, naming both") {
    temp_dir dir;
    auto o = options(dir.path());
    o.retention.inbox_retention = 1h;
    o.retention.source = idem::redelivery_bound{2h + 30min, "AckWait 30m x MaxDeliver 5"};
    try {
        idem::store s{o};
        FAIL("the store opened");
    } catch (const std::system_error& e) {
        const std::string what = e.what();
        CHECK(what.find("1h") != std::string::npos);
        CHECK(what.find("2h30m") != std::string::npos);
        CHECK(what.find("AckWait 30m x MaxDeliver 5") != std::string::npos);
    }
    o.retention.inbox_retention = 3h;
    CHECK_NOTHROW(idem::store{o});
}

TEST_CASE("wall-clock retention: ids expire by processing time") {
    temp_dir dir;
    std::uint64_t now = start_ns;
    auto o = options(dir.path());
    o.retention.inbox_retention = 10min;
    o.retention.now = [&] { return now; };
    idem::store s{o};
    s.add(totals_by_order());
    for (int i = 0; i < 10; ++i) s.apply(deliver(line("w" + std::to_string(i), "o1", 1)));
    now += 5 * 60 * second_ns;
    for (int i = 10; i < 20; ++i) s.apply(deliver(line("w" + std::to_string(i), "o1", 1)));
    CHECK(s.prune().ids == 0);
    now += 6 * 60 * second_ns;  // the first ten are 11 minutes old
    auto r = s.prune();
    CHECK(r.ids == 10);
    CHECK(s.inbox_size() == 10);
    // A redelivery of an expired id: the contributing set still knows its effect.
    CHECK(s.apply(deliver(line("w0", "o1", 1))).kind == idem::outcome_kind::duplicate_event);
    CHECK(s.read().get<order_total>("order-totals", "o1")->state.total == 20);
    // Bounded steps: one row per step takes as many steps as rows.
    now += 20 * 60 * second_ns;
    std::size_t steps = 0;
    while (s.prune(idem::prune_limits{1, std::chrono::seconds(1), {}}).more) ++steps;
    CHECK(steps >= 9);
    CHECK(s.inbox_size() == 1);  // the last entry stays: positions never restart
}
