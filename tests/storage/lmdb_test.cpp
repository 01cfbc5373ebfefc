#include <idem/storage/lmdb.hpp>

#include "../common/temp_dir.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using idem::test::temp_dir;

TEST_SUITE("lmdb") {

TEST_CASE("one environment per path per process") {
    temp_dir dir;
    auto a = idem::environment::open(dir / "db");
    auto b = idem::environment::open(dir / "db");
    auto c = idem::environment::open(dir / "other");
    CHECK(a == b);
    CHECK(a != c);
    SUBCASE("a relative spelling of the same path is the same environment") {
        auto d = idem::environment::open(dir / "db" / ".." / "db");
        CHECK(d == a);
    }
}

TEST_CASE("a write is invisible until committed and gone if aborted") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    auto t = env->table("t");
    {
        idem::write_txn w{*env};
        w.put(t, "k", "v1");
        idem::read_txn r{*env};
        CHECK_FALSE(r.get(t, "k").has_value());
        // destroyed without commit: aborted
    }
    {
        idem::read_txn r{*env};
        CHECK_FALSE(r.get(t, "k").has_value());
    }
    {
        idem::write_txn w{*env};
        w.put(t, "k", "v2");
        w.commit();
    }
    idem::read_txn r{*env};
    REQUIRE(r.get(t, "k").has_value());
    CHECK(*r.get(t, "k") == "v2");
}

TEST_CASE("keys over the limit are refused, never truncated") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    auto t = env->table("t");
    CHECK(env->max_key_size() == 511);
    idem::write_txn w{*env};
    std::string long_key(512, 'k');
    try {
        w.put(t, long_key, "v");
        FAIL("a 512-byte key was accepted");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::key_too_long);
        CHECK(std::string(e.what()).find("512 bytes") != std::string::npos);
    }
    CHECK(w.put(t, std::string(511, 'k'), "v"));
    CHECK_FALSE(w.get(t, std::string(510, 'k')).has_value());
}

TEST_CASE("NOOVERWRITE reports an existing key as a result, not an error") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    auto t = env->table("t");
    idem::write_txn w{*env};
    CHECK(w.put(t, "k", "1", MDB_NOOVERWRITE));
    CHECK_FALSE(w.put(t, "k", "2", MDB_NOOVERWRITE));
    CHECK(*w.get(t, "k") == "1");
    CHECK(w.del(t, "k"));
    CHECK_FALSE(w.del(t, "k"));
}

TEST_CASE("a full map is reported as map_full and growing it lets the same write succeed") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.map_size = 64 * 1024, .sync = idem::durability::none});
    auto t = env->table("t");
    std::string value(1000, 'x');
    auto write_all = [&] {
        idem::write_txn w{*env};
        for (int i = 0; i < 500; ++i) w.put(t, "key-" + std::to_string(i), value);
        w.commit();
    };
    bool grew = false;
    for (int attempt = 0; attempt < 10; ++attempt) {
        try {
            write_all();
            break;
        } catch (const std::system_error& e) {
            REQUIRE(e.code() == idem::errc::map_full);
            env->grow();  // no transaction is live here
            grew = true;
        }
    }
    CHECK(grew);
    idem::read_txn r{*env};
    CHECK(r.entries(t) == 500);
    CHECK(env->map_size() > 64 * 1024);
}

TEST_CASE("a map grown by another process is adopted") {
    temp_dir dir;
    auto path = dir / "db";
    // One writer per store: the writer is a child process, this one reads.
    auto write_in_child = [&](std::size_t map_size, int entries) {
        pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            int status = 1;
            try {
                auto mine = idem::environment::open(path, {.map_size = map_size, .sync = idem::durability::none});
                auto tt = mine->table("t");
                idem::write_txn w{*mine};
                std::string value(1000, 'y');
                for (int i = 0; i < entries; ++i) w.put(tt, "key-" + std::to_string(i), value);
                w.commit();
                status = 0;
            } catch (...) {
            }
            ::_exit(status);
        }
        int status = 0;
        ::waitpid(child, &status, 0);
        REQUIRE(WIFEXITED(status));
        REQUIRE(WEXITSTATUS(status) == 0);
    };
    write_in_child(256 * 1024, 1);
    auto env = idem::environment::open(path, {.read_only = true});
    env->refresh_tables();
    auto t = env->try_table("t");
    REQUIRE(t);
    const auto before = env->map_size();
    write_in_child(8 * 1024 * 1024, 2000);
    // The data now exceeds our map: beginning a transaction must adopt the new size.
    idem::read_txn r{*env};
    CHECK(r.entries(*t) == 2000);
    CHECK(env->map_size() >= 8 * 1024 * 1024);
    CHECK(env->map_size() > before);
}

