// `rebuild` builds the projections from logs aside and swaps them in; `consume` applies logs
// through the live path, committing each log's offset with every batch.

#include "commands.hpp"
#include "interrupt.hpp"
#include "health_file.hpp"
#include "pause_file.hpp"
#include "log_run.hpp"
#include "options.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace idem::cli::detail {

namespace {

int rebuild_logs(const tool_context& t, const arguments& a) {
    stop_signals signals;
    rebuild_options o;
    progress_bar bar{"rebuild"};
    log_run_from(t, a, a.required("db"), o, bar);
    const auto mb = a.number("memory", 1024);  // 0: rows are written after every batch
    if (mb > (std::uint64_t{1} << 40)) throw usage_error("option '--memory': " + std::to_string(mb) + " MB is too large");
    o.memory_budget = static_cast<std::size_t>(mb) << 20;
    o.discard_operator_actions = a.flag("discard-operator-actions");
    auto r = rebuild(o);
    bar.finish();
    return report_run("rebuilt " + o.store.path.string(), r);
}

// An option of one kind of input given with the other is refused, never silently ignored.
void refuse_options_of_the_other_input(const arguments& a, bool nats) {
    static constexpr std::string_view log_only[] = {"format",       "skip-bad",  "batch",         "follow",
                                                    "restart-changed-log", "rotation-grace", "journal-rows", "transport",
                                                    "resend-within"};
    if (nats) {
        for (auto name : log_only) {
            if (a.get(name)) {
                throw usage_error("option '--" + std::string(name) + "' applies to --log files, not to a --nats stream");
            }
        }
        return;
    }
#ifdef IDEM_JETSTREAM
    for (const auto& o : jetstream_consume_options()) {
        if (o.name != "nats" && a.get(o.name)) {
            throw usage_error("option '--" + o.name + "' applies to a --nats stream, not to --log files");
        }
    }
#endif
}

int consume_logs(const tool_context& t, const arguments& a) {
    refuse_options_of_the_other_input(a, a.get("nats").has_value());
    if (a.get("nats")) {
        if (!a.all("log").empty()) throw usage_error("consume reads either --log files or a --nats stream, not both");
#ifdef IDEM_JETSTREAM
        return consume_jetstream(t, a);
#else
        throw usage_error("option '--nats': this idem was built without the jetstream feature (cnats)");
#endif
    }
    if (a.all("log").empty()) throw usage_error("consume needs --log FILE (or --nats URL --stream S --consumer C)");
    consume_options o;
    progress_bar bar{"consume"};
    // o.batch stays the library's 25,000: at most that many records per commit. A followed log
    // hands over what it has at its end, so a slow one still commits every record promptly.
    log_run_from(t, a, a.required("db"), o, bar);
    o.store.sync = durability_from(a);
    o.store.tuning.journal_rows = static_cast<std::size_t>(a.number("journal-rows", 0));
    o.store.tuning.huge_index_pages = true;  // a job that inserts an id per record: fewer page faults
    o.follow = a.flag("follow");
    o.restart_changed_logs = a.flag("restart-changed-log");
    if (auto grace = duration_option(a, "rotation-grace")) {
        if (!o.follow) throw usage_error("option '--rotation-grace' applies to a followed log (--follow)");
        o.rotation_grace = std::chrono::duration_cast<std::chrono::milliseconds>(*grace);
    }
    stop_signals signals;
    // A followed log's watchdog: idem stats reads its verdict from DIR/idem.health.
    std::optional<health_monitor> monitor;
    std::optional<health_file> health;
    std::optional<pause_watch> paused;  // the follower records pauses in the audit itself
    if (!o.follow) refuse_if_paused(o.store.path, "a consume without --follow");
    if (o.follow) {
        monitor.emplace(stall_after_from(a));
        o.health = &*monitor;
        health.emplace(o.store.path, [&] { return monitor->report(); });
        paused.emplace(o.store.path, *monitor);
    }
    auto r = consume(o);
    bar.finish();
    return report_run("consumed into " + o.store.path.string(), r);
}

}  // namespace

std::vector<command> log_run_commands(context_fn t) {
    std::vector<command> out;
    out.push_back(command{
        "rebuild",
        "build every projection from event logs into a fresh environment, then swap it in atomically",
        {db_option, log_option, format_option, skip_bad_option, batch_option,
         {"memory", "MB", "rows are aggregated in memory up to about this much, then written (default 1024)"},
         {"discard-operator-actions", "",
          "rebuild a store whose audit holds operator actions (release, redrive), which the logs do not hold: "
          "the rebuild undoes them"},
         wait_option, inbox_retention_option, lateness_option, transport_option, future_skew_option, resend_option},
        [t](const arguments& a) { return rebuild_logs(t(), a); }});
    auto consume_log = log_option;
    consume_log.required = false;  // or --nats
    std::vector<option> consume_flags{
        db_option, consume_log, format_option, skip_bad_option, batch_option,
        {"follow", "", "keep tailing the last log for appended events (stop with Ctrl-C or SIGTERM)"},
         {"restart-changed-log", "",
          "read a log truncated or rewritten under its checkpoint again from offset 0 (the inbox drops what was "
          "applied) instead of stopping with exit 2"},
         {"rotation-grace", "D",
          "following, a rotated log's old file is read until it has not grown for D (default 5s: its writer may "
          "append until it reopens the log), then the new file"},
         {"durability", "full|periodic|none", "fsync policy (default full: a commit is on disk before the next)"},
         {"journal-rows", "N",
          "changed rows are journaled and folded into the row table once N are journaled (default: automatic)"},
         wait_option, inbox_retention_option, lateness_option, transport_option, future_skew_option, resend_option,
         change_retention_option, change_keep_option, no_change_feed_option, gaps_option, stall_after_option};
#ifdef IDEM_JETSTREAM
    // A broker redelivers in wall time: with --nats the inbox retention is measured on the wall clock.
    for (auto& o : consume_flags) {
        if (o.name == "inbox-retention") {
            o.help = "prune inbox ids older than D as the run goes (7d, 1h, 90m): of event time for --log, of "
                     "wall-clock time for --nats";
        }
    }
    for (auto& o : jetstream_consume_options()) consume_flags.push_back(std::move(o));
#endif
    out.push_back(command{
        "consume",
        "apply event logs or a NATS JetStream stream through the live path, resumable: the log offset or stream "
        "sequence is committed with each batch",
        std::move(consume_flags), [t](const arguments& a) { return consume_logs(t(), a); }});
    return out;
}

}  // namespace idem::cli::detail
