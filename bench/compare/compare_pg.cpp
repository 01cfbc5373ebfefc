// compare_pg: the textbook idempotent consumer in SQL on PostgreSQL through libpq (see
// compare.hpp). One prepared statement per message records the id and, only if that
// inserted a row, adds the amount to the order's total:
//
//   WITH ins AS (INSERT INTO processed_messages(message_id) VALUES ($1)
//                ON CONFLICT DO NOTHING RETURNING 1)
//   INSERT INTO order_totals AS t (order_id, total, lines) SELECT $2, $3, 1 FROM ins
//   ON CONFLICT (order_id) DO UPDATE SET total = t.total + EXCLUDED.total, lines = t.lines + 1
//
// synchronous_commit is on (the server's default), so every commit waits for its WAL flush.
//
//   pg-1      one message per transaction (autocommit): one round trip and one flush each
//   pg-1000   1000 messages per transaction, sent in libpq pipeline mode (one round trip per
//             transaction)
//
// The server is another process: the bytes written are summed over the postmaster given
// by --server-pid and its children (/proc/<pid>/io, after a CHECKPOINT that is not timed),
// and the peak RSS adds the serving backend's to the client's.

#include "compare.hpp"

#include <libpq-fe.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace idem_compare;
using idem_bench::clock_type;

class connection {
public:
    explicit connection(const std::string& conninfo) : conn_(PQconnectdb(conninfo.c_str())) {
        if (PQstatus(conn_) != CONNECTION_OK) fail("connect");
    }
    ~connection() { PQfinish(conn_); }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    PGconn* get() const noexcept { return conn_; }
    [[noreturn]] void fail(const std::string& what) const {
        throw std::runtime_error("PostgreSQL: " + what + ": " + PQerrorMessage(conn_));
    }

private:
    PGconn* conn_;
};

class result {
public:
    explicit result(PGresult* r) : r_(r) {}
    ~result() { PQclear(r_); }
    result(const result&) = delete;
    result& operator=(const result&) = delete;
    PGresult* get() const noexcept { return r_; }
    bool ok() const noexcept {
        auto s = PQresultStatus(r_);
        return s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK || s == PGRES_PIPELINE_SYNC;
    }

private:
    PGresult* r_;
};

void exec(connection& c, const std::string& sql) {
    result r{PQexec(c.get(), sql.c_str())};
    if (!r.ok()) c.fail(sql);
}

std::string scalar(connection& c, const std::string& sql) {
    result r{PQexec(c.get(), sql.c_str())};
    if (!r.ok() || PQntuples(r.get()) != 1) c.fail(sql);
    return PQgetvalue(r.get(), 0, 0);
}

constexpr const char* consume_sql =
    "WITH ins AS (INSERT INTO processed_messages(message_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING 1) "
    "INSERT INTO order_totals AS t (order_id, total, lines) SELECT $2, $3, 1 FROM ins "
    "ON CONFLICT (order_id) DO UPDATE SET total = t.total + EXCLUDED.total, lines = t.lines + 1";

// The postmaster and its children (backends, WAL writer, checkpointer, background writer).
idem_bench::io_counters server_io(int postmaster) {
    idem_bench::io_counters sum = read_io_of(postmaster);
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        const auto name = entry.path().filename().string();
        if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat{entry.path() / "stat"};
        std::string text;
        std::getline(stat, text);
        // pid (comm) state ppid ...: comm may hold spaces, so parse after its last ')'.
        auto close = text.rfind(')');
        if (close == std::string::npos || close + 4 > text.size()) continue;
        const int ppid = std::atoi(text.c_str() + close + 4);
        if (ppid != postmaster) continue;
        const auto io = read_io_of(std::atoi(name.c_str()));
        sum.write_bytes += io.write_bytes;
        sum.wchar += io.wchar;
    }
    return sum;
}

// Reads the result of one pipelined statement (its result, then the null that ends it).
bool take_result(connection& c, bool& applied) {
    PGresult* raw = PQgetResult(c.get());
    if (raw == nullptr) c.fail("pipeline ended early");
    result r{raw};
    if (PQresultStatus(raw) == PGRES_PIPELINE_SYNC) return false;
    if (!r.ok()) c.fail("pipelined statement");
    applied = std::string_view{PQcmdTuples(raw)} == "1";
    if (PQgetResult(c.get()) != nullptr) c.fail("a statement returned two results");
    return true;
}

