// A reader process for the concurrent-readers test (readers_test.py): it opens an
// environment that another process (`idem consume`) writes, read-only, and in a loop takes
// a snapshot, checks invariants on it, releases it. The invariants tie tables the writer
// changes together in one transaction (rows, counters, dead letters, the log checkpoint)
// to each other and to the log file, so a snapshot that mixed two commits, or a commit the
// writer lost, breaks at least one of them.
//
//   reader_check --db DIR --log FILE [--seconds N] [--min-commit C]
//                [--min-checkpoint P [--records-before N]] [--pause-ms MS] [--seed N] [--tear]
//       Starts no lower than the commit and checkpoint other readers saw (a restarted reader
//       must not see the past). Prints "progress ..." lines while it runs and "done ..." when
//       it ends (SIGTERM or the duration). A violation is printed with the commit it was seen
//       at: exit status 1; any other failure (READERS_FULL among them): exit status 2.
//       --tear reads the counters from a later snapshot than the tables: a torn read made on
//       purpose, which the test expects to be reported (it shows the invariants catch one).
//   reader_check --slots DIR
//       Prints LMDB's reader table of DIR as JSON (used slots, slots of dead processes, the
//       oldest snapshot they pin) without reclaiming anything: it opens the environment with
//       LMDB directly, because idem::environment clears dead readers' slots when it opens.

#include <idem/examples/domains.hpp>
#include <idem/projections/store_hooks.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/lmdb.hpp>
#include <idem/storage/log_position.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

namespace ex = idem::examples;
using clock_type = std::chrono::steady_clock;

std::atomic<bool> stop_requested{false};

extern "C" void on_stop_signal(int) {
    stop_requested.store(true);
}

/// A broken invariant: what was expected and what the snapshot held.
struct violation : std::runtime_error {
    using std::runtime_error::runtime_error;
};

struct check_options {
    std::filesystem::path db;
    std::filesystem::path log;
    std::string consumer = "idem";
    double seconds = 0;  // 0: until SIGTERM
    std::uint64_t min_commit = 0;
    std::uint64_t min_checkpoint = 0;
    std::optional<std::uint64_t> records_before;  // before min_checkpoint, as an earlier reader counted them
    std::uint64_t pause_ms = 0;                   // sleep up to this long between snapshots (random)
    std::uint64_t seed = 0;
    bool tear = false;  // read counters and tables from two snapshots taken apart: must be caught
};

/// Counts the records (non-blank lines) of a JSON Lines log up to an offset, reading only
/// what it has not read yet while the offsets it is asked about grow.
class log_records {
public:
    /// Opens the log; known_offset/known_records: the records before an offset, if another run counted them.
    log_records(const std::filesystem::path& path, std::uint64_t known_offset, std::uint64_t known_records)
        : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)), pos_(known_offset), records_(known_records) {
        if (fd_ < 0) throw std::system_error(errno, std::system_category(), "cannot open " + path.string());
    }
    log_records(const log_records&) = delete;
    log_records& operator=(const log_records&) = delete;
    ~log_records() { ::close(fd_); }

    /// Returns the number of records that end before offset (a line boundary).
    std::uint64_t before(std::uint64_t offset) {
        if (offset < pos_) {
            pos_ = 0;
            records_ = 0;
            blank_ = true;
        }
        while (pos_ < offset) {
            const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(buffer_.size(), offset - pos_));
            auto got = ::pread(fd_, buffer_.data(), want, static_cast<off_t>(pos_));
            if (got < 0) throw std::system_error(errno, std::system_category(), "cannot read the log");
            if (got == 0)
                throw violation("the checkpoint " + std::to_string(offset) + " is past the log's end (" +
                                std::to_string(pos_) + " bytes)");
            for (char c : std::string_view(buffer_.data(), static_cast<std::size_t>(got))) {
                if (c == '\n') {
                    if (!blank_) ++records_;
                    blank_ = true;
                } else if (c != ' ' && c != '\t' && c != '\r') {
                    blank_ = false;
                }
            }
            pos_ += static_cast<std::uint64_t>(got);
        }
        return records_;
    }

    /// Returns whether offset starts a line: 0, or right after a newline.
    bool at_line_start(std::uint64_t offset) const {
        if (offset == 0) return true;
        char c = 0;
        return ::pread(fd_, &c, 1, static_cast<off_t>(offset - 1)) == 1 && c == '\n';
    }

private:
    int fd_;
    std::vector<char> buffer_ = std::vector<char>(std::size_t{1} << 20);
    std::uint64_t pos_ = 0;
    std::uint64_t records_ = 0;
    bool blank_ = true;  // the line being read has only blank characters so far
};

