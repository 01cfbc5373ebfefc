// `verify` rebuilds the logs aside and compares every projection with the store: exit 1
// names the first different row, 3 says the store only lags its logs. `verify --store`
// checks the store's pages and records instead (store_check.cpp).

#include "commands.hpp"
#include "json_writer.hpp"
#include "log_run.hpp"
#include "options.hpp"
#include "store_check.hpp"
#include "text.hpp"

#include <idem/storage/store_dir.hpp>

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace idem::cli::detail {

namespace {

std::string hex_digest(std::uint64_t digest) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, digest);
    return hex;
}

std::string comparison_json(const comparison& c, std::optional<std::uint64_t> behind) {
    std::string out;
    json_writer w{out};
    w.begin_object().field("match", !c.first_difference && !behind);
    if (behind) w.field("behind", true).field("behind_by", *behind);
    w.key("projections").begin_array();
    for (std::size_t i = 0; i < c.left.size(); ++i) {
        w.begin_object().field("projection", c.left[i].projection).field("rows", c.left[i].rows);
        w.field("digest", hex_digest(c.left[i].digest));
        w.field("rebuilt_rows", c.right[i].rows).field("rebuilt_digest", hex_digest(c.right[i].digest));
        w.end_object();
    }
    w.end_array();
    if (c.first_difference) w.field("first_difference", *c.first_difference);
    w.end_object();
    out += "\n";
    return out;
}

int verify(const tool_context& t, const arguments& a) {
    if (a.flag("store") && !a.all("log").empty()) throw usage_error("option '--store' checks DIR alone: give no --log");
    if (!a.flag("store") && a.all("log").empty()) throw usage_error("missing option '--log FILE'");
    const auto db = normalized_dir(a.required("db"));
    require_store(db);
    if (a.flag("store")) return verify_store(t.name, db, t.consumer, t.projections);
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
        log_run_from(t, a, aside, o, bar);
        o.until = until;
        std::pair<comparison, std::uint64_t> r;
        try {
            r.second = build(o).records;
            bar.finish();
            r.first = compare(snap, db, snapshot::open(aside), aside, t.projection_names());
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
            const auto at = snap.checkpoint(t.consumer, log_source(l));
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
    print(comparison_json(c, behind));
    if (behind) {
        std::fprintf(stderr,
                     "%s verify: %s is behind its logs by %s events: it equals a build of the logs up to its "
                     "checkpoints\n",
                     t.name.c_str(), db.c_str(), with_commas(*behind).c_str());
        return 3;
    }
    if (c.first_difference) {
        // An operator's release, redrive or event-clock changed rows in ways no log says: name it as the likely cause.
        const auto all = snap.consumer(t.consumer).operator_actions();
        const auto actions = static_cast<std::size_t>(
            std::count_if(all.begin(), all.end(), [](const operator_action& x) { return x.changes_state(); }));
        const auto why = actions == 0 ? std::string()
                                      : " (it holds " + std::to_string(actions) + " operator action" +
                                            (actions == 1 ? "" : "s") +
                                            ", release, redrive or event-clock, whose effects no log holds: idem audit lists them)";
        std::fprintf(stderr, "%s verify: %s differs from its logs: %s%s\n", t.name.c_str(), db.c_str(),
                     c.first_difference->c_str(), why.c_str());
        return 1;
    }
    std::fprintf(stderr, "%s verify: %s matches its logs\n", t.name.c_str(), db.c_str());
    return 0;
}

}  // namespace

command verify_command(context_fn t) {
    return command{
        "verify",
        "rebuild aside from the logs and compare every projection with DIR; exit 1 naming the first different row, "
        "3 if DIR is behind its logs (it equals them up to its checkpoints)",
        {db_option, {log_option.name, log_option.value, log_option.help + " (not with --store)", false, true},
         format_option, skip_bad_option, batch_option, inbox_retention_option, lateness_option, transport_option,
         future_skew_option, resend_option,
         {"store", "", "instead, check DIR's pages and records for damage; exit 2 naming the first problems"}},
        [t](const arguments& a) { return verify(t(), a); }};
}

}  // namespace idem::cli::detail
