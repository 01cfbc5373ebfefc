#include <idem/cli/tool.hpp>

#include "commands.hpp"
#include "map_fault.hpp"
#include "store_check.hpp"

#include <idem/engine/offline.hpp>
#include <idem/storage/duration.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>
#include <idem/storage/store_dir.hpp>

#include <simdjson.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <iostream>

namespace idem::cli {

namespace {

std::atomic<bool> stop_requested{false};

extern "C" void on_stop_signal(int) { stop_requested.store(true); }

/// For the life of a command: the first Ctrl-C or SIGTERM sets stop_requested (a consume stops
/// after the batch in hand, a rebuild or a wait for the writer lock gives up); a second one ends
/// the process the default way. The caller's handlers are restored afterwards.
class stop_signals {
public:
    stop_signals() {
        stop_requested.store(false);
        struct sigaction sa{};
        sa.sa_handler = on_stop_signal;
        sa.sa_flags = static_cast<int>(SA_RESETHAND);
        ::sigaction(SIGINT, &sa, &old_int_);
        ::sigaction(SIGTERM, &sa, &old_term_);
    }
    ~stop_signals() {
        ::sigaction(SIGINT, &old_int_, nullptr);
        ::sigaction(SIGTERM, &old_term_, nullptr);
    }
    stop_signals(const stop_signals&) = delete;
    stop_signals& operator=(const stop_signals&) = delete;

private:
    struct sigaction old_int_{};
    struct sigaction old_term_{};
};

std::string with_commas(std::uint64_t n) {
    auto digits = std::to_string(n);
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i != 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
        out.push_back(digits[i]);
    }
    return out;
}

std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

/// A progress bar on stderr when it is a terminal; nothing otherwise.
class progress_bar {
public:
    explicit progress_bar(std::string label) : label_(std::move(label)), tty_(::isatty(STDERR_FILENO) == 1) {}