std::string describe_outcomes(const idem::consumer_stats& s) {
    std::string out;
    for (std::size_t i = 0; i < idem::outcome_kinds; ++i) {
        out += std::string(idem::to_string(static_cast<idem::outcome_kind>(i))) + "=" + std::to_string(s.outcomes[i]) +
               " ";
    }
    return out + "released=" + std::to_string(s.released) + " batches=" + std::to_string(s.batches);
}

std::uint64_t outcome_count(const idem::consumer_stats& s, idem::outcome_kind k) {
    return s.outcomes[static_cast<std::size_t>(k)];
}

/// What one snapshot showed, kept to compare the next one against.
struct seen {
    std::uint64_t commit = 0;
    std::uint64_t checkpoint = 0;
    std::uint64_t records = 0;
    std::uint64_t versions = 0;
    std::uint64_t inbox = 0;
    std::uint64_t batches = 0;
    std::uint64_t rows = 0;
};

/// Sums a projection's row versions and checks what each row must hold; a projection this
/// snapshot does not have counts as empty (the writer creates its tables before its first commit).
template <class State, class F>
std::uint64_t check_rows(const idem::snapshot& snap, const char* projection, bool must_exist,
                         std::unordered_map<std::string, std::uint64_t>& versions_seen, std::uint64_t& rows,
                         std::vector<std::pair<std::string, std::uint64_t>>& sample, std::mt19937_64& rng, F&& check) {
    std::uint64_t versions = 0;
    std::uint64_t n = 0;
    try {
        snap.scan<State>(projection, [&](const idem::row<State>& r) {
            if (r.version == 0) throw violation(std::string(projection) + " row '" + r.key + "' has version 0");
            // A row never goes back to an older version, nor disappears (checked after the scan).
            auto& before = versions_seen[std::string(projection) + "\n" + r.key];
            if (r.version < before) {
                throw violation(std::string(projection) + " row '" + r.key + "' went back from version " +
                                std::to_string(before) + " to " + std::to_string(r.version));
            }
            before = r.version;
            check(r);
            versions += r.version;
            ++n;
            // Reservoir sampling: one row per projection, uniformly, for the contributing-set check.
            if (std::uniform_int_distribution<std::uint64_t>(1, n)(rng) == 1) {
                sample.back() = {projection + std::string("\n") + r.key, r.version};
            }
        });
    } catch (const std::system_error& e) {
        if (e.code() != idem::errc::unknown_projection) throw;
        if (must_exist) throw violation(std::string("projection '") + projection + "' is missing");
    }
    rows += n;
    return versions;
}

