// The event-log source: a consume that fails half way resumes exactly after its last
// commit, a failed rebuild leaves the target as it was, and both agree with a plain
// batch-by-batch apply of the same records (compared row by row).

#include <idem/sources/compare.hpp>
#include <idem/projections/store_hooks.hpp>
#include <idem/sources/consume.hpp>
#include <idem/sources/rebuild.hpp>
#include <idem/examples/domains.hpp>
#include <idem/examples/gen.hpp>

#include "../projections/fixtures.hpp"

#include <doctest/doctest.h>

#include <fcntl.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
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

/// Appends order lines e-from .. e-(to-1) (amount i + 1, order i % 13) to a JSON Lines log.
void append_lines(const std::filesystem::path& path, int from, int to) {
    idem::log_writer out{path, idem::log_format::jsonl, true};
    for (int i = from; i < to; ++i) {
        out.write(line("e-" + std::to_string(i), "order-" + std::to_string(i % 13), i + 1).to_json());
    }
}

/// The sum of all orders' totals and lines, for comparison with lines 0 .. n-1 (computed independently).
std::pair<std::int64_t, std::int64_t> sums(const std::filesystem::path& env) {
    std::int64_t total = 0;
    std::int64_t lines = 0;
    for (const auto& [key, row] : dump(idem::snapshot::open(env), "order-totals")) {
        total += row.total;
        lines += row.lines;
    }
    return {total, lines};
}

std::pair<std::int64_t, std::int64_t> expected_sums(std::int64_t n) { return {n * (n + 1) / 2, n}; }

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
    idem::detail::set_before_commit(o.store, [&](std::uint64_t) {
        if (++commits == 7) throw std::runtime_error("injected failure on the 7th commit");
    });
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
    CHECK(snap.consumer(consumer).stats().outcomes == ref.read().consumer(consumer).stats().outcomes);
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
    idem::detail::set_before_commit(failing.store, [](std::uint64_t) { throw std::runtime_error("disk gone"); });
    CHECK_THROWS_WITH(idem::rebuild(failing), "disk gone");
    CHECK(dump(idem::snapshot::open(dir / "db"), "order-totals") == before);
    CHECK_FALSE(std::filesystem::exists(dir / "db.rebuild"));

    auto c = consume_options(dir, log);
    c.store.path = dir / "consumed";
    idem::consume(c);
    CHECK(dump(idem::snapshot::open(dir / "consumed"), "order-totals") == before);
    CHECK(idem::snapshot::open(dir / "consumed").consumer(consumer).stats().outcomes ==
          idem::snapshot::open(dir / "db").consumer(consumer).stats().outcomes);
}

