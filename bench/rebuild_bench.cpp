// Offline rebuild throughput, side by side in one run: `idem rebuild` from the binary log
// and from JSON Lines, against a raw-LMDB bulk load of the very rows the rebuild produced
// (sorted, MDB_APPEND, one transaction, one sync: the least any rebuild must write).
//
//   rebuild_bench [--events N] [--aggregates N] [--duplicates SHARE] [--defects] [--runs N] [--dir DIR]
//
// Workload: trading fills (examples/domains), N distinct events over N aggregates'
// positions, SHARE of them redelivered later. --defects keeps the defect mix of `idem gen`
// (republished events, drop-copy reissues, reordered events that park, malformed lines). Each measured run is a child process, so its
// peak memory (ru_maxrss) is its own. Prints medians and ratios.

#include <idem/sources/rebuild.hpp>
#include <idem/examples/domains.hpp>
#include <idem/examples/gen.hpp>
#include <idem/projections/layout.hpp>
#include <idem/storage/event_log.hpp>
#include <idem/storage/lmdb.hpp>

#include <lmdb.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace {

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr, "rebuild_bench: %s\nusage: rebuild_bench [--events N] [--aggregates N] [--duplicates SHARE] "
                         "[--defects] [--runs N] [--dir DIR]\n", why);
    std::exit(2);
}

struct measured {
    double seconds = 0;
    double cpu_seconds = 0;  // user + system of the child, all threads: robust to a loaded machine
    long max_rss_kb = 0;
};

