// Snapshot isolation: a snapshot sees exactly the commits made before it, whether it is
// taken in the writer's thread, in another thread while a batch is inside its
// transaction, or in another process reading while the parent writes (and grows the map).
// Scenarios that could deadlock run in a child process that is killed after a time limit,
// so a deadlock fails the test instead of hanging the run.

#include <idem/projections/store.hpp>
#include <idem/projections/store_hooks.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;
using namespace std::chrono_literals;

namespace {

// Waits for a child process; kills it after `limit` (a deadlock) so the test fails instead of hanging.
// Returns whether it exited by itself, and its wait status.
std::pair<bool, int> wait_or_kill(pid_t child, std::chrono::seconds limit) {
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(child, &status, WNOHANG) == child) return {true, status};
        std::this_thread::sleep_for(10ms);
    }
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    return {false, status};
}

// Reads one byte from fd; false on EOF or error.
bool wait_byte(int fd) {
    char byte = 0;
    return ::read(fd, &byte, 1) == 1;
}

bool send_byte(int fd) {
    char byte = 'x';
    return ::write(fd, &byte, 1) == 1;
}

// The reader process: thread A (this one) holds a snapshot while the writer process grows
// the map; then thread B takes a snapshot (which must adopt the new map size) and A goes on
// reading from its snapshot. Returns 0 when both finished.
int two_reader_threads(const std::filesystem::path& path, int to_parent, int from_parent) {
    try {
        std::optional<idem::snapshot> held{idem::snapshot::open(path)};
        const auto seen = held->commit();
        if (!send_byte(to_parent) || !wait_byte(from_parent)) return 3;  // the writer has grown the map
        std::thread other{[&] {
            auto fresh = idem::snapshot::open(path);  // the same read-only environment as A's
            (void)fresh.commit();
        }};
        std::this_thread::sleep_for(200ms);  // let B begin its snapshot
        const bool same = held->commit() == seen && !held->get<order_total>("order-totals", "order-9");
        held.reset();
        other.join();
        return same ? 0 : 1;
    } catch (...) {
        return 4;
    }
}

// The child's side: reads order-1 and order-2 through fresh read-only snapshots until it has
// seen the final state. Every state seen must be one the parent committed (states[k]), in
// commit order. Returns the exit status: 0 good, 1 a state no batch produced or out of order,
// 2 timeout, 3 an exception.
int read_while_parent_writes(const std::filesystem::path& path, bool keep_open,
                             const std::vector<std::pair<std::int64_t, std::int64_t>>& states, int ready_fd) {
    try {
        // Either one read-only environment for every read (it must follow the parent's map growth),
        // or a fresh one per read (snapshot::open).
        std::shared_ptr<idem::environment> env;
        if (keep_open) {
            idem::environment_options eo;
            eo.read_only = true;
            env = idem::environment::open(path, eo);
        }
        std::size_t at = 0;
        std::uint64_t last_commit = 0;
        bool signalled = false;
        const auto deadline = std::chrono::steady_clock::now() + 120s;
        for (;;) {
            std::pair<std::int64_t, std::int64_t> seen{0, 0};
            std::uint64_t commit = 0;
            {
                auto snap = keep_open ? idem::detail::snapshot_of(env) : idem::snapshot::open(path);
                if (auto r = snap.get<order_total>("order-totals", "order-1")) seen.first = r->state.total;
                if (auto r = snap.get<order_total>("order-totals", "order-2")) seen.second = r->state.total;
                commit = snap.commit();
            }
            std::size_t k = at;
            while (k < states.size() && states[k] != seen) ++k;
            if (k == states.size() || commit < last_commit) return 1;
            at = k;
            last_commit = commit;
            if (!signalled) {
                char byte = 'r';
                if (::write(ready_fd, &byte, 1) != 1) return 3;
                ::close(ready_fd);
                signalled = true;
            }
            if (at + 1 == states.size()) return 0;
            if (std::chrono::steady_clock::now() > deadline) return 2;
        }
    } catch (...) {
        return 3;
    }
}

}  // namespace

