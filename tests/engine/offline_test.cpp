// The offline paths over event logs: a consume that fails half way resumes exactly after
// its last commit, a failed rebuild leaves the target as it was, and both agree with a
// plain batch-by-batch apply of the same records.

#include <idem/engine/offline.hpp>

#include "../projections/fixtures.hpp"

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <vector>

using namespace idem_test;

namespace {

/// Writes a JSON Lines log of n order lines over a few orders, every 7th redelivered, one malformed line.
std::vector<std::string> write_log(const std::filesystem::path& path, int n) {
    std::vector<std::string> bodies;
    for (int i = 0; i < n; ++i) {
        bodies.push_back(line("e-" + std::to_string(i), "order-" + std::to_string(i % 13), i + 1).to_json());
        if (i % 7 == 0) bodies.push_back(bodies.back());
        if (i == n / 2) bodies.emplace_back("{not json");
    }
    idem::log_writer out{path, idem::log_format::jsonl};
    for (const auto& b : bodies) out.write(b);
    return bodies;
}

idem::consume_options consume_options(const temp_dir& dir, const std::filesystem::path& log) {
    idem::consume_options o;
    o.store = options(dir.env());
    o.logs = {log};
    o.setup = [](idem::store& s) { s.add(totals_by_order()); };
    o.batch = 100;
    return o;
}

}  // namespace

TEST_CASE("a consume that fails on a commit resumes after its last good commit and ends exact") {
    temp_dir dir;
    const auto log = dir / "orders.jsonl";
    const auto bodies = write_log(log, 2000);

    // The reference: the same records applied batch by batch through the store.
    temp_dir ref_dir;
    idem::store ref{options(ref_dir.env())};
    ref.add(totals_by_order());
    for (std::size_t at = 0; at < bodies.size(); at += 100) {
        std::vector<idem::delivery> batch;
        for (std::size_t i = at; i < std::min(bodies.size(), at + 100); ++i) batch.push_back({bodies[i], {}});
        ref.apply(batch);
    }

    auto o = consume_options(dir, log);
    int commits = 0;
    o.store.before_commit = [&](std::uint64_t) {
        if (++commits == 7) throw std::runtime_error("injected failure on the 7th commit");
    };
    CHECK_THROWS_WITH(idem::consume(o), "injected failure on the 7th commit");
    {
        auto snap = idem::snapshot::open(dir.env());
        CHECK(snap.commit() == 6);
        auto at = snap.checkpoint(consumer, idem::log_source(log));
        REQUIRE(at.has_value());
        CHECK(*at > 0);
        CHECK(*at < std::filesystem::file_size(log));
    }

    auto again = consume_options(dir, log);
    auto result = idem::consume(again);
    CHECK(result.records == bodies.size() - 600);  // six batches of 100 were committed before the failure
    auto snap = idem::snapshot::open(dir.env());
    CHECK(dump(snap, "order-totals") == dump(ref.read(), "order-totals"));
    CHECK(snap.stats(consumer).outcomes == ref.read().stats(consumer).outcomes);
    CHECK(*snap.checkpoint(consumer, idem::log_source(log)) == std::filesystem::file_size(log));
}

TEST_CASE("a rebuild that fails leaves the target as it was, and a rebuild equals a consume") {
    temp_dir dir;
    const auto log = dir / "orders.jsonl";
    write_log(log, 1500);

    idem::rebuild_options r;
    r.store = options(dir / "db");
    r.logs = {log};
    r.setup = [](idem::store& s) { s.add(totals_by_order()); };
    r.batch = 100;
    r.memory_budget = 0;  // spill rows after every batch
    idem::rebuild(r);
    const auto before = dump(idem::snapshot::open(dir / "db"), "order-totals");
    CHECK(!before.empty());

    auto failing = r;
    failing.store.before_commit = [](std::uint64_t) { throw std::runtime_error("disk gone"); };
    CHECK_THROWS_WITH(idem::rebuild(failing), "disk gone");
    CHECK(dump(idem::snapshot::open(dir / "db"), "order-totals") == before);
    CHECK_FALSE(std::filesystem::exists(dir / "db.rebuild"));

    auto c = consume_options(dir, log);
    c.store.path = dir / "consumed";
    idem::consume(c);
    CHECK(dump(idem::snapshot::open(dir / "consumed"), "order-totals") == before);
    CHECK(idem::snapshot::open(dir / "consumed").stats(consumer).outcomes ==
          idem::snapshot::open(dir / "db").stats(consumer).outcomes);
}

TEST_CASE("compare walks two environments in step and names the first difference") {
    temp_dir dir;
    auto fill = [&](const char* name, const std::vector<std::tuple<std::string, std::string, int>>& events) {
        idem::store s{options(dir / name)};
        s.add(totals_by_order());
        for (const auto& [id, order, amount] : events) s.apply(deliver(line(id, order, amount)));
    };
    fill("a", {{"e1", "order-1", 5}, {"e2", "order-2", 7}, {"e3", "order-3", 9}});
    fill("same", {{"x1", "order-3", 9}, {"x2", "order-1", 5}, {"x3", "order-2", 7}});
    fill("extra", {{"e1", "order-1", 5}, {"e2", "order-2", 7}, {"e3", "order-3", 9}, {"e4", "order-0", 1}});
    fill("changed", {{"e1", "order-1", 5}, {"e2", "order-2", 8}, {"e3", "order-3", 9}});

    auto same = idem::compare(dir / "a", dir / "same", {"order-totals"});
    CHECK_FALSE(same.first_difference.has_value());
    CHECK(same.left[0].rows == 3);
    CHECK(same.left[0].digest == same.right[0].digest);

    auto extra = idem::compare(dir / "a", dir / "extra", {"order-totals"});
    REQUIRE(extra.first_difference.has_value());
    CHECK(extra.first_difference->find("row 'order-0'") != std::string::npos);
    CHECK(extra.first_difference->find("only in") != std::string::npos);
    CHECK(extra.right[0].rows == 4);
    CHECK(extra.left[0].digest != extra.right[0].digest);

    auto changed = idem::compare(dir / "a", dir / "changed", {"order-totals"});
    REQUIRE(changed.first_difference.has_value());
    CHECK(changed.first_difference->find("row 'order-2' differs") != std::string::npos);
    CHECK(changed.first_difference->find("states differ") != std::string::npos);
}
