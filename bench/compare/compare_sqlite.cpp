// compare_sqlite: the textbook idempotent consumer in SQL on SQLite 3 (see compare.hpp).
//
//   INSERT INTO processed_messages(message_id, processed_at) VALUES (?, ?) ON CONFLICT DO NOTHING
//   -- only if that inserted a row (sqlite3_changes() == 1):
//   INSERT INTO order_totals(order_id, total, lines) VALUES (?, ?, 1)
//     ON CONFLICT(order_id) DO UPDATE SET total = total + excluded.total, lines = lines + 1
//
// Prepared once, WAL journal, WITHOUT ROWID tables (the text keys are the primary keys, so
// one B-tree each), a 256 MiB page cache, memory-mapped reads.
//
//   sqlite-normal-1, sqlite-normal-1000  synchronous=NORMAL: in WAL mode a commit is not
//                                        fsync'ed (only checkpoints are): survives a crash
//                                        of the process, not of the machine
//   sqlite-full-1, sqlite-full-1000      synchronous=FULL: every commit fsyncs the WAL
// The suffix is the number of messages per transaction.

#include "compare.hpp"

#include <sqlite3.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace idem_compare;
using idem_bench::clock_type;

class database {
public:
    explicit database(const std::filesystem::path& file) {
        if (sqlite3_open(file.c_str(), &db_) != SQLITE_OK) fail("sqlite3_open");
    }
    ~database() { sqlite3_close_v2(db_); }
    database(const database&) = delete;
    database& operator=(const database&) = delete;

    sqlite3* get() const noexcept { return db_; }
    void exec(const std::string& sql) {
        if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) fail(sql.c_str());
    }
    [[noreturn]] void fail(const char* what) const {
        throw std::runtime_error(std::string(what) + ": " + sqlite3_errmsg(db_));
    }

private:
    sqlite3* db_ = nullptr;
};

class statement {
public:
    statement(database& db, const char* sql) : db_(db) {
        if (sqlite3_prepare_v3(db.get(), sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt_, nullptr) != SQLITE_OK) {
            db.fail(sql);
        }
    }
    ~statement() { sqlite3_finalize(stmt_); }
    statement(const statement&) = delete;
    statement& operator=(const statement&) = delete;

    void bind(int i, std::string_view text) {
        sqlite3_bind_text(stmt_, i, text.data(), static_cast<int>(text.size()), SQLITE_STATIC);
    }
    void bind(int i, std::int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
    /// Steps once; true while it yields rows.
    bool step() {
        int rc = sqlite3_step(stmt_);
        if (rc == SQLITE_ROW) return true;
        if (rc != SQLITE_DONE) db_.fail("sqlite3_step");
        return false;
    }
    void reset() { sqlite3_reset(stmt_); }
    sqlite3_stmt* get() const noexcept { return stmt_; }

private:
    database& db_;
    sqlite3_stmt* stmt_ = nullptr;
};

std::uint64_t size_or_zero(const std::filesystem::path& p) {
    std::error_code ec;
    auto n = std::filesystem::file_size(p, ec);
    return ec ? 0 : n;
}

run_result run_textbook(const run_options& o, const char* synchronous, std::uint64_t per_txn) {
    run_result r;
    const auto file = o.dir / "orders.db";
    {
        database db{file};
        db.exec("PRAGMA journal_mode=WAL");
        db.exec(std::string("PRAGMA synchronous=") + synchronous);
        db.exec("PRAGMA cache_size=-262144");
        db.exec("PRAGMA mmap_size=1073741824");
        db.exec("PRAGMA temp_store=MEMORY");
        db.exec("CREATE TABLE processed_messages(message_id TEXT PRIMARY KEY, processed_at INTEGER NOT NULL) "
                "WITHOUT ROWID");
        db.exec("CREATE TABLE order_totals(order_id TEXT PRIMARY KEY, total INTEGER NOT NULL, "
                "lines INTEGER NOT NULL) WITHOUT ROWID");
        statement begin{db, "BEGIN"};
        statement commit{db, "COMMIT"};
        statement mark{db,
                       "INSERT INTO processed_messages(message_id, processed_at) VALUES (?1, ?2) "
                       "ON CONFLICT DO NOTHING"};
        statement add{db,
                      "INSERT INTO order_totals(order_id, total, lines) VALUES (?1, ?2, 1) "
                      "ON CONFLICT(order_id) DO UPDATE SET total = total + excluded.total, lines = lines + 1"};

        message_reader in{o.log, o.limit};
        message m;
        const auto io_before = idem_bench::read_io();
        const auto start = clock_type::now();
        bool more = true;
        while (more) {
            begin.step();
            begin.reset();
            const std::int64_t now = unix_ns();
            std::uint64_t n = 0;
            while (n < per_txn && (more = in.next(m))) {
                ++n;
                mark.bind(1, m.message_id);
                mark.bind(2, now);
                mark.step();
                mark.reset();
                if (sqlite3_changes(db.get()) == 0) {
                    ++r.duplicates;
                    continue;
                }
                add.bind(1, m.order_id);
                add.bind(2, m.amount);
                add.step();
                add.reset();
                ++r.applied;
            }
            r.messages += n;
            commit.step();
            commit.reset();
        }
        r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        // Untimed but counted: move what the WAL still holds into the database file, as a
        // long-running consumer's checkpoints eventually would.
        db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
        const auto io_after = idem_bench::read_io();
        r.write_bytes = io_after.write_bytes - io_before.write_bytes;
        r.wchar = io_after.wchar - io_before.wchar;

        std::vector<std::pair<std::string, idem_bench::totals>> rows;
        statement scan{db, "SELECT order_id, total, lines FROM order_totals ORDER BY order_id"};
        while (scan.step()) {
            const auto* key = reinterpret_cast<const char*>(sqlite3_column_text(scan.get(), 0));
            rows.emplace_back(std::string(key, static_cast<std::size_t>(sqlite3_column_bytes(scan.get(), 0))),
                              idem_bench::totals{sqlite3_column_int64(scan.get(), 1), sqlite3_column_int64(scan.get(), 2)});
        }
        r.state = idem_bench::summarize(std::move(rows));
    }
    r.store_bytes = size_or_zero(file) + size_or_zero(o.dir / "orders.db-wal");
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main(argc, argv, "compare_sqlite",
                    {
                        {"sqlite-normal-1", [](const run_options& o) { return run_textbook(o, "NORMAL", 1); }},
                        {"sqlite-normal-1000", [](const run_options& o) { return run_textbook(o, "NORMAL", 1000); }},
                        {"sqlite-full-1", [](const run_options& o) { return run_textbook(o, "FULL", 1); }},
                        {"sqlite-full-1000", [](const run_options& o) { return run_textbook(o, "FULL", 1000); }},
                    });
}
