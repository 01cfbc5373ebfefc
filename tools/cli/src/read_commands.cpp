// The read commands: `get` and `dump` print rows as JSON, `stats` the consumer's counters,
// checkpoints and their lag. They read one snapshot and never take the writer lock.

#include "commands.hpp"
#include "health_file.hpp"
#include "json_writer.hpp"
#include "log_run.hpp"
#include "options.hpp"
#include "pause_file.hpp"
#include "text.hpp"

#include <idem/sources/partition_layout.hpp>
#include <idem/storage/duration.hpp>
#include <idem/storage/event_log.hpp>
#include <idem/storage/log_position.hpp>
#include <idem/storage/writer_lock.hpp>

#include <algorithm>
#include <cstdio>

namespace idem::cli::detail {

namespace {

/// Writes {"key","version","state"} and a newline.
void row_json(std::string& out, const projection_base& p, const snapshot::raw_row_view& r) {
    json_writer w{out};
    w.begin_object().field("key", r.key).field("version", r.version);
    p.write_json(*p.load(r.state, r.state_version), w.key("state").raw_value());
    w.end_object();
    out += "\n";
}

int get(const tool_context& t, const arguments& a) {
    const auto& p = t.projection_named(a.required("projection"));
    std::filesystem::path db = a.required("db");
    require_store(db);
    auto snap = snapshot::open(db);
    auto r = snap.raw_row(p.name(), a.required("key"));
    if (!r) {
        std::fprintf(stderr, "%s get: projection '%s' has no row '%s'\n", t.name.c_str(), p.name().c_str(),
                     a.required("key").c_str());
        return 1;
    }
    std::string line;
    row_json(line, p, *r);
    print(line);
    return 0;
}

// The environments of the partitions a partitioned instance's directory holds (the list
// `consume --partitions` leaves in it), or nothing if DIR is a store of its own.
std::optional<std::vector<std::string>> owned_partitions(const std::filesystem::path& db) {
    if (std::filesystem::exists(db / "data.mdb")) return std::nullopt;
    auto owned = jetstream::read_owned(db);
    if (!owned) return std::nullopt;
    std::vector<std::string> out;
    for (auto k : *owned) out.push_back(jetstream::partition_directory(k));
    return out;
}

// A partitioned instance: the rows of the partitions it owns (held when it stopped), in key
// order as one store's dump (a key lives in one partition).
int dump_partitions(const projection_base& p, const std::filesystem::path& db, const std::vector<std::string>& parts) {
    std::vector<std::pair<std::string, std::string>> rows;
    for (const auto& part : parts) {
        if (!std::filesystem::exists(db / part / "data.mdb")) continue;  // taken, nothing committed yet
        auto snap = snapshot::open(db / part);
        snap.scan_raw(p.name(), [&](const snapshot::raw_row_view& r) {
            std::string line;
            row_json(line, p, r);
            rows.emplace_back(std::string(r.key), std::move(line));
        });
    }
    std::sort(rows.begin(), rows.end());
    output out;
    for (const auto& r : rows) out.write(r.second);
    out.flush();
    return 0;
}

int dump(const tool_context& t, const arguments& a) {
    const auto& p = t.projection_named(a.required("projection"));
    std::filesystem::path db = a.required("db");
    if (auto parts = owned_partitions(db)) return dump_partitions(p, db, *parts);
    require_store(db);
    auto snap = snapshot::open(db);
    output out;
    std::string line;
    snap.scan_raw(p.name(), [&](const snapshot::raw_row_view& r) {
        line.clear();
        row_json(line, p, r);
        out.write(line);
    });
    out.flush();
    return 0;
}

/// Writes a log checkpoint's "state" (ok, rotated, truncated, replaced, missing) and "lag_bytes".
void write_log_lag(json_writer& w, const std::filesystem::path& log, const std::optional<std::string>& value) {
    if (!value) return;
    try {
        auto check = check_log_position(log, decode_log_position(*value));
        w.field("state", to_string(check.state));
        if (check.state != log_state::missing) w.field("lag_bytes", check.lag_bytes);
        if (check.old_file) w.field("rotated_to", check.old_file->string());
        if (!check.detail.empty()) w.field("detail", check.detail);
    } catch (const std::exception& e) {
        w.field("state", "unreadable").field("detail", e.what());
    }
}

// What the process writing the store says of its health (health_file.hpp), first: state (idle,
// running, stalled, paused; stopped: no process writes it; writing: a writer that keeps no health
// file, a rebuild or a prune) and reason, then its whole report as "health".
void write_state(json_writer& w, const std::filesystem::path& db) {
    const auto writer = writer_of(db);
    if (!writer) {
        w.field("state", "stopped").field("reason", "");
        return;
    }
    const auto& holder = writer->holder;
    const auto& file = writer->health;
    if (!file) {
        w.field("state", "writing").field("reason", "written by " + describe(holder) + ", which reports no health");
        return;
    }
    const auto now_ns = static_cast<std::int64_t>(wall_clock_ns());
    const double age = static_cast<double>(now_ns - file->written_unix_ns) / 1e9;
    // Written every second: a file much older means the process no longer gets to write it.
    if (age > std::max(10.0, 5.0 * static_cast<double>(file->every_ms) / 1000.0)) {
        w.field("state", "stalled")
            .field("reason", "the consumer (" + describe(holder) + ") has not reported its health for " +
                                 fixed(age, 0) + " s (it may hang: a stack trace with gdb -p shows where)");
    } else {
        w.field("state", file->state).field("reason", file->reason);
    }
    w.key("health").raw(file->report);
}

int stats(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    auto snap = snapshot::open(db);
    std::string out;
    json_writer w{out};
    w.begin_object();
    write_state(w, db);
    // An operator's pause (idem pause), whether a consumer runs or not: the next one starts paused.
    if (const auto p = read_pause_file(db)) {
        w.key("pause").begin_object().field("reason", p->reason).field("by", p->by);
        w.field("at", format_utc(static_cast<std::uint64_t>(p->at_unix_ns))).end_object();
    } else {
        w.key("pause").null();
    }
    w.field("consumer", t.consumer).field("commit", snap.commit());
    const auto tables = snap.consumer(t.consumer);
    auto s = tables.stats();
    write_outcomes(w.key("outcomes"), s);
    w.field("batches", s.batches);
    w.field("inbox_size", tables.inbox_size());
    w.field("parked", tables.parked());
    w.field("dead_letters", tables.dead_letter_count());
    auto r = tables.retention();
    w.key("retention").begin_object();
    w.field("event_time_ns", r.event_time);
    w.field("event_time", format_utc(r.event_time));
    w.field("oldest_id_ns", r.oldest.value_or(0));
    // Ages are measured on the consumer's event time (the clock the command line stamps ids by).
    w.field("oldest_id_age_s", r.oldest && r.event_time > *r.oldest ? (r.event_time - *r.oldest) / 1'000'000'000 : 0);
    w.field("inbox_floor_ns", r.inbox_floor);
    w.field("late_events", s.late_events);
    w.field("id_conflicts", s.id_conflicts);
    w.field("transport_collisions", s.transport_collisions);
    w.field("future_events", s.future_events);
    w.field("pruned_ids", s.pruned_ids);
    w.field("pruned_contributors", s.pruned_contributors);
    w.key("contributors").begin_object();
    for (const auto& p : t.projections) w.field(p->name(), snap.projection(p->name()).contributor_entries());
    w.end_object().end_object();
    const auto feed = snap.change_feed();
    w.key("change_feed").begin_object();
    w.field("entries", feed.entries).field("first_commit", feed.first_commit).field("last_commit", feed.last_commit);
    w.field("pruned_through", feed.pruned_through).field("oldest_time_ns", feed.oldest_time_ns);
    w.end_object();
    w.key("checkpoints").begin_array();
    for (const auto& [source, position] : snap.checkpoints(t.consumer)) {
        w.begin_object().field("source", source).field("position", position);
        if (const auto path = log_source_path(source)) {
            write_log_lag(w, *path, snap.checkpoint_value(t.consumer, source));
        }
        w.end_object();
    }
    w.end_array();
    w.key("projections").begin_object();
    for (const auto& p : t.projections) {
        std::uint64_t rows = 0;
        snap.scan_raw(p->name(), [&](const snapshot::raw_row_view&) { ++rows; });
        w.field(p->name(), rows);
    }
    w.end_object().end_object();
    out += "\n";
    print(out);
    return 0;
}

}  // namespace

std::vector<command> read_commands(context_fn t) {
    std::vector<command> out;
    out.push_back(command{
        "get",
        "print one row as JSON: {\"key\",\"version\",\"state\"}",
        {db_option, {"projection", "NAME", "the projection", true}, {"key", "KEY", "the row's aggregate key", true}},
        [t](const arguments& a) { return get(t(), a); }});
    out.push_back(command{
        "dump",
        "print every row of a projection as JSON Lines sorted by key: {\"key\",\"version\",\"state\"}",
        {db_option, {"projection", "NAME", "the projection", true}},
        [t](const arguments& a) { return dump(t(), a); }});
    out.push_back(command{
        "stats",
        "print the consumer's state (idle, running, stalled, paused, stopped) and reason, then its counters as JSON: "
        "health and lag, outcomes, inbox size, dead letters, checkpoints, rows",
        {db_option},
        [t](const arguments& a) { return stats(t(), a); }});
    return out;
}

}  // namespace idem::cli::detail
