// `changes`: prints a store's change feed as JSON Lines, from another process while a consumer
// writes, and with --follow keeps printing until Ctrl-C or SIGTERM. Each poll opens the store
// afresh (no read transaction is held between polls, so the writer's pages are not pinned), which
// also finds the new store a rebuild swapped in: its feed continues the old one's numbering.

#include "commands.hpp"
#include "interrupt.hpp"
#include "options.hpp"

#include <idem/storage/error.hpp>

#include <chrono>
#include <cstdio>
#include <thread>

namespace idem::cli::detail {

namespace {

int changes(const tool_context& t, const arguments& a) {
    const std::filesystem::path db = a.required("db");
    require_store(db);
    const auto only = a.get("projection");
    if (only) t.projection_named(*only);  // a usage error naming the tool's projections
    std::optional<change_position> at;
    if (auto since = a.get("since")) {
        auto parsed = change_position::parse(*since);
        if (!parsed) {
            throw usage_error("--since '" + *since + "': expected a commit (42) or a position (42.3)");
        }
        at = *parsed;
    }
    const bool follow = a.flag("follow");
    const auto poll = std::chrono::milliseconds(a.positive("poll-ms", 100));
    const auto limit = a.positive("limit", 1000);
    stop_signals signals;
    std::string id;  // the store followed: a different one at the path is an error, not a new feed
    output out;
    std::string line;
    while (!stop_requested.load()) {
        std::vector<change> batch;
        {
            auto snap = snapshot::open(db);
            const auto seen = snap.store_id();
            if (id.empty()) {
                id = seen;
            } else if (seen != id) {
                throw_error(errc::invalid_argument, db.string() + ": now holds another store (id " + seen +
                                                        ", was " + id + "); its change feed does not continue the one followed");
            }
            if (!at) at = change_position{snap.change_feed().pruned_through, UINT32_MAX};  // the oldest kept
            batch = snap.changes_after(*at, limit);
        }
        for (const auto& c : batch) {
            at = c.position;
            if (only && c.projection != *only) continue;
            line.clear();
            const projection_base* p = nullptr;
            for (const auto& known : t.projections) {
                if (known->name() == c.projection) p = known.get();
            }
            append_change_json(line, c, p);
            line += "\n";
            out.write(line);
        }
        out.flush();
        if (!follow) break;
        if (batch.size() < limit) std::this_thread::sleep_for(poll);
    }
    return 0;
}

}  // namespace

command changes_command(context_fn t) {
    return command{
        "changes",
        "print the change feed as JSON Lines: {\"position\",\"commit\",\"kind\",\"projection\",\"key\",\"version\","
        "\"time_ns\",\"state\"}; with --follow, keep printing new commits until Ctrl-C or SIGTERM",
        {db_option,
         {"projection", "NAME", "only this projection's entries"},
         {"since", "C[.I]", "start after commit C (or after position C.I); default: from the oldest kept"},
         {"follow", "", "keep printing new commits as they are made"},
         {"limit", "N", "entries read per poll, whole commits (default 1000)"},
         {"poll-ms", "MS", "with --follow, how often to look for new commits when idle (default 100)"}},
        [t](const arguments& a) { return changes(t(), a); }};
}

}  // namespace idem::cli::detail
