// Randomized delivery: for many seeds, a few hundred distinct events are delivered in a
// random order, with redeliveries (same message id) and republications (new message id),
// in random batches. The rows must equal those of applying each distinct event once,
// computed with a plain std::map.

#include <idem/projections/store.hpp>
#include <idem/projections/store_hooks.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;

namespace {

struct scenario {
    std::vector<idem::delivery> deliveries;
    reference ref;
    std::size_t distinct = 0;
    std::size_t redelivered = 0;  // extra copies with the same message id
    std::size_t republished = 0;  // copies under a new message id
};

std::size_t pick(std::mt19937_64& rng, std::size_t lo, std::size_t hi) {
    return std::uniform_int_distribution<std::size_t>{lo, hi}(rng);
}

scenario generate(std::mt19937_64& rng, bool sequences) {
    scenario s;
    const auto orders = pick(rng, 1, 8);
    s.distinct = pick(rng, 150, 300);
    std::map<std::string, std::uint64_t> stream_length;
    for (std::size_t i = 0; i < s.distinct; ++i) {
        const auto order = "order-" + std::to_string(pick(rng, 0, orders - 1));
        const auto amount = static_cast<std::int64_t>(pick(rng, 1, 1000));
        std::optional<std::uint64_t> seq;
        if (sequences) seq = ++stream_length[order];
        auto e = line("ev-" + std::to_string(i), order, amount, seq);
        s.ref.add(order, amount, seq);

        // How the broker identifies it: a transport id, a msgid attribute, or nothing (the event id).
        std::string transport;
        switch (pick(rng, 0, 2)) {
        case 0: transport = "msg-" + std::to_string(i); break;
        case 1: e.msgid = "attr-" + std::to_string(i); break;
        default: break;
        }
        auto original = deliver(e, transport);
        s.deliveries.push_back(original);
        while (pick(rng, 0, 4) == 0) {
            s.deliveries.push_back(original);
            ++s.redelivered;
        }
        if (pick(rng, 0, 7) == 0) {
            s.deliveries.push_back(deliver(e, "republished-" + std::to_string(i)));
            ++s.republished;
        }
    }
    // Any order: with sequences this shuffles every stream too, so events park and are released.
    std::shuffle(s.deliveries.begin(), s.deliveries.end(), rng);
    return s;
}

}  // namespace

