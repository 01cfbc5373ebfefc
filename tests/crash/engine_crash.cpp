// The in-process engine under crash points (tests/crash/README.md): crash_test.py runs
// this program again and again with IDEM_CRASH_AT armed and checks what each run left.
//
// It feeds a log's records through idem::engine (durability full, several submitting
// coroutines, group commit) as a broker would: each record is one message whose transport
// id ("rec-<line>") stays the same on every redelivery. A record is acknowledged by
// appending "<line> <outcome>\n" to the ack file after its completion ran, with one
// write(2): the kernel holds it before the next record is taken, so a SIGKILL cannot lose
// it (a power cut could; that would take an fsync per acknowledgement, which is the
// broker's business, not the store's).
//
// Every start first checks what the previous runs left, in a child process that has no
// crash point armed (the parent keeps IDEM_CRASH_AT for its own run):
//   - every record acknowledged since the last check (and a sample of the older ones),
//     redelivered, is a duplicate_message: an outcome that was reported was durable
//     ("<acks>.checked" remembers how far the ack file was checked);
//   - a row's version equals the number of effect keys that contributed to it (a window
//     of rows per start);
//   - the inbox holds one id per delivery that was not a duplicate_message; the parked
//     events and dead letters match their counters; each commit is one batch.
// Then it redelivers every record not acknowledged yet, in log order from several
// submitters, and may be killed anywhere by the armed crash point.
//
// usage: engine_crash --db DIR --log FILE --acks FILE [--submitters N] [--max-batch N]
//                     [--map-size BYTES] [--check]
//   --check  only check, every acknowledged record and every row, and require every
//            record acknowledged
// exit status: 0 every record acknowledged and every check held; 3 a check failed (stderr
// says which); 1 usage error; 2 I/O or storage failure.

#include <idem/engine/engine.hpp>
#include <idem/examples/domains.hpp>
#include <idem/storage/event_log.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

constexpr int exit_usage = 1;
constexpr int exit_failure = 2;
constexpr int exit_divergence = 3;

struct options {
    std::filesystem::path db;
    std::filesystem::path log;
    std::filesystem::path acks;
    std::size_t submitters = 8;
    std::size_t max_batch = 64;
    std::size_t map_size = std::size_t{256} << 10;  // small, so the map grows while the log is applied
    bool check_only = false;
};

/// One log record as the broker's message.
struct message {
    std::string body;
    std::string id;  // the transport id, the same on every redelivery
    std::uint64_t line = 0;
    std::uint64_t offset = 0;
};

/// A check that did not hold: the process exits 3 with the message.
struct divergence : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::uint64_t number(const std::string& name, const std::string& text) {
    std::uint64_t n = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (ec != std::errc{} || end != text.data() + text.size()) {
        throw std::invalid_argument("option '--" + name + "': '" + text + "' is not a number");
    }
    return n;
}

options parse(int argc, char** argv) {
    options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) throw std::invalid_argument("option '" + a + "' needs a value");
            return argv[++i];
        };
        if (a == "--db") {
            o.db = value();
        } else if (a == "--log") {
            o.log = value();
        } else if (a == "--acks") {
            o.acks = value();
        } else if (a == "--submitters") {
            o.submitters = std::max<std::size_t>(1, number("submitters", value()));
        } else if (a == "--max-batch") {
            o.max_batch = std::max<std::size_t>(1, number("max-batch", value()));
        } else if (a == "--map-size") {
            o.map_size = number("map-size", value());
        } else if (a == "--check") {
            o.check_only = true;
        } else {
            throw std::invalid_argument("unknown option '" + a + "'");
        }
    }
    if (o.db.empty() || o.log.empty() || o.acks.empty()) throw std::invalid_argument("--db, --log and --acks are required");
    return o;
}

std::vector<message> read_log(const std::filesystem::path& path) {
    std::vector<message> out;
    idem::log_reader reader{path};
    idem::log_record r;
    while (reader.next(r)) {
        out.push_back({std::string(r.body), "rec-" + std::to_string(r.line), r.line, r.offset});
    }
    return out;
}

/// One acknowledgement of an earlier run.
struct ack {
    std::string outcome;
    std::uint64_t end = 0;  // byte offset just past it in the ack file
};

