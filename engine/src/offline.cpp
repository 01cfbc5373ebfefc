#include <idem/engine/offline.hpp>

#include <idem/storage/crash_point.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/store_dir.hpp>
#include <idem/storage/writer_lock.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <span>
#include <thread>

namespace idem {

namespace {

using clock = std::chrono::steady_clock;

void fsync_dir(const std::filesystem::path& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw std::system_error(errno, std::system_category(), "cannot open directory " + dir.string());
    int rc = ::fsync(fd);
    int saved = errno;
    ::close(fd);
    if (rc != 0) throw std::system_error(saved, std::system_category(), "cannot sync directory " + dir.string());
}

std::uint64_t file_size_or_zero(const std::filesystem::path& p) {
    std::error_code ec;
    auto n = std::filesystem::file_size(p, ec);
    return ec ? 0 : n;
}

/// Reads the logs in order and applies them in batches, each with its log position as
/// checkpoint. Two stages on two threads: a reader thread reads records and prepares each
/// batch (store::prepare: parsing, decoding, key functions), the calling thread applies the
/// prepared batches in order; at most two prepared batches wait between them.
class log_run {
public:
    log_run(store& s, const log_run_options& o) : store_(s), options_(o) {
        batch_.resize(std::max<std::size_t>(o.batch, 1));
        for (const auto& log : o.logs) progress_.total_bytes += file_size_or_zero(log);
    }

    /// resume: start each log at the consumer's checkpoint, and leave an incomplete last
    /// record for a later run (a live log may be mid-append) instead of applying it.
    log_run_result run(bool resume, bool follow, std::chrono::milliseconds poll, const std::atomic<bool>* stop) {
        poll_ = poll;
        stop_ = stop;
        auto started = clock::now();
        std::thread reader([&] {
            ::pthread_setname_np(::pthread_self(), "idem-log-reader");
            try {
                for (std::size_t i = 0; i < options_.logs.size() && !stopping(); ++i) {
                    // UINT64_MAX: the whole log (a std::optional here trips GCC's maybe-uninitialized).
                    const std::uint64_t until = i < options_.until.size() ? options_.until[i] : UINT64_MAX;
                    read_log(options_.logs[i], resume, follow && i + 1 == options_.logs.size(), until);
                }
            } catch (...) {
                std::lock_guard lock{mutex_};
                failure_ = std::current_exception();
            }
            std::lock_guard lock{mutex_};
            reading_done_ = true;
            changed_.notify_all();
        });
        try {
            apply_loop();
        } catch (...) {
            {
                std::lock_guard lock{mutex_};
                abandoned_ = true;
                queue_.clear();
                changed_.notify_all();
            }
            reader.join();
            throw;
        }
        reader.join();
        if (failure_) std::rethrow_exception(failure_);
        result_.elapsed = clock::now() - started;
        return std::move(result_);
    }

private:
    struct pending {
        prepared_batch batch;
        checkpoint at;
        std::uint64_t records = 0;  // records read so far, including this batch
        std::uint64_t bytes = 0;    // bytes read so far, including this batch
    };

    bool stopping() const { return (stop_ != nullptr && stop_->load()) || abandoned_.load(); }

    // --- the reader thread ------------------------------------------------------------

    void read_log(const std::filesystem::path& path, bool resume, bool follow, std::uint64_t until) {
        const std::string source = log_source(path);
        log_reader_options ro;
        ro.skip_bad = options_.skip_bad;
        // A live log (resume) is read like a followed one: a last record without its end is
        // not taken yet, or its two halves would be two malformed events.
        ro.follow = follow || resume;
        if (resume) ro.start = snapshot{store_.env()}.checkpoint(store_.options().consumer, source).value_or(0);
        const bool lines_known = ro.start == 0;  // after a resume only byte offsets are known
        log_reader reader{path, ro};
        if (options_.format && reader.format() != *options_.format) {
            throw_error(errc::invalid_argument, path.string() + ": is a " + std::string(to_string(reader.format())) +
                                                    " log, not " + std::string(to_string(*options_.format)));
        }
        const std::uint64_t base = bytes_read_;
        const std::uint64_t started_at = reader.position();
        log_record record;
        bool at_limit = false;
        for (;;) {
            while (reader.next(record)) {
                if (record.end > until) {
                    at_limit = true;  // a prefix of the log: the rest is not read
                    break;
                }
                auto& d = batch_[used_++];
                d.body.assign(record.body);
                d.message_id.clear();
                d.line = lines_known ? record.line : 0;
                d.offset = record.offset;
                ++records_read_;
                if (used_ == batch_.size()) {
                    bytes_read_ = base + (reader.position() - started_at);
                    if (!hand_over(source, reader.position())) return;
                    if (stopping()) break;  // Ctrl-C: stop at a batch boundary, its checkpoint committed
                }
            }
            bytes_read_ = base + (reader.position() - started_at);
            if (!hand_over(source, at_limit ? until : reader.position())) return;
            if (at_limit) return;
            if (!follow || stopping()) break;
            std::this_thread::sleep_for(poll_);
        }
        std::lock_guard lock{mutex_};
        result_.skipped += reader.skipped();
        if (auto torn = reader.torn_tail()) {
            result_.torn.push_back({path, *torn, reader.torn_detail()});
        } else if (resume && !stopping() && reader.size() > reader.position()) {
            result_.torn.push_back({path, reader.position(),
                                    "the last record is incomplete (no end yet): not applied; a later run takes it "
                                    "once it is complete"});
        }
    }

