// `chaos` runs the tool's projections over a log's events through the chaos test kit
// (<idem/testing.hpp>): exit 0 when every schedule matched the reference, 1 with the shrunk
// schedule and the first differing row when one did not, 2 when stopped (Ctrl-C, SIGTERM).

#include "commands.hpp"
#include "interrupt.hpp"
#include "options.hpp"

#include <idem/storage/event_log.hpp>
#include <idem/testing.hpp>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <system_error>

namespace idem::cli::detail {

namespace {

int chaos(const tool_context& t, const arguments& a) {
    const auto& log = a.required("log");
    testing::chaos_options o;
    o.schedules = a.positive("schedules", o.schedules);
    o.seed = a.number("seed", o.seed);
    o.resends = !a.flag("no-resends");
    o.forked_crashes = a.flag("fork");
    if (a.get("workers")) o.workers = a.positive("workers", 1);

    // Envelope N of the kit's messages is the log's record N.
    std::vector<std::string> envelopes;
    log_reader reader{log};
    log_record r;
    while (reader.next(r)) envelopes.emplace_back(r.body);
    if (reader.torn_tail()) throw std::runtime_error(log + ": " + reader.torn_detail());
    // Schedules done, on stderr, at most once a second: a run over a large log takes minutes.
    const auto started = std::chrono::steady_clock::now();
    auto last = started;
    std::size_t done = 0;
    o.progress = [&](std::size_t n, std::size_t total) {
        done = n;
        const auto now = std::chrono::steady_clock::now();
        if (n < total && now - last < std::chrono::seconds(1)) return;
        last = now;
        std::fprintf(stderr, "%s chaos: %zu/%zu schedules done (%.0f s)\n", t.name.c_str(), n, total,
                     std::chrono::duration<double>(now - started).count());
    };
    stop_signals signals;  // Ctrl-C or SIGTERM: stop at the next step; the kit removes its stores
    o.stop = &stop_requested;
    testing::chaos kit{o};
    for (std::size_t i = 0; i < t.projections.size(); ++i) kit.add_projection(t.projections[i], t.installers[i]);
    for (const auto& step : t.upcasters) kit.upcast(step);
    auto store_for = t.store_for;
    kit.configure([store_for](store_options& so) { so = store_for(so.path); });
    testing::chaos_report report;
    try {
        report = kit.run(envelopes);
    } catch (const std::invalid_argument& e) {
        std::string_view what = e.what();
        if (what.starts_with("chaos: ")) what.remove_prefix(7);
        throw usage_error(log + ": " + std::string(what));
    } catch (const std::system_error& e) {
        if (e.code() != std::errc::operation_canceled) throw;
        throw std::runtime_error("stopped after " + std::to_string(done) + " of " + std::to_string(o.schedules) +
                                 " schedules; the temporary stores were removed");
    }
    std::fputs(report.explain().c_str(), stdout);
    std::fflush(stdout);
    return report.ok() ? 0 : 1;
}

}  // namespace

command chaos_command(context_fn t) {
    return command{
        "chaos",
        "run the projections over a log's events through seeded schedules of duplicates, re-sends, reordering, "
        "crashes and inbox pruning; exit 1 with a shrunk failing schedule and the first row that differs from "
        "applying each event once",
        {{"log", "FILE",
          "the events (JSON Lines or binary); each distinct event id counts once; lines that do not parse are "
          "dead letters, counted and left out",
          true, false},
         {"schedules", "N", "number of schedules (default 100)"},
         {"seed", "S", "seed of the first schedule (default 1; schedule i uses S + i)"},
         {"fork", "", "also kill forked children with SIGKILL at the store's crash points"},
         {"no-resends", "", "never re-send an event under a new event id (sources that keep ids stable)"},
         {"workers", "N", "schedules run at once, each on a thread (default 1; more only for handlers without shared state; --fork runs one)"}},
        [t](const arguments& a) { return chaos(t(), a); }};
}

}  // namespace idem::cli::detail