/// Checks one snapshot against the log and the previous snapshot; fills now with what it saw.
/// counters and tables are the same snapshot, except in --tear mode, where counters is newer.
void check_snapshot(const idem::snapshot& counters, const idem::snapshot& snap, const check_options& o,
                    const std::string& source, log_records& log, const seen& before, seen& now,
                    std::unordered_map<std::string, std::uint64_t>& versions_seen, std::mt19937_64& rng) {
    now = seen{};
    now.commit = counters.commit();
    if (now.commit < before.commit) {
        throw violation("the commit number went back from " + std::to_string(before.commit));
    }

    const auto checkpoints = counters.checkpoints(o.consumer);
    std::optional<std::uint64_t> position;
    for (const auto& [name, at] : checkpoints) {
        if (name == source) {
            position = at;
        } else {
            throw violation("an unexpected checkpoint source '" + name + "'");
        }
    }
    if (!position && now.commit > 0 && !checkpoints.empty()) throw violation("no checkpoint for " + source);
    now.checkpoint = position.value_or(0);
    if (now.checkpoint < before.checkpoint) {
        throw violation("the checkpoint went back from " + std::to_string(before.checkpoint) + " to " +
                        std::to_string(now.checkpoint));
    }
    if (!log.at_line_start(now.checkpoint)) {
        throw violation("the checkpoint " + std::to_string(now.checkpoint) + " is not at the start of a log line");
    }
    now.records = log.before(now.checkpoint);

    // Every record up to the checkpoint got exactly one outcome, in the same commit.
    const auto stats = counters.consumer(o.consumer).stats();
    std::uint64_t outcomes = 0;
    for (auto n : stats.outcomes) outcomes += n;
    if (outcomes != now.records) {
        throw violation("the outcomes sum to " + std::to_string(outcomes) + " but the " + std::to_string(now.records) +
                        " records before checkpoint " + std::to_string(now.checkpoint) + " were consumed (" +
                        describe_outcomes(stats) + ")");
    }
    now.batches = stats.batches;
    if (now.batches < before.batches || now.batches > now.commit) {
        throw violation("batches " + std::to_string(now.batches) + " (before: " + std::to_string(before.batches) +
                        ") against commit " + std::to_string(now.commit));
    }

    // Dead letters and parked events are tables of their own, written in the same commit.
    const auto dead = outcome_count(stats, idem::outcome_kind::dead_lettered);
    if (snap.consumer(o.consumer).dead_letter_count() != dead) {
        throw violation("the dead-letter table holds " + std::to_string(snap.consumer(o.consumer).dead_letter_count()) +
                        " entries but " + std::to_string(dead) + " were counted");
    }
    const auto parked = outcome_count(stats, idem::outcome_kind::parked);
    if (snap.consumer(o.consumer).parked() + stats.released != parked) {
        throw violation("the parked table holds " + std::to_string(snap.consumer(o.consumer).parked()) + " events, " +
                        std::to_string(stats.released) + " were released, but " + std::to_string(parked) +
                        " were parked");
    }
    now.inbox = snap.consumer(o.consumer).inbox_size();
    if (now.inbox < before.inbox ||
        now.inbox > outcomes - outcome_count(stats, idem::outcome_kind::duplicate_message)) {
        throw violation("the inbox holds " + std::to_string(now.inbox) +
                        " ids (before: " + std::to_string(before.inbox) + ") against " + describe_outcomes(stats));
    }

    // Each applied event (and each released one) changed exactly one row of one projection:
    // the example projections map an event to one key.
    const bool tables = now.commit > 0 && now.batches > 0;
    std::uint64_t rows = 0;
    std::vector<std::pair<std::string, std::uint64_t>> sample;
    std::uint64_t versions = 0;
    sample.emplace_back();
    versions += check_rows<ex::order_total>(snap, ex::order_totals_projection, tables, versions_seen, rows, sample, rng,
                                            [](const idem::row<ex::order_total>& r) {
                                                if (r.state.lines != static_cast<std::int64_t>(r.version)) {
                                                    throw violation("order-totals row '" + r.key + "' counts " +
                                                                    std::to_string(r.state.lines) +
                                                                    " lines at version " + std::to_string(r.version));
                                                }
                                            });
    sample.emplace_back();
    versions += check_rows<ex::position>(
        snap, ex::positions_projection, tables, versions_seen, rows, sample, rng, [](const idem::row<ex::position>& r) {
            const auto& p = r.state;
            const bool flat_ok = p.qty != 0 || (p.cost == 0 && p.avg_price == 0);
            const bool sign_ok = (p.qty > 0) == (p.cost > 0) && (p.qty < 0) == (p.cost < 0);
            if (!flat_ok || !sign_ok) {
                throw violation("positions row '" + r.key + "' holds qty " + std::to_string(p.qty) + ", cost " +
                                std::to_string(p.cost) + ", avg_price " + std::to_string(p.avg_price));
            }
        });
    sample.emplace_back();
    versions += check_rows<ex::scoreboard>(snap, ex::leaderboard_projection, tables, versions_seen, rows, sample, rng,
                                           [](const idem::row<ex::scoreboard>& r) {
                                               std::int64_t sum = 0;
                                               for (const auto& [player, points] : r.state.points) sum += points;
                                               if (sum != r.state.total) {
                                                   throw violation("leaderboard row '" + r.key + "' totals " +
                                                                   std::to_string(r.state.total) +
                                                                   " but its players sum to " + std::to_string(sum));
                                               }
                                           });
    sample.emplace_back();
    versions += check_rows<ex::holdings>(
        snap, ex::inventory_projection, tables, versions_seen, rows, sample, rng, [](const idem::row<ex::holdings>& r) {
            for (const auto& [item, count] : r.state.items) {
                if (count <= 0) {
                    throw violation("inventory row '" + r.key + "' holds " + std::to_string(count) + " of " + item);
                }
            }
        });
    // A released event may turn out to be a duplicate (it was parked twice), so released
    // events bound the versions from above only.
    const auto applied = outcome_count(stats, idem::outcome_kind::applied);
    if (versions < applied || versions > applied + stats.released) {
        throw violation("the rows' versions sum to " + std::to_string(versions) +
                        ", outside [applied, applied + released] (" + describe_outcomes(stats) + ")");
    }
    now.versions = versions;
    now.rows = rows;
    if (rows < before.rows || rows != versions_seen.size()) {
        throw violation("the snapshot holds " + std::to_string(rows) + " rows, the previous one " +
                        std::to_string(before.rows) + ", and " + std::to_string(versions_seen.size()) +
                        " rows were seen so far: a row disappeared");
    }

    // A row's contributing set holds one effect key per event applied to it.
    std::vector<std::pair<std::string, std::uint64_t>> picked;
    for (const auto& s : sample) {
        if (!s.first.empty()) picked.push_back(s);
    }
    // It walks the projection's whole contributor log: one snapshot in eight.
    if (!picked.empty() && std::uniform_int_distribution<int>(0, 7)(rng) == 0) {
        const auto& [name, version] = picked[std::uniform_int_distribution<std::size_t>(0, picked.size() - 1)(rng)];
        const auto cut = name.find('\n');
        const auto projection = name.substr(0, cut);
        const auto key = name.substr(cut + 1);
        const auto n = snap.projection(projection).contributors(key);
        if (n != version) {
            throw violation(projection + " row '" + key + "' has version " + std::to_string(version) + " but " +
                            std::to_string(n) + " effect keys in its contributing set");
        }
    }
}

