// The row journal: a batch appends the rows it changed to a journal and folds a slice of the
// previous journal into the row table; every read (point reads and key-ordered scans, in this
// process and from a fresh snapshot) sees the latest row wherever it lives.

#include "fixtures.hpp"

#include <idem/projections/layout.hpp>
#include <idem/projections/store_hooks.hpp>
#include <idem/storage/lmdb.hpp>

#include <algorithm>
#include <random>

using namespace idem_test;

namespace {

/// Entries of a named table as a fresh read transaction sees them (0 if it does not exist).
std::size_t entries(const idem::store& s, const std::string& table) {
    auto& env = *idem::detail::store_env(s);
    env.refresh_tables();
    idem::read_txn txn{env};
    auto t = env.try_table(table);
    return t ? txn.entries(*t) : 0;
}

std::size_t journaled(const idem::store& s) {
    return entries(s, idem::layout::journal_table("order-totals", 0)) + entries(s, idem::layout::journal_table("order-totals", 1));
}

/// Every row read one by one (point reads look the journals up before the row table).
std::map<std::string, row_summary> read_each(const idem::snapshot& snap, const reference& ref) {
    std::map<std::string, row_summary> out;
    for (const auto& [key, want] : ref.rows) {
        if (auto r = snap.get<order_total>("order-totals", key)) {
            out[key] = row_summary{r->state.total, r->state.lines, r->version, r->state.sequences};
        }
    }
    return out;
}

/// Batches of order lines over orders, with redeliveries; the reference of their distinct events.
struct workload {
    std::vector<std::vector<idem::delivery>> batches;
    reference ref;
    workload(std::size_t n_batches, std::size_t per_batch, std::size_t orders, unsigned seed, const std::string& prefix = "e",
             const std::string& order_prefix = "o") {
        std::mt19937 rng{seed};
        std::vector<idem::envelope> sent;
        for (std::size_t b = 0; b < n_batches; ++b) {
            auto& batch = batches.emplace_back();
            for (std::size_t i = 0; i < per_batch; ++i) {
                if (!sent.empty() && rng() % 10 == 0) {
                    batch.push_back(deliver(sent[rng() % sent.size()]));  // a redelivery
                    continue;
                }
                const auto order = order_prefix + std::to_string(rng() % orders);
                const auto amount = static_cast<std::int64_t>(rng() % 1000);
                sent.push_back(line(prefix + std::to_string(sent.size()), order, amount));
                // A CloudEvents subject holds no control characters; the row key is the payload's order_id.
                std::replace(sent.back().subject.begin(), sent.back().subject.end(), '\0', '_');
                ref.add(order, amount);
                batch.push_back(deliver(sent.back()));
            }
        }
    }
};

/// Store options with journals frozen at rows entries.
idem::store_options journaled(const temp_dir& dir, std::size_t rows) {
    auto o = options(dir.env());
    o.tuning.journal_rows = rows;
    return o;
}

/// The rows read by a scan and one by one both equal the reference.
void check_rows(const idem::store& s, const reference& ref) {
    auto snap = s.read();
    CHECK(dump(snap, "order-totals") == ref.rows);
    CHECK(read_each(snap, ref) == ref.rows);
}

}  // namespace

TEST_CASE("rows go to the journal first and are folded into the row table; every read sees the latest") {
    temp_dir dir;
    auto o = journaled(dir, 50);
    idem::store s{o};
    s.add(totals_by_order());
    workload w{60, 25, 300, 1};
    for (const auto& batch : w.batches) s.apply(batch);
    {
        auto snap = s.read();
        CHECK(dump(snap, "order-totals") == w.ref.rows);
        CHECK(read_each(snap, w.ref) == w.ref.rows);
        auto other = idem::snapshot::open(dir.env());
        CHECK(dump(other, "order-totals") == w.ref.rows);
    }
    // Folds moved rows into the row table; the journals hold at most two journals' worth.
    CHECK(entries(s, idem::layout::rows_table("order-totals")) > 0);
    CHECK(journaled(s) <= 2 * 50 + 2 * 25);
}

TEST_CASE("the journal keeps its bound over a long run, and reads stay right at every batch") {
    temp_dir dir;
    auto o = journaled(dir, 40);
    idem::store s{o};
    s.add(totals_by_order());
    workload w{200, 20, 120, 2};
    std::size_t most = 0;
    for (const auto& batch : w.batches) {
        s.apply(batch);
        most = std::max(most, journaled(s));
    }
    CHECK(most <= 2 * 40 + 2 * 20);
    check_rows(s, w.ref);
    CHECK(entries(s, idem::layout::rows_table("order-totals")) >= w.ref.rows.size() / 2);  // most rows were folded in
}

