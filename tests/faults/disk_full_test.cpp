// A full or failing disk under real writers: the store, the engine and the `idem consume`
// binary run in child processes with the LD_PRELOAD fault injector (inject.cpp), which makes
// writes and syncs of files in the environment fail with ENOSPC or EIO while a control file
// exists — refused outright, or done and then reported failed — at every position within a
// commit (data pages, the data sync, the meta page). While the disk is full nothing may be
// acknowledged that is not durable, and errors must name the environment and the cause; once
// space is back, redelivering everything must reach the reference state exactly. A child that
// stops dead right after the failures (no destructors, no sync) shows what is durable: exactly
// what was acknowledged.

#include <idem/engine/engine.hpp>

#include "../engine/engine_fixtures.hpp"
#include "child.hpp"

#include <doctest/doctest.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

namespace asio = boost::asio;
namespace fs = std::filesystem;
using namespace idem_test;
using idem_faults::injection;

namespace {

constexpr std::size_t groups = 10;     // batches (store) or rounds of submissions (engine)
constexpr std::size_t per_group = 25;  // deliveries in each
constexpr std::size_t full_from = 3;   // the disk is full for groups 3, 4 and 5
constexpr std::size_t full_to = 6;

// Distinct lines over a few orders: delivery n is line n.
idem::delivery delivery_at(std::size_t n) {
    return deliver(line("line-" + std::to_string(n), "order-" + std::to_string(n % 7), static_cast<std::int64_t>(n + 1)),
                   "msg-" + std::to_string(n));
}

reference reference_of(const std::set<std::size_t>& deliveries) {
    reference ref;
    for (auto n : deliveries) ref.add("order-" + std::to_string(n % 7), static_cast<std::int64_t>(n + 1));
    return ref;
}

std::set<std::size_t> everything() {
    std::set<std::size_t> all;
    for (std::size_t n = 0; n < groups * per_group; ++n) all.insert(n);
    return all;
}

// The child's running account, one line per event, read back by the parent.
class report {
public:
    explicit report(const fs::path& p) : out_(p) {}
    void line(const std::string& text) { out_ << text << '\n' << std::flush; }
    void ack(std::size_t n) { line("ack " + std::to_string(n)); }

private:
    std::ofstream out_;
};

struct report_view {
    std::set<std::size_t> acked;
    std::size_t failures = 0;
    std::string text;
};

report_view read_report(const fs::path& p) {
    report_view v;
    v.text = idem_faults::slurp(p);
    std::istringstream in{v.text};
    for (std::string l; std::getline(in, l);) {
        if (l.starts_with("ack ")) v.acked.insert(std::stoul(l.substr(4)));
        if (l.starts_with("fail ")) ++v.failures;
    }
    return v;
}

// Whether a storage error is the one a full or failing disk gives, and says where and why.
std::string judge(const std::system_error& e, const fs::path& env) {
    const auto& c = e.code();
    const bool disk = c == std::errc::no_space_on_device || c == std::errc::io_error;
    if (!disk && c != idem::errc::panic) return "unexpected error " + c.message();
    const std::string what = e.what();
    if (what.find(env.string()) == std::string::npos) return "the message does not name the environment: " + what;
    if (what.find(c.message()) == std::string::npos) return "the message does not give the cause: " + what;
    return {};
}

// Compares the rows in env with the reference of `acked`; "" when equal.
std::string differs(const idem::snapshot& snap, const std::set<std::size_t>& acked) {
    const auto want = reference_of(acked).rows;
    const auto got = dump(snap, "order-totals");
    if (got == want) return {};
    return "rows " + std::string(doctest::StringMaker<std::map<std::string, row_summary>>::convert(got).c_str()) +
           " instead of " + doctest::StringMaker<std::map<std::string, row_summary>>::convert(want).c_str();
}

// --- the children ---------------------------------------------------------------

const char* child_dir() {
    const char* d = std::getenv("IDEM_FAULTS_CHILD_DIR");
    return d != nullptr ? d : "";
}
bool child_crashes() {
    const char* c = std::getenv("IDEM_FAULTS_CHILD_CRASH");
    return c != nullptr && std::strcmp(c, "1") == 0;
}

// The store, durability full, applying one batch per group; returns 0 or the failing step.
int store_child() {
    const fs::path dir = child_dir();
    const auto env = dir / "env";
    const auto control = dir / "full";
    report rep{dir / "report.txt"};
    std::set<std::size_t> acked;
    auto batch = [](std::size_t g) {
        std::vector<idem::delivery> b;
        for (std::size_t i = 0; i < per_group; ++i) b.push_back(delivery_at(g * per_group + i));
        return b;
    };
    try {
        idem::store s{options(env, idem::durability::full)};
        s.add(totals_by_order());
        for (std::size_t g = 0; g < full_from; ++g) {
            s.apply(batch(g));
            for (std::size_t i = 0; i < per_group; ++i) acked.insert(g * per_group + i);
        }
        for (auto n : acked) rep.ack(n);
        std::ofstream{control}.put('x');  // the disk is full
        for (std::size_t g = full_from; g < full_to; ++g) {
            try {
                s.apply(batch(g));
                for (std::size_t i = 0; i < per_group; ++i) {
                    acked.insert(g * per_group + i);
                    rep.ack(g * per_group + i);
                }
            } catch (const std::system_error& e) {
                rep.line("fail " + std::to_string(g) + ": " + e.what());
                if (auto bad = judge(e, env); !bad.empty()) {
                    rep.line("error: " + bad);
                    return 3;
                }
                if (e.code() == idem::errc::panic) s.reopen();
            }
            try {
                if (auto bad = differs(s.read(), acked); !bad.empty()) {
                    rep.line("error: while the disk is full the store shows " + bad);
                    return 4;
                }
            } catch (const std::system_error& e) {
                // LMDB refuses every transaction after a failed meta page write (MDB_PANIC): the
                // caller reopens, as the next apply() tells it to.
                rep.line(std::string("read failed: ") + e.what());
            }
        }
        if (child_crashes()) ::_exit(0);  // no destructor, no sync: what is on disk now is what survives
        fs::remove(control);  // space is back
        // The broker redelivers everything; what was acknowledged is a duplicate.
        for (std::size_t g = 0; g < groups; ++g) {
            for (int attempt = 0;; ++attempt) {
                try {
                    s.apply(batch(g));
                    break;
                } catch (const std::system_error& e) {
                    rep.line("after space returned, batch " + std::to_string(g) + " failed: " + e.what());
                    if (attempt == 2 || e.code() != idem::errc::panic) return 5;
                    s.reopen();
                }
            }
        }
        if (auto bad = differs(s.read(), everything()); !bad.empty()) {
            rep.line("error: after redelivery " + bad);
            return 6;
        }
    } catch (const std::exception& e) {
        rep.line(std::string("error: ") + e.what());
        return 2;
    }
    return 0;
}

// The engine, durability full, with a group of deliveries submitted at once per round.
int engine_child() {
    const fs::path dir = child_dir();
    const auto env = dir / "env";
    const auto control = dir / "full";
    report rep{dir / "report.txt"};
    std::set<std::size_t> acked;
    try {
        asio::io_context io;
        io_threads runner{io, 2};
        idem::engine e{io.get_executor(), engine_options(env, idem::durability::full)};
        e.add(totals_by_order());
        // Submits deliveries at once; returns those that failed, after recording the others.
        auto submit = [&](const std::vector<std::size_t>& which, const char* when) {
            std::vector<std::future<std::tuple<std::error_code, idem::outcome>>> results;
            for (auto n : which) results.push_back(e.async_apply(delivery_at(n), asio::use_future));
            std::vector<std::size_t> failed;
            for (std::size_t i = 0; i < which.size(); ++i) {
                auto [ec, out] = results[i].get();
                if (ec) {
                    failed.push_back(which[i]);
                    rep.line("fail " + std::to_string(which[i]) + " " + when + ": " + ec.message());
                } else {
                    acked.insert(which[i]);
                    rep.ack(which[i]);
                }
            }
            return failed;
        };
        auto group = [](std::size_t g) {
            std::vector<std::size_t> out;
            for (std::size_t i = 0; i < per_group; ++i) out.push_back(g * per_group + i);
            return out;
        };
        for (std::size_t g = 0; g < full_from; ++g) {
            if (!submit(group(g), "before the disk was full").empty()) return 3;
        }
        std::ofstream{control}.put('x');
        for (std::size_t g = full_from; g < full_to; ++g) {
            submit(group(g), "while the disk was full");
            try {
                if (auto bad = differs(e.read(), acked); !bad.empty()) {
                    rep.line("error: while the disk is full the engine shows " + bad);
                    return 4;
                }
            } catch (const std::system_error& ex) {
                rep.line(std::string("read failed while the disk was full: ") + ex.what());
            }
        }
        if (child_crashes()) ::_exit(0);
        fs::remove(control);
        try {
            (void)e.read();
        } catch (const std::system_error& ex) {
            rep.line(std::string("read failed after space returned: ") + ex.what());
        }
        // Everything again; failures (an environment the engine must still reopen) once more.
        std::vector<std::size_t> pending;
        for (std::size_t n = 0; n < groups * per_group; ++n) pending.push_back(n);
        for (int round = 0; !pending.empty(); ++round) {
            if (round == 3) {
                rep.line("error: deliveries still fail after space returned");
                return 5;
            }
            pending = submit(pending, "after space returned");
        }
        if (auto bad = differs(e.read(), everything()); !bad.empty()) {
            rep.line("error: after redelivery " + bad);
            return 6;
        }
    } catch (const std::exception& ex) {
        rep.line(std::string("error: ") + ex.what());
        return 2;
    }
    return 0;
}

// One failed meta page write (EIO once, then the disk is healthy): LMDB marks the environment
// unusable (MDB_FATAL_ERROR) but reports the errno, not MDB_PANIC. Afterwards reads must work
// and the next delivery must apply at its first try.
int meta_write_child() {
    const fs::path dir = child_dir();
    const auto env = dir / "env";
    const auto control = dir / "full";
    report rep{dir / "report.txt"};
    try {
        asio::io_context io;
        io_threads runner{io, 2};
        idem::engine e{io.get_executor(), engine_options(env, idem::durability::full)};
        e.add(totals_by_order());
        auto apply = [&](std::size_t n) { return std::get<0>(e.async_apply(delivery_at(n), asio::use_future).get()); };
        if (auto ec = apply(0)) {
            rep.line("error: the first delivery failed: " + ec.message());
            return 2;
        }
        std::ofstream{control}.put('x');
        const auto failed = apply(1);
        fs::remove(control);
        if (failed != std::errc::io_error) {
            rep.line("error: the delivery whose meta page write failed completed with '" + failed.message() + "'");
            return 3;
        }
        try {
            if (auto bad = differs(e.read(), {0}); !bad.empty()) {
                rep.line("error: after the failed commit the engine shows " + bad);
                return 4;
            }
        } catch (const std::system_error& ex) {
            rep.line(std::string("a read after the failed commit, on a healthy disk, threw: ") + ex.what());
            return 5;
        }
        if (auto ec = apply(2)) {
            rep.line("the next delivery, on a healthy disk, failed: " + ec.message());
            return 6;
        }
        if (auto ec = apply(1)) {
            rep.line("error: the redelivered delivery failed: " + ec.message());
            return 7;
        }
        if (auto bad = differs(e.read(), {0, 1, 2}); !bad.empty()) {
            rep.line("error: at the end the engine shows " + bad);
            return 8;
        }
    } catch (const std::exception& ex) {
        rep.line(std::string("error: ") + ex.what());
        return 9;
    }
    return 0;
}

// A projection's rows as text (key, version, state bytes), read in this process; "" if the
// environment has no such projection yet (the disk was full before its table was created).
std::string rows_of(const fs::path& db) {
    std::string out;
    try {
        auto snap = idem::snapshot::open(db);
        snap.scan_raw("order-totals", [&](const idem::snapshot::raw_row_view& r) {
            out += std::string(r.key) + " " + std::to_string(r.version) + " ";
            for (char c : r.state) out += std::to_string(static_cast<unsigned char>(c)) + ",";
            out += "\n";
        });
    } catch (const std::system_error& e) {
        if (e.code() != idem::errc::unknown_projection) throw;
    }
    return out;
}

// --- the parent's side --------------------------------------------------------------

struct child_run {
    idem_faults::exit_status status;
    report_view report;
    std::string output;
    std::size_t injected = 0;
};

child_run run_child(const char* test_case, const fs::path& dir, const injection& inj, bool crash) {
    const std::vector<std::string> args{"--no-skip", "--no-version", "--no-intro", std::string("--test-case=") + test_case};
    child_run r;
    r.status = idem_faults::run("/proc/self/exe", args, true, inj, fs::canonical(dir) / "env", dir / "full",
                                {"IDEM_FAULTS_CHILD_DIR=" + dir.string(), std::string("IDEM_FAULTS_CHILD_CRASH=") + (crash ? "1" : "0")},
                                dir / "output.txt");
    r.report = read_report(dir / "report.txt");
    r.output = idem_faults::slurp(dir / "output.txt");
    r.injected = idem_faults::lines(dir / "injected.log");
    return r;
}

std::vector<injection> injections() {
    std::vector<injection> out;
    for (const char* error : {"ENOSPC", "EIO"}) {
        for (const char* ops : {"write", "sync"}) {
            for (const char* mode : {"before", "after"}) {
                for (long skip : {0L, 1L, 2L, 3L, 5L}) {
                    if (std::string(ops) == "sync" && skip > 1) continue;  // one sync per commit
                    out.push_back(injection{error, ops, mode, skip, -1, false});
                }
            }
        }
    }
    // One failing call only: the disk recovers at once (LMDB's own undo write of the meta page succeeds).
    for (long skip : {0L, 1L, 2L, 3L, 4L}) out.push_back(injection{"EIO", "write", "after", skip, 1, false});
    return out;
}

void check_child(const char* test_case) {
    if (idem_faults::injector_library().empty()) {
        MESSAGE("skipped: IDEM_FAULTS_LIB does not name the injector library (meson test sets it)");
        return;
    }
    std::size_t runs_with_failures = 0;
    std::size_t runs = 0;
    for (const auto& inj : injections()) {
        for (bool crash : {false, true}) {
            CAPTURE(inj.describe());
            CAPTURE(crash);
            temp_dir dir;
            const auto r = run_child(test_case, dir.path(), inj, crash);
            CAPTURE(r.report.text);
            CAPTURE(r.output);
            ++runs;
            REQUIRE_MESSAGE(r.status.finished, "the child hung");
            CHECK(r.status.code == 0);
            if (r.report.failures > 0) ++runs_with_failures;
            if (inj.skip == 0) CHECK(r.injected > 0);
            // What is on disk, read by a process without the injector: with the child stopped dead
            // after the failures, exactly what was acknowledged; else everything, once.
            idem::store s{options(dir.path() / "env")};
            s.add(totals_by_order());
            auto snap = s.read();
            CHECK(differs(snap, crash ? r.report.acked : everything()) == "");
            if (!crash) CHECK(snap.consumer(consumer).inbox_size() == groups * per_group);
            for (std::size_t n = 0; n < full_from * per_group; ++n) CHECK(r.report.acked.contains(n));
        }
    }
    CHECK(runs_with_failures > runs / 2);
    MESSAGE(runs << " child runs, " << runs_with_failures << " with failed commits");
}

}  // namespace