TEST_SUITE("isolation") {

TEST_CASE("a snapshot sees the batches committed before it and none after") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    reference ref;

    auto empty = store.read();
    store.apply(std::vector{deliver(line("line-1", "order-1", 10)), deliver(line("line-2", "order-2", 3))});
    ref.add("order-1", 10);
    ref.add("order-2", 3);
    const auto first = ref.rows;

    auto before = store.read();
    store.apply(std::vector{deliver(line("line-3", "order-1", 20)), deliver(line("line-4", "order-3", 4))});
    ref.add("order-1", 20);
    ref.add("order-3", 4);
    auto after = store.read();

    CHECK(dump(empty, "order-totals").empty());
    CHECK(empty.commit() == 0);
    CHECK(dump(before, "order-totals") == first);
    CHECK(dump(after, "order-totals") == ref.rows);
    CHECK(after.commit() == before.commit() + 1);
    CHECK_FALSE(before.get<order_total>("order-totals", "order-3"));
}

TEST_CASE("a snapshot taken in another thread while a batch is inside its transaction sees the state before it") {
    temp_dir dir;
    std::promise<std::uint64_t> inside;  // the writer reached the commit
    std::promise<void> proceed;          // the reader is done
    auto proceed_signal = proceed.get_future().share();
    bool pause = false;
    auto o = options(dir.env());
    idem::detail::set_before_commit(o, [&](std::uint64_t commit) {
        if (!pause) return;
        inside.set_value(commit);
        proceed_signal.wait_for(60s);
    });
    idem::store store{o};
    store.add(totals_by_order());
    store.apply(deliver(line("line-1", "order-1", 10)));
    reference ref;
    ref.add("order-1", 10);
    const auto old_rows = ref.rows;
    const auto old_commit = store.read().commit();

    pause = true;
    std::vector<idem::outcome> outcomes;
    std::thread writer{[&] {
        outcomes = store.apply(std::vector{deliver(line("line-2", "order-1", 20)), deliver(line("line-3", "order-2", 5))});
    }};
    // Releases and joins the writer however this test leaves.
    struct join_guard {
        std::promise<void>& proceed;
        std::thread& writer;
        bool released = false;
        void release() {
            if (!released) proceed.set_value();
            released = true;
            if (writer.joinable()) writer.join();
        }
        ~join_guard() { release(); }
    } guard{proceed, writer};

    auto reached = inside.get_future();
    REQUIRE(reached.wait_for(60s) == std::future_status::ready);
    const auto pending_commit = reached.get();
    CHECK(pending_commit == old_commit + 1);

    // Read in this thread (not the writer's) and in a third one, while the writer holds its transaction.
    {
        auto snap = store.read();
        CHECK(dump(snap, "order-totals") == old_rows);
        CHECK(snap.commit() == old_commit);
        CHECK(store.last_commit() == old_commit);
    }
    auto third = std::async(std::launch::async, [&] {
        auto snap = store.read();
        return std::pair{dump(snap, "order-totals"), snap.commit()};
    });
    auto [third_rows, third_commit] = third.get();
    CHECK(third_rows == old_rows);
    CHECK(third_commit == old_commit);
    auto held = store.read();  // kept across the commit

    guard.release();
    ref.add("order-1", 20);
    ref.add("order-2", 5);
    REQUIRE(outcomes.size() == 2);
    for (const auto& oc : outcomes) CHECK(oc.commit == pending_commit);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
    CHECK(store.read().commit() == pending_commit);
    CHECK(dump(held, "order-totals") == old_rows);
}