void print_line(const char* what, std::uint64_t snapshots, std::uint64_t opens, const seen& last) {
    std::printf("%s snapshots=%" PRIu64 " opens=%" PRIu64 " commit=%" PRIu64 " checkpoint=%" PRIu64 " records=%" PRIu64
                " versions=%" PRIu64 "\n",
                what, snapshots, opens, last.commit, last.checkpoint, last.records, last.versions);
    std::fflush(stdout);
}

int run_checks(const check_options& o) {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);

    const std::string source = idem::log_source(o.log);
    log_records log =
        o.records_before ? log_records{o.log, o.min_checkpoint, *o.records_before} : log_records{o.log, 0, 0};
    std::mt19937_64 rng{o.seed != 0 ? o.seed : static_cast<std::uint64_t>(::getpid())};
    const auto started = clock_type::now();
    auto last_report = started;
    seen last;
    last.commit = o.min_commit;
    last.checkpoint = o.min_checkpoint;
    std::unordered_map<std::string, std::uint64_t> versions_seen;  // projection "\n" key -> version
    std::uint64_t snapshots = 0;
    std::uint64_t opens = 0;
    idem::environment_options eo;
    eo.read_only = true;
    try {
        while (!stop_requested.load()) {
            // A session: the environment opened (reclaiming dead readers' slots), a few
            // snapshots, the environment closed; sometimes a single snapshot::open.
            const auto session = std::uniform_int_distribution<int>(1, 48)(rng);
            std::shared_ptr<idem::environment> env;
            if (session > 1) env = idem::environment::open(o.db, eo);
            ++opens;
            for (int i = 0; i < session && !stop_requested.load(); ++i) {
                seen now;
                try {
                    auto snap = env ? idem::detail::snapshot_of(env) : idem::snapshot::open(o.db);
                    if (o.tear) {
                        // A torn read on purpose (the test checks that it is caught): the
                        // counters come from a later snapshot than the tables.
                        std::this_thread::sleep_for(std::chrono::milliseconds(30));
                        auto later = env ? idem::detail::snapshot_of(env) : idem::snapshot::open(o.db);
                        check_snapshot(later, snap, o, source, log, last, now, versions_seen, rng);
                    } else {
                        check_snapshot(snap, snap, o, source, log, last, now, versions_seen, rng);
                    }
                } catch (const violation& v) {
                    std::fprintf(stderr,
                                 "reader_check %d: VIOLATION at commit %" PRIu64 " (checkpoint %" PRIu64
                                 ", previous snapshot: commit %" PRIu64 ", checkpoint %" PRIu64 "): %s\n",
                                 ::getpid(), now.commit, now.checkpoint, last.commit, last.checkpoint, v.what());
                    print_line("failed", snapshots, opens, last);
                    return 1;
                }
                last = now;
                ++snapshots;
                const auto t = clock_type::now();
                if (t - last_report >= std::chrono::milliseconds(100)) {
                    print_line("progress", snapshots, opens, last);
                    last_report = t;
                }
                if (o.seconds > 0 && t - started >= std::chrono::duration<double>(o.seconds)) {
                    stop_requested.store(true);
                }
                if (o.pause_ms > 0) {
                    std::this_thread::sleep_for(std::chrono::microseconds(
                        std::uniform_int_distribution<std::uint64_t>(0, o.pause_ms * 1000)(rng)));
                }
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "reader_check %d: ERROR after commit %" PRIu64 ": %s\n", ::getpid(), last.commit,
                     e.what());
        print_line("failed", snapshots, opens, last);
        return 2;
    }
    print_line("done", snapshots, opens, last);
    return 0;
}