TEST_CASE("a store reopened with a half-folded journal goes on from the disk's state") {
    temp_dir dir;
    auto o = journaled(dir, 30);
    workload w{91, 15, 200, 3};
    // Stop every 7 batches: most stops leave the frozen journal part-folded, and a store
    // reopened there must fold on from the key the disk says it reached. (The writer keeps
    // its keys in sorted runs merged as it goes; were they out of order, the fold before the
    // stop and the one after would disagree about which rows were folded.)
    for (std::size_t part = 0; part < 13; ++part) {
        idem::store s{o};
        s.add(totals_by_order());
        for (std::size_t b = part * 7; b < part * 7 + 7; ++b) s.apply(w.batches[b]);
    }
    idem::store s{o};
    s.add(totals_by_order());
    // Every redelivery again: all duplicates, nothing changes.
    for (const auto& batch : w.batches) {
        for (const auto& out : s.apply(batch)) CHECK(out.kind == idem::outcome_kind::duplicate_message);
    }
    check_rows(s, w.ref);
}

TEST_CASE("aggregate keys holding NUL bytes are found in the journal, live and after a reopen") {
    // The journal's index hashes a row key as its unescaped aggregate key (what a batch has at
    // hand): a key whose row key escapes a NUL must hash the same read back from the disk.
    temp_dir dir;
    auto o = journaled(dir, 30);
    workload w{40, 15, 60, 4, "e", std::string("o\0\0", 2) + "-"};
    for (std::size_t part = 0; part < 5; ++part) {
        idem::store s{o};
        s.add(totals_by_order());
        for (std::size_t b = part * 8; b < part * 8 + 8; ++b) s.apply(w.batches[b]);
        if (part == 4) check_rows(s, w.ref);
    }
    CHECK(w.ref.rows.begin()->first.find('\0') != std::string::npos);
}

TEST_CASE("a batch whose commit fails leaves the journal as the disk has it") {
    temp_dir dir;
    auto o = journaled(dir, 20);
    int n = 0;
    idem::detail::set_before_commit(o, [&](std::uint64_t) {
        if (++n % 3 == 0) throw std::system_error(std::make_error_code(std::errc::io_error), "injected EIO at commit");
    });
    idem::store s{o};
    s.add(totals_by_order());
    workload w{80, 12, 90, 4};
    std::size_t failures = 0;
    for (const auto& batch : w.batches) {
        for (;;) {  // the broker redelivers a batch that failed
            try {
                s.apply(batch);
                break;
            } catch (const std::system_error& e) {
                CHECK(e.code() == std::errc::io_error);
                ++failures;
            }
        }
    }
    CHECK(failures > 20);
    check_rows(s, w.ref);
}

TEST_CASE("a bulk build folds the journals into the row table before it writes rows directly") {
    temp_dir dir;
    auto o = journaled(dir, 25);
    idem::store s{o};
    s.add(totals_by_order());
    workload w{40, 20, 150, 5};
    for (std::size_t b = 0; b < 20; ++b) s.apply(w.batches[b]);
    CHECK(journaled(s) > 0);
    s.begin_bulk(std::size_t{1} << 20);
    for (std::size_t b = 20; b < 40; ++b) s.apply(w.batches[b]);
    s.end_bulk();
    CHECK(journaled(s) == 0);
    check_rows(s, w.ref);
    // Live batches after the build journal again.
    workload more{10, 20, 150, 6, "more-"};
    for (const auto& batch : more.batches) s.apply(batch);
    CHECK(journaled(s) > 0);
}

TEST_CASE("snapshots of every age read their own state while the journals swap, fold and empty") {
    // Journals that fold in one batch, and journals that take many batches to fold.
    std::size_t journal_rows = 10;
    std::size_t per_batch = 8;
    SUBCASE("quick folds") {}
    SUBCASE("folds over many batches") {
        journal_rows = 40;
        per_batch = 3;
    }
    temp_dir dir;
    auto o = journaled(dir, journal_rows);
    idem::store s{o};
    s.add(totals_by_order());
    workload w{60, per_batch, 60, 7};
    struct taken {
        idem::snapshot snap;
        std::map<std::string, row_summary> rows;
    };
    std::vector<taken> snapshots;
    for (const auto& batch : w.batches) {
        s.apply(batch);
        auto snap = s.read();
        auto rows = dump(snap, "order-totals");
        snapshots.push_back(taken{std::move(snap), std::move(rows)});
    }
    // Point reads go through the environment's shared journal index, which later snapshots
    // moved on (other epochs, emptied frozen journals): each snapshot still sees its own rows.
    for (std::size_t i = snapshots.size(); i-- > 0;) {
        auto& t = snapshots[i];
        std::map<std::string, row_summary> got;
        for (const auto& [key, want] : w.ref.rows) {
            if (auto r = t.snap.get<order_total>("order-totals", key)) {
                got[key] = row_summary{r->state.total, r->state.lines, r->version, r->state.sequences};
            }
        }
        CHECK_MESSAGE(got == t.rows, "snapshot after batch " << i);
    }
    for (std::size_t i = 0; i < snapshots.size(); i += 7) {
        auto& t = snapshots[i];
        for (const auto& [key, want] : w.ref.rows) {
            auto r = t.snap.get<order_total>("order-totals", key);
            auto it = t.rows.find(key);
            CHECK((r.has_value() == (it != t.rows.end())));
            if (r && it != t.rows.end()) CHECK(r->version == it->second.version);
        }
    }
    CHECK(dump(s.read(), "order-totals") == w.ref.rows);
}