    void update(const log_progress& p) {
        if (!tty_) return;
        auto now = std::chrono::steady_clock::now();
        if (now - last_ < std::chrono::milliseconds(200) && p.bytes < p.total_bytes) return;
        last_ = now;
        const double s = std::max(seconds(p.elapsed), 1e-9);
        const double fraction = p.total_bytes == 0 ? 1.0 : std::min(1.0, double(p.bytes) / double(p.total_bytes));
        constexpr int width = 30;
        auto filled = static_cast<int>(fraction * width);
        std::string bar(static_cast<std::size_t>(filled), '#');
        bar.append(static_cast<std::size_t>(width - filled), '.');
        const double rate = double(p.records) / s;
        const double bytes_rate = double(p.bytes) / s;
        std::string eta = "-";
        if (bytes_rate > 0 && p.total_bytes >= p.bytes) {
            eta = fixed(double(p.total_bytes - p.bytes) / bytes_rate, 0) + "s";
        }
        std::fprintf(stderr, "\r%s [%s] %3.0f%%  %s events  %s events/s  ETA %s   ", label_.c_str(), bar.c_str(),
                     fraction * 100, with_commas(p.records).c_str(), with_commas(std::uint64_t(rate)).c_str(),
                     eta.c_str());
        std::fflush(stderr);
        drawn_ = true;
    }
    void finish() {
        if (drawn_) std::fputs("\n", stderr);
        drawn_ = false;
    }

private:
    std::string label_;
    bool tty_;
    bool drawn_ = false;
    std::chrono::steady_clock::time_point last_{};
};

void append_kv(std::string& out, std::string_view key, std::uint64_t v, bool comma = true) {
    if (comma) out.push_back(',');
    append_json_string(out, key);
    out.push_back(':');
    out.append(std::to_string(v));
}

/// Appends a log checkpoint's "state" (ok, rotated, truncated, replaced, missing) and "lag_bytes".
void append_log_lag(std::string& out, const std::filesystem::path& log, const std::optional<std::string>& value) {
    if (!value) return;
    try {
        auto check = check_log_position(log, decode_log_position(*value));
        out += ",\"state\":";
        append_json_string(out, to_string(check.state));
        if (check.state != log_state::missing) append_kv(out, "lag_bytes", check.lag_bytes);
        if (check.old_file) {
            out += ",\"rotated_to\":";
            append_json_string(out, check.old_file->string());
        }
        if (!check.detail.empty()) {
            out += ",\"detail\":";
            append_json_string(out, check.detail);
        }
    } catch (const std::exception& e) {
        out += ",\"state\":\"unreadable\",\"detail\":";
        append_json_string(out, e.what());
    }
}

std::string outcomes_json(const consumer_stats& s) {
    std::string out = "{";
    for (std::size_t i = 0; i < outcome_kinds; ++i) {
        append_kv(out, to_string(static_cast<outcome_kind>(i)), s.outcomes[i], i != 0);
    }
    append_kv(out, "released", s.released);
    out.push_back('}');
    return out;
}

std::string run_json(const log_run_result& r) {
    std::string out = "{";
    append_kv(out, "records", r.records, false);
    append_kv(out, "skipped", r.skipped);
    out += ",\"seconds\":" + fixed(seconds(r.elapsed), 3);
    out += ",\"events_per_second\":" + std::to_string(std::uint64_t(double(r.records) / std::max(seconds(r.elapsed), 1e-9)));
    out += ",\"outcomes\":" + outcomes_json(r.stats);  // the store's totals (as before this_run existed)
    out += ",\"this_run\":" + outcomes_json(r.run);
    out += ",\"store_totals\":" + outcomes_json(r.stats);
    out += ",\"torn\":[";
    for (std::size_t i = 0; i < r.torn.size(); ++i) {
        if (i != 0) out.push_back(',');
        out += "{\"log\":";
        append_json_string(out, r.torn[i].log.string());
        append_kv(out, "offset", r.torn[i].offset);
        out += ",\"detail\":";
        append_json_string(out, r.torn[i].detail);
        out.push_back('}');
    }
    out += "]}\n";
    return out;
}

std::string outcomes_text(const consumer_stats& s) {
    auto at = [&](outcome_kind k) { return with_commas(s.outcomes[static_cast<std::size_t>(k)]); };
    return "applied " + at(outcome_kind::applied) + ", duplicate message " + at(outcome_kind::duplicate_message) +
           ", duplicate event " + at(outcome_kind::duplicate_event) + ", parked " + at(outcome_kind::parked) +
           " (released " + with_commas(s.released) + "), dead-lettered " + at(outcome_kind::dead_lettered) +
           ", ignored " + at(outcome_kind::ignored);
}

std::string summary_line(std::string_view what, const log_run_result& r) {
    std::string line = std::string(what) + ": " + with_commas(r.records) + " events in " + fixed(seconds(r.elapsed), 2) +
                       " s (" + with_commas(std::uint64_t(double(r.records) / std::max(seconds(r.elapsed), 1e-9))) +
                       " events/s); this run: " + outcomes_text(r.run) + "; store totals: " + outcomes_text(r.stats);
    if (r.skipped != 0) line += ", " + with_commas(r.skipped) + " corrupt records skipped";
    for (const auto& t : r.torn) {
        line += "\n  " + t.log.string() + ": incomplete last record at offset " + std::to_string(t.offset) +
                " not applied (" + t.detail + ")";
    }
    return line;
}

/// Prints a run's summary line on stderr and its JSON on stdout; returns the exit status.
int report_run(const std::string& what, const log_run_result& r) {
    std::fprintf(stderr, "%s\n", summary_line(what, r).c_str());
    output out;
    out.write(run_json(r));
    out.flush();
    return 0;
}

std::optional<log_format> parse_format(const arguments& a) {
    auto v = a.get("format");
    if (!v) return std::nullopt;
    if (*v == "jsonl") return log_format::jsonl;
    if (*v == "binary") return log_format::binary;
    throw usage_error("option '--format': '" + *v + "' is neither jsonl nor binary");
}

durability parse_durability(const arguments& a) {
    auto v = a.get("durability").value_or("full");
    if (v == "full") return durability::full;
    if (v == "periodic") return durability::periodic;
    if (v == "none") return durability::none;
    throw usage_error("option '--durability': '" + v + "' is not full, periodic or none");
}

void require_environment(const std::filesystem::path& db) {
    if (!std::filesystem::exists(db / "data.mdb")) {
        throw std::system_error(ENOENT, std::system_category(), db.string() + ": no idem environment here");
    }
}

const option db_option{"db", "DIR", "the LMDB environment directory", true, false};
const option log_option{"log", "FILE", "an event log (JSON Lines or binary); repeat for several, read in order", true,
                        true};
const option format_option{"format", "jsonl|binary", "the logs' format (default: detected from each file)"};
const option skip_bad_option{"skip-bad", "", "skip corrupt records of binary logs and count them"};
const option batch_option{"batch", "N", "events per write transaction"};
const option wait_option{"wait", "",
                         "if another process writes the store, wait until it is done (Ctrl-C gives up) instead "
                         "of refusing at once"};
const option inbox_retention_option{"inbox-retention", "D",
                                    "prune inbox ids older than D of event time as the run goes (7d, 1h, 90m)"};
const option lateness_option{"allowed-lateness", "D",
                             "prune effect keys older than the highest event time minus D; older unsequenced "
                             "events are dead-lettered as late_event"};

const option transport_option{"transport", "NAME",
                              "the transport the logs' msgids belong to (default: each log's file name without "
                              "rotation suffixes); a consume continuing a rebuild's inbox needs the same"};
const option future_skew_option{"max-future-skew", "D",
                                "with a horizon, events more than D ahead of the event time are dead-lettered as "
                                "future_event unless 3 agree (default 24h; 0 to switch off)"};
const option resend_option{"resend-within", "D",
                           "the logs re-send events under new ids and times up to D later: refuse an "
                           "--allowed-lateness shorter than that"};

std::optional<std::chrono::nanoseconds> duration_option(const arguments& a, std::string_view name) {
    auto v = a.get(name);
    if (!v) return std::nullopt;
    auto d = parse_duration(*v);
    if (!d) throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not a duration (7d, 1h, 90m, 30s)");
    return d;
}

/// Logs are read on their own clock: retention ages are event time, so a rebuild is deterministic.
void retention_from(const arguments& a, store_options& o) {
    o.retention.clock = retention_clock::event;
    if (auto d = duration_option(a, "inbox-retention")) o.retention.inbox_retention = d;
    if (auto d = duration_option(a, "allowed-lateness")) o.retention.allowed_lateness = d;
    if (auto d = duration_option(a, "max-future-skew")) {
        o.retention.max_future_skew = d->count() > 0 ? d : std::nullopt;
    }
    if (auto d = duration_option(a, "resend-within")) o.retention.resend_within = d;
    const auto& r = o.retention;
    if (r.resend_within && r.allowed_lateness && *r.allowed_lateness < *r.resend_within) {
        throw usage_error("option '--allowed-lateness': " + format_duration(*r.allowed_lateness) +
                          " is shorter than the logs' re-send delay of " + format_duration(*r.resend_within) +
                          " (--resend-within): a re-sent event could be applied twice");
    }
}

}  // namespace