/// Runs fn in a child process; returns the seconds it reported and its peak resident memory.
template <class F>
measured in_child(F fn) {
    int pipefd[2];
    if (::pipe(pipefd) != 0) usage("pipe failed");
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(pipefd[0]);
        double s = fn();
        if (::write(pipefd[1], &s, sizeof s) != sizeof s) std::_Exit(3);
        std::_Exit(0);
    }
    ::close(pipefd[1]);
    measured m;
    if (::read(pipefd[0], &m.seconds, sizeof m.seconds) != sizeof m.seconds) usage("a measured run failed");
    ::close(pipefd[0]);
    int status = 0;
    struct rusage ru{};
    ::wait4(pid, &status, 0, &ru);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) usage("a measured run failed");
    m.max_rss_kb = ru.ru_maxrss;
    auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
    m.cpu_seconds = secs(ru.ru_utime) + secs(ru.ru_stime);
    return m;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double rebuild_once(const std::filesystem::path& db, const std::filesystem::path& log) {
    std::filesystem::remove_all(db);
    idem::rebuild_options o;
    o.store.path = db;
    o.store.consumer = "bench";
    o.store.unknown_types = idem::unknown_type_policy::dead_letter;
    o.logs = {log};
    o.setup = [](idem::store& s) { idem::examples::add_all(s); };
    auto started = std::chrono::steady_clock::now();
    idem::rebuild(o);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

/// The rows of one table of an environment, in key order.
std::vector<std::pair<std::string, std::string>> read_table(const std::filesystem::path& db, const std::string& name) {
    std::vector<std::pair<std::string, std::string>> rows;
    MDB_env* env = nullptr;
    mdb_env_create(&env);
    mdb_env_set_maxdbs(env, 64);
    if (mdb_env_open(env, db.c_str(), MDB_RDONLY, 0644) != 0) usage("cannot open the rebuilt environment");
    MDB_txn* txn = nullptr;
    mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
    MDB_dbi dbi;
    if (mdb_dbi_open(txn, name.c_str(), 0, &dbi) != 0) usage("the rebuilt environment has no positions table");
    MDB_cursor* c = nullptr;
    mdb_cursor_open(txn, dbi, &c);
    MDB_val k, v;
    for (int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
        rows.emplace_back(std::string(static_cast<const char*>(k.mv_data), k.mv_size),
                          std::string(static_cast<const char*>(v.mv_data), v.mv_size));
    }
    mdb_cursor_close(c);
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return rows;
}

/// Writes rows into a fresh environment the fastest way LMDB allows: sorted appends, one txn, one sync.
double bulk_load(const std::filesystem::path& db, const std::vector<std::pair<std::string, std::string>>& rows) {
    std::filesystem::remove_all(db);
    std::filesystem::create_directories(db);
    auto started = std::chrono::steady_clock::now();
    MDB_env* env = nullptr;
    mdb_env_create(&env);
    mdb_env_set_maxdbs(env, 4);
    mdb_env_set_mapsize(env, std::size_t{1} << 32);
    if (mdb_env_open(env, db.c_str(), MDB_NOSYNC, 0644) != 0) usage("cannot create the bulk-load environment");
    MDB_txn* txn = nullptr;
    mdb_txn_begin(env, nullptr, 0, &txn);
    MDB_dbi dbi;
    mdb_dbi_open(txn, "rows", MDB_CREATE, &dbi);
    for (const auto& [key, value] : rows) {
        MDB_val k{key.size(), const_cast<char*>(key.data())};
        MDB_val v{value.size(), const_cast<char*>(value.data())};
        if (mdb_put(txn, dbi, &k, &v, MDB_APPEND) != 0) usage("bulk load failed");
    }
    mdb_txn_commit(txn);
    mdb_env_sync(env, 1);
    mdb_env_close(env);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

}  // namespace

int main(int argc, char** argv) {
    idem::examples::gen_options g;
    g.domain = "trading";
    g.events = 1'000'000;
    g.aggregates = 100'000;
    g.redeliver = 0.10;
    g.republish = 0;
    g.reissue = 0;
    g.reorder = 0;
    g.malformed = 0;
    bool defects = false;
    int runs = 3;
    std::filesystem::path dir = std::filesystem::temp_directory_path() / ("idem-rebuild-bench-" + std::to_string(::getpid()));
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--defects") {
            defects = true;
            continue;
        }
        if (i + 1 >= argc) usage(("missing value for " + a).c_str());
        std::string v = argv[++i];
        if (a == "--events") g.events = std::stoull(v);
        else if (a == "--aggregates") g.aggregates = std::stoull(v);
        else if (a == "--duplicates") g.redeliver = std::stod(v);
        else if (a == "--runs") runs = std::max(1, std::stoi(v));
        else if (a == "--dir") dir = v;
        else usage(("unknown option " + a).c_str());
    }
    if (defects) {
        const idem::examples::gen_options mix;
        g.republish = mix.republish;
        g.reissue = mix.reissue;
        g.reorder = mix.reorder;
        g.malformed = mix.malformed;
    }
    std::filesystem::create_directories(dir);
    const auto jsonl = dir / "fills.jsonl";
    const auto binary = dir / "fills.bin";
    std::uint64_t lines = 0;
    {
        idem::log_writer out{jsonl, idem::log_format::jsonl};
        auto r = idem::examples::generate(g, [&](std::string_view line) { out.write(line); });
        lines = r.lines;
    }
    idem::convert_log(jsonl, binary, idem::log_format::binary);
    std::printf("workload: %llu trading fills over %llu positions, %.0f%% redelivered%s: %llu log records\n",
                static_cast<unsigned long long>(g.events), static_cast<unsigned long long>(g.aggregates),
                g.redeliver * 100, defects ? ", idem gen's defect mix" : "", static_cast<unsigned long long>(lines));
    std::printf("logs: jsonl %.1f MB, binary %.1f MB\n", double(std::filesystem::file_size(jsonl)) / 1e6,
                double(std::filesystem::file_size(binary)) / 1e6);

    std::vector<double> bin_s, jsonl_s, bulk_s, bin_cpu, jsonl_cpu;
    long bin_rss = 0, jsonl_rss = 0, bulk_rss = 0;
    std::vector<std::pair<std::string, std::string>> rows;
    for (int r = 0; r < runs; ++r) {
        auto b = in_child([&] { return rebuild_once(dir / "db-binary", binary); });
        bin_s.push_back(b.seconds);
        bin_cpu.push_back(b.cpu_seconds);
        bin_rss = std::max(bin_rss, b.max_rss_kb);
        auto j = in_child([&] { return rebuild_once(dir / "db-jsonl", jsonl); });
        jsonl_s.push_back(j.seconds);
        jsonl_cpu.push_back(j.cpu_seconds);
        jsonl_rss = std::max(jsonl_rss, j.max_rss_kb);
        if (rows.empty()) rows = read_table(dir / "db-binary", idem::layout::rows_table("positions"));
        auto l = in_child([&] { return bulk_load(dir / "db-bulk", rows); });
        bulk_s.push_back(l.seconds);
        bulk_rss = std::max(bulk_rss, l.max_rss_kb);
    }
    const double n = double(lines);
    auto report = [&](const char* what, double s, double cpu, long rss_kb, double base) {
        std::printf("%-28s %8.3f s  %10.0f events/s  %5.2f CPU us/event  peak RSS %6.1f MB  %6.2fx the bulk load's time\n",
                    what, s, n / s, cpu * 1e6 / n, double(rss_kb) / 1024, s / base);
    };
    const double bulk = median(bulk_s);
    std::printf("median of %d runs (each in its own process):\n", runs);
    report("rebuild from binary log", median(bin_s), median(bin_cpu), bin_rss, bulk);
    report("rebuild from JSON Lines", median(jsonl_s), median(jsonl_cpu), jsonl_rss, bulk);
    std::printf("%-28s %8.3f s  %10zu rows        peak RSS %6.1f MB\n", "raw LMDB bulk load of rows", bulk, rows.size(),
                double(bulk_rss) / 1024);
    std::filesystem::remove_all(dir);
    return 0;
}
