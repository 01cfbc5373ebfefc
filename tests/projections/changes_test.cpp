// The change feed: recorded in the batch's transaction, only for projections that ask, read back
// by position in whole commits, pruned by commits and age with a clear error behind it, and a
// bulk build recorded as one reset per projection.

#include "fixtures.hpp"

#include <idem/storage/error.hpp>

#include <chrono>
#include <map>
#include <string>
#include <vector>

using namespace idem_test;
using namespace std::chrono_literals;

namespace {

idem::store_options feed_options(const std::filesystem::path& dir) {
    auto o = options(dir);
    o.changes.max_age.reset();
    return o;
}

/// The last state the feed gives each row, decoded: what a follower ends with.
std::map<std::string, row_summary> follow(const idem::snapshot& snap, const idem::projection<order_total>& p,
                                          std::uint64_t since = 0) {
    std::map<std::string, row_summary> out;
    for (const auto& c : snap.changes(since, SIZE_MAX)) {
        if (c.kind != idem::change_kind::row || c.projection != p.name()) continue;
        auto state = idem::state_of(p, c);
        out[c.key] = row_summary{state.total, state.lines, c.version, state.sequences};
    }
    return out;
}

}  // namespace

TEST_CASE("the change feed records each commit's changed rows, for projections that ask") {
    temp_dir dir;
    idem::store s{feed_options(dir.path())};
    s.add(totals_by_order().changes());
    s.add(totals_by_subject());  // records nothing
    reference ref;
    std::vector<idem::delivery> batch{deliver(line("e1", "o1", 10)), deliver(line("e2", "o2", 5)),
                                      deliver(line("e3", "o1", 7))};
    s.apply(batch);
    ref.add("o1", 10);
    ref.add("o2", 5);
    ref.add("o1", 7);
    // A duplicate changes nothing, and records nothing.
    s.apply(std::vector{deliver(line("e1", "o1", 10))});
    s.apply(std::vector{deliver(line("e4", "o2", 1))});
    ref.add("o2", 1);

    auto snap = s.read();
    auto feed = snap.changes(0);
    REQUIRE(feed.size() == 3);  // commit 1: o1 and o2 once each (versions skip within a batch); commit 3: o2
    CHECK(feed[0].position == idem::change_position{1, 0});
    CHECK(feed[0].key == "o1");
    CHECK(feed[0].version == 2);
    CHECK(feed[1].position == idem::change_position{1, 1});
    CHECK(feed[1].key == "o2");
    CHECK(feed[2].position == idem::change_position{3, 0});
    CHECK(feed[2].version == 2);
    for (const auto& c : feed) {
        CHECK(c.projection == "order-totals");
        CHECK(c.time_ns > 0);
    }
    CHECK(follow(snap, totals_by_order()) == ref.rows);
    CHECK(follow(snap, totals_by_order()) == dump(snap, "order-totals"));

    // Resuming: after a commit, after a position inside one.
    CHECK(snap.changes(1).size() == 1);
    CHECK(snap.changes(3).empty());
    auto rest = snap.changes_after({1, 0});
    REQUIRE(rest.size() == 2);
    CHECK(rest[0].position == idem::change_position{1, 1});

    auto info = snap.change_feed();
    CHECK(info.entries == 3);
    CHECK(info.first_commit == 1);
    CHECK(info.last_commit == 3);
    CHECK(info.pruned_through == 0);
    CHECK(snap.store_id().size() == 32);
}

TEST_CASE("the change feed hands out whole commits, past the limit if one commit is larger") {
    temp_dir dir;
    idem::store s{feed_options(dir.path())};
    s.add(totals_by_order().changes());
    for (int b = 0; b < 3; ++b) {
        std::vector<idem::delivery> batch;
        for (int i = 0; i < 4; ++i) {
            batch.push_back(deliver(line("b" + std::to_string(b) + "-" + std::to_string(i), "o" + std::to_string(i), 1)));
        }
        s.apply(batch);
    }
    auto snap = s.read();
    CHECK(snap.changes(0, 1).size() == 4);
    CHECK(snap.changes(0, 5).size() == 8);
    CHECK(snap.changes(0, 8).size() == 8);
    CHECK(snap.changes(0, 9).size() == 12);
    CHECK(snap.changes_after({2, 1}, 1).size() == 2);  // the rest of commit 2
}

TEST_CASE("a pruned feed refuses readers behind it, naming the oldest commit kept") {
    temp_dir dir;
    auto o = feed_options(dir.path());
    o.changes.keep_commits = 2;
    idem::store s{o};
    s.add(totals_by_order().changes());
    for (int b = 1; b <= 5; ++b) s.apply(std::vector{deliver(line("e" + std::to_string(b), "o1", b))});
    auto snap = s.read();
    // Every batch pruned what fell behind the last two commits.
    auto info = snap.change_feed();
    CHECK(info.first_commit == 4);
    CHECK(info.pruned_through == 3);
    CHECK(info.entries == 2);
    try {
        snap.changes(2);
        FAIL("no error");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::changes_pruned);
        CHECK(std::string(e.what()).find("oldest commit kept whole is 4") != std::string::npos);
    }
    CHECK(snap.changes(3).size() == 2);
    CHECK(snap.changes_after({3, 0}).size() == 2);
    CHECK_THROWS_AS(snap.changes_after({2, 0}), std::system_error);
}

