// compare_lmdb: the textbook idempotent consumer written directly with the LMDB C API
// (see compare.hpp). Two tables: processed (message id -> processed-at time) and orders
// (order id -> total, lines). Per message: put the message id with MDB_NOOVERWRITE; if it
// was new, read the order row and put it back with the amount added.
//
//   lmdb-1000   1000 messages per transaction, each commit synced (LMDB's default)
//   lmdb-bulk   100,000 messages per transaction, MDB_NOSYNC, one sync at the end: the
//               bulk-load floor of this schema

#include "compare.hpp"

#include <lmdb.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace idem_compare;
using idem_bench::clock_type;

void check(int rc, const char* what) {
    if (rc != 0) throw std::runtime_error(std::string(what) + ": " + mdb_strerror(rc));
}

MDB_val as_val(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }

void put_i64(unsigned char* out, std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(u >> (8 * i));
}

std::int64_t get_i64(const unsigned char* in) {
    std::uint64_t u = 0;
    for (int i = 8; i-- > 0;) u = (u << 8) | in[i];
    return static_cast<std::int64_t>(u);
}

class env_owner {
public:
    env_owner(const std::filesystem::path& dir, unsigned flags) {
        check(mdb_env_create(&env_), "mdb_env_create");
        check(mdb_env_set_maxdbs(env_, 2), "mdb_env_set_maxdbs");
        // Address space only: without MDB_WRITEMAP the file grows as pages are written.
        check(mdb_env_set_mapsize(env_, std::size_t{64} << 30), "mdb_env_set_mapsize");
        check(mdb_env_open(env_, dir.c_str(), flags | MDB_NORDAHEAD, 0644), "mdb_env_open");
    }
    ~env_owner() { mdb_env_close(env_); }
    env_owner(const env_owner&) = delete;
    env_owner& operator=(const env_owner&) = delete;
    MDB_env* get() const noexcept { return env_; }

private:
    MDB_env* env_ = nullptr;
};

class txn_owner {
public:
    txn_owner(MDB_env* env, unsigned flags) { check(mdb_txn_begin(env, nullptr, flags, &txn_), "mdb_txn_begin"); }
    ~txn_owner() {
        if (txn_ != nullptr) mdb_txn_abort(txn_);
    }
    txn_owner(const txn_owner&) = delete;
    txn_owner& operator=(const txn_owner&) = delete;
    MDB_txn* get() const noexcept { return txn_; }
    void commit() { check(mdb_txn_commit(std::exchange(txn_, nullptr)), "mdb_txn_commit"); }

private:
    MDB_txn* txn_ = nullptr;
};

run_result run_textbook(const run_options& o, std::uint64_t per_txn, bool durable) {
    run_result r;
    {
        env_owner env{o.dir, durable ? 0u : MDB_NOSYNC};
        MDB_dbi processed = 0;
        MDB_dbi orders = 0;
        {
            txn_owner txn{env.get(), 0};
            check(mdb_dbi_open(txn.get(), "processed", MDB_CREATE, &processed), "open processed");
            check(mdb_dbi_open(txn.get(), "orders", MDB_CREATE, &orders), "open orders");
            txn.commit();
        }
        message_reader in{o.log, o.limit};
        message m;
        std::array<unsigned char, 8> time_bytes{};
        std::array<unsigned char, 16> row_bytes{};

        const auto io_before = idem_bench::read_io();
        const auto start = clock_type::now();
        bool more = true;
        while (more) {
            txn_owner txn{env.get(), 0};
            put_i64(time_bytes.data(), unix_ns());
            std::uint64_t n = 0;
            while (n < per_txn && (more = in.next(m))) {
                ++n;
                MDB_val key = as_val(m.message_id);
                MDB_val time{time_bytes.size(), time_bytes.data()};
                int rc = mdb_put(txn.get(), processed, &key, &time, MDB_NOOVERWRITE);
                if (rc == MDB_KEYEXIST) {
                    ++r.duplicates;
                    continue;
                }
                check(rc, "put processed");
                MDB_val order = as_val(m.order_id);
                MDB_val row{};
                std::int64_t total = 0;
                std::int64_t lines = 0;
                rc = mdb_get(txn.get(), orders, &order, &row);
                if (rc == 0) {
                    total = get_i64(static_cast<const unsigned char*>(row.mv_data));
                    lines = get_i64(static_cast<const unsigned char*>(row.mv_data) + 8);
                } else if (rc != MDB_NOTFOUND) {
                    check(rc, "get order");
                }
                put_i64(row_bytes.data(), total + m.amount);
                put_i64(row_bytes.data() + 8, lines + 1);
                row = MDB_val{row_bytes.size(), row_bytes.data()};
                check(mdb_put(txn.get(), orders, &order, &row, 0), "put order");
                ++r.applied;
            }
            r.messages += n;
            txn.commit();
        }
        if (!durable) check(mdb_env_sync(env.get(), 1), "mdb_env_sync");
        r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        const auto io_after = idem_bench::read_io();
        r.write_bytes = io_after.write_bytes - io_before.write_bytes;
        r.wchar = io_after.wchar - io_before.wchar;

        std::vector<std::pair<std::string, idem_bench::totals>> rows;
        txn_owner txn{env.get(), MDB_RDONLY};
        MDB_cursor* c = nullptr;
        check(mdb_cursor_open(txn.get(), orders, &c), "mdb_cursor_open");
        MDB_val k{};
        MDB_val v{};
        for (int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc != MDB_NOTFOUND; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
            check(rc, "scan orders");
            const auto* bytes = static_cast<const unsigned char*>(v.mv_data);
            rows.emplace_back(std::string(static_cast<const char*>(k.mv_data), k.mv_size),
                              idem_bench::totals{get_i64(bytes), get_i64(bytes + 8)});
        }
        mdb_cursor_close(c);
        r.state = idem_bench::summarize(std::move(rows));
    }
    r.store_bytes = std::filesystem::file_size(o.dir / "data.mdb");
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    return run_main(argc, argv, "compare_lmdb",
                    {
                        {"lmdb-1000", [](const run_options& o) { return run_textbook(o, 1000, true); }},
                        {"lmdb-bulk", [](const run_options& o) { return run_textbook(o, 100'000, false); }},
                    });
}