struct tool::impl {
    std::string name;
    std::string consumer = "idem";
    std::vector<std::shared_ptr<const projection_base>> projections;
    std::vector<std::function<void(store&)>> installers;
    std::function<void(store_options&)> configure;
    std::vector<command> commands;

    store_options store_for(const std::filesystem::path& db) const {
        store_options o;
        o.path = db;
        o.consumer = consumer;
        o.unknown_types = unknown_type_policy::dead_letter;
        if (configure) configure(o);
        return o;
    }
    std::function<void(store&)> setup() const {
        return [this](store& s) {
            for (const auto& install : installers) install(s);
        };
    }
    const projection_base& projection_named(const std::string& n) const {
        for (const auto& p : projections) {
            if (p->name() == n) return *p;
        }
        std::string known;
        for (const auto& p : projections) known += (known.empty() ? "" : ", ") + p->name();
        throw usage_error("no projection named '" + n + "' (this tool has: " + known + ")");
    }
    std::vector<std::string> projection_names() const {
        std::vector<std::string> out;
        for (const auto& p : projections) out.push_back(p->name());
        return out;
    }

    void row_json(std::string& out, const projection_base& p, const snapshot::raw_row_view& r) const {
        out += "{\"key\":";
        append_json_string(out, r.key);
        append_kv(out, "version", r.version);
        out += ",\"state\":";
        p.write_json(*p.load(r.state, r.state_version), out);
        out += "}\n";
    }

    /// Fills what rebuild, consume and verify share from their options: the store at db, the
    /// logs and their format, the projections, the batch size, and progress shown on bar.
    void log_run_from(const arguments& a, const std::filesystem::path& db, log_run_options& o,
                      progress_bar& bar) const {
        o.store = store_for(db);
        for (const auto& l : a.all("log")) o.logs.emplace_back(l);
        o.setup = setup();
        o.format = parse_format(a);
        o.skip_bad = a.flag("skip-bad");
        o.batch = static_cast<std::size_t>(a.positive("batch", o.batch));
        o.progress = [&bar](const log_progress& p) { bar.update(p); };
        o.stop = &stop_requested;
        o.store.wait_for_writer = writer_wait(a, db);
        if (auto t = a.get("transport")) o.transport = *t;
        retention_from(a, o.store);
    }

    /// With --wait, a lock_wait that says once on stderr who holds db and gives up on Ctrl-C;
    /// without it, none (a store another process writes is refused at once).
    lock_wait writer_wait(const arguments& a, const std::filesystem::path& db) const {
        if (!a.flag("wait")) return {};
        auto told = std::make_shared<bool>(false);
        return [told, db, tool_name = name](const lock_holder& holder) {
            if (!*told) {
                std::fprintf(stderr, "%s: waiting for %s: it is being written by %s (Ctrl-C to give up)\n",
                             tool_name.c_str(), db.c_str(), describe(holder).c_str());
                *told = true;
            }
            return !stop_requested.load();
        };
    }

