#include "store_check.hpp"

#include "commands.hpp"
#include "json_writer.hpp"

#include <idem/cli/tool.hpp>
#include <idem/projections/layout.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/page_check.hpp>

#include <chrono>
#include <cstdio>
#include <functional>

namespace idem::cli::detail {

namespace {

struct record_counts {
    bool checked = false;
    std::uint64_t rows = 0;
    std::uint64_t rows_unchecked = 0;  // written before rows carried a checksum
    std::uint64_t dead_letters = 0;
    std::uint64_t checkpoints = 0;
};

constexpr std::size_t max_problems = 100;

void note(environment_report& r, const std::string& table, std::string what) {
    ++r.problem_count;
    if (r.problems.size() < max_problems) r.problems.push_back({std::nullopt, table, std::move(what)});
}

/// Runs one reader; an exception is a problem of its table (a missing table is not).
void read_part(environment_report& r, const std::string& table, const std::function<void()>& fn) {
    try {
        fn();
    } catch (const std::system_error& e) {
        if (e.code() != errc::unknown_projection) note(r, table, std::string("cannot be read: ") + e.what());
    } catch (const std::exception& e) {
        note(r, table, std::string("cannot be read: ") + e.what());
    }
}

record_counts read_records(environment_report& r, const std::filesystem::path& db, const std::string& consumer,
                           const std::vector<std::shared_ptr<const projection_base>>& projections) {
    record_counts n;
    std::optional<snapshot> snap;
    read_part(r, "", [&] { snap.emplace(snapshot::open(db)); });
    if (!snap) return n;
    n.checked = true;
    for (const auto& p : projections) {
        const auto table = layout::rows_table(p->name());
        read_part(r, table, [&] {
            auto rows = snap->read_rows(p->name());
            for (;;) {
                // A damaged row (its checksum does not match) is named, and the walk goes on.
                std::optional<snapshot::raw_row_view> row;
                try {
                    row = rows.next();
                } catch (const std::system_error& e) {
                    if (e.code() != errc::corrupt_record) throw;
                    ++n.rows;
                    note(r, table, e.what());
                    continue;
                }
                if (!row) break;
                ++n.rows;
                if (!row->checked) ++n.rows_unchecked;
                try {
                    p->load(row->state, row->state_version);
                } catch (const std::exception& e) {
                    note(r, table, "row '" + std::string(row->key) + "' does not decode: " + e.what());
                }
            }
        });
        read_part(r, layout::contrib_table(p->name()), [&] {
            snap->projection(p->name()).scan_contributors(std::string_view("\0", 1), [](std::string_view) {});
            snap->projection(p->name()).contributor_floor();
        });
    }
    read_part(r, layout::dead_letter_table(consumer), [&] { n.dead_letters = snap->consumer(consumer).dead_letters().size(); });
    read_part(r, layout::checkpoint_table(consumer), [&] { n.checkpoints = snap->checkpoints(consumer).size(); });
    read_part(r, std::string(layout::meta_table), [&] {
        snap->commit();
        snap->consumer(consumer).stats();
        snap->consumer(consumer).retention();
    });
    // Lookups of an id no record holds walk every record of the inbox and the parked events.
    read_part(r, layout::inbox_table(consumer), [&] { snap->consumer(consumer).inbox_lookup(std::string_view("\0", 1)); });
    read_part(r, layout::parked_table(consumer), [&] { snap->consumer(consumer).parked_lookup(std::string_view("\0", 1)); });
    read_part(r, layout::event_ids_table(consumer), [&] { snap->consumer(consumer).event_id_of(std::string_view("\0", 1)); });
    read_part(r, layout::audit_table(consumer), [&] { snap->consumer(consumer).operator_actions(); });
    return n;
}

}  // namespace

int verify_store(const std::string& tool, const std::filesystem::path& db, const std::string& consumer,
                 const std::vector<std::shared_ptr<const projection_base>>& projections) {
    const auto started = std::chrono::steady_clock::now();
    auto r = check_environment(db);
    record_counts records;
    if (r.sound()) records = read_records(r, db, consumer, projections);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f", seconds);
    std::string out;
    json_writer w{out};
    w.begin_object().field("store", r.sound() ? "ok" : "damaged").field("db", db.string());
    w.field("page_size", r.page_size).field("pages", r.pages).field("file_pages", r.file_pages);
    w.field("free_pages", r.free_pages).field("transaction", r.transaction);
    w.key("seconds").raw(secs);
    w.key("tables").begin_array();
    for (const auto& t : r.tables) {
        w.begin_object().field("name", t.name).field("entries", t.entries).field("depth", t.depth);
        w.field("branch_pages", t.branch_pages).field("leaf_pages", t.leaf_pages);
        w.field("overflow_pages", t.overflow_pages).end_object();
    }
    w.end_array();
    w.key("records").begin_object().field("checked", records.checked).field("rows", records.rows);
    w.field("rows_without_checksum", records.rows_unchecked);
    w.field("dead_letters", records.dead_letters).field("checkpoints", records.checkpoints).end_object();
    w.field("problem_count", r.problem_count);
    w.key("problems").begin_array();
    for (const auto& p : r.problems) {
        w.begin_object().key("page");
        if (p.page) {
            w.value(*p.page);
        } else {
            w.null();
        }
        w.field("table", p.table).field("what", p.what).end_object();
    }
    w.end_array().end_object();
    out += "\n";
    print(out);

    if (r.sound()) {
        // A row written before rows carried a checksum decodes, but a flipped bit in it may too.
        const auto rows = records.rows_unchecked == 0
                              ? std::to_string(records.rows) + " rows, checksums matched,"
                              : std::to_string(records.rows) + " rows (" + std::to_string(records.rows_unchecked) +
                                    " of them written before rows carried a checksum: a changed bit there that "
                                    "still decodes is found only by verify --log; a rebuild adds checksums)";
        std::fprintf(stderr, "%s verify: %s: the store is sound (%llu pages, %zu tables; %s and %llu dead letters decoded) in %s s\n",
                     tool.c_str(), db.c_str(), static_cast<unsigned long long>(r.pages), r.tables.size(), rows.c_str(),
                     static_cast<unsigned long long>(records.dead_letters), secs);
        return 0;
    }
    const auto first = r.first_problems();
    std::fprintf(stderr,
                 "%s verify: %s is damaged: %llu problem%s, first: %s; stop its writers and restore it from a backup, "
                 "or rebuild it from its logs (%s rebuild --db %s --log ...)\n",
                 tool.c_str(), db.c_str(), static_cast<unsigned long long>(r.problem_count), r.problem_count == 1 ? "" : "s",
                 first.c_str(), tool.c_str(), db.c_str());
    return 2;
}

}  // namespace idem::cli::detail
