// `backup` copies a store, consistent with one commit, while its consumer writes.

#include "commands.hpp"
#include "json_writer.hpp"
#include "options.hpp"
#include "text.hpp"

#include <idem/projections/backup.hpp>

#include <cstdio>

namespace idem::cli::detail {

namespace {

int run_backup(const tool_context& t, const arguments& a) {
    const std::filesystem::path db = a.required("db");
    const std::filesystem::path out = a.required("out");
    const auto r = idem::backup(db, out);
    std::string line;
    json_writer w{line};
    w.begin_object().field("path", r.path.string()).field("commit", r.commit).field("bytes", r.bytes);
    w.field("pages", r.pages).key("seconds").fixed(r.seconds, 3).end_object();
    line += "\n";
    std::fprintf(stderr, "%s backup: %s: commit %s copied and checked into %s (%s bytes)\n", t.name.c_str(),
                 db.c_str(), with_commas(r.commit).c_str(), out.c_str(), with_commas(r.bytes).c_str());
    print(line);
    return 0;
}

}  // namespace

command backup_command(context_fn t) {
    return command{
        "backup",
        "copy the store at --db into the new directory --out, one commit, checked, while its consumer writes; "
        "a backup is a store: point --db at it to restore",
        {db_option, {"out", "PATH", "the backup: a new (or empty) directory; never replaced", true}},
        [t](const arguments& a) { return run_backup(t(), a); }};
}

}  // namespace idem::cli::detail