TEST_SUITE("randomized") {

TEST_CASE("any delivery order with duplicates gives the rows of applying each distinct event once") {
    bool sequences = false;
    SUBCASE("without sequences") { sequences = false; }
    SUBCASE("with sequences, shuffled within each stream") { sequences = true; }

    for (std::uint64_t seed = 1; seed <= 100; ++seed) {
        CAPTURE(seed);
        std::mt19937_64 rng{seed * 7919 + (sequences ? 1 : 0)};
        const auto s = generate(rng, sequences);

        // The rows the writer keeps between batches: the default budget, none, or a few rows'
        // worth (dropped every few batches); and now and then a new store object.
        temp_dir dir;
        auto o = options(dir.env());
        const std::size_t budgets[] = {o.tuning.kept_rows_bytes, 0, 600};
        o.tuning.kept_rows_bytes = budgets[seed % 3];
        o.tuning.huge_index_pages = seed % 2 == 0;  // as `idem consume --log` runs
        std::optional<idem::store> open;
        auto reopen = [&] {
            open.reset();
            open.emplace(o);
            open->add(totals_by_subject());
        };
        reopen();

        std::map<outcome_kind, std::size_t> outcomes;
        std::size_t batches = 0;
        for (std::size_t at = 0; at < s.deliveries.size();) {
            const auto n = std::min(pick(rng, 1, 64), s.deliveries.size() - at);
            const std::span<const idem::delivery> batch{s.deliveries.data() + at, n};
            for (const auto& outcome : open->apply(batch)) ++outcomes[outcome.kind];
            at += n;
            ++batches;
            if (pick(rng, 0, 9) == 0) reopen();
        }
        auto& store = *open;

        auto snap = store.read();
        REQUIRE(dump(snap, "order-streams") == s.ref.rows);
        CHECK(snap.consumer(consumer).parked() == 0);
        CHECK(snap.consumer(consumer).dead_letters().empty());
        CHECK(outcomes[outcome_kind::duplicate_message] == s.redelivered);
        CHECK(outcomes[outcome_kind::duplicate_event] == s.republished);
        CHECK(outcomes[outcome_kind::applied] + outcomes[outcome_kind::parked] == s.distinct);
        CHECK(snap.consumer(consumer).stats().released == outcomes[outcome_kind::parked]);
        CHECK(snap.consumer(consumer).stats().batches == batches);
        CHECK(snap.commit() == batches);
        if (sequences) {
            CHECK(outcomes[outcome_kind::parked] > 0);  // the shuffle did exercise parking
            for (const auto& r : snap.rows<order_total>("order-streams")) {
                CHECK(r.highest_sequence == s.ref.rows.at(r.key).lines);
            }
        } else {
            CHECK(outcomes[outcome_kind::parked] == 0);
        }
    }
}

TEST_CASE("a bulk build gives the rows, outcomes and counters of batch-by-batch commits, whatever its memory budget") {
    for (std::uint64_t seed = 1; seed <= 30; ++seed) {
        CAPTURE(seed);
        std::mt19937_64 rng{seed * 104729};
        const auto s = generate(rng, seed % 2 == 0);
        // Add malformed lines, so dead letters are spilled and numbered across calls too.
        auto deliveries = s.deliveries;
        for (std::size_t i = 0; i < deliveries.size(); i += 37) deliveries.insert(deliveries.begin() + long(i), {"{bad", ""});
        std::vector<std::size_t> cuts;
        for (std::size_t at = 0; at < deliveries.size();) {
            cuts.push_back(std::min(pick(rng, 1, 64), deliveries.size() - at));
            at += cuts.back();
        }
        auto run = [&](const std::filesystem::path& env, std::optional<std::size_t> budget) {
            idem::store store{options(env)};
            store.add(totals_by_subject());
            if (budget) store.begin_bulk(*budget);
            std::vector<idem::outcome> outcomes;
            std::size_t at = 0;
            for (auto n : cuts) {
                const std::span<const idem::delivery> batch{deliveries.data() + at, n};
                at += n;
                for (auto& o : store.apply(batch, idem::checkpoint{"src", at})) outcomes.push_back(std::move(o));
            }
            if (budget) store.end_bulk();
            auto snap = store.read();
            return std::tuple{dump(snap, "order-streams"), count(outcomes), snap.consumer(consumer).stats().outcomes,
                              snap.consumer(consumer).stats().released, snap.consumer(consumer).dead_letters().size(),
                              snap.checkpoint(consumer, "src"), snap.consumer(consumer).inbox_size(),
                              snap.projection("order-streams").contributors("order-0")};
        };
        temp_dir a, b, c;
        auto batches = run(a.env(), std::nullopt);
        auto bulk = run(b.env(), std::size_t{1} << 30);
        auto spilling = run(c.env(), 0);  // rows written and forgotten after every call
        REQUIRE(std::get<0>(batches) == s.ref.rows);
        CHECK(std::get<0>(bulk) == std::get<0>(batches));
        CHECK(std::get<0>(spilling) == std::get<0>(batches));
        CHECK(std::get<1>(bulk) == std::get<1>(batches));
        CHECK(std::get<1>(spilling) == std::get<1>(batches));
        CHECK(std::get<2>(bulk) == std::get<2>(batches));
        CHECK(std::get<3>(bulk) == std::get<3>(batches));
        CHECK(std::get<4>(bulk) == std::get<4>(batches));
        CHECK(std::get<4>(spilling) == std::get<4>(batches));
        CHECK(std::get<5>(bulk) == std::get<5>(batches));
        CHECK(std::get<6>(bulk) == std::get<6>(batches));
        CHECK(std::get<7>(spilling) == std::get<7>(batches));
    }
}

TEST_CASE("a bulk build is invisible until it ends, and an abandoned one leaves the store as it was") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    store.apply(deliver(line("e-1", "order-1", 10)));

    store.begin_bulk(std::size_t{1} << 20);
    store.apply(deliver(line("e-2", "order-1", 5)));
    CHECK(idem::snapshot::open(dir.env()).get<order_total>("order-totals", "order-1")->state.total == 10);
    store.end_bulk();
    CHECK(store.read().get<order_total>("order-totals", "order-1")->state.total == 15);
    CHECK(store.read().commit() == 2);

    // A handler that throws outside the dead-letter rules cannot happen; a storage failure can:
    // inject one at the bulk build's commit.
    temp_dir other;
    auto o = options(other.env());
    idem::detail::set_before_commit(o, [](std::uint64_t) { throw std::runtime_error("injected commit failure"); });
    idem::store failing{o};
    failing.add(totals_by_order());
    failing.begin_bulk(0);
    failing.apply(deliver(line("e-3", "order-2", 7)));
    CHECK_THROWS_WITH(failing.end_bulk(), "injected commit failure");
    auto snap = failing.read();
    CHECK_FALSE(snap.get<order_total>("order-totals", "order-2").has_value());
    CHECK(snap.consumer(consumer).inbox_size() == 0);
    CHECK(failing.inbox_size() == 0);  // the index forgot the ids of the abandoned build
}

}  // TEST_SUITE
