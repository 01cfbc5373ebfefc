// MAP_FULL at every commit boundary: a reference run records how large the data file is after
// each commit; then, for every map limit from the smallest that opens the store to one past the
// largest the workload needs (page by page), a fresh environment capped at that limit takes the
// batches until one fails. The failing batch must report map_full and store nothing, the commits
// before it must be intact, and once the limit is raised (reopened with a larger max_map_size)
// a redelivery of everything from the start must end in the reference state. Every commit at
// which the file grows must be the failing one for some limit.

#include <idem/projections/store.hpp>

#include "../projections/fixtures.hpp"

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <system_error>
#include <vector>

using namespace idem_test;

namespace {

// Batches of new lines over fresh orders (so every commit needs new pages), with redeliveries
// of earlier lines under the same message id and republications under a new one.
std::vector<std::vector<idem::delivery>> make_batches(std::size_t batches, std::size_t per_batch) {
    std::mt19937_64 rng{20261202};
    std::vector<std::vector<idem::delivery>> out;
    std::vector<idem::delivery> earlier;
    for (std::size_t b = 0; b < batches; ++b) {
        std::vector<idem::delivery> batch;
        for (std::size_t i = 0; i < per_batch; ++i) {
            const auto n = b * per_batch + i;
            const auto order = "order-" + std::to_string(n % (per_batch * 3)) + "-" + std::to_string(b / 2);
            auto e = line("line-" + std::to_string(n), order, static_cast<std::int64_t>(n % 997 + 1));
            batch.push_back(deliver(e, "msg-" + std::to_string(n)));
            if (!earlier.empty() && rng() % 5 == 0) batch.push_back(earlier[rng() % earlier.size()]);
            if (rng() % 9 == 0) batch.push_back(deliver(e, "again-" + std::to_string(n)));
        }
        for (const auto& d : batch) earlier.push_back(d);
        out.push_back(std::move(batch));
    }
    return out;
}

std::uintmax_t data_file_size(const std::filesystem::path& env) { return std::filesystem::file_size(env / "data.mdb"); }

struct expected_state {
    std::map<std::string, row_summary> rows;
    std::size_t inbox = 0;
    std::uint64_t commit = 0;
    bool operator==(const expected_state&) const = default;
};

expected_state observe(const idem::store& s) {
    auto snap = s.read();
    return {dump(snap, "order-totals"), snap.consumer(consumer).inbox_size(), snap.commit()};
}

}  // namespace

template <>
struct doctest::StringMaker<expected_state> {
    static doctest::String convert(const expected_state& e) {
        return ("{commit " + std::to_string(e.commit) + ", inbox " + std::to_string(e.inbox) + ", " +
                std::to_string(e.rows.size()) + " rows}")
            .c_str();
    }
};

TEST_SUITE("storage faults") {

TEST_CASE("MAP_FULL at every commit boundary stores nothing of the failing batch, and a larger map recovers everything") {
    const auto batches = make_batches(16, 60);
    const auto page = static_cast<std::uintmax_t>(::sysconf(_SC_PAGESIZE));

    // The reference: the state and the data file's size after every commit.
    std::vector<expected_state> states;
    std::vector<std::uintmax_t> sizes;
    {
        temp_dir dir;
        idem::store s{options(dir.env())};
        s.add(totals_by_order());
        states.push_back(observe(s));
        sizes.push_back(data_file_size(dir.env()));
        for (const auto& b : batches) {
            s.apply(b);
            states.push_back(observe(s));
            sizes.push_back(data_file_size(dir.env()));
        }
    }
    REQUIRE(sizes.back() > sizes.front());
    std::set<std::size_t> growing;  // commits at which the file grows: each must be hit
    for (std::size_t c = 1; c < sizes.size(); ++c) {
        if (sizes[c] > sizes[c - 1]) growing.insert(c);
    }
    CAPTURE(sizes.front());
    CAPTURE(sizes.back());

    std::set<std::size_t> hit;
    std::size_t limits = 0;
    for (auto limit = sizes.front() - page; limit <= sizes.back() + page; limit += page) {
        CAPTURE(limit);
        temp_dir dir;
        auto o = options(dir.env());
        o.tuning.map_size = static_cast<std::size_t>(limit);
        o.tuning.max_map_size = static_cast<std::size_t>(limit);
        std::optional<idem::store> s;
        try {
            s.emplace(o);
            s->add(totals_by_order());
        } catch (const std::system_error& e) {
            // Too small to even create the tables: only the smallest limits may be.
            CHECK(e.code() == idem::errc::map_full);
            CHECK(limit <= sizes.front() + page);
            continue;
        }
        ++limits;
        std::size_t committed = 0;
        for (; committed < batches.size(); ++committed) {
            try {
                s->apply(batches[committed]);
            } catch (const std::system_error& e) {
                CHECK(e.code() == idem::errc::map_full);
                CHECK(std::string(e.what()).find(dir.env().string()) != std::string::npos);  // names the environment
                break;
            }
            REQUIRE(observe(*s) == states[committed + 1]);
        }
        if (committed < batches.size()) {
            hit.insert(committed + 1);
            // Nothing of the failed batch, every commit before it.
            CHECK(observe(*s) == states[committed]);
            CHECK(s->inbox_size() == states[committed].inbox);
            // Failing again changes nothing either.
            CHECK_THROWS_AS(s->apply(batches[committed]), std::system_error);
            CHECK(observe(*s) == states[committed]);
        } else {
            CHECK(limit >= sizes.back());  // every batch fit: the limit held them all
        }
        // Raise the limit and redeliver everything from the start, as a broker replaying would.
        s.reset();
        auto larger = options(dir.env());
        larger.tuning.map_size = static_cast<std::size_t>(limit);
        larger.tuning.max_map_size = std::size_t{1} << 30;
        idem::store again{larger};
        again.add(totals_by_order());
        for (const auto& b : batches) again.apply(b);
        auto snap = again.read();
        CHECK(dump(snap, "order-totals") == states.back().rows);
        CHECK(snap.consumer(consumer).inbox_size() == states.back().inbox);
    }
    CHECK(limits > growing.size());
    for (auto c : growing) {
        CAPTURE(c);
        CHECK(hit.contains(c));
    }
    MESSAGE("limits tried: " << limits << ", commit boundaries hit: " << hit.size() << " of " << growing.size()
                             << " at which the file grows");
}

}  // TEST_SUITE
