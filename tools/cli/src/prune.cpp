// `prune` removes inbox ids and effect keys past their retention, in small committed steps so
// a consumer writing the same store waits at most one step.

#include "commands.hpp"
#include "interrupt.hpp"
#include "json_writer.hpp"
#include "options.hpp"
#include "text.hpp"

#include <algorithm>
#include <cstdio>

namespace idem::cli::detail {

namespace {

int prune(const tool_context& t, const arguments& a) {
    stop_signals signals;
    std::filesystem::path db = a.required("db");
    const auto lateness = duration_option(a, "allowed-lateness");
    prune_limits limits;
    limits.older_than = duration_option(a, "older-than");
    if (!limits.older_than && !lateness) throw usage_error("give --older-than, --allowed-lateness or both");
    limits.max_rows = static_cast<std::size_t>(a.positive("step", limits.max_rows));
    limits.max_time = std::chrono::milliseconds(200);
    auto st = t.open_writer(a, db, [&](store_options& o) {
        o.retention.clock = retention_clock::event;
        o.retention.allowed_lateness = lateness;
    });
    std::uint64_t ids = 0, contributors = 0, steps = 0;
    double worst = 0;
    const auto started = std::chrono::steady_clock::now();
    for (;;) {
        const auto t0 = std::chrono::steady_clock::now();
        auto r = st->prune(limits);
        worst = std::max(worst, seconds(std::chrono::steady_clock::now() - t0));
        ++steps;
        ids += r.ids;
        contributors += r.contributors;
        if (!r.more || stop_requested.load()) break;  // each step is committed: stopping loses nothing
    }
    std::string out;
    json_writer w{out};
    w.begin_object().field("ids", ids).field("contributors", contributors).field("steps", steps);
    w.field("inbox_size", st->inbox_size());
    w.key("seconds").fixed(seconds(std::chrono::steady_clock::now() - started), 3);
    w.key("worst_step_ms").fixed(worst * 1000, 2);
    w.end_object();
    out += "\n";
    std::fprintf(stderr, "prune: removed %s inbox ids and %s effect keys in %s steps\n", with_commas(ids).c_str(),
                 with_commas(contributors).c_str(), with_commas(steps).c_str());
    print(out);
    return 0;
}

}  // namespace

command prune_command(context_fn t) {
    return command{
        "prune",
        "remove inbox ids older than D and, with --allowed-lateness, effect keys past the event-time horizon",
        {db_option,
         {"older-than", "D", "inbox ids stamped more than D before the consumer's event time (7d, 1h, 90m)"},
         lateness_option,
         {"step", "N", "entries per transaction at most (default 10000)"}, wait_option},
        [t](const arguments& a) { return prune(t(), a); }};
}

}  // namespace idem::cli::detail
