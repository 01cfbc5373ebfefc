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
                    until_ = i < options_.until.size() ? options_.until[i] : UINT64_MAX;
                    read_log(options_.logs[i], resume, follow && i + 1 == options_.logs.size());
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

    /// Reads a log that changed under its checkpoint again from offset 0 instead of failing.
    void restart_changed_logs(bool yes) { restart_changed_logs_ = yes; }

private:
    struct pending {
        prepared_batch batch;
        checkpoint at;
        std::uint64_t records = 0;  // records read so far, including this batch
        std::uint64_t bytes = 0;    // bytes read so far, including this batch
        bool finishes_file = false; // ends a rotated file: the next batch starts the log's new file
    };

    bool stopping() const { return (stop_ != nullptr && stop_->load()) || abandoned_.load(); }

    // --- the reader thread ------------------------------------------------------------

    /// Reads one log: with resume, from its checkpoint, first finishing the checkpoint's file if
    /// the log was rotated since (docs/DESIGN.md, "Event logs").
    void read_log(const std::filesystem::path& path, bool resume, bool follow) {
        const std::string source = log_source(path);
        log_position start;
        if (resume) {
            if (auto value = snapshot{store_.env()}.checkpoint_value(store_.options().consumer, source)) {
                start = decode_log_position(*value);
                auto check = check_log_position(path, start);
                switch (check.state) {
                case log_state::ok:
                case log_state::missing: break;  // missing: opening it fails, naming it
                case log_state::truncated:
                case log_state::replaced:
                    refuse_unless_restarting(check.detail);
                    start = {};
                    break;
                case log_state::rotated:
                    if (!check.later_rotations.empty()) {
                        refuse_unless_restarting(check.detail, "Consume those with --log first (oldest first), "
                                                               "then --restart-changed-log finishes the old file "
                                                               "and reads the log's current file from its start");
                    }
                    // Without old_file the old file was finished by an earlier run, and is gone now.
                    if (check.old_file && !read_file(source, path, *check.old_file, start, false)) return;
                    if (stopping() || !wait_for(path, follow)) return;
                    start = {};
                    break;
                }
            }
        }
        read_file(source, path, path, start, follow);
    }

    /// Throws errc::log_changed with detail and what --restart-changed-log would do, unless the
    /// run may go on that way.
    void refuse_unless_restarting(const std::string& detail,
                                  const std::string& restart = "If the log was rewritten on purpose, "
                                                               "--restart-changed-log reads it again from offset 0 "
                                                               "(the inbox recognizes the events already applied)")
        const {
        if (!restart_changed_logs_) throw_error(errc::log_changed, detail + "; nothing was read. " + restart);
    }

    /// Whether path exists, waiting for it while following (a rotation's new file may come later).
    bool wait_for(const std::filesystem::path& path, bool follow) {
        while (!try_identity_of(path)) {
            if (!follow || stopping()) return false;
            std::this_thread::sleep_for(poll_);
        }
        return true;
    }

    /// Reads file (the log at path, or its rotated predecessor) from start. Returns false if
    /// the run was abandoned or stopped. A rotated predecessor (file != path) is read to its
    /// end and committed as finished. Following, a path that comes to name another file is a
    /// rotation: the open file is finished, then the new one read from its start; a file that
    /// no longer holds what was read (truncated, rewritten) is a changed log.
    bool read_file(const std::string& source, const std::filesystem::path& path, const std::filesystem::path& file,
                   log_position start, bool follow) {
        const bool predecessor = file != path;
        const std::string transport = options_.transport ? *options_.transport : log_transport(path);
        log_reader_options ro;
        ro.skip_bad = options_.skip_bad;
        ro.follow = follow;
        ro.start = start.offset;
        ro.format = options_.format;
        // A rotated file is finished by a reader that does not take an incomplete last record
        // (the writer may still be writing to it); it is reported as torn below.
        if (predecessor) ro.follow = true;
        log_reader reader{file, ro};
        if (start.file && !reader.still_holds(start)) {
            throw_error(errc::log_changed, file.string() + ": changed while it was being opened at offset " +
                                               std::to_string(start.offset) + "; run again");
        }
        bool lines_known = start.offset == 0;  // after a resume only byte offsets are known
        std::uint64_t counted = reader.position();
        log_position last = start;
        auto hand_over_read = [&](bool finished) {
            bytes_read_ += reader.position() - counted;
            counted = reader.position();
            if (used_ == 0 && !finished) return true;
            last = reader.where();
            last.finished = finished;
            return hand_over(source, last, finished);
        };
        bool at_limit = false;  // a prefix of the log (until_): the rest is not read
        auto read_available = [&]() {
            log_record record;
            while (reader.next(record)) {
                if (record.end > until_) {
                    at_limit = true;  // a prefix of the log: the rest is not read
                    break;
                }
                auto& d = batch_[used_++];
                d.body.assign(record.body);
                d.message_id.clear();
                d.transport.assign(transport);  // the log's msgids count within its origin
                d.line = lines_known ? record.line : 0;
                d.offset = record.offset;
                ++records_read_;
                if (used_ == batch_.size()) {
                    if (!hand_over_read(false)) return false;
                    if (stopping()) return true;  // Ctrl-C: stop at a batch boundary, its checkpoint committed
                }
            }
            return true;
        };
        for (;;) {
            if (!read_available() || !hand_over_read(false)) return false;
            if (stopping() || at_limit) break;
            if (predecessor) {
                if (!hand_over_read(true)) return false;
                break;
            }
            if (!follow) break;
            if (!reader.still_holds(last)) {
                std::string detail = file.string() + ": followed to offset " + std::to_string(last.offset) +
                                     ", the file is now " + std::to_string(reader.size()) + " bytes " +
                                     (reader.size() < last.offset ? "(truncated, e.g. copytruncate)"
                                                                  : "and the bytes before the offset changed "
                                                                    "(rewritten in place)");
                refuse_unless_restarting(detail);
                note_done(reader, file, false);
                ro.start = 0;
                reader = log_reader{path, ro};
                lines_known = true;
                counted = reader.position();
                last = {};
                continue;
            }
            auto at_path = try_identity_of(path);
            if (at_path && *at_path != reader.identity()) {
                // Rotated (or deleted and created anew): finish the open file, then take the new one.
                if (!read_available()) return false;
                if (stopping()) break;
                if (!hand_over_read(true)) return false;
                note_done(reader, file, true);
                ro.start = 0;
                reader = log_reader{path, ro};
                lines_known = true;
                counted = reader.position();
                last = {};
                continue;
            }
            std::this_thread::sleep_for(poll_);
        }
        note_done(reader, file, predecessor && !stopping());
        return !stopping();
    }

    /// Counts what a reader skipped and the torn tail it found; left_behind: the file was
    /// finished after a rotation, so an incomplete last record in it will not be read.
    void note_done(const log_reader& reader, const std::filesystem::path& file, bool left_behind) {
        std::lock_guard lock{mutex_};
        result_.skipped += reader.skipped();
        if (auto torn = reader.torn_tail()) {
            result_.torn.push_back({file, *torn, reader.torn_detail()});
        } else if (left_behind && reader.size() > reader.position()) {
            result_.torn.push_back({file, reader.position(),
                                    "the last record of a rotated file is incomplete: not applied"});
        }
    }

    /// Prepares the records read so far and queues them; false if the run was abandoned.
    /// finished: the batch ends its file, which a rotation left behind (committed even if empty).
    bool hand_over(const std::string& source, const log_position& position, bool finished = false) {
        if (used_ == 0 && !finished) return true;
        pending p;
        {
            std::lock_guard lock{mutex_};
            if (!recycled_.empty()) {
                p.batch = std::move(recycled_.back());
                recycled_.pop_back();
            }
        }
        store_.prepare(std::span<const delivery>(batch_.data(), used_), p.batch);
        p.at = checkpoint{source, position.offset, encode_log_position(position).substr(8)};
        p.finishes_file = finished;
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
            if (p.finishes_file) crash_point("after_rotated_log");
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
    bool restart_changed_logs_ = false;
    std::chrono::milliseconds poll_{100};
    clock::time_point started_ = clock::now();

    // Reader thread only.
    std::uint64_t until_ = UINT64_MAX;  // the log being read is read up to this offset (verify's prefix builds)
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

std::string log_transport(const std::filesystem::path& log) {
    // The file name without rotation suffixes ("events.jsonl.3", "events.jsonl-20261203"): the
    // rotations of one log are one origin, whichever directory the files are read from.
    std::string name = log.filename().string();
    for (;;) {
        const auto cut = name.find_last_of(".-");
        if (cut == std::string::npos || cut == 0 || cut + 1 == name.size()) break;
        const auto tail = std::string_view(name).substr(cut + 1);
        if (!std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; })) break;
        name.resize(cut);
    }
    return name;
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
    run.restart_changed_logs(options.restart_changed_logs);
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