// --- the reader table, as LMDB keeps it ---------------------------------------------

struct slot_census {
    std::uint64_t used = 0;          // slots with a process id
    std::uint64_t dead = 0;          // ... of a process that no longer exists
    std::uint64_t dead_pinning = 0;  // ... that still hold a snapshot
    std::uint64_t oldest_dead_txnid = 0;
};

extern "C" int count_slot(const char* line, void* context) {
    auto& census = *static_cast<slot_census*>(context);
    int pid = 0;
    std::size_t thread = 0;
    char txnid[32] = {};
    if (std::sscanf(line, "%d %zx %31s", &pid, &thread, txnid) != 3 || pid <= 0) return 0;  // the header line
    ++census.used;
    if (::kill(pid, 0) == 0 || errno != ESRCH) return 0;
    ++census.dead;
    if (std::strcmp(txnid, "-") != 0) {
        ++census.dead_pinning;
        const auto id = std::strtoull(txnid, nullptr, 10);
        if (census.oldest_dead_txnid == 0 || id < census.oldest_dead_txnid) census.oldest_dead_txnid = id;
    }
    return 0;
}

int list_slots(const std::filesystem::path& db) {
    MDB_env* env = nullptr;
    int rc = mdb_env_create(&env);
    if (rc == 0) rc = mdb_env_set_maxreaders(env, 512);
    if (rc == 0) rc = mdb_env_open(env, db.c_str(), MDB_RDONLY | MDB_NOTLS | MDB_NORDAHEAD, 0644);
    slot_census census;
    MDB_envinfo info{};
    unsigned max_readers = 0;
    if (rc == 0) rc = mdb_reader_list(env, count_slot, &census);
    if (rc == 0) rc = mdb_env_info(env, &info);
    if (rc == 0) rc = mdb_env_get_maxreaders(env, &max_readers);
    mdb_env_close(env);
    if (rc != 0) {
        std::fprintf(stderr, "reader_check: cannot read the reader table of %s: %s\n", db.c_str(), mdb_strerror(rc));
        return 2;
    }
    std::printf("{\"max_readers\":%u,\"high_water\":%u,\"used\":%" PRIu64 ",\"dead\":%" PRIu64
                ",\"dead_pinning\":%" PRIu64 ",\"oldest_dead_txnid\":%" PRIu64 ",\"last_txnid\":%zu}\n",
                max_readers, info.me_numreaders, census.used, census.dead, census.dead_pinning,
                census.oldest_dead_txnid, info.me_last_txnid);
    return 0;
}

int usage() {
    std::fprintf(stderr,
                 "usage: reader_check --db DIR --log FILE [--seconds N] [--min-commit C] [--min-checkpoint P "
                 "[--records-before N]] [--pause-ms MS] [--seed N] [--tear]\n"
                 "       reader_check --slots DIR\n");
    return 1;
}

std::uint64_t number(const char* text) {
    char* end = nullptr;
    errno = 0;
    auto n = std::strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') throw std::invalid_argument(std::string("not a number: ") + text);
    return n;
}

}  // namespace

int main(int argc, char** argv) {
    check_options o;
    try {
        for (int i = 1; i < argc; ++i) {
            const std::string_view arg = argv[i];
            if (arg == "--tear") {
                o.tear = true;
                continue;
            }
            if (i + 1 >= argc) return usage();
            const char* value = argv[++i];
            if (arg == "--slots") return list_slots(value);
            if (arg == "--db") {
                o.db = value;
            } else if (arg == "--log") {
                o.log = value;
            } else if (arg == "--consumer") {
                o.consumer = value;
            } else if (arg == "--seconds") {
                o.seconds = std::strtod(value, nullptr);
            } else if (arg == "--min-commit") {
                o.min_commit = number(value);
            } else if (arg == "--min-checkpoint") {
                o.min_checkpoint = number(value);
            } else if (arg == "--records-before") {
                o.records_before = number(value);
            } else if (arg == "--pause-ms") {
                o.pause_ms = number(value);
            } else if (arg == "--seed") {
                o.seed = number(value);
            } else {
                return usage();
            }
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "reader_check: %s\n", e.what());
        return usage();
    }
    if (o.db.empty() || o.log.empty()) return usage();
    return run_checks(o);
}
