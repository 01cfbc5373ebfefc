#include <idem/storage/id_log.hpp>

#include "../common/smaps.hpp"
#include "../common/temp_dir.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>

using idem::test::huge_advised_bytes;
using idem::test::temp_dir;

namespace {

void record(idem::environment& env, idem::id_log& box, std::initializer_list<std::string> ids) {
    idem::write_txn w{env};
    box.catch_up(w);
    for (const auto& id : ids) box.stage(id, 1);
    box.write(w);
    w.commit();
    box.committed();
}

std::size_t index_bytes_after(idem::environment& env, const std::string& table, bool huge) {
    const auto before = huge_advised_bytes();
    idem::id_log box{env, table};
    box.use_huge_pages(huge);
    idem::write_txn w{env};
    for (int i = 0; i < 300000; ++i) box.stage(table + "-" + std::to_string(i), 1);
    box.write(w);
    w.commit();
    box.committed();
    return huge_advised_bytes() - before;
}

}  // namespace

TEST_SUITE("id_log") {

TEST_CASE("a committed id is found, an aborted one is not") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    idem::id_log box{*env, "inbox/c"};
    record(*env, box, {"m-1", "m-2"});
    {
        idem::write_txn w{*env};
        box.stage("m-3", 1);
        CHECK(box.contains(w, "m-3"));  // visible to its own batch at once
        box.write(w);
        // aborted
    }
    box.rolled_back();
    idem::read_txn r{*env};
    CHECK(box.contains(r, "m-1"));
    CHECK(box.contains(r, "m-2"));
    CHECK_FALSE(box.contains(r, "m-3"));
    CHECK_FALSE(box.contains(r, "m-"));
    CHECK(box.size() == 2);
}

TEST_CASE("many ids survive reopening and the index grows past its first size") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    {
        idem::id_log box{*env, "inbox/c"};
        idem::write_txn w{*env};
        for (int i = 0; i < 5000; ++i) box.stage("id-" + std::to_string(i), 1);
        box.write(w);
        w.commit();
        box.committed();
    }
    idem::id_log reopened{*env, "inbox/c"};
    CHECK(reopened.size() == 5000);
    idem::read_txn r{*env};
    for (int i = 0; i < 5000; ++i) CHECK(reopened.contains(r, "id-" + std::to_string(i)));
    CHECK_FALSE(reopened.contains(r, "id-5000"));
}

TEST_CASE("while the index grows and sheds pruned entries, every live id is found and no pruned one") {
    // Batches of 37 ids, stamped with their batch number; every 7th batch prunes what is 20
    // batches old. The index moves to a new table several times on the way (growing, and
    // shedding tombstones), a few slots per insert, so lookups and prunes meet it half moved.
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    idem::id_log box{*env, "inbox/c"};
    auto id = [](int batch, int k) { return "m-" + std::to_string(batch) + "-" + std::to_string(k); };
    constexpr int per_batch = 37;
    int pruned_below = 0;  // batches below it are pruned (all but the log's last entry, never pruned here)
    for (int b = 0; b < 400; ++b) {
        {
            idem::write_txn w{*env};
            box.catch_up(w);
            for (int k = 0; k < per_batch; ++k) box.stage(id(b, k), static_cast<std::uint64_t>(b));
            box.write(w);
            w.commit();
            box.committed();
        }
        if (b % 7 == 6 && b >= 20) {
            idem::write_txn w{*env};
            auto step = box.prune(w, static_cast<std::uint64_t>(b - 20), SIZE_MAX,
                                  std::chrono::steady_clock::now() + std::chrono::hours(1));
            w.commit();
            box.pruned(step);
            CHECK(step.removed == static_cast<std::size_t>((b - 20 - pruned_below) * per_batch));
            pruned_below = b - 20;
        }
        CHECK(box.size() == static_cast<std::size_t>((b + 1 - pruned_below) * per_batch));
        idem::read_txn r{*env};
        for (int c = std::max(0, pruned_below - 3); c <= b; ++c) {
            for (int k = 0; k < per_batch; k += 6) {
                if (c < pruned_below) {
                    CHECK_FALSE(box.contains(r, id(c, k)));
                } else {
                    REQUIRE(box.contains(r, id(c, k)));
                }
            }
        }
    }
}

TEST_CASE("ids appended by another writer are seen after catching up") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    idem::id_log mine{*env, "inbox/c"};
    idem::id_log theirs{*env, "inbox/c"};  // stands for a writer in another process
    record(*env, mine, {"a"});
    record(*env, theirs, {"b", "c"});
    idem::write_txn w{*env};
    mine.catch_up(w);
    CHECK(mine.contains(w, "b"));
    CHECK(mine.contains(w, "c"));
    CHECK(mine.size() == 3);
    // and positions keep increasing: our next append does not overwrite theirs
    mine.stage("d", 1);
    mine.write(w);
    w.commit();
    mine.committed();
    idem::read_txn r{*env};
    CHECK(r.entries(mine.table()) == 4);
}

TEST_CASE("each entry costs a few dozen bytes of log, appended in order") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    idem::id_log box{*env, "inbox/c"};
    idem::write_txn w{*env};
    for (int i = 0; i < 10000; ++i) box.stage("0f8fad5b-d9cb-469f-a165-" + std::to_string(100000000000 + i), 1);
    box.write(w);
    MDB_stat st{};
    mdb_stat(w.handle(), box.table(), &st);
    // 10k ids of 36 bytes: append-only leaves are full, so ~75 per 4 KiB page, not one page per id.
    CHECK(st.ms_leaf_pages < 10000 / 50);
}

TEST_CASE("index tables ask for huge pages only when told to (a bulk build)") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    // 300k ids fill a table of 512k slots of 16 bytes: 8 MiB, advised while the box lives.
    CHECK(index_bytes_after(*env, "small", false) == 0);
    if (idem::test::kernel_has_huge_pages()) {
        CHECK(index_bytes_after(*env, "huge", true) >= std::size_t{8} << 20);
    }
}

}  // TEST_SUITE
