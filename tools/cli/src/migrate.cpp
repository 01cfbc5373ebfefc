// `migrate` rewrites every row of an older state version at its projection's current one,
// in small committed steps (a row is also migrated whenever it is read or changed; this is for
// being done with the old versions at once).

#include "commands.hpp"
#include "interrupt.hpp"
#include "json_writer.hpp"
#include "options.hpp"
#include "text.hpp"

#include <cstdio>

namespace idem::cli::detail {

namespace {

int migrate(const tool_context& t, const arguments& a) {
    stop_signals signals;
    std::filesystem::path db = a.required("db");
    auto st = t.open_writer(a, db);
    const auto started = std::chrono::steady_clock::now();
    auto r = st->migrate_rows(static_cast<std::size_t>(a.positive("step", 10000)), [](const migrate_result& p) {
        std::fprintf(stderr, "\rmigrate: %s rows rewritten, %s to go", with_commas(p.rows).c_str(),
                     with_commas(p.remaining).c_str());
    });
    if (r.commits > 0) std::fputc('\n', stderr);
    std::string out;
    json_writer w{out};
    w.begin_object().field("rows", r.rows).field("commits", r.commits);
    w.key("seconds").fixed(seconds(std::chrono::steady_clock::now() - started), 3);
    w.end_object();
    out += "\n";
    std::fprintf(stderr, "migrate: %s rows of older state versions rewritten in %s\n", with_commas(r.rows).c_str(),
                 db.string().c_str());
    print(out);
    return 0;
}

}  // namespace

command migrate_command(context_fn t) {
    return command{"migrate",
                   "rewrite every row of an older state version at its projection's current one (through its "
                   "declared migrations), in committed steps",
                   {db_option, {"step", "N", "rows per transaction at most (default 10000)"}, wait_option},
                   [t](const arguments& a) { return migrate(t(), a); }};
}

}  // namespace idem::cli::detail