    /// Prepares the records read so far and queues them; false if the run was abandoned.
    bool hand_over(const std::string& source, std::uint64_t position) {
        if (used_ == 0) return true;
        pending p;
        {
            std::lock_guard lock{mutex_};
            if (!recycled_.empty()) {
                p.batch = std::move(recycled_.back());
                recycled_.pop_back();
            }
        }
        store_.prepare(std::span<const delivery>(batch_.data(), used_), p.batch);
        p.at = checkpoint{source, position};
        p.records = records_read_;
        p.bytes = bytes_read_;
        used_ = 0;
        std::unique_lock lock{mutex_};
        changed_.wait(lock, [&] { return queue_.size() < 2 || abandoned_; });
        if (abandoned_) return false;
        queue_.push_back(std::move(p));
        changed_.notify_all();
        return true;
    }

    // --- the applying thread ----------------------------------------------------------

    void apply_loop() {
        for (;;) {
            pending p;
            {
                std::unique_lock lock{mutex_};
                changed_.wait(lock, [&] { return !queue_.empty() || reading_done_; });
                if (queue_.empty()) return;
                p = std::move(queue_.front());
                queue_.pop_front();
                changed_.notify_all();
            }
            store_.apply(p.batch, p.at);  // expired entries leave inside each batch's transaction
            {
                std::lock_guard lock{mutex_};
                recycled_.push_back(std::move(p.batch));  // its strings' capacity serves the next batch
            }
            result_.records = p.records;
            progress_.records = p.records;
            progress_.bytes = p.bytes;
            report();
        }
    }

    void report() {
        if (!options_.progress) return;
        progress_.elapsed = clock::now() - started_;
        options_.progress(progress_);
    }

    store& store_;
    const log_run_options& options_;
    const std::atomic<bool>* stop_ = nullptr;
    std::chrono::milliseconds poll_{100};
    clock::time_point started_ = clock::now();

    // Reader thread only.
    std::vector<delivery> batch_;
    std::size_t used_ = 0;
    std::uint64_t records_read_ = 0;
    std::uint64_t bytes_read_ = 0;

    // Shared, under mutex_.
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<pending> queue_;
    std::vector<prepared_batch> recycled_;
    bool reading_done_ = false;
    std::atomic<bool> abandoned_{false};  // the applier failed: the reader stops (also read without mutex_)
    std::exception_ptr failure_;

