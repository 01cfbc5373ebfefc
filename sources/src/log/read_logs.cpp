// The reader thread of a log run: where each log starts (its checkpoint, checked against
// the file now at its path), and reading a file to its end or following it through
// rotations and truncations (docs/LOGS.md, "Event logs").

#include "log_run.hpp"

#include <idem/storage/error.hpp>
#include <idem/storage/reused_buffer.hpp>

#include <thread>

namespace idem::detail {

void log_run::read_logs(bool resume, bool follow) {
    for (std::size_t i = 0; i < options_.logs.size() && !stopping(); ++i) {
        // UINT64_MAX: the whole log (a std::optional here trips GCC's maybe-uninitialized).
        until_ = i < options_.until.size() ? options_.until[i] : UINT64_MAX;
        read_log(options_.logs[i], resume, follow && i + 1 == options_.logs.size());
    }
}

/// Reads one log: with resume, from its checkpoint, first finishing the checkpoint's file if
/// the log was rotated since.
void log_run::read_log(const std::filesystem::path& path, bool resume, bool follow) {
    const std::string source = log_source(path);
    log_position start;
    if (resume) {
        if (auto value = store_.read().checkpoint_value(store_.options().consumer, source)) {
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
                if (check.old_file && !read_file(source, path, *check.old_file, start, follow)) return;
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
void log_run::refuse_unless_restarting(const std::string& detail, const std::string& restart) const {
    if (!restart_changed_logs_) throw_error(errc::log_changed, detail + "; nothing was read. " + restart);
}

void log_run::refuse_unless_restarting(const std::string& detail) const {
    refuse_unless_restarting(detail, "If the log was rewritten on purpose, --restart-changed-log reads it again "
                                     "from offset 0 (the inbox recognizes the events already applied)");
}

/// Whether path exists, waiting for it while following (a rotation's new file may come later).
bool log_run::wait_for(const std::filesystem::path& path, bool follow) {
    while (!try_identity_of(path)) {
        if (!follow || stopping()) return false;
        std::this_thread::sleep_for(poll_);
    }
    return true;
}

/// Reads file (the log at path, or its rotated predecessor) from start. Returns false if
/// the run was abandoned or stopped. A rotated file (a predecessor, or the open file once the
/// path names another while following) is read to its end and committed as finished; while
/// following, only after it has not grown for the rotation grace (its writer may not have
/// reopened the log yet). Then, following, the file at the path is read from its start. A
/// file that no longer holds what was read (truncated, rewritten) is a changed log.
bool log_run::read_file(const std::string& source, const std::filesystem::path& path,
                        const std::filesystem::path& file, log_position start, bool follow) {
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
    // A file that may change while it is read (followed, or rotated and perhaps still written)
    // is checked against what was read before every read and every hand-over.
    const bool watched = ro.follow;
    log_reader reader{file, ro};
    std::filesystem::path open_file = file;
    if (start.file && !reader.still_holds(start)) {
        throw_error(errc::log_changed, file.string() + ": changed while it was being opened at offset " +
                                           std::to_string(start.offset) + "; run again");
    }
    bool lines_known = start.offset == 0;  // after a resume only byte offsets are known
    std::uint64_t counted = reader.position();
    log_position last = start;           // the position handed over last (or the start)
    std::optional<std::string> changed;  // what happened to the open file, once it no longer holds what was read

    // Whether the open file still holds the bytes before `last` (else `changed` says how not).
    auto unchanged = [&]() {
        if (!watched) return true;
        auto check = reader.check(last);
        if (check.state == log_state::ok) return true;
        changed = check.detail;
        return false;
    };
    auto hand_over_read = [&](bool finished) {
        bytes_read_ += reader.position() - counted;
        counted = reader.position();
        if (options_.health) {
            const auto size = reader.size();
            options_.health->source(source, size > reader.position() ? size - reader.position() : 0, "bytes");
        }
        if (used_ == 0 && !finished) return true;
        // The new position is taken first, then the file is checked against the previous
        // one: a rewrite before the check is seen now (the records may be of the new bytes,
        // at an offset that means nothing there), a rewrite after it by the next check
        // (this position's digest is of the bytes read).
        auto next = reader.try_where();
        if (watched && (!unchanged() || !next)) {
            if (!changed) {
                changed = open_file.string() + ": read to offset " + std::to_string(reader.position()) +
                          ", the file is now " + std::to_string(reader.size()) +
                          " bytes (truncated, e.g. copytruncate)";
            }
            used_ = 0;  // not applied: their bytes may be the new content's
            return true;
        }
        if (!next) next = reader.where();  // throws, naming the file
        last = *next;
        last.finished = finished;
        return hand_over(source, last, finished);
    };
    // Leaves the open file (left_behind: finished after a rotation) and reads the file now at
    // the log's path from offset 0: after a truncation or rewrite, or a rotation.
    auto reopen_at_path = [&](bool left_behind) {
        note_done(reader, open_file, left_behind);
        ro.start = 0;
        ro.follow = follow;
        reader = log_reader{path, ro};
        open_file = path;
        lines_known = true;
        counted = reader.position();
        last = {};
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
            assign_reused(d.body, record.body);  // the slot held an earlier batch's record
            assign_reused(d.attributes, record.attributes);
            d.message_id.clear();
            d.transport.assign(transport);  // the log's msgids count within its origin
            d.line = lines_known ? record.line : 0;
            d.offset = record.offset;
            ++records_read_;
            if (used_ == batch_.size()) {
                if (!hand_over_read(false)) return false;
                // Ctrl-C: stop at a batch boundary, its checkpoint committed; a pause waits there.
                if (changed || stopping() || (follow && paused())) return true;
            }
        }
        return true;
    };
    // A rotated file, following: finished once it has not grown for the rotation grace.
    bool rotated = predecessor;
    std::uint64_t rotated_size = reader.size();
    auto grace_ends = clock::now() + rotation_grace_;
    for (;;) {
        // idem pause: wait at a batch boundary (saying so, and what waits); stopped while
        // paused, read nothing more.
        while (follow && paused() && !stopping()) {
            options_.health->pause_taken();
            const auto size = reader.size();
            options_.health->source(source, size > reader.position() ? size - reader.position() : 0, "bytes");
            std::this_thread::sleep_for(poll_);
        }
        if (follow && paused()) break;
        if (!changed && unchanged()) {
            try {
                if (!read_available() || !hand_over_read(false)) return false;
            } catch (const std::system_error&) {
                // A rewritten binary log read at the old offset is a corrupt record: say what happened.
                if (unchanged()) throw;
                used_ = 0;
            }
        }
        if (changed) {
            refuse_unless_restarting(*changed);
            changed.reset();
            used_ = 0;
            if (open_file != path) {  // a rotated predecessor: the caller reads the path's file next
                note_done(reader, open_file, false);
                return !stopping();
            }
            reopen_at_path(false);
            rotated = false;
            continue;
        }
        if (stopping() || at_limit) break;
        if (rotated) {
            const auto size = reader.size();
            if (size != rotated_size) {
                rotated_size = size;
                grace_ends = clock::now() + rotation_grace_;
            }
            if (!follow || clock::now() >= grace_ends) {
                if (!hand_over_read(true)) return false;
                if (changed) continue;
                if (open_file != path) break;
                reopen_at_path(true);
                rotated = false;
                continue;
            }
        } else {
            if (!follow) break;
            auto at_path = try_identity_of(path);
            if (at_path && *at_path != reader.identity()) {
                // Rotated (or deleted and created anew): drain the open file until it is finished.
                rotated = true;
                rotated_size = reader.size();
                grace_ends = clock::now() + rotation_grace_;
                continue;
            }
        }
        std::this_thread::sleep_for(poll_);
    }
    note_done(reader, open_file, open_file != path && !stopping());
    return !stopping();
}

/// Counts what a reader skipped and the torn tail it found; left_behind: the file was
/// finished after a rotation, so an incomplete last record in it will not be read.
void log_run::note_done(const log_reader& reader, const std::filesystem::path& file, bool left_behind) {
    std::lock_guard lock{mutex_};
    result_.skipped += reader.skipped();
    if (auto torn = reader.torn_tail()) {
        result_.torn.push_back({file, *torn, reader.torn_detail()});
    } else if (left_behind && reader.size() > reader.position()) {
        result_.torn.push_back({file, reader.position(),
                                "the last record of a rotated file is incomplete: not applied"});
    }
}

}  // namespace idem::detail