/// The acknowledgements of earlier runs by line. A line without its newline is not one (a
/// write cannot be cut by SIGKILL, but a full disk could cut it).
std::map<std::uint64_t, ack> read_acks(const std::filesystem::path& path) {
    std::map<std::uint64_t, ack> out;
    std::ifstream in{path, std::ios::binary};
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t start = 0;
    for (auto end = text.find('\n'); end != std::string::npos; start = end + 1, end = text.find('\n', start)) {
        std::string_view entry{text.data() + start, end - start};
        auto space = entry.find(' ');
        std::uint64_t line = 0;
        if (space == std::string_view::npos ||
            std::from_chars(entry.data(), entry.data() + space, line).ec != std::errc{}) {
            throw divergence(path.string() + ": malformed acknowledgement '" + std::string(entry) + "'");
        }
        if (!out.emplace(line, ack{std::string(entry.substr(space + 1)), end + 1}).second) {
            throw divergence("record at line " + std::to_string(line) + " was acknowledged twice");
        }
    }
    return out;
}

/// How much of the ack file an earlier check redelivered in full ("<acks>.checked").
std::uint64_t checked_until(const options& o) {
    std::ifstream in{o.acks.string() + ".checked"};
    std::uint64_t n = 0;
    in >> n;
    return in ? n : 0;
}

void set_checked_until(const options& o, std::uint64_t n) {
    const auto path = o.acks.string() + ".checked";
    {
        std::ofstream out{path + ".new", std::ios::trunc};
        out << n << "\n";
        if (!out.flush()) throw std::system_error(errno, std::system_category(), "cannot write " + path);
    }
    std::filesystem::rename(path + ".new", path);
}

idem::store_options store_options_for(const options& o) {
    idem::store_options s;
    s.path = o.db;
    s.consumer = "idem";  // the `idem` tool's consumer, so `idem stats` reads this one
    s.unknown_types = idem::unknown_type_policy::dead_letter;
    s.sync = idem::durability::full;
    s.tuning.map_size = o.map_size;
    s.tuning.journal_rows = 8;  // small row journals: swapped and folded many times per run
    return s;
}

std::string kind_name(idem::outcome_kind k) { return std::string(idem::to_string(k)); }

/// The change feed is committed with the rows it describes: positions rise, versions rise per
/// row, and the last entry of every row is the row (its version and state bytes), every row in it.
void check_feed(const idem::snapshot& snap) {
    std::map<std::pair<std::string, std::string>, idem::change> last;
    idem::change_position at{};
    for (auto& c : snap.changes(0, SIZE_MAX)) {
        if (c.position <= at) throw divergence("change feed: position " + c.position.to_string() + " after " + at.to_string());
        at = c.position;
        auto& slot = last[{c.projection, c.key}];
        if (slot.version >= c.version) {
            throw divergence("change feed: " + c.projection + " row '" + c.key + "' version " + std::to_string(c.version) +
                             " after " + std::to_string(slot.version));
        }
        slot = std::move(c);
    }
    std::size_t rows = 0;
    for (const char* p : {"order-totals", "positions", "leaderboard", "inventory"}) {
        snap.scan_raw(p, [&](const idem::snapshot::raw_row_view& r) {
            ++rows;
            auto it = last.find({p, std::string(r.key)});
            if (it == last.end() || it->second.version != r.version || it->second.state != r.state) {
                throw divergence("change feed: " + std::string(p) + " row '" + std::string(r.key) + "' at version " +
                                 std::to_string(r.version) + " is not the feed's last entry of it");
            }
        });
    }
    if (rows != last.size()) {
        throw divergence("change feed: " + std::to_string(last.size()) + " rows changed, " + std::to_string(rows) + " rows");
    }
}

