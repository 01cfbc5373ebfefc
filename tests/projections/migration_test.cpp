// Projection state migration: a store written by old code (state versions 1 and 2) opened by
// code at state version 3 with a chain of migrations; rows migrated when read and rewritten
// at version 3 when next changed; readers through the projection migrate, readers by type
// alone refuse other versions; rows newer than the code refused everywhere; chains with gaps
// or mismatched types refused when the projection is added; a migration that throws
// dead-letters the event that needed the row. Real LMDB environments; references computed here.

#include <idem/projections/store.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;
using idem::reason;

namespace {

struct total_v1 {  // version 1: the sum only
    std::int64_t total = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(total);
    }
};
struct total_v2 {  // version 2: and the number of lines
    std::int64_t total = 0;
    std::int64_t lines = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(total, lines);
    }
};
struct total_v3 {  // version 3: and the currency
    static constexpr std::uint32_t state_version = 3;
    std::int64_t total = 0;
    std::int64_t lines = 0;
    std::string currency;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(total, lines, currency);
    }
    friend bool operator==(const total_v3&, const total_v3&) = default;
};

idem::projection<total_v1> code_v1() {
    return idem::projection<total_v1>("totals")
        .on<line_added>([](total_v1& t, const line_added& e) { t.total += e.amount; })
        .key([](const line_added& e) { return e.order_id; });
}
idem::projection<total_v2> code_v2() {
    return idem::projection<total_v2>("totals")
        .on<line_added>([](total_v2& t, const line_added& e) {
            t.total += e.amount;
            if (t.lines >= 0) ++t.lines;
        })
        .key([](const line_added& e) { return e.order_id; })
        .state_version(2)
        .migrate<total_v1>(1, [](const total_v1& o) { return total_v2{o.total, o.total == 0 ? 0 : -1}; });
}
// Lines unknown in version 1 are counted as -1 (unknown); version 3 keeps that and adds EUR.
idem::projection<total_v3> code_v3(bool failing = false) {
    return idem::projection<total_v3>("totals")
        .on<line_added>([](total_v3& t, const line_added& e) {
            t.total += e.amount;
            if (t.lines >= 0) ++t.lines;
        })
        .key([](const line_added& e) { return e.order_id; })
        .state_version(3)
        .migrate<total_v1>(1, [](const total_v1& o) { return total_v2{o.total, o.total == 0 ? 0 : -1}; })
        .migrate<total_v2>(2, [failing](const total_v2& o) {
            if (failing && o.total > 100) throw std::runtime_error("total " + std::to_string(o.total) + " too large");
            return total_v3{o.total, o.lines, "EUR"};
        });
}

void apply_lines(idem::store& s, const std::vector<std::pair<std::string, std::int64_t>>& lines, int& next_id) {
    std::vector<idem::delivery> batch;
    for (const auto& [order, amount] : lines) batch.push_back(deliver(line("e" + std::to_string(next_id++), order, amount)));
    for (const auto& o : s.apply(batch)) REQUIRE(o.kind == outcome_kind::applied);
}

}  // namespace