TEST_CASE("a cursor walks keys in order and seeks to the first key not below the target") {
    temp_dir dir;
    auto env = idem::environment::open(dir / "db", {.sync = idem::durability::none});
    auto t = env->table("t");
    {
        idem::write_txn w{*env};
        for (auto k : {"b", "d", "a", "c"}) w.put(t, k, k);
        w.commit();
    }
    idem::read_txn r{*env};
    idem::cursor c{r, t};
    std::string seen;
    for (auto e = c.first(); e; e = c.next()) seen += e->first;
    CHECK(seen == "abcd");
    auto e = c.seek("bb");
    REQUIRE(e);
    CHECK(e->first == "c");
    CHECK_FALSE(c.seek("e"));
    CHECK(c.last()->first == "d");
}

TEST_CASE("opening a missing environment read-only names the path") {
    temp_dir dir;
    auto missing = dir / "nowhere";
    try {
        idem::environment::open(missing, {.read_only = true});
        FAIL("opened a missing environment");
    } catch (const std::system_error& e) {
        CHECK(std::string(e.what()).find(missing.string()) != std::string::npos);
    }
}

TEST_CASE("writing through a read-only environment is refused") {
    temp_dir dir;
    auto path = dir / "db";
    pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        // A separate process: read-write there, then read-only here would share the registry otherwise.
        int status = 1;
        try {
            auto env = idem::environment::open(path, {.sync = idem::durability::none});
            env->table("t");
            status = 0;
        } catch (...) {
        }
        ::_exit(status);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WEXITSTATUS(status) == 0);
    auto ro = idem::environment::open(path, {.read_only = true});
    try {
        idem::write_txn w{*ro};
        FAIL("a write transaction began on a read-only environment");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::read_only);
    }
}

TEST_CASE("a new data file appears complete, and leftovers of killed creations are removed") {
    temp_dir dir;
    const auto db = dir / "db";
    std::filesystem::create_directories(db / ".create-99999");
    std::ofstream{db / ".create-99999" / "data.mdb"} << "half";
    {
        auto env = idem::environment::open(db, {.sync = idem::durability::none});
        CHECK(std::filesystem::file_size(db / "data.mdb") >= 2 * static_cast<std::uintmax_t>(::sysconf(_SC_PAGESIZE)));
    }
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(db)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    CHECK(names == std::vector<std::string>{"data.mdb", "idem.lock", "lock.mdb"});
}

TEST_CASE("a data file cut short or emptied is refused as damaged and left as it is") {
    temp_dir dir;
    const auto db = dir / "db";
    {
        auto env = idem::environment::open(db, {.sync = idem::durability::none});
        auto t = env->table("t");
        idem::write_txn w{*env};
        for (int i = 0; i < 3000; ++i) w.put(t, "key-" + std::to_string(i), std::string(200, 'v'));
        w.commit();
    }
    const auto size = std::filesystem::file_size(db / "data.mdb");
    const auto page = static_cast<std::uintmax_t>(::sysconf(_SC_PAGESIZE));
    for (auto cut : {std::uintmax_t{0}, page, 2 * page, size / 2, size - page}) {
        CAPTURE(cut);
        std::filesystem::copy_file(db / "data.mdb", dir / "keep", std::filesystem::copy_options::overwrite_existing);
        std::filesystem::resize_file(db / "data.mdb", cut);
        for (bool read_only : {false, true}) {
            CAPTURE(read_only);
            try {
                auto env = idem::environment::open(db, {.read_only = read_only});
                FAIL("opened a data file cut to " << cut << " bytes");
            } catch (const std::system_error& e) {
                CHECK(e.code() == idem::errc::store_damaged);
                CHECK(std::string(e.what()).find((db / "data.mdb").string()) != std::string::npos);
            }
            CHECK(std::filesystem::file_size(db / "data.mdb") == cut);
        }
        std::filesystem::rename(dir / "keep", db / "data.mdb");
    }
    auto env = idem::environment::open(db, {.read_only = true});
    idem::read_txn r{*env};
}

}  // TEST_SUITE