    detail::tool_context context() const {
        detail::tool_context t;
        t.name = name;
        t.consumer = consumer;
        t.projections = projections;
        t.store_for = [this](const std::filesystem::path& db) { return store_for(db); };
        t.setup = setup();
        t.writer_wait = [this](const arguments& a, const std::filesystem::path& db) { return writer_wait(a, db); };
        return t;
    }

    void add_builtin_commands();
    int why(const arguments& a) const { return detail::why(context(), a); }
    int usage(std::FILE* to) const;
    int help(const command& c, std::FILE* to) const;
};

void tool::impl::add_builtin_commands() {
    commands.push_back(command{
        "rebuild",
        "build every projection from event logs into a fresh environment, then swap it in atomically",
        {db_option, log_option, format_option, skip_bad_option, batch_option,
         {"memory", "MB", "rows are aggregated in memory up to about this much, then written (default 1024)"},
         wait_option, inbox_retention_option, lateness_option, transport_option, future_skew_option, resend_option},
        [this](const arguments& a) {
            stop_signals signals;
            rebuild_options o;
            progress_bar bar{"rebuild"};
            log_run_from(a, a.required("db"), o, bar);
            const auto mb = a.number("memory", 1024);  // 0: rows are written after every batch
            if (mb > (std::uint64_t{1} << 40)) throw usage_error("option '--memory': " + std::to_string(mb) + " MB is too large");
            o.memory_budget = static_cast<std::size_t>(mb) << 20;
            auto r = rebuild(o);
            bar.finish();
            return report_run("rebuilt " + o.store.path.string(), r);
        }});
    commands.push_back(command{
        "consume",
        "apply event logs through the live path, resumable: the log offset is committed with each batch",
        {db_option, log_option, format_option, skip_bad_option, batch_option,
         {"follow", "", "keep tailing the last log for appended events (stop with Ctrl-C or SIGTERM)"},
         {"restart-changed-log", "",
          "read a log truncated or rewritten under its checkpoint again from offset 0 (the inbox drops what was "
          "applied) instead of stopping with exit 2"},
         {"durability", "full|periodic|none", "fsync policy (default full: a commit is on disk before the next)"},
         {"journal-rows", "N",
          "changed rows are journaled and folded into the row table once N are journaled (default: automatic)"},
         wait_option, inbox_retention_option, lateness_option, transport_option, future_skew_option, resend_option},
        [this](const arguments& a) {
            consume_options o;
            progress_bar bar{"consume"};
            o.batch = 1000;  // the live path commits (and syncs) more often than a rebuild
            log_run_from(a, a.required("db"), o, bar);
            o.store.sync = parse_durability(a);
            o.store.journal_rows = static_cast<std::size_t>(a.number("journal-rows", 0));
            o.follow = a.flag("follow");
            o.restart_changed_logs = a.flag("restart-changed-log");
            stop_signals signals;
            auto r = consume(o);
            bar.finish();
            return report_run("consumed into " + o.store.path.string(), r);
        }});
    commands.push_back(command{
        "get",
        "print one row as JSON: {\"key\",\"version\",\"state\"}",
        {db_option, {"projection", "NAME", "the projection", true}, {"key", "KEY", "the row's aggregate key", true}},
        [this](const arguments& a) {
            const auto& p = projection_named(a.required("projection"));
            std::filesystem::path db = a.required("db");
            require_environment(db);
            auto snap = snapshot::open(db);
            auto r = snap.raw_row(p.name(), a.required("key"));
            if (!r) {
                std::fprintf(stderr, "%s get: projection '%s' has no row '%s'\n", name.c_str(), p.name().c_str(),
                             a.required("key").c_str());
                return 1;
            }
            std::string line;
            row_json(line, p, *r);
            output out;
            out.write(line);
            out.flush();
            return 0;
        }});
    commands.push_back(command{
        "dump",
        "print every row of a projection as JSON Lines sorted by key: {\"key\",\"version\",\"state\"}",
        {db_option, {"projection", "NAME", "the projection", true}},
        [this](const arguments& a) {
            const auto& p = projection_named(a.required("projection"));
            std::filesystem::path db = a.required("db");
            require_environment(db);
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
        }});
    commands.push_back(command{
        "stats",
        "print the consumer's counters as JSON: outcomes, inbox size, dead letters, checkpoints and lag, rows",
        {db_option},
        [this](const arguments& a) {
            std::filesystem::path db = a.required("db");
            require_environment(db);
            auto snap = snapshot::open(db);
            std::string out = "{\"consumer\":";
            append_json_string(out, consumer);
            append_kv(out, "commit", snap.commit());
            auto s = snap.stats(consumer);
            out += ",\"outcomes\":" + outcomes_json(s);
            append_kv(out, "batches", s.batches);
            append_kv(out, "inbox_size", snap.inbox_size(consumer));
            append_kv(out, "parked", snap.parked(consumer));
            append_kv(out, "dead_letters", snap.dead_letter_count(consumer));
            auto r = snap.retention(consumer);
            out += ",\"retention\":{";
            append_kv(out, "event_time_ns", r.event_time, false);
            out += ",\"event_time\":";
            append_json_string(out, format_utc(r.event_time));
            append_kv(out, "oldest_id_ns", r.oldest.value_or(0));
            // Ages are measured on the consumer's event time (the clock the command line stamps ids by).
            append_kv(out, "oldest_id_age_s", r.oldest && r.event_time > *r.oldest ? (r.event_time - *r.oldest) / 1'000'000'000 : 0);
            append_kv(out, "inbox_floor_ns", r.inbox_floor);
            append_kv(out, "late_events", s.late_events);
            append_kv(out, "id_conflicts", s.id_conflicts);
            append_kv(out, "transport_collisions", s.transport_collisions);
            append_kv(out, "future_events", s.future_events);
            append_kv(out, "pruned_ids", s.pruned_ids);
            append_kv(out, "pruned_contributors", s.pruned_contributors);
            out += ",\"contributors\":{";
            bool first_p = true;
            for (const auto& p : projections) {
                append_kv(out, p->name(), snap.contributor_entries(p->name()), !first_p);
                first_p = false;
            }
            out += "}}";
            out += ",\"checkpoints\":[";
            bool first = true;
            for (const auto& [source, position] : snap.checkpoints(consumer)) {
                if (!first) out.push_back(',');
                first = false;
                out += "{\"source\":";
                append_json_string(out, source);
                append_kv(out, "position", position);
                if (source.starts_with("log:")) append_log_lag(out, source.substr(4), snap.checkpoint_value(consumer, source));
                out.push_back('}');
            }
            out += "],\"projections\":{";
            first = true;
            for (const auto& p : projections) {
                std::uint64_t rows = 0;
                snap.scan_raw(p->name(), [&](const snapshot::raw_row_view&) { ++rows; });
                append_kv(out, p->name(), rows, !first);
                first = false;
            }
            out += "}}\n";
            output o;
            o.write(out);
            o.flush();
            return 0;
        }});
    commands.push_back(command{
        "deadletters",
        "print the dead letters as JSON Lines: position, reason, detail, message id, time, and the event",
        {db_option, {"reason", "R", "only dead letters with this reason"},
         {"collisions", "", "instead, the transport collisions: deliveries under a transport id another event had "
                            "used, each judged as a new message (its outcome in the detail)"}},
        [this](const arguments& a) {
            std::filesystem::path db = a.required("db");
            std::optional<reason> only;
            if (auto r = a.get("reason")) {
                only = reason_from_string(*r);
                if (!only) {
                    std::string known;
                    for (auto k : dead_letter_reasons()) known += (known.empty() ? "" : ", ") + std::string(to_string(k));
                    throw usage_error("option '--reason': '" + *r + "' is not a reason (" + known + ")");
                }
            }
            require_environment(db);
            auto snap = snapshot::open(db);
            simdjson::dom::parser parser;
            output out;
            std::string line;
            std::string compact;
            for (const auto& d : a.flag("collisions") ? snap.collisions(consumer) : snap.dead_letters(consumer)) {
                if (only && d.why != *only) continue;
                line = "{";
                append_kv(line, "position", d.position, false);
                line += ",\"reason\":";
                append_json_string(line, to_string(d.why));
                line += ",\"detail\":";
                append_json_string(line, d.detail);
                line += ",\"message_id\":";
                // Stored ids carry a namespace: 'm' transport id, 't' transport id of a named transport, 'e' event id.
                const auto [transport, id] = split_message_id(d.message_id);
                append_json_string(line, id);
                if (!transport.empty()) {
                    line += ",\"transport\":";
                    append_json_string(line, transport);
                }
                append_kv(line, "time_ns", d.time_ns);
                append_kv(line, "size", d.body_size);
                if (d.truncated) {
                    // Only the first bytes were kept: the body is a prefix, never parsed as the event.
                    line += ",\"truncated\":true";
                    append_kv(line, "kept", d.body.size());
                    char hex[32];
                    std::snprintf(hex, sizeof hex, "%016" PRIx64, d.body_digest);
                    line += ",\"digest\":\"fnv1a64:" + std::string(hex) + "\",\"body_prefix\":";
                    append_json_string(line, d.body);
                    line += "}\n";
                    out.write(line);
                    continue;
                }
                compact.resize(d.body.size());
                std::size_t n = 0;
                simdjson::padded_string padded{d.body};
                simdjson::dom::element e;
                if (parser.parse(padded).get(e) == simdjson::SUCCESS &&
                    simdjson::minify(d.body.data(), d.body.size(), compact.data(), n) == simdjson::SUCCESS) {
                    compact.resize(n);
                    line += ",\"envelope\":" + compact;  // the event as received, compacted
                } else {
                    line += ",\"body\":";  // not JSON: the text as received
                    append_json_string(line, d.body);
                }
                line += "}\n";
                out.write(line);
            }
            out.flush();
            return 0;
        }});
    commands.push_back(command{
        "verify",
        "rebuild aside from the logs and compare every projection with DIR; exit 1 naming the first different row, "
        "3 if DIR is behind its logs (it equals them up to its checkpoints)",
        {db_option, {log_option.name, log_option.value, log_option.help + " (not with --store)", false, true},
         format_option, skip_bad_option, batch_option, inbox_retention_option, lateness_option, transport_option,
         future_skew_option, resend_option,
         {"store", "", "instead, check DIR's pages and records for damage; exit 2 naming the first problems"}},
        [this](const arguments& a) {
            if (a.flag("store") && !a.all("log").empty()) {
                throw usage_error("option '--store' checks DIR alone: give no --log");
            }
            if (!a.flag("store") && a.all("log").empty()) throw usage_error("missing option '--log FILE'");
            const auto db = normalized_dir(a.required("db"));
            require_environment(db);
            if (a.flag("store")) return detail::verify_store(name, db, consumer, projections);
            auto aside = db;
            aside += ".verify-" + std::to_string(::getpid());
            remove_leftovers(db, ".verify-");  // of verifies that were killed
            // The rows compared are this snapshot's, and so are the checkpoints that say how far
            // into each log they reach: a consumer committing meanwhile changes neither.
            const auto snap = snapshot::open(db);
            progress_bar bar{"verify"};
            // Builds the logs aside (each only up to until[i] if given) and compares with snap.
            auto build_and_compare = [&](const std::vector<std::uint64_t>& until) {
                std::filesystem::remove_all(aside);
                rebuild_options o;
                log_run_from(a, aside, o, bar);
                o.until = until;
                std::pair<comparison, std::uint64_t> r;
                try {
                    r.second = build(o).records;
                    bar.finish();
                    r.first = compare(snap, db, snapshot::open(aside), aside, projection_names());
                } catch (...) {
                    std::filesystem::remove_all(aside);
                    throw;
                }
                std::filesystem::remove_all(aside);
                return r;
            };
            auto [c, records] = build_and_compare({});
            // A store that differs from its logs may only lag them: if each log's checkpoint is
            // before its end and the store equals a build of the logs up to those checkpoints,
            // it is behind (a consume still running, or logs appended since), not different.
            std::optional<std::uint64_t> behind;
            if (c.first_difference) {
                std::vector<std::uint64_t> until;
                bool lags = false;
                for (const auto& l : a.all("log")) {
                    const auto at = snap.checkpoint(consumer, log_source(l));
                    std::error_code ec;
                    const auto size = std::filesystem::file_size(l, ec);
                    until.push_back(at.value_or(0));
                    if (!ec && at.value_or(0) < size) lags = true;  // no checkpoint: nothing of it consumed yet
                }
                if (lags) {
                    auto [prefix, prefix_records] = build_and_compare(until);
                    if (!prefix.first_difference) {
                        behind = records > prefix_records ? records - prefix_records : 0;
                        c = std::move(prefix);
                    }
                }
            }
            std::string out = "{\"match\":";
            out += c.first_difference || behind ? "false" : "true";
            if (behind) {
                out += ",\"behind\":true";
                append_kv(out, "behind_by", *behind);
            }
            out += ",\"projections\":[";
            for (std::size_t i = 0; i < c.left.size(); ++i) {
                if (i != 0) out.push_back(',');
                out += "{\"projection\":";
                append_json_string(out, c.left[i].projection);
                append_kv(out, "rows", c.left[i].rows);
                char hex[32];
                std::snprintf(hex, sizeof hex, "%016" PRIx64, c.left[i].digest);
                out += ",\"digest\":\"" + std::string(hex) + "\"";
                append_kv(out, "rebuilt_rows", c.right[i].rows);
                std::snprintf(hex, sizeof hex, "%016" PRIx64, c.right[i].digest);
                out += ",\"rebuilt_digest\":\"" + std::string(hex) + "\"}";
            }
            out += "]";
            if (c.first_difference) {
                out += ",\"first_difference\":";
                append_json_string(out, *c.first_difference);
            }
            out += "}\n";
            output o2;
            o2.write(out);
            o2.flush();
            if (behind) {
                std::fprintf(stderr,
                             "%s verify: %s is behind its logs by %s events: it equals a build of the logs up to its "
                             "checkpoints\n",
                             name.c_str(), db.c_str(), with_commas(*behind).c_str());
                return 3;
            }
            if (c.first_difference) {
                std::fprintf(stderr, "%s verify: %s differs from its logs: %s\n", name.c_str(), db.c_str(),
                             c.first_difference->c_str());
                return 1;
            }
            std::fprintf(stderr, "%s verify: %s matches its logs\n", name.c_str(), db.c_str());
            return 0;
        }});
    commands.push_back(command{
        "prune",
        "remove inbox ids older than D and, with --allowed-lateness, effect keys past the event-time horizon",
        {db_option,
         {"older-than", "D", "inbox ids stamped more than D before the consumer's event time (7d, 1h, 90m)"},
         lateness_option,
         {"step", "N", "entries per transaction at most (default 10000)"}, wait_option},
        [this](const arguments& a) {
            stop_signals signals;
            std::filesystem::path db = a.required("db");
            require_environment(db);
            auto o = store_for(db);
            o.retention.clock = retention_clock::event;
            o.retention.allowed_lateness = duration_option(a, "allowed-lateness");
            prune_limits limits;
            limits.older_than = duration_option(a, "older-than");
            if (!limits.older_than && !o.retention.allowed_lateness) {
                throw usage_error("give --older-than, --allowed-lateness or both");
            }
            limits.max_rows = static_cast<std::size_t>(a.positive("step", limits.max_rows));
            limits.max_time = std::chrono::milliseconds(200);
            o.wait_for_writer = writer_wait(a, db);
            store st{o};
            setup()(st);
            std::uint64_t ids = 0, contributors = 0, steps = 0;
            double worst = 0;
            const auto started = std::chrono::steady_clock::now();
            for (;;) {
                const auto t0 = std::chrono::steady_clock::now();
                auto r = st.prune(limits);
                worst = std::max(worst, seconds(std::chrono::steady_clock::now() - t0));
                ++steps;
                ids += r.ids;
                contributors += r.contributors;
                if (!r.more || stop_requested.load()) break;  // each step is committed: stopping loses nothing
            }
            std::string out = "{";
            append_kv(out, "ids", ids, false);
            append_kv(out, "contributors", contributors);
            append_kv(out, "steps", steps);
            append_kv(out, "inbox_size", st.inbox_size());
            out += ",\"seconds\":" + fixed(seconds(std::chrono::steady_clock::now() - started), 3);
            out += ",\"worst_step_ms\":" + fixed(worst * 1000, 2) + "}\n";
            std::fprintf(stderr, "prune: removed %s inbox ids and %s effect keys in %s steps\n",
                         with_commas(ids).c_str(), with_commas(contributors).c_str(), with_commas(steps).c_str());
            output w;
            w.write(out);
            w.flush();
            return 0;
        }});
    commands.push_back(command{
        "why",
        "explain what became of an event: applied, duplicate, parked, dead-lettered, late, or never seen",
        {db_option,
         {"event", "SOURCE/ID", "the event: its source and id (split at the last '/')"},
         {"message", "ID", "or the transport message id it was delivered under"},
         {"transport", "NAME", "the transport of --message (a log's file name without rotation suffixes; default: any that holds it)"},
         {"key", "KEY", "also say whether this row holds the event's effect (its effect key per projection)"},
         {"projection", "NAME", "the projection of --key (default: every projection with that row)"}},
        [this](const arguments& a) { return why(a); }});
    commands.push_back(command{
        "convert",
        "convert an event log between JSON Lines and the binary format (lossless both ways)",
        {{"in", "FILE", "the log to read", true},
         {"out", "FILE", "the log to write (replaced)", true},
         {"to", "jsonl|binary", "the output format", true},
         skip_bad_option},
        [](const arguments& a) {
            auto to = a.required("to");
            if (to != "jsonl" && to != "binary") {
                throw usage_error("option '--to': '" + to + "' is neither jsonl nor binary");
            }
            auto r = convert_log(a.required("in"), a.required("out"), to == "jsonl" ? log_format::jsonl : log_format::binary,
                                 a.flag("skip-bad"));
            std::string out = "{";
            append_kv(out, "records", r.records, false);
            append_kv(out, "skipped", r.skipped);
            if (r.torn_tail) {
                append_kv(out, "torn_tail", *r.torn_tail);
                out += ",\"torn_detail\":";
                append_json_string(out, r.torn_detail);
                std::fprintf(stderr, "convert: %s: incomplete last record at offset %" PRIu64 " not copied (%s)\n",
                             a.required("in").c_str(), *r.torn_tail, r.torn_detail.c_str());
            }
            out += "}\n";
            output o;
            o.write(out);
            o.flush();
            return 0;
        }});
    for (auto& c : detail::operator_commands([this] { return context(); })) commands.push_back(std::move(c));
}

int tool::impl::usage(std::FILE* to) const {
    std::fprintf(to, "usage: %s COMMAND [OPTIONS]   (%s COMMAND --help for its options)\n\ncommands:\n", name.c_str(),
                 name.c_str());
    for (const auto& c : commands) std::fprintf(to, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
    std::fprintf(to, "\nexit status: 0 success (dead-lettered input is counted, not an error), 1 usage error,\n"
                     "2 I/O or storage failure; verify: 1 differs, 3 behind its logs.\n");
    return to == stdout ? 0 : 1;
}

int tool::impl::help(const command& c, std::FILE* to) const {
    std::string line = "usage: " + name + " " + c.name;
    for (const auto& o : c.options) {
        std::string part = "--" + o.name + (o.value.empty() ? "" : " " + o.value);
        if (o.repeated) part += " [--" + o.name + " ...]";
        line += o.required ? " " + part : " [" + part + "]";
    }
    std::fprintf(to, "%s\n\n%s\n\noptions:\n", line.c_str(), c.summary.c_str());
    for (const auto& o : c.options) {
        std::string flag = "--" + o.name + (o.value.empty() ? "" : " " + o.value);
        std::fprintf(to, "  %-26s %s%s\n", flag.c_str(), o.help.c_str(), o.required ? " (required)" : "");
    }
    std::fprintf(to, "  %-26s %s\n", "--help", "show this help");
    return to == stdout ? 0 : 1;
}

tool::tool(std::string name) : impl_(std::make_unique<impl>()) {
    impl_->name = std::move(name);
    impl_->add_builtin_commands();
}

tool::~tool() = default;

tool& tool::consumer(std::string name) {
    impl_->consumer = std::move(name);
    return *this;
}

tool& tool::configure(std::function<void(store_options&)> fn) {
    impl_->configure = std::move(fn);
    return *this;
}

tool& tool::add_command(command c) {
    auto& cs = impl_->commands;
    auto it = std::find_if(cs.begin(), cs.end(), [&](const command& x) { return x.name == c.name; });
    if (it != cs.end()) {
        *it = std::move(c);
    } else {
        cs.push_back(std::move(c));
    }
    return *this;
}

tool& tool::add_projection(std::shared_ptr<const projection_base> p, std::function<void(store&)> install) {
    impl_->projections.push_back(std::move(p));
    impl_->installers.push_back(std::move(install));
    return *this;
}

int tool::run(int argc, char** argv) {
    std::vector<std::string> args;
    for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
    return run(args);
}

int tool::run(const std::vector<std::string>& args) {
    auto& s = *impl_;
    detail::map_fault_guard fault_guard;  // a fault inside a damaged map is reported, not silent
    if (args.empty()) return s.usage(stderr);
    if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") return s.usage(stdout);
    auto it = std::find_if(s.commands.begin(), s.commands.end(), [&](const command& c) { return c.name == args[0]; });
    if (it == s.commands.end()) {
        std::fprintf(stderr, "%s: unknown command '%s'\n", s.name.c_str(), args[0].c_str());
        s.usage(stderr);
        return 1;
    }
    const auto& c = *it;
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (std::find(rest.begin(), rest.end(), "--help") != rest.end() ||
        std::find(rest.begin(), rest.end(), "-h") != rest.end()) {
        return s.help(c, stdout);
    }
    try {
        arguments parsed{c.name, c.options, rest};
        if (auto db = parsed.get("db")) detail::note_store(s.name, *db);
        return c.run(parsed);
    } catch (const usage_error& e) {
        std::fprintf(stderr, "%s %s: %s\n", s.name.c_str(), c.name.c_str(), e.what());
        s.help(c, stderr);
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s %s: %s\n", s.name.c_str(), c.name.c_str(), e.what());
        return 2;
    }
}

}  // namespace idem::cli