TEST_CASE("rows of older state versions are migrated when read and rewritten when next changed") {
    temp_dir dir;
    int id = 0;
    {
        idem::store old{options(dir.env())};
        old.add(code_v1());
        apply_lines(old, {{"a", 10}, {"b", 20}, {"c", 30}}, id);
    }
    {
        idem::store mid{options(dir.env())};
        mid.add(code_v2());
        apply_lines(mid, {{"b", 5}, {"d", 1}}, id);  // b migrated from 1 and rewritten at 2; d new at 2
    }
    idem::store now{options(dir.env())};
    auto p = code_v3();
    now.add(code_v3());
    auto snap = now.read();
    CHECK(snap.raw_row("totals", "a")->state_version == 1);
    CHECK(snap.raw_row("totals", "b")->state_version == 2);
    // Read through the projection: every row at version 3.
    std::map<std::string, total_v3> expected{{"a", {10, -1, "EUR"}}, {"b", {25, -1, "EUR"}}, {"c", {30, -1, "EUR"}},
                                             {"d", {1, 1, "EUR"}}};
    std::map<std::string, total_v3> read;
    for (auto& r : snap.rows(p)) read[r.key] = r.state;
    CHECK(read == expected);
    CHECK(snap.get(p, "a")->state == expected["a"]);
    // By type alone: a version-1 row is refused, not misread as version 3.
    CHECK_THROWS_WITH_AS(snap.get<total_v3>("totals", "a"),
                         doctest::Contains("a row has state version 1, and the state type read declares 3"),
                         std::system_error);
    // The writer migrates the row it changes and writes it at version 3; the others stay as they were.
    apply_lines(now, {{"a", 1}, {"d", 2}}, id);
    snap = now.read();
    CHECK(snap.raw_row("totals", "a")->state_version == 3);
    CHECK(snap.raw_row("totals", "c")->state_version == 1);
    CHECK(snap.get<total_v3>("totals", "a")->state == total_v3{11, -1, "EUR"});
    CHECK(snap.get<total_v3>("totals", "d")->state == total_v3{3, 2, "EUR"});
    CHECK(snap.get<total_v3>("totals", "a")->version == 2);  // events applied to the row, across versions
}

TEST_CASE("a row newer than the code is refused by the writer and by every reader") {
    temp_dir dir;
    int id = 0;
    {
        idem::store now{options(dir.env())};
        now.add(code_v3());
        apply_lines(now, {{"a", 10}}, id);
    }
    idem::store old{options(dir.env())};
    auto p = code_v2();
    old.add(code_v2());
    auto snap = old.read();
    CHECK_THROWS_WITH_AS(snap.get(p, "a"), doctest::Contains("row has state version 3, this code knows up to 2"),
                         std::system_error);
    CHECK_THROWS_AS(snap.get<total_v2>("totals", "a"), std::system_error);
    CHECK_THROWS_WITH_AS(old.apply(deliver(line("x", "a", 1))), doctest::Contains("row has state version 3"),
                         std::system_error);
}

TEST_CASE("a migration that throws dead-letters the event that needed the row; others go on") {
    temp_dir dir;
    int id = 0;
    {
        idem::store mid{options(dir.env())};
        mid.add(code_v2());
        apply_lines(mid, {{"small", 10}, {"large", 500}}, id);
    }
    idem::store now{options(dir.env())};
    now.add(code_v3(true));
    auto out = now.apply(std::vector<idem::delivery>{deliver(line("n1", "large", 1)), deliver(line("n2", "small", 1))});
    REQUIRE(out.size() == 2);
    CHECK(out[0].kind == outcome_kind::dead_lettered);
    CHECK(out[0].why == reason::upcast_failed);
    CHECK(out[0].detail.find("row 'large': projection 'totals': migrating a row from state version 2 failed: total 500 "
                             "too large") != std::string::npos);
    CHECK(out[1].kind == outcome_kind::applied);
    auto snap = now.read();
    CHECK(snap.raw_row("totals", "large")->state_version == 2);  // left as it was
    CHECK(snap.get<total_v3>("totals", "small")->state == total_v3{11, 2, "EUR"});
}

TEST_CASE("a row of an older version with no migration is refused, naming the fix") {
    temp_dir dir;
    int id = 0;
    {
        idem::store old{options(dir.env())};
        old.add(code_v1());
        apply_lines(old, {{"a", 10}}, id);
    }
    idem::store now{options(dir.env())};
    now.add(idem::projection<total_v2>("totals")
                .on<line_added>([](total_v2& t, const line_added& e) { t.total += e.amount; })
                .key([](const line_added& e) { return e.order_id; })
                .state_version(2));
    CHECK_THROWS_WITH_AS(now.apply(deliver(line("x", "a", 1))),
                         doctest::Contains("row has state version 1, and no migration reads that version"),
                         std::system_error);
}