    // Applying thread (and the reader's skipped/torn under mutex_; read after join).
    log_progress progress_;
    log_run_result result_;
};

}  // namespace

std::string log_source(const std::filesystem::path& log) {
    return "log:" + std::filesystem::absolute(log).lexically_normal().string();
}

log_run_result build(const rebuild_options& options) {
    const auto& dir = options.store.path;
    if (std::filesystem::exists(dir) && !std::filesystem::is_empty(dir)) {
        throw_error(errc::invalid_argument, dir.string() + ": a build needs a new, empty directory");
    }
    for (const auto& log : options.logs) {
        if (!std::filesystem::exists(log)) {
            throw std::system_error(ENOENT, std::system_category(), log.string() + ": cannot read the log");
        }
    }
    auto so = options.store;
    so.sync = durability::none;  // one sync at the end instead of one per batch
    // A bulk build cannot grow the map half way: reserve address space for the logs' content
    // several times over (the file only grows as it is written).
    std::uint64_t log_bytes = 0;
    for (const auto& log : options.logs) log_bytes += file_size_or_zero(log);
    so.map_size = std::min<std::size_t>(so.max_map_size, std::max<std::size_t>(so.map_size, 8 * log_bytes));
    log_run_result result;
    {
        store s{so};
        if (options.setup) options.setup(s);
        s.begin_bulk(options.memory_budget);
        log_run run{s, options};
        result = run.run(false, false, {}, options.stop);
        if (options.stop != nullptr && options.stop->load()) {
            throw std::system_error(std::make_error_code(std::errc::operation_canceled),
                                    "stopped before the build was complete; nothing was replaced");
        }
        s.end_bulk();
        result.stats = s.read().stats(so.consumer);
        result.run = result.stats;  // a build starts from nothing
        s.env()->sync(true);
    }
    fsync_dir(normalized_dir(dir).parent_path());
    return result;
}

std::filesystem::path normalized_dir(const std::filesystem::path& dir) {
    auto p = std::filesystem::absolute(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "data/" names "data"
    return p;
}

namespace {

// Whether path starts with an LMDB meta page: a 16-byte page header, then the magic 0xBEEFC0DE
// (in the writing machine's byte order). An empty file is an environment never written yet.
bool lmdb_file(const std::filesystem::path& path) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) return false;
    unsigned char head[20] = {};
    const auto n = std::fread(head, 1, sizeof head, f);
    std::fclose(f);
    if (n == 0) return true;
    if (n < sizeof head) return false;
    const bool little = head[16] == 0xde && head[17] == 0xc0 && head[18] == 0xef && head[19] == 0xbe;
    const bool big = head[16] == 0xbe && head[17] == 0xef && head[18] == 0xc0 && head[19] == 0xde;
    return little || big;
}

// Refuses a target that is not a store's directory: the rebuild replaces it and deletes the old one.
void check_rebuild_target(const std::filesystem::path& target) {
    if (!std::filesystem::exists(target)) return;
    if (!std::filesystem::is_directory(target)) {
        throw_error(errc::invalid_argument, target.string() + ": exists and is not a directory");
    }
    if (auto other = foreign_files(target); !other.empty()) {
        std::string names;
        for (std::size_t i = 0; i < other.size() && i < 5; ++i) names += (i ? ", " : "") + other[i];
        if (other.size() > 5) names += ", ...";
        throw_error(errc::invalid_argument,
                    target.string() + ": holds files that are not part of an idem store (" + names +
                        "); a rebuild replaces the whole directory, so it is refused: give the store a "
                        "directory of its own");
    }
    if (std::filesystem::exists(target / "data.mdb") && !lmdb_file(target / "data.mdb")) {
        throw_error(errc::invalid_argument, target.string() +
                                                ": its data.mdb is not an LMDB file (no LMDB meta page); "
                                                "not replacing it");
    }
}

}  // namespace

log_run_result rebuild(const rebuild_options& options) {
    const auto target = normalized_dir(options.store.path);
    if (target == target.root_path()) throw_error(errc::invalid_argument, "rebuild: no target directory given");
    check_rebuild_target(target);
    std::error_code ec;
    const bool created = !std::filesystem::exists(target);
    std::filesystem::create_directories(target, ec);
    if (ec) throw std::system_error(ec, "cannot create " + target.string());
    // The target's writer lock for the whole rebuild: no consumer writes into the store being
    // replaced, and no other rebuild deletes this one's half-built environment. It is held
    // through the swap; a writer that waited for it then finds the new store at the path.
    writer_lock lock{target, options.store.wait_for_writer};
    check_rebuild_target(target);  // again, now that nobody else writes there
    auto fresh = target;
    fresh += ".rebuild";
    remove_store_dir(fresh);  // left by a rebuild that was killed: start over
    auto legacy_lock = target;
    legacy_lock += ".rebuild.lock";  // the rebuild lock of earlier versions
    std::filesystem::remove(legacy_lock, ec);

    auto o = options;
    o.store.path = fresh;
    log_run_result result;
    try {
        result = build(o);
    } catch (...) {
        std::filesystem::remove_all(fresh, ec);  // the target was not touched; leave nothing beside it
        if (created) std::filesystem::remove_all(target, ec);  // holds just the lock this run made
        throw;
    }

    // Swap in one rename: the target is the old or the new environment, never a mix.
    crash_point("during_swap");
    if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
        const int e = errno;
        std::filesystem::remove_all(fresh, ec);
        throw std::system_error(e, std::system_category(), "cannot swap " + fresh.string() + " into " + target.string());
    }
    fsync_dir(target.parent_path());
    crash_point("after_swap");
    remove_store_dir(fresh);  // now the previous environment
    return result;
}

