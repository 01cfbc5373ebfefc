#include <idem/storage/writer_lock.hpp>

#include <idem/storage/lmdb.hpp>

#include "../common/temp_dir.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

using idem::test::temp_dir;
using namespace std::chrono_literals;

namespace {

// Runs fn in a child process that holds the result in its exit status; returns the status.
template <class F>
int in_child(F&& fn) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int code = 99;
        try {
            code = fn();
        } catch (...) {
        }
        ::_exit(code);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFEXITED(status));
    return WEXITSTATUS(status);
}

// A child process that opens the environment for writing and holds it until `release` exists.
pid_t hold_in_child(const std::filesystem::path& db, const std::filesystem::path& release) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        try {
            auto env = idem::environment::open(db, {.sync = idem::durability::none});
            std::ofstream{db.parent_path() / "held"};
            while (!std::filesystem::exists(release)) std::this_thread::sleep_for(5ms);
        } catch (...) {
            ::_exit(1);
        }
        ::_exit(0);
    }
    while (!std::filesystem::exists(db.parent_path() / "held")) std::this_thread::sleep_for(5ms);
    return child;
}

int wait_for(pid_t child) {
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_SUITE("writer lock") {

TEST_CASE("a second writer process is refused at once, naming the holder; readers are not") {
    temp_dir dir;
    const auto db = dir / "db";
    const pid_t holder = hold_in_child(db, dir / "release");
    const int refused = in_child([&] {
        try {
            idem::environment::open(db);
            return 1;
        } catch (const std::system_error& e) {
            const std::string what = e.what();
            const bool names = what.find("pid " + std::to_string(holder)) != std::string::npos &&
                               what.find(db.string()) != std::string::npos;
            return e.code() == idem::errc::store_locked && names ? 0 : 2;
        }
    });
    CHECK(refused == 0);
    CHECK(idem::writer_lock::held(db));
    CHECK(idem::writer_lock::holder(db).pid == holder);
    CHECK(in_child([&] {
              auto env = idem::environment::open(db, {.read_only = true});
              idem::read_txn r{*env};
              return 0;
          }) == 0);
    std::ofstream{dir / "release"};
    CHECK(wait_for(holder) == 0);
    CHECK_FALSE(idem::writer_lock::held(db));
    CHECK(in_child([&] {
              idem::environment::open(db);
              return 0;
          }) == 0);
}

TEST_CASE("a waiting writer is told who holds the store and takes it when it is free") {
    temp_dir dir;
    const auto db = dir / "db";
    const pid_t holder = hold_in_child(db, dir / "release");
    std::thread releaser{[&] {
        std::this_thread::sleep_for(300ms);
        std::ofstream{dir / "release"};
    }};
    std::int64_t told = 0;
    int calls = 0;
    {
        idem::writer_lock lock{db, [&](const idem::lock_holder& h) {
                                   told = h.pid;
                                   ++calls;
                                   return true;
                               }};
        CHECK(told == holder);
        CHECK(calls >= 2);
        CHECK(idem::writer_lock::holder(db).pid == ::getpid());
    }
    releaser.join();
    CHECK(wait_for(holder) == 0);
}

TEST_CASE("a wait that gives up is refused with store_locked") {
    temp_dir dir;
    const auto db = dir / "db";
    const pid_t holder = hold_in_child(db, dir / "release");
    int calls = 0;
    try {
        idem::writer_lock lock{db, [&](const idem::lock_holder&) { return ++calls < 3; }};
        FAIL("took a lock another process holds");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::store_locked);
        CHECK(std::string(e.what()).find("gave up waiting") != std::string::npos);
    }
    CHECK(calls == 3);
    std::ofstream{dir / "release"};
    CHECK(wait_for(holder) == 0);
}

TEST_CASE("a writer that waited while the directory was swapped locks the store now at the path") {
    temp_dir dir;
    const auto db = dir / "db";
    std::filesystem::create_directories(db);
    auto first = std::make_unique<idem::writer_lock>(db);
    bool swapped = false;
    idem::writer_lock mine{db, [&](const idem::lock_holder&) {
                               if (!swapped) {
                                   // What a rebuild does: a new directory takes the path, then the
                                   // old one (whose lock file this writer waits on) is released.
                                   std::filesystem::rename(db, dir / "old");
                                   std::filesystem::create_directories(db);
                                   first.reset();
                                   swapped = true;
                               }
                               return true;
                           }};
    CHECK(swapped);
    CHECK(idem::writer_lock::holder(db).pid == ::getpid());
    CHECK_FALSE(idem::writer_lock::held(dir / "old"));  // the old file was let go
}

}  // TEST_SUITE

TEST_CASE("a writer whose lock file was deleted commits nothing more: a second writer could hold the store") {
    temp_dir dir;
    const auto db = dir / "db";
    auto env = idem::environment::open(db);
    const auto table = env->table("t");
    {
        idem::write_txn w{*env};
        w.put(table, "a", "1");
        w.commit();
    }
    std::filesystem::remove(db / idem::writer_lock_file);
    // Another writer can now take a lock of its own, on a new file.
    CHECK(in_child([&] {
              idem::writer_lock second{db};
              return 0;
          }) == 0);
    idem::write_txn w{*env};
    w.put(table, "b", "2");
    try {
        w.commit();
        FAIL("committed after the lock file was deleted");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::store_locked);
        CHECK(std::string(e.what()).find("idem.lock was deleted or replaced") != std::string::npos);
    }
    idem::read_txn r{*env};
    CHECK(r.get(table, "a") == "1");
    CHECK_FALSE(r.get(table, "b"));
}