TEST_CASE("migration chains with a gap or a mismatched type are refused when the projection is added") {
    temp_dir dir;
    idem::store s{options(dir.env())};
    auto base = [] {
        return idem::projection<total_v3>("totals")
            .on<line_added>([](total_v3& t, const line_added& e) { t.total += e.amount; })
            .state_version(3);
    };
    CHECK_THROWS_WITH_AS(
        s.add(base().migrate<total_v1>(1, [](const total_v1& o) { return total_v2{o.total, 0}; })),
        doctest::Contains("the migration from state version 1 leads to version 2, which has no migration (a gap)"),
        std::system_error);
    CHECK_THROWS_WITH_AS(
        s.add(base()
                  .migrate<total_v1>(1, [](const total_v1& o) { return total_v3{o.total, 0, ""}; })
                  .migrate<total_v2>(2, [](const total_v2& o) { return total_v3{o.total, o.lines, ""}; })),
        doctest::Contains("the migration from state version 1 returns another type than version 2's state"),
        std::system_error);
    CHECK_THROWS_WITH_AS(s.add(base().migrate<total_v3>(3, [](const total_v3& o) { return o; })),
                         doctest::Contains("is not below the current state version 3"), std::system_error);
}

TEST_CASE("migrate_rows rewrites every older row at the current version in bounded steps") {
    temp_dir dir;
    int id = 0;
    {
        idem::store old{options(dir.env())};
        old.add(code_v1());
        apply_lines(old, {{"a", 10}, {"b", 20}, {"c", 30}, {"d", 40}, {"e", 50}}, id);
    }
    {
        idem::store mid{options(dir.env())};
        mid.add(code_v2());
        apply_lines(mid, {{"b", 1}, {"f", 2}}, id);
    }
    idem::store now{options(dir.env())};
    now.add(code_v3());
    const auto before = now.read().commit();
    std::vector<std::uint64_t> remaining;
    auto r = now.migrate_rows(2, [&](const idem::migrate_result& p) { remaining.push_back(p.remaining); });
    CHECK(r.rows == 6);  // a, b, c, d, e at 1 or 2, f at 2
    CHECK(r.commits == 3);
    CHECK(remaining == std::vector<std::uint64_t>{4, 2, 0});
    auto snap = now.read();
    CHECK(snap.commit() == before + 3);
    std::map<std::string, std::pair<total_v3, std::uint64_t>> rows;
    snap.scan<total_v3>("totals", [&](const idem::row<total_v3>& row) { rows[row.key] = {row.state, row.version}; });
    CHECK(rows == std::map<std::string, std::pair<total_v3, std::uint64_t>>{
                      {"a", {{10, -1, "EUR"}, 1}},
                      {"b", {{21, -1, "EUR"}, 2}},
                      {"c", {{30, -1, "EUR"}, 1}},
                      {"d", {{40, -1, "EUR"}, 1}},
                      {"e", {{50, -1, "EUR"}, 1}},
                      {"f", {{2, 1, "EUR"}, 1}},
                  });
    CHECK(now.migrate_rows().rows == 0);  // nothing left
}

TEST_CASE("migrate_rows stops at a migration that throws, naming the row; earlier steps stay") {
    temp_dir dir;
    int id = 0;
    {
        idem::store mid{options(dir.env())};
        mid.add(code_v2());
        apply_lines(mid, {{"a", 10}, {"b", 20}, {"c", 300}, {"d", 40}}, id);
    }
    idem::store now{options(dir.env())};
    now.add(code_v3(true));
    CHECK_THROWS_WITH_AS(now.migrate_rows(2), doctest::Contains("row 'c': projection 'totals': migrating a row from "
                                                                "state version 2 failed: total 300 too large"),
                         std::system_error);
    auto snap = now.read();
    CHECK(snap.raw_row("totals", "a")->state_version == 3);
    CHECK(snap.raw_row("totals", "b")->state_version == 3);
    CHECK(snap.raw_row("totals", "c")->state_version == 2);
    CHECK(snap.raw_row("totals", "d")->state_version == 2);  // in the step that failed
}