consumer_stats difference(const consumer_stats& after, const consumer_stats& before) {
    auto minus = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; };
    consumer_stats d;
    for (std::size_t i = 0; i < outcome_kinds; ++i) d.outcomes[i] = minus(after.outcomes[i], before.outcomes[i]);
    d.released = minus(after.released, before.released);
    d.batches = minus(after.batches, before.batches);
    d.late_events = minus(after.late_events, before.late_events);
    d.id_conflicts = minus(after.id_conflicts, before.id_conflicts);
    d.pruned_ids = minus(after.pruned_ids, before.pruned_ids);
    d.pruned_contributors = minus(after.pruned_contributors, before.pruned_contributors);
    return d;
}

log_run_result consume(const consume_options& options) {
    store s{options.store};
    if (options.setup) options.setup(s);
    const auto before = s.read().stats(options.store.consumer);
    log_run run{s, options};
    auto result = run.run(true, options.follow, options.poll, options.stop);
    result.stats = s.read().stats(options.store.consumer);
    result.run = difference(result.stats, before);
    return result;
}

namespace {

std::uint64_t fnv1a(std::uint64_t h, std::string_view bytes) {
    for (char ch : bytes) {
        auto c = static_cast<unsigned char>(ch);
        h ^= c;
        h *= 0x100000001b3ULL;
    }
    return h;
}

std::string row_bytes(const snapshot::raw_row_view& r) {
    std::string out;
    out.append(std::to_string(r.version)).push_back(' ');
    out.append(std::to_string(r.highest_sequence)).push_back(' ');
    out.append(std::to_string(r.state_version)).push_back(' ');
    out.append(r.state);
    return out;
}

std::string describe_row(const snapshot::raw_row_view& r) {
    return "row '" + std::string(r.key) + "' (version " + std::to_string(r.version) + ")";
}

}  // namespace

comparison compare(const std::filesystem::path& left, const std::filesystem::path& right,
                   const std::vector<std::string>& projections) {
    return compare(snapshot::open(left), left, snapshot::open(right), right, projections);
}

comparison compare(const snapshot& l, const std::filesystem::path& left, const snapshot& r,
                   const std::filesystem::path& right, const std::vector<std::string>& projections) {
    comparison out;
    for (const auto& name : projections) {
        // Both sides in key order, in step: memory stays flat however large the environments.
        projection_digest ld{name, 0, 0xcbf29ce484222325ULL};
        projection_digest rd{name, 0, 0xcbf29ce484222325ULL};
        // A projection without a table (a store that has not written it yet) has no rows.
        auto open_rows = [&](const snapshot& snap) {
            std::optional<snapshot::row_reader> rows;
            try {
                rows.emplace(snap.read_rows(name));
            } catch (const std::system_error& e) {
                if (e.code() != errc::unknown_projection) throw;
            }
            return rows;
        };
        auto lrows = open_rows(l);
        auto rrows = open_rows(r);
        auto next = [](std::optional<snapshot::row_reader>& rows) {
            return rows ? rows->next() : std::optional<snapshot::raw_row_view>{};
        };
        auto a = next(lrows);
        auto b = next(rrows);
        const std::string where = "projection '" + name + "': ";
        auto note = [&](std::string what) {
            if (!out.first_difference) out.first_difference = where + std::move(what);
        };
        while (a || b) {
            if (a && (!b || a->key < b->key)) {
                note(describe_row(*a) + " is only in " + left.string());
            } else if (b && (!a || b->key < a->key)) {
                note(describe_row(*b) + " is only in " + right.string());
            } else {
                const auto lb = row_bytes(*a);
                const auto rb = row_bytes(*b);
                if (lb != rb) {
                    note("row '" + std::string(a->key) + "' differs: " + left.string() + " has version " +
                         std::to_string(a->version) + ", " + right.string() + " has version " +
                         std::to_string(b->version) + (a->version == b->version ? " (states differ)" : ""));
                }
            }
            // Advance the side(s) holding the smaller key, digesting what is passed.
            const bool take_a = a && (!b || a->key <= b->key);
            const bool take_b = b && (!a || b->key <= a->key);
            if (take_a) {
                ld.digest = fnv1a(fnv1a(ld.digest, a->key), row_bytes(*a));
                ++ld.rows;
                a = next(lrows);
            }
            if (take_b) {
                rd.digest = fnv1a(fnv1a(rd.digest, b->key), row_bytes(*b));
                ++rd.rows;
                b = next(rrows);
            }
        }
        out.left.push_back(ld);
        out.right.push_back(rd);
    }
    return out;
}

}  // namespace idem