/// What must hold in any committed state, whatever was killed where. Checks every row's
/// contributing set if all_rows, else a window of rows that moves with the commit number
/// (counting a row's contributors walks its projection's whole contributor log).
void check_invariants(const idem::snapshot& snap, bool all_rows) {
    const std::string consumer = "idem";
    const auto stats = snap.consumer(consumer).stats();
    auto count = [&](idem::outcome_kind k) { return stats.outcomes[static_cast<std::size_t>(k)]; };
    std::uint64_t deliveries = 0;
    for (auto n : stats.outcomes) deliveries += n;
    const auto recorded = deliveries - count(idem::outcome_kind::duplicate_message);
    if (snap.consumer(consumer).inbox_size() != recorded) {
        throw divergence("the inbox holds " + std::to_string(snap.consumer(consumer).inbox_size()) + " ids, but " +
                         std::to_string(recorded) + " deliveries were not duplicate messages");
    }
    const auto parked = count(idem::outcome_kind::parked) - stats.released;
    if (snap.consumer(consumer).parked() != parked) {
        throw divergence(std::to_string(snap.consumer(consumer).parked()) + " events are parked, the counters say " +
                         std::to_string(parked));
    }
    if (snap.consumer(consumer).dead_letter_count() != count(idem::outcome_kind::dead_lettered)) {
        throw divergence(std::to_string(snap.consumer(consumer).dead_letter_count()) + " dead letters, the counters say " +
                         std::to_string(count(idem::outcome_kind::dead_lettered)));
    }
    if (snap.commit() != stats.batches) {
        throw divergence("commit " + std::to_string(snap.commit()) + " but " + std::to_string(stats.batches) +
                         " batches counted");
    }
    check_feed(snap);
    constexpr std::size_t window = 12;
    for (const char* p : {"order-totals", "positions", "leaderboard", "inventory"}) {
        std::vector<std::pair<std::string, std::uint64_t>> rows;
        snap.scan_raw(p, [&](const idem::snapshot::raw_row_view& r) { rows.emplace_back(std::string(r.key), r.version); });
        const std::size_t n = all_rows ? rows.size() : std::min(rows.size(), window);
        for (std::size_t i = 0; i < n; ++i) {
            const auto& [key, version] = rows[(snap.commit() * window + i) % rows.size()];
            const auto contributors = snap.projection(p).contributors(key);
            if (contributors != version) {
                throw divergence(std::string(p) + " row '" + key + "' has version " + std::to_string(version) +
                                 " but " + std::to_string(contributors) + " contributing effect keys");
            }
        }
    }
}

/// Checks the state the earlier runs left and redelivers acknowledged records: every one
/// acknowledged since the last check, a sample of the older ones (all of them if final).
void check(const options& o, const std::vector<message>& log, const std::map<std::uint64_t, ack>& acked, bool final) {
    if (!std::filesystem::exists(o.db / "data.mdb")) {
        if (!acked.empty()) {
            throw divergence(std::to_string(acked.size()) + " records were acknowledged, but there is no environment");
        }
        if (final && !log.empty()) throw divergence("nothing was applied");
        return;
    }
    idem::store store{store_options_for(o)};
    idem::examples::add_all(store, true);
    check_invariants(store.read(), final);
    const auto checked = checked_until(o);
    std::uint64_t acks_end = checked;
    std::vector<const message*> older;
    std::vector<const message*> which;
    std::size_t named = 0;
    for (const auto& m : log) {
        auto it = acked.find(m.line);
        if (it == acked.end()) {
            if (final) throw divergence("record at line " + std::to_string(m.line) + " was never acknowledged");
            continue;
        }
        ++named;
        acks_end = std::max(acks_end, it->second.end);
        (final || it->second.end > checked ? which : older).push_back(&m);
    }
    if (named != acked.size()) throw divergence("acknowledgements name lines the log does not have");
    std::minstd_rand pick{static_cast<std::uint32_t>(acked.size() + 1)};
    for (std::size_t i = 0; i < 32 && !older.empty(); ++i) {
        auto j = pick() % older.size();
        which.push_back(older[j]);
        older[j] = older.back();
        older.pop_back();
    }
    if (which.empty()) return;
    std::vector<idem::delivery> again;
    for (const auto* m : which) again.push_back({m->body, m->id, m->line, m->offset});
    auto outcomes = store.apply(std::span<const idem::delivery>(again));
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
        if (outcomes[i].kind != idem::outcome_kind::duplicate_message) {
            throw divergence("record at line " + std::to_string(which[i]->line) + " was acknowledged as " +
                             acked.at(which[i]->line).outcome + ", but its redelivery is " +
                             kind_name(outcomes[i].kind) + " (" + outcomes[i].detail +
                             "): its outcome was reported before it was durable");
        }
    }
    check_invariants(store.read(), final);
    set_checked_until(o, acks_end);
}