TEST_CASE("a forked process reads consistent snapshots while the parent writes") {
    bool keep_open = false;
    SUBCASE("a fresh read-only environment per read") { keep_open = false; }
    SUBCASE("one read-only environment while the parent's map grows") { keep_open = true; }

    // The map starts small so the parent grows it several times while the child reads.
    temp_dir dir;
    auto o = options(dir.env());
    o.tuning.map_size = std::size_t{64} << 10;
    idem::store store{o};
    store.add(totals_by_order());

    // The parent's 40 batches and the state (order-1 total, order-2 total) after each one.
    std::mt19937_64 rng{11};
    std::vector<std::vector<idem::delivery>> batches;
    std::vector<std::pair<std::int64_t, std::int64_t>> states{{0, 0}};
    int next_id = 0;
    for (int b = 0; b < 40; ++b) {
        auto state = states.back();
        std::vector<idem::delivery> batch;
        for (int i = 0; i < 50; ++i) {
            const bool first = i % 2 == 0;
            auto amount = static_cast<std::int64_t>(rng() % 100) + 1;
            batch.push_back(deliver(line("a-long-event-id-so-the-map-fills-" + std::to_string(next_id++),
                                         first ? "order-1" : "order-2", amount)));
            (first ? state.first : state.second) += amount;
        }
        batches.push_back(std::move(batch));
        states.push_back(state);
    }

    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(ready[0]);
        ::_exit(read_while_parent_writes(dir.env(), keep_open, states, ready[1]));
    }
    ::close(ready[1]);
    char byte = 0;
    const auto got = ::read(ready[0], &byte, 1);
    ::close(ready[0]);
    CHECK(got == 1);  // the child has taken its first snapshot

    for (const auto& batch : batches) {
        store.apply(batch);
        std::this_thread::sleep_for(1ms);
    }
    CHECK(idem::detail::store_env(store)->map_size() > o.tuning.map_size);  // the parent grew the map under the reader
    const auto [exited, status] = wait_or_kill(child, 60s);
    REQUIRE_MESSAGE(exited, "the reader process hung and was killed");
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);  // 1: it saw a state no commit produced, 2: timeout, 3: exception

    auto snap = store.read();
    auto r1 = snap.get<order_total>("order-totals", "order-1");
    auto r2 = snap.get<order_total>("order-totals", "order-2");
    REQUIRE(r1);
    REQUIRE(r2);
    CHECK(std::pair{r1->state.total, r2->state.total} == states.back());
}

TEST_CASE("a reader process keeps working when the writer grows the map while one of its threads reads") {
    temp_dir dir;
    auto o = options(dir.env());
    o.tuning.map_size = std::size_t{64} << 10;
    idem::store store{o};
    store.add(totals_by_order());
    store.apply(deliver(line("line-0", "order-1", 1)));

    int up[2];    // child -> parent
    int down[2];  // parent -> child
    REQUIRE(::pipe(up) == 0);
    REQUIRE(::pipe(down) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(up[0]);
        ::close(down[1]);
        ::_exit(two_reader_threads(dir.env(), up[1], down[0]));
    }
    ::close(up[1]);
    ::close(down[0]);
    REQUIRE(wait_byte(up[0]));  // the child holds its snapshot

    // Grow the map well past what the child mapped.
    for (int b = 0; b < 20; ++b) {
        std::vector<idem::delivery> batch;
        for (int i = 0; i < 100; ++i) {
            batch.push_back(deliver(line("growing-the-map-" + std::to_string(b * 100 + i),
                                         "order-" + std::to_string(10 + i), 1)));
        }
        store.apply(batch);
    }
    CHECK(idem::detail::store_env(store)->map_size() >= 4 * o.tuning.map_size);
    CHECK(send_byte(down[1]));

    const auto [exited, status] = wait_or_kill(child, 10s);
    ::close(up[0]);
    ::close(down[1]);
    REQUIRE_MESSAGE(exited, "the reader process deadlocked and was killed");
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("a snapshot held by the caller does not hang a batch that must grow the map") {
    // Run in a child process: a hang there is killed and reported instead of hanging the tests.
    temp_dir dir;
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int code = 0;
        try {
            auto o = options(dir.env());
            o.tuning.map_size = std::size_t{64} << 10;
            idem::store store{o};
            store.add(totals_by_order());
            store.apply(deliver(line("line-0", "order-1", 1)));
            auto before = store.read();  // held across the batch, as in "before/after" comparisons
            std::vector<idem::delivery> batch;
            for (int i = 0; i < 3000; ++i) {
                batch.push_back(deliver(line("line-" + std::to_string(i + 1), "order-" + std::to_string(i % 300), 1)));
            }
            try {
                store.apply(batch);
                // Applied: the held snapshot still sees the state before the batch.
                auto r = before.get<order_total>("order-totals", "order-1");
                code = r && r->state.total == 1 && !before.get<order_total>("order-totals", "order-2") ? 0 : 1;
            } catch (const std::system_error&) {
                code = 0;  // refusing promptly (e.g. map_full: a snapshot is live) is acceptable; hanging is not
            }
        } catch (...) {
            code = 4;
        }
        ::_exit(code);
    }
    const auto [exited, status] = wait_or_kill(child, 10s);
    REQUIRE_MESSAGE(exited, "apply() deadlocked growing the map while the caller held a snapshot; the child was killed");
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

}  // TEST_SUITE
