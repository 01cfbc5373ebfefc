#include <idem/storage/id_log.hpp>

#include "../common/temp_dir.hpp"

#include <doctest/doctest.h>

#include <string>

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

}  // TEST_SUITE