TEST_CASE("change retention by age, in bounded steps of store::prune") {
    temp_dir dir;
    auto o = feed_options(dir.path());
    std::uint64_t now = 1'000'000'000'000'000'000ull;
    o.retention.now = [&] { return now; };
    o.retention.prune_per_batch = 0;  // only store::prune removes
    o.changes.max_age = 1h;
    idem::store s{o};
    s.add(totals_by_order().changes());
    for (int b = 0; b < 10; ++b) {
        std::vector<idem::delivery> batch;
        for (int i = 0; i < 3; ++i) batch.push_back(deliver(line("e" + std::to_string(b * 3 + i), "o" + std::to_string(i), 1)));
        s.apply(batch);
    }
    now += 2 * 3600 * 1'000'000'000ull;
    s.apply(std::vector{deliver(line("late", "o9", 1))});  // commit 11, younger than an hour
    idem::prune_limits limits;
    limits.max_rows = 4;
    auto step = s.prune(limits);
    CHECK(step.changes == 4);
    CHECK(step.more);
    {
        // Commit 2 was cut after its first entry: it counts as pruned, so a reader after commit 1 is refused.
        auto snap = s.read();
        CHECK(snap.change_feed().pruned_through == 2);
        CHECK_THROWS_AS(snap.changes(1), std::system_error);
        CHECK(snap.changes(2).front().position.commit == 3);
    }
    std::size_t removed = 4;
    while (step.more) {
        step = s.prune(limits);
        removed += step.changes;
    }
    CHECK(removed == 30);
    auto snap = s.read();
    auto feed = snap.changes(10);
    REQUIRE(feed.size() == 1);
    CHECK(feed.front().key == "o9");
    CHECK(snap.change_feed().entries == 1);
}

TEST_CASE("a bulk build records one reset per projection; a successor continues the feed") {
    temp_dir dir;
    auto old_dir = dir.path() / "old";
    auto new_dir = dir.path() / "new";
    std::string id;
    std::uint64_t last = 0;
    {
        idem::store s{feed_options(old_dir)};
        s.add(totals_by_order().changes());
        s.apply(std::vector{deliver(line("e1", "o1", 1))});
        s.apply(std::vector{deliver(line("e2", "o2", 2))});
        auto snap = s.read();
        id = snap.store_id();
        last = snap.commit();
    }
    idem::store s{feed_options(new_dir)};
    s.add(totals_by_order().changes());
    s.add(totals_by_subject());
    s.succeed(id, last);
    s.begin_bulk(1 << 20);
    s.apply(std::vector{deliver(line("e1", "o1", 1)), deliver(line("e2", "o2", 2)), deliver(line("e3", "o3", 3))});
    s.end_bulk();
    auto snap = s.read();
    CHECK(snap.store_id() == id);
    CHECK(snap.commit() == last + 1);
    // A follower of the old store at its last commit, or before it, finds the reset next.
    for (std::uint64_t since : {std::uint64_t{0}, last}) {
        auto feed = snap.changes(since);
        REQUIRE(feed.size() == 1);
        CHECK(feed[0].kind == idem::change_kind::reset);
        CHECK(feed[0].projection == "order-totals");
        CHECK(feed[0].position.commit == last + 1);
    }
    // Live batches after it record rows again.
    s.apply(std::vector{deliver(line("e4", "o1", 4))});
    auto after = s.read().changes(last + 1);
    REQUIRE(after.size() == 1);
    CHECK(after[0].key == "o1");
    CHECK(after[0].version == 2);
    CHECK_THROWS_AS(s.succeed(id, 1), std::system_error);
}

TEST_CASE("a redrive records the rows it changes") {
    temp_dir dir;
    idem::store s{feed_options(dir.path())};
    bool broken = true;
    s.add(idem::projection<order_total>("order-totals")
              .on<line_added>([&](order_total& t, const line_added& e) {
                  if (broken && e.amount == 13) throw std::runtime_error("unlucky");
                  t.total += e.amount;
                  t.lines += 1;
              })
              .key([](const line_added& e) { return e.order_id; })
              .changes());
    s.apply(std::vector{deliver(line("e1", "o1", 13)), deliver(line("e2", "o2", 2))});
    CHECK(s.read().changes(0).size() == 1);  // the dead letter changed nothing
    broken = false;
    auto result = s.redrive();
    CHECK(result.applied == 1);
    auto feed = s.read().changes(1);
    REQUIRE(feed.size() == 1);
    CHECK(feed[0].key == "o1");
    CHECK(feed[0].version == 1);
}

TEST_CASE("change positions print and parse") {
    CHECK(idem::change_position{12, 3}.to_string() == "12.3");
    CHECK(idem::change_position::parse("12.3") == idem::change_position{12, 3});
    CHECK(idem::change_position::parse("12") == idem::change_position{12, UINT32_MAX});
    CHECK_FALSE(idem::change_position::parse(""));
    CHECK_FALSE(idem::change_position::parse("1.x"));
    CHECK_FALSE(idem::change_position::parse("-1"));
    CHECK_FALSE(idem::change_position::parse("1."));
}