run_result run_textbook(const run_options& o, std::uint64_t per_txn) {
    if (o.conninfo.empty() || o.server_pid == 0) throw std::runtime_error("--conninfo and --server-pid are required");
    run_result r;
    connection c{o.conninfo};
    exec(c, "SET client_min_messages = warning");
    exec(c, "DROP TABLE IF EXISTS processed_messages, order_totals");
    exec(c, "CREATE TABLE processed_messages(message_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())");
    exec(c, "CREATE TABLE order_totals(order_id text PRIMARY KEY, total bigint NOT NULL, lines bigint NOT NULL)");
    exec(c, "CHECKPOINT");
    {
        result prep{PQprepare(c.get(), "consume", consume_sql, 3, nullptr)};
        if (!prep.ok()) c.fail("prepare");
    }
    const int backend = std::atoi(scalar(c, "SELECT pg_backend_pid()").c_str());

    message_reader in{o.log, o.limit};
    message m;
    std::string id;
    std::string order;
    std::string amount;
    auto send = [&] {
        id.assign(m.message_id);
        order.assign(m.order_id);
        amount = std::to_string(m.amount);
        return std::array<const char*, 3>{id.c_str(), order.c_str(), amount.c_str()};
    };
    auto count = [&](bool applied) {
        if (applied) {
            ++r.applied;
        } else {
            ++r.duplicates;
        }
    };

    const auto io_before = server_io(o.server_pid);
    const auto client_before = idem_bench::read_io();
    const auto start = clock_type::now();
    if (per_txn == 1) {
        while (in.next(m)) {
            auto values = send();
            result res{PQexecPrepared(c.get(), "consume", 3, values.data(), nullptr, nullptr, 0)};
            if (!res.ok()) c.fail("execute");
            count(std::string_view{PQcmdTuples(res.get())} == "1");
            ++r.messages;
        }
    } else {
        if (PQenterPipelineMode(c.get()) != 1) c.fail("pipeline mode");
        bool more = true;
        while (more) {
            if (PQsendQueryParams(c.get(), "BEGIN", 0, nullptr, nullptr, nullptr, nullptr, 0) != 1) c.fail("BEGIN");
            std::uint64_t n = 0;
            while (n < per_txn && (more = in.next(m))) {
                auto values = send();
                if (PQsendQueryPrepared(c.get(), "consume", 3, values.data(), nullptr, nullptr, 0) != 1) c.fail("send");
                ++n;
            }
            if (PQsendQueryParams(c.get(), "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 0) != 1) c.fail("COMMIT");
            if (PQpipelineSync(c.get()) != 1) c.fail("sync");
            bool applied = false;
            take_result(c, applied);  // BEGIN
            for (std::uint64_t k = 0; k < n; ++k) {
                if (!take_result(c, applied)) c.fail("pipeline ended early");
                count(applied);
            }
            take_result(c, applied);  // COMMIT
            if (take_result(c, applied)) c.fail("no pipeline sync");
            r.messages += n;
        }
        if (PQexitPipelineMode(c.get()) != 1) c.fail("leaving pipeline mode");
    }
    r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    exec(c, "CHECKPOINT");
    const auto io_after = server_io(o.server_pid);
    const auto client_after = idem_bench::read_io();
    r.write_bytes = io_after.write_bytes - io_before.write_bytes + client_after.write_bytes - client_before.write_bytes;
    r.wchar = io_after.wchar - io_before.wchar + client_after.wchar - client_before.wchar;
    r.extra_rss_kb = peak_rss_kb(backend);
    r.store_bytes = std::stoull(
        scalar(c, "SELECT pg_total_relation_size('processed_messages') + pg_total_relation_size('order_totals')"));

    std::vector<std::pair<std::string, idem_bench::totals>> rows;
    {
        result scan{PQexec(c.get(), "SELECT order_id, total, lines FROM order_totals")};
        if (!scan.ok()) c.fail("scan");
        for (int i = 0; i < PQntuples(scan.get()); ++i) {
            rows.emplace_back(PQgetvalue(scan.get(), i, 0),
                              idem_bench::totals{std::stoll(PQgetvalue(scan.get(), i, 1)),
                                                 std::stoll(PQgetvalue(scan.get(), i, 2))});
        }
    }
    r.state = idem_bench::summarize(std::move(rows));
    exec(c, "DROP TABLE processed_messages, order_totals");
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main(argc, argv, "compare_pg",
                    {
                        {"pg-1", [](const run_options& o) { return run_textbook(o, 1); }},
                        {"pg-1000", [](const run_options& o) { return run_textbook(o, 1000); }},
                    });
}