TEST_CASE("a rebuild from the binary log, which carries parsed attributes, equals one from JSON Lines") {
    // idem gen's defect mix for every domain: redeliveries, republished and reissued events,
    // reordered ones that park and are released, malformed lines. The binary log's records
    // carry the attributes the writer parsed; the JSON Lines rebuild parses every body.
    for (const std::string domain : {"trading", "game", "orders"}) {
        CAPTURE(domain);
        temp_dir dir;
        const auto jsonl = dir / "log.jsonl";
        const auto binary = dir / "log.bin";
        idem::examples::gen_options g;
        g.domain = domain;
        g.events = 3000;
        g.aggregates = 40;
        g.malformed = 0.02;
        idem::examples::gen_result expected;
        {
            idem::log_writer out{jsonl, idem::log_format::jsonl};
            expected = idem::examples::generate(g, [&](std::string_view line) { out.write(line); });
        }
        idem::convert_log(jsonl, binary, idem::log_format::binary);
        {
            idem::log_reader reader{binary};
            idem::log_record record;
            std::uint64_t with_attributes = 0;
            while (reader.next(record)) if (!record.attributes.empty()) ++with_attributes;
            CHECK(with_attributes * 10 > expected.lines * 9);  // all but the malformed lines
        }
        auto build = [&](const std::filesystem::path& log, const std::filesystem::path& db) {
            idem::rebuild_options r;
            r.store = options(db);
            r.store.unknown_types = idem::unknown_type_policy::dead_letter;
            r.logs = {log};
            r.transport = "gen";  // msgids count within one transport, whichever file carries them
            r.setup = [](idem::store& s) { idem::examples::add_all(s); };
            r.batch = 500;
            return idem::rebuild(r);
        };
        const auto from_jsonl = build(jsonl, dir / "from-jsonl");
        const auto from_binary = build(binary, dir / "from-binary");
        CHECK(from_binary.stats.outcomes == from_jsonl.stats.outcomes);
        CHECK(from_binary.stats.released == from_jsonl.stats.released);
        CHECK(from_binary.stats.released == expected.outcomes.at("released"));
        auto a = idem::snapshot::open(dir / "from-jsonl");
        auto b = idem::snapshot::open(dir / "from-binary");
        // The independent reference: the totals the generator computed from what it wrote.
        CHECK(idem::examples::domain_totals(b, domain) == expected.totals_json);
        CHECK(idem::examples::domain_totals(a, domain) == expected.totals_json);
        const std::vector<std::string> projections{"order-totals", "positions", "leaderboard", "inventory"};
        auto diff = idem::compare(a, dir / "from-jsonl", b, dir / "from-binary", projections);
        CHECK_MESSAGE(!diff.first_difference, diff.first_difference.value_or(""));
        const auto dead_a = a.consumer(consumer).dead_letters();
        const auto dead_b = b.consumer(consumer).dead_letters();
        REQUIRE(dead_a.size() == dead_b.size());
        for (std::size_t i = 0; i < dead_a.size(); ++i) {
            CHECK(dead_a[i].why == dead_b[i].why);
            CHECK(dead_a[i].detail == dead_b[i].detail);
            CHECK(dead_a[i].body == dead_b[i].body);
            CHECK(dead_a[i].message_id == dead_b[i].message_id);
        }
    }
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

TEST_SUITE("log files that change under a consumer") {

TEST_CASE("a log rotated between two consumes is finished in its old file, then read in its new one") {
    temp_dir dir;
    const auto log = dir / "live.jsonl";
    append_lines(log, 0, 300);
    idem::consume(consume_options(dir, log));
    append_lines(log, 300, 350);  // appended just before the rotation: not yet consumed
    std::filesystem::rename(log, dir / "live.jsonl.1");
    append_lines(log, 350, 500);
    SUBCASE("consumed at once") {
        auto r = idem::consume(consume_options(dir, log));
        CHECK(r.records == 200);
    }
    SUBCASE("a run killed once the old file was committed as finished; the old file deleted since") {
        // What such a run leaves: lines 300..349 applied with the checkpoint at the old file's end, finished.
        {
            idem::store s{options(dir.env())};
            s.add(totals_by_order());
            int fd = ::open((dir / "live.jsonl.1").c_str(), O_RDONLY);
            REQUIRE(fd >= 0);
            auto end = idem::position_in(fd, dir / "live.jsonl.1", std::filesystem::file_size(dir / "live.jsonl.1"));
            ::close(fd);
            end.finished = true;
            std::vector<idem::delivery> batch;
            for (int i = 300; i < 350; ++i) {
                batch.push_back({line("e-" + std::to_string(i), "order-" + std::to_string(i % 13), i + 1).to_json(), {}});
            }
            s.apply(batch, idem::checkpoint{idem::log_source(log), end.offset,
                                            idem::encode_log_position(end).substr(8)});
        }
        std::filesystem::remove(dir / "live.jsonl.1");
        CHECK(idem::consume(consume_options(dir, log)).records == 150);
    }
    CHECK(sums(dir.env()) == expected_sums(500));
    auto snap = idem::snapshot::open(dir.env());
    auto at = idem::decode_log_position(*snap.checkpoint_value(consumer, idem::log_source(log)));
    CHECK(at.offset == std::filesystem::file_size(log));
    CHECK(at.file == idem::try_identity_of(log));
}

TEST_CASE("a log truncated or replaced under its checkpoint stops the consume, unless it may restart") {
    temp_dir dir;
    const auto log = dir / "live.jsonl";
    append_lines(log, 0, 300);
    idem::consume(consume_options(dir, log));
    SUBCASE("copytruncate") {
        std::filesystem::resize_file(log, 0);
        append_lines(log, 300, 400);
    }
    SUBCASE("replaced by a shorter file") {
        append_lines(dir / "new.jsonl", 300, 400);
        std::filesystem::rename(dir / "new.jsonl", log);
    }
    try {
        idem::consume(consume_options(dir, log));
        FAIL("a changed log was read at its old offset");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::log_changed);
        CHECK(std::string(e.what()).find(log.string()) != std::string::npos);
        CHECK(std::string(e.what()).find("checkpoint at offset") != std::string::npos);
    }
    CHECK(sums(dir.env()) == expected_sums(300));
    auto o = consume_options(dir, log);
    o.restart_changed_logs = true;
    CHECK(idem::consume(o).records == 100);
    CHECK(sums(dir.env()) == expected_sums(400));
}

TEST_CASE("a long run holds memory for the large records in flight, not for every one it read") {
    // Reused batch slots keep their strings' capacity. Large records (over the size limit, and
    // valid ones above 64 KiB) land in one slot after another; were each slot to keep the
    // largest record it ever held, the run's memory would grow with every large record read.
    auto in_use = [] {
        const auto m = ::mallinfo2();
        return m.uordblks + m.hblkhd;
    };
    if (in_use() == 0) {
        MESSAGE("this allocator reports no heap figures (a sanitizer build): memory not measured");
        return;
    }
    const int small = 12000;
    const int every = 65;  // a large record every 65 records: one batch slot further each time
    const std::string pad(200 * 1024, 'x');
    // The heap in use at its highest after a batch, consuming a log of the small records, with
    // or without the large ones among them.
    auto peak_of = [&](bool with_large) {
        temp_dir dir;
        const auto log = dir / "mixed.jsonl";
        int large = 0;
        {
            idem::log_writer out{log, idem::log_format::jsonl};
            for (int i = 0; i < small; ++i) {
                out.write(line("e-" + std::to_string(i), "order-" + std::to_string(i % 13), i + 1).to_json());
                if (!with_large || i % every != every - 1) continue;
                auto big = line("big-" + std::to_string(i), "order-big", 1);
                if (++large % 2 == 0) {
                    big.type = "order.note_added";  // no projection handles it: parsed, its data kept, ignored
                    big.data = "{\"note\":\"" + pad.substr(0, 100 * 1024) + "\"}";
                } else {
                    big.data = "{\"pad\":\"" + pad + "\"}";  // over the limit below: dead-lettered as too_large
                }
                out.write(big.to_json());
            }
        }
        auto o = consume_options(dir, log);
        o.store.max_event_bytes = 150 * 1024;
        o.batch = 64;
        std::size_t peak = 0;
        o.progress = [&](const idem::log_progress&) { peak = std::max(peak, in_use()); };
        auto r = idem::consume(o);
        CHECK(r.records == static_cast<std::uint64_t>(small + large));
        CHECK(sums(dir.env()) == expected_sums(small));
        return peak;
    };
    const auto without = peak_of(false);
    const auto with = peak_of(true);
    // In flight at once: the reader's batch and up to four prepared ones, about one large record
    // (100-200 KiB) each, and the readers' and parser's buffers: ~3 MiB. Kept by every slot that
    // ever held one: the reader's 64 slots ~10 MiB, the prepared batches' ~180 slots ~30 MiB.
    MESSAGE("heap in use at most " << without / 1024 << " KiB without the large records, " << with / 1024
                                   << " KiB with them");
    CHECK(with - without < 6 * 1024 * 1024);
}

TEST_CASE("a follower notices its log rotated and reads the old file to its end, then the new one") {
    temp_dir dir;
    const auto log = dir / "live.jsonl";
    append_lines(log, 0, 200);
    auto o = consume_options(dir, log);
    o.follow = true;
    o.poll = std::chrono::milliseconds{10};
    o.rotation_grace = std::chrono::milliseconds{100};  // nothing is appended to the old file after the rotation
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> applied{0};
    o.stop = &stop;
    o.progress = [&](const idem::log_progress& p) { applied = p.records; };
    std::thread follower([&] { idem::consume(o); });
    auto wait_for = [&](std::uint64_t n) {
        for (int i = 0; i < 3000 && applied < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds{5});
        return applied.load();
    };
    CHECK(wait_for(200) == 200);
    append_lines(log, 200, 260);
    SUBCASE("rotation by rename") { std::filesystem::rename(log, dir / "live.jsonl.1"); }
    SUBCASE("deleted and created anew") { std::filesystem::remove(log); }
    append_lines(log, 260, 400);
    CHECK(wait_for(400) == 400);
    stop = true;
    follower.join();
    CHECK(sums(dir.env()) == expected_sums(400));
}

}  // TEST_SUITE