/// Runs check() in a child process without IDEM_CRASH_AT, so no crash point fires there and
/// the parent's points count only its own run. Returns the child's exit status.
int check_in_child(const options& o, const std::vector<message>& log, const std::map<std::uint64_t, ack>& acked) {
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::system_error(errno, std::system_category(), "fork");
    if (pid == 0) {
        ::unsetenv("IDEM_CRASH_AT");  // before any crash point reads it
        int code = 0;
        try {
            check(o, log, acked, false);
        } catch (const divergence& e) {
            std::fprintf(stderr, "engine_crash: DIVERGENCE: %s\n", e.what());
            code = exit_divergence;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "engine_crash: check: %s\n", e.what());
            code = exit_failure;
        }
        std::fflush(stderr);
        ::_exit(code);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) throw std::system_error(errno, std::system_category(), "waitpid");
    }
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    std::fprintf(stderr, "engine_crash: the check process died (status %d)\n", status);
    return exit_failure;
}

void write_all(int fd, std::string_view text) {
    while (!text.empty()) {
        auto n = ::write(fd, text.data(), text.size());
        if (n < 0) {
            if (errno == EINTR) continue;
            throw std::system_error(errno, std::system_category(), "cannot write the acknowledgements");
        }
        text.remove_prefix(static_cast<std::size_t>(n));
    }
}

/// One submitter: takes the next unacknowledged record, awaits its completion, acknowledges it.
boost::asio::awaitable<void> submit(idem::engine& e, const std::vector<const message*>& pending,
                                    std::atomic<std::size_t>& next, int ack_fd) {
    for (;;) {
        const auto i = next.fetch_add(1);
        if (i >= pending.size()) co_return;
        const auto& m = *pending[i];
        idem::delivery d{m.body, m.id, m.line, m.offset};
        auto [ec, o] = co_await e.async_apply(std::move(d), boost::asio::use_awaitable);
        if (ec) throw std::system_error(ec, "record at line " + std::to_string(m.line));
        write_all(ack_fd, std::to_string(m.line) + " " + kind_name(o.kind) + "\n");
    }
}

/// Redelivers every record not acknowledged yet through the engine; returns how many.
std::size_t deliver(const options& o, const std::vector<message>& log, const std::map<std::uint64_t, ack>& acked) {
    std::vector<const message*> pending;
    for (const auto& m : log) {
        if (!acked.contains(m.line)) pending.push_back(&m);
    }
    const int ack_fd = ::open(o.acks.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (ack_fd < 0) throw std::system_error(errno, std::system_category(), "cannot open " + o.acks.string());
    std::exception_ptr failure;
    std::mutex failure_mutex;
    {
        boost::asio::io_context io;
        idem::engine_options eo;
        eo.store = store_options_for(o);
        eo.max_batch = o.max_batch;
        idem::engine engine{io.get_executor(), eo};
        // The example domains as the `idem` tool has them: projections and the orders upcaster.
        engine.add_projections([](idem::store& s) { idem::examples::add_all(s, true); });
        std::atomic<std::size_t> next{0};
        for (std::size_t i = 0; i < o.submitters; ++i) {
            boost::asio::co_spawn(io, submit(engine, pending, next, ack_fd), [&](std::exception_ptr ex) {
                if (!ex) return;
                std::lock_guard lock{failure_mutex};
                if (!failure) failure = ex;
                next.store(pending.size());  // the others stop after their record in hand
            });
        }
        std::thread second([&io] { io.run(); });
        io.run();
        second.join();
    }
    ::close(ack_fd);
    if (failure) std::rethrow_exception(failure);
    return pending.size();
}

}  // namespace

int main(int argc, char** argv) {
    options o;
    try {
        o = parse(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "engine_crash: %s\nusage: engine_crash --db DIR --log FILE --acks FILE [--submitters N] "
                             "[--max-batch N] [--map-size BYTES] [--check]\n",
                     e.what());
        return exit_usage;
    }
    try {
        const auto log = read_log(o.log);
        const auto acked = read_acks(o.acks);
        if (o.check_only) {
            check(o, log, acked, true);
            std::printf("{\"records\":%zu,\"acknowledged\":%zu}\n", log.size(), acked.size());
            return 0;
        }
        if (int code = check_in_child(o, log, acked); code != 0) return code;
        const auto delivered = deliver(o, log, acked);
        std::printf("{\"records\":%zu,\"acknowledged_before\":%zu,\"delivered\":%zu}\n", log.size(), acked.size(),
                    delivered);
        return 0;
    } catch (const divergence& e) {
        std::fprintf(stderr, "engine_crash: DIVERGENCE: %s\n", e.what());
        return exit_divergence;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "engine_crash: %s\n", e.what());
        return exit_failure;
    }
}
