// Which memory the store's in-memory id indexes ask for: huge pages only where asked
// (store_options::tuning.huge_index_pages, as `idem consume --log` runs), and the same rows either way.

#include <idem/projections/store.hpp>

#include "../common/smaps.hpp"
#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

using namespace idem_test;
using idem::test::huge_advised_bytes;
using idem::test::kernel_has_huge_pages;

TEST_SUITE("index pages") {

TEST_CASE("a store asked for huge index pages advises them as its indexes grow; by default it does not") {
    constexpr int events = 120'000;  // an index of 120,000 ids grows to 2^18 slots (4 MiB)
    constexpr int orders = 1'000;
    reference ref;
    for (int i = 0; i < events; ++i) ref.add("order-" + std::to_string(i % orders), i % 7 + 1);

    for (const bool huge : {false, true}) {
        CAPTURE(huge);
        temp_dir dir;
        auto o = options(dir.env());
        o.tuning.huge_index_pages = huge;
        const auto before = huge_advised_bytes();
        idem::store store{o};
        store.add(totals_by_subject());
        std::vector<idem::delivery> batch;
        for (int i = 0; i < events; ++i) {
            const auto order = "order-" + std::to_string(i % orders);
            batch.push_back(deliver(line("line-" + std::to_string(i), order, i % 7 + 1)));
            if (batch.size() == 10'000 || i + 1 == events) {
                for (const auto& out : store.apply(batch)) REQUIRE(out.kind == idem::outcome_kind::applied);
                batch.clear();
            }
        }
        const auto advised = huge_advised_bytes() - before;
        if (huge) {
            // Both indexes (the inbox's and the projection's contributing set) hold 120,000 ids:
            // each has a table of at least 4 MiB.
            if (kernel_has_huge_pages()) {
                CHECK(advised >= std::size_t{8} << 20);
            }
        } else {
            CHECK(advised == 0);
        }
        CHECK(dump(store.read(), "order-streams") == ref.rows);
    }
}
}