TEST_SUITE("storage faults") {

TEST_CASE("the store under a full or failing disk acknowledges only what is durable and recovers once space is back") {
    check_child("child: the store under a full disk");
}

TEST_CASE("the engine under a full or failing disk acknowledges only what is durable and recovers once space is back") {
    check_child("child: the engine under a full disk");
}

// A failed meta page write leaves LMDB's environment fatally flagged but returns the errno (EIO,
// ENOSPC): the engine must notice and reopen at once, not after one more batch failed with
// MDB_PANIC (and every read() in between).
TEST_CASE("after one failed meta page write the engine reads and applies again without failing another batch") {
    if (idem_faults::injector_library().empty()) {
        MESSAGE("skipped: IDEM_FAULTS_LIB does not name the injector library (meson test sets it)");
        return;
    }
    temp_dir dir;
    const auto r = run_child("child: one failed meta page write under the engine", dir.path(),
                             injection{"EIO", "write", "before", 0, 1, true}, false);
    CAPTURE(r.output);
    REQUIRE_MESSAGE(r.status.finished, "the child hung");
    CHECK(r.injected == 1);
    CHECK_MESSAGE(r.status.code == 0, r.report.text);
}

TEST_CASE("idem consume on a full disk exits 2 naming the environment and the cause, and a later run finishes the log") {
    const char* exe = std::getenv("IDEM_EXE");
    if (exe == nullptr || idem_faults::injector_library().empty()) {
        MESSAGE("skipped: IDEM_EXE and IDEM_FAULTS_LIB must name the idem binary and the injector (meson test sets them)");
        return;
    }
    temp_dir dir;
    const auto base = fs::canonical(dir.path());
    // A log of order lines with some lines repeated later (duplicates for the inbox).
    const auto log = base / "events.jsonl";
    std::vector<std::string> lines_of_log;
    for (std::size_t n = 0; n < 3000; ++n) {
        const auto order = "order-" + std::to_string(n % 50);
        lines_of_log.push_back(R"({"specversion":"1.0","id":"e-)" + std::to_string(n) +
                               R"(","source":"/orders","type":"order.line_added","subject":")" + order +
                               R"(","data":{"order_id":")" + order + R"(","amount":)" + std::to_string(n % 100 + 1) + "}}");
        if (n % 10 == 9) lines_of_log.push_back(lines_of_log[lines_of_log.size() - 5]);
    }
    {
        std::ofstream out{log};
        for (const auto& l : lines_of_log) out << l << '\n';
    }
    auto idem = [&](const std::vector<std::string>& args, const fs::path& out, bool preload = false,
                    const injection& inj = {}, const fs::path& db = {}) {
        return idem_faults::run(exe, args, preload, inj, db, base / "full", {}, out);
    };
    auto dump_of = [&](const fs::path& db, const std::string& name) {
        const auto out = base / (name + ".dump");
        const auto st = idem({"dump", "--db", db.string(), "--projection", "order-totals"}, out);
        CHECK(st.code == 0);
        return idem_faults::slurp(out);
    };
    REQUIRE(idem({"rebuild", "--db", (base / "ref").string(), "--log", log.string()}, base / "ref.txt").code == 0);
    const auto reference_dump = dump_of(base / "ref", "ref");
    REQUIRE(!reference_dump.empty());

    std::size_t partial = 0;  // runs that committed some batches before the disk filled
    for (long skip : {0L, 5L, 25L, 60L, 120L, 300L}) {
        for (const std::string error : {"ENOSPC", "EIO"}) {
            CAPTURE(skip);
            CAPTURE(error);
            const auto db = base / ("db-" + std::to_string(skip) + error);
            std::ofstream{base / "full"}.put('x');
            const auto out = base / "consume.txt";
            const auto full = idem({"consume", "--db", db.string(), "--log", log.string(), "--batch", "100"}, out, true,
                                   injection{error, "write,sync", "before", skip, -1, false}, db);
            const auto text = idem_faults::slurp(out);
            CAPTURE(text);
            REQUIRE(full.finished);
            CHECK(full.code == 2);
            CHECK(text.find(db.string()) != std::string::npos);
            CHECK(text.find(std::make_error_code(error == "EIO" ? std::errc::io_error
                                                                               : std::errc::no_space_on_device)
                                .message()) != std::string::npos);
            fs::remove(base / "full");

            // What is durable is exactly the log up to the committed offset.
            if (fs::exists(db / "data.mdb") && fs::file_size(db / "data.mdb") == 0) {
                // The disk was full before LMDB could write its first page: nothing to read back.
                MESSAGE("the environment was never initialized");
            } else if (fs::exists(db / "data.mdb")) {
                std::uint64_t offset = 0;
                {
                    auto snap = idem::snapshot::open(db);
                    for (const auto& [source, position] : snap.checkpoints("idem")) offset = position;
                }
                if (offset > 0) ++partial;
                const auto prefix = base / "prefix.jsonl";
                {
                    std::ofstream p{prefix};
                    p << idem_faults::slurp(log).substr(0, offset);
                }
                const auto prefix_db = base / ("prefix-" + std::to_string(skip) + error);
                REQUIRE(idem({"rebuild", "--db", prefix_db.string(), "--log", prefix.string()}, base / "prefix.txt").code == 0);
                CHECK(rows_of(db) == rows_of(prefix_db));
            }
            // Space is back: the same command finishes the log, and the result is the reference.
            const auto again = idem({"consume", "--db", db.string(), "--log", log.string(), "--batch", "100"}, out);
            CAPTURE(idem_faults::slurp(out));
            CHECK(again.code == 0);
            CHECK(dump_of(db, "final") == reference_dump);
        }
    }
    CHECK(partial > 0);
}

TEST_CASE("child: one failed meta page write under the engine" * doctest::skip()) {
    CHECK(meta_write_child() == 0);  // 5 and 6 are the known failures described above
}

TEST_CASE("child: the store under a full disk" * doctest::skip()) {
    CHECK(store_child() == 0);  // 2..6: which step went wrong (the report says more)
}

TEST_CASE("child: the engine under a full disk" * doctest::skip()) {
    CHECK(engine_child() == 0);
}

}  // TEST_SUITE
