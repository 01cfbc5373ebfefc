// apply_bench: idem's apply path against the textbook idempotent consumer written
// directly with the LMDB C API, over the same pre-generated CloudEvents deliveries.
//
//   apply_bench [--messages N] [--aggregates A] [--duplicates F] [--batch B]
//               [--runs R] [--seed S] [--dir D] [--only idem|naive] [--quick]
//
// Both variants commit durably (fsync per batch), parse the same bytes and must end
// with the same order totals as a reference computed in memory. One line per run goes
// to stderr; the table of medians goes to stdout. --only runs one variant (to measure
// device-level writes of one of them from outside).

#include "workload.hpp"

#include <idem/idem.hpp>

#include <lmdb.h>
#include <simdjson.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

[[noreturn]] void idem_bench::usage(const char* why) {
    std::fprintf(stderr,
                 "apply_bench: %s\n"
                 "usage: apply_bench [--messages N] [--aggregates A] [--duplicates F] [--batch B]\n"
                 "                   [--runs R] [--seed S] [--dir D] [--only idem|naive] [--quick]\n",
                 why);
    std::exit(2);
}

namespace {

using namespace idem_bench;

struct bench_options {
    std::size_t messages = 1'000'000;
    std::size_t aggregates = 100'000;
    double duplicates = 0.10;
    std::size_t batch = 1000;
    std::size_t runs = 3;
    std::uint64_t seed = 42;
    std::filesystem::path dir{};
    std::string only{};  // run just this variant ("" for both)
};

bench_options parse_args(int argc, char** argv) {
    bench_options o;
    std::optional<std::size_t> messages;
    std::optional<std::size_t> aggregates;
    std::optional<std::size_t> runs;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--quick") {
            quick = true;
            continue;
        }
        if (arg == "--help" || arg == "-h") usage("idem apply path vs. a hand-written LMDB idempotent consumer");
        static constexpr std::array<std::string_view, 8> valued{"--messages", "--aggregates", "--duplicates", "--batch",
                                                                "--runs",     "--seed",       "--dir",        "--only"};
        if (std::find(valued.begin(), valued.end(), arg) == valued.end()) {
            usage(("unknown option " + std::string(arg)).c_str());
        }
        if (i + 1 >= argc) usage(("missing value for " + std::string(arg)).c_str());
        std::string_view value = argv[++i];
        if (arg == "--messages") {
            messages = parse_number<std::size_t>(arg, value);
        } else if (arg == "--aggregates") {
            aggregates = parse_number<std::size_t>(arg, value);
        } else if (arg == "--duplicates") {
            o.duplicates = parse_number<double>(arg, value);
        } else if (arg == "--batch") {
            o.batch = parse_number<std::size_t>(arg, value);
        } else if (arg == "--runs") {
            runs = parse_number<std::size_t>(arg, value);
        } else if (arg == "--seed") {
            o.seed = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--dir") {
            o.dir = std::string(value);
        } else if (arg == "--only") {
            if (value != "idem" && value != "naive") usage("--only takes idem or naive");
            o.only = std::string(value);
        }
    }
    // Explicit sizes win over --quick wherever they appear on the line.
    if (quick) {
        o.messages = 100'000;
        o.aggregates = 10'000;
        o.runs = 1;
    }
    if (messages) o.messages = *messages;
    if (aggregates) o.aggregates = *aggregates;
    if (runs) o.runs = *runs;
    if (o.messages == 0 || o.aggregates == 0 || o.batch == 0 || o.runs == 0) usage("sizes must be positive");
    if (!(o.duplicates >= 0.0 && o.duplicates < 1.0)) usage("--duplicates must be in [0, 1)");
    return o;
}

// --- variants --------------------------------------------------------------------

struct run_result {
    double seconds = 0;
    std::uint64_t written = 0;      // write_bytes delta over the timed loop
    std::uint64_t handed = 0;       // wchar delta over the timed loop
    std::uint64_t store_bytes = 0;  // data.mdb size afterwards
    std::size_t applied = 0;
    std::size_t duplicates = 0;
    std::size_t other = 0;  // outcomes that should not happen with this workload
    summary got;
};

std::uint64_t now_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
}

// --- variant "idem" --------------------------------------------------------------

run_result run_idem(const workload& w, const bench_options& o, const std::filesystem::path& dir) {
    run_result r;
    {
        idem::store_options so;
        so.path = dir;
        so.consumer = "order-projector";
        so.sync = idem::durability::full;
        idem::store store{so};
        store.add(order_totals_projection());

        std::span<const idem::delivery> all{w.deliveries};
        const auto io_before = read_io();
        const auto start = clock_type::now();
        for (std::size_t i = 0; i < all.size(); i += o.batch) {
            for (const auto& outcome : store.apply(all.subspan(i, std::min(o.batch, all.size() - i)))) {
                switch (outcome.kind) {
                case idem::outcome_kind::applied: ++r.applied; break;
                case idem::outcome_kind::duplicate_message: ++r.duplicates; break;
                default: ++r.other; break;
                }
            }
        }
        r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        const auto io_after = read_io();
        r.written = io_after.write_bytes - io_before.write_bytes;
        r.handed = io_after.wchar - io_before.wchar;

        r.got = read_summary(store.read());
    }
    r.store_bytes = std::filesystem::file_size(dir / "data.mdb");
    return r;
}

// --- variant "naive" -------------------------------------------------------------

void check(int rc, const char* what) {
    if (rc != 0) throw std::runtime_error(std::string("naive: ") + what + ": " + mdb_strerror(rc));
}

MDB_val as_val(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }

class naive_env {
public:
    explicit naive_env(const std::filesystem::path& dir) {
        std::filesystem::create_directories(dir);
        check(mdb_env_create(&env_), "mdb_env_create");
        check(mdb_env_set_maxdbs(env_, 2), "mdb_env_set_maxdbs");
        // Address space only: without MDB_WRITEMAP the file grows as pages are written.
        check(mdb_env_set_mapsize(env_, std::size_t{64} << 30), "mdb_env_set_mapsize");
        check(mdb_env_open(env_, dir.c_str(), MDB_NORDAHEAD, 0644), "mdb_env_open");
    }
    ~naive_env() { mdb_env_close(env_); }
    naive_env(const naive_env&) = delete;
    naive_env& operator=(const naive_env&) = delete;

    MDB_env* handle() const noexcept { return env_; }

private:
    MDB_env* env_ = nullptr;
};

// Aborts the transaction unless it was committed (release() forgets it first).
class naive_txn {
public:
    naive_txn(MDB_env* env, unsigned flags) { check(mdb_txn_begin(env, nullptr, flags, &txn_), "mdb_txn_begin"); }
    ~naive_txn() {
        if (txn_ != nullptr) mdb_txn_abort(txn_);
    }
    naive_txn(const naive_txn&) = delete;
    naive_txn& operator=(const naive_txn&) = delete;

    MDB_txn* handle() const noexcept { return txn_; }
    void commit() { check(mdb_txn_commit(std::exchange(txn_, nullptr)), "mdb_txn_commit"); }

private:
    MDB_txn* txn_ = nullptr;
};

// Reads {"order_id": ..., "amount": ...} from an envelope's data with simdjson.
class line_decoder {
public:
    bool decode(std::string_view data, std::string_view& order_id, std::int64_t& amount) {
        if (buffer_.capacity() < data.size() + simdjson::SIMDJSON_PADDING) {
            buffer_.reserve(data.size() + simdjson::SIMDJSON_PADDING);
        }
        buffer_.assign(data);
        simdjson::padded_string_view view{buffer_.data(), buffer_.size(), buffer_.capacity()};
        simdjson::ondemand::document doc;
        if (parser_.iterate(view).get(doc) != simdjson::SUCCESS) return false;
        // order_id views the parser's string buffer: valid until the next decode().
        if (doc["order_id"].get_string().get(order_id) != simdjson::SUCCESS) return false;
        return doc["amount"].get_int64().get(amount) == simdjson::SUCCESS;
    }

private:
    simdjson::ondemand::parser parser_;
    std::string buffer_;
};

void put_i64_le(unsigned char* out, std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(u >> (8 * i));
}

std::int64_t get_i64_le(const unsigned char* in) {
    std::uint64_t u = 0;
    for (int i = 8; i-- > 0;) u = (u << 8) | in[i];
    return static_cast<std::int64_t>(u);
}

run_result run_naive(const workload& w, const bench_options& o, const std::filesystem::path& dir) {
    run_result r;
    {
        naive_env env{dir};
        MDB_dbi processed = 0;
        MDB_dbi orders = 0;
        {
            naive_txn txn{env.handle(), 0};
            check(mdb_dbi_open(txn.handle(), "processed", MDB_CREATE, &processed), "open processed");
            check(mdb_dbi_open(txn.handle(), "orders", MDB_CREATE, &orders), "open orders");
            txn.commit();
        }

        idem::envelope_parser parser;
        line_decoder lines;
        idem::envelope ev;
        idem::parse_error err;
        std::string message_id;
        std::array<unsigned char, 8> time_bytes{};
        std::array<unsigned char, 16> row_bytes{};

        std::span<const idem::delivery> all{w.deliveries};
        const auto io_before = read_io();
        const auto start = clock_type::now();
        for (std::size_t i = 0; i < all.size(); i += o.batch) {
            naive_txn txn{env.handle(), 0};
            put_i64_le(time_bytes.data(), static_cast<std::int64_t>(now_ns()));
            for (const auto& d : all.subspan(i, std::min(o.batch, all.size() - i))) {
                if (!parser.parse(d.body, ev, err)) {
                    ++r.other;
                    continue;
                }
                message_id = d.message_id.empty() ? ev.message_id() : d.message_id;
                MDB_val key = as_val(message_id);
                MDB_val time{time_bytes.size(), time_bytes.data()};
                int rc = mdb_put(txn.handle(), processed, &key, &time, MDB_NOOVERWRITE);
                if (rc == MDB_KEYEXIST) {
                    ++r.duplicates;
                    continue;
                }
                check(rc, "put processed");

                std::string_view order_id;
                std::int64_t amount = 0;
                if (!lines.decode(ev.data, order_id, amount)) {
                    ++r.other;
                    continue;
                }
                MDB_val order_key = as_val(order_id);
                MDB_val row{};
                std::int64_t total = 0;
                std::int64_t count = 0;
                rc = mdb_get(txn.handle(), orders, &order_key, &row);
                if (rc == 0) {
                    if (row.mv_size != row_bytes.size()) throw std::runtime_error("naive: order row of wrong size");
                    total = get_i64_le(static_cast<const unsigned char*>(row.mv_data));
                    count = get_i64_le(static_cast<const unsigned char*>(row.mv_data) + 8);
                } else if (rc != MDB_NOTFOUND) {
                    check(rc, "get order");
                }
                put_i64_le(row_bytes.data(), total + amount);
                put_i64_le(row_bytes.data() + 8, count + 1);
                row = MDB_val{row_bytes.size(), row_bytes.data()};
                check(mdb_put(txn.handle(), orders, &order_key, &row, 0), "put order");
                ++r.applied;
            }
            txn.commit();
        }
        r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        const auto io_after = read_io();
        r.written = io_after.write_bytes - io_before.write_bytes;
        r.handed = io_after.wchar - io_before.wchar;

        std::vector<std::pair<std::string, totals>> rows;
        naive_txn txn{env.handle(), MDB_RDONLY};
        MDB_cursor* c = nullptr;
        check(mdb_cursor_open(txn.handle(), orders, &c), "open cursor");
        MDB_val k{};
        MDB_val v{};
        for (int rc = mdb_cursor_get(c, &k, &v, MDB_FIRST); rc != MDB_NOTFOUND; rc = mdb_cursor_get(c, &k, &v, MDB_NEXT)) {
            check(rc, "scan orders");
            const auto* bytes = static_cast<const unsigned char*>(v.mv_data);
            rows.emplace_back(std::string(static_cast<const char*>(k.mv_data), k.mv_size),
                              totals{get_i64_le(bytes), get_i64_le(bytes + 8)});
        }
        mdb_cursor_close(c);
        r.got = summarize(std::move(rows));
    }
    r.store_bytes = std::filesystem::file_size(dir / "data.mdb");
    return r;
}

// --- report ----------------------------------------------------------------------

struct variant {
    const char* name;
    run_result (*run)(const workload&, const bench_options&, const std::filesystem::path&);
    std::vector<double> rates{};
    std::vector<double> written_per_msg{};
    std::vector<double> handed_per_msg{};
    std::vector<double> store_mib{};
};

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse_args(argc, argv);
    const bool own_dir = o.dir.empty();
    const auto base = own_dir ? std::filesystem::temp_directory_path() /
                                    ("idem-apply-bench-" + std::to_string(::getpid()))
                              : o.dir;
    try {
        std::fprintf(stderr, "generating %s messages over %s aggregates (seed %llu)...\n",
                     with_commas(o.messages).c_str(), with_commas(o.aggregates).c_str(),
                     static_cast<unsigned long long>(o.seed));
        const auto w = generate(o.messages, o.aggregates, o.duplicates, o.seed);
        const auto expected = reference(w);
        const auto redeliveries = o.messages - w.distinct;

        std::vector<variant> variants;
        if (o.only.empty() || o.only == "idem") variants.push_back({"idem", &run_idem});
        if (o.only.empty() || o.only == "naive") variants.push_back({"naive", &run_naive});
        for (std::size_t run = 0; run < o.runs; ++run) {
            // Alternate which variant goes first, so drift of a shared machine hits both alike.
            for (std::size_t k = 0; k < variants.size(); ++k) {
                auto& v = variants[(k + run) % variants.size()];
                auto dir = base / (std::string(v.name) + "-" + std::to_string(run + 1));
                std::filesystem::remove_all(dir);
                auto r = v.run(w, o, dir);
                std::filesystem::remove_all(dir);

                const double n = static_cast<double>(o.messages);
                const double rate = n / r.seconds;
                const double written = static_cast<double>(r.written) / n;
                const double handed = static_cast<double>(r.handed) / n;
                const double mib = static_cast<double>(r.store_bytes) / (1024.0 * 1024.0);
                std::fprintf(stderr,
                             "[run %zu/%zu] %-5s %s msgs in %s s = %s msgs/s; %s B written/msg (write_bytes), "
                             "%s B pwritten/msg (wchar); store %s MiB; %zu applied, %zu duplicates\n",
                             run + 1, o.runs, v.name, with_commas(o.messages).c_str(), fixed(r.seconds, 2).c_str(),
                             with_commas(static_cast<std::uint64_t>(rate)).c_str(), fixed(written, 0).c_str(),
                             fixed(handed, 0).c_str(), fixed(mib, 1).c_str(), r.applied, r.duplicates);
                if (r.got != expected || r.applied != w.distinct || r.duplicates != redeliveries || r.other != 0) {
                    std::fprintf(stderr,
                                 "error: %s ended wrong\n  expected: %s; %zu applied, %zu duplicates\n"
                                 "  got:      %s; %zu applied, %zu duplicates, %zu other outcomes\n",
                                 v.name, describe(expected).c_str(), w.distinct, redeliveries,
                                 describe(r.got).c_str(), r.applied, r.duplicates, r.other);
                    if (own_dir) std::filesystem::remove_all(base);
                    return 1;
                }
                v.rates.push_back(rate);
                v.written_per_msg.push_back(written);
                v.handed_per_msg.push_back(handed);
                v.store_mib.push_back(mib);
            }
        }
        if (own_dir) std::filesystem::remove_all(base);

        std::printf("apply_bench: %s messages (%s distinct + %s redeliveries) over %s aggregates, "
                    "batch %zu, durable commits, %zu run%s, seed %llu\n\n",
                    with_commas(o.messages).c_str(), with_commas(w.distinct).c_str(),
                    with_commas(redeliveries).c_str(), with_commas(o.aggregates).c_str(), o.batch, o.runs,
                    o.runs == 1 ? "" : "s", static_cast<unsigned long long>(o.seed));
        std::printf("| variant | msgs/s (median of %zu) | ratio to naive | bytes written/msg (write_bytes) "
                    "| bytes pwritten/msg (wchar) | store size MiB |\n",
                    o.runs);
        std::printf("|---|---:|---:|---:|---:|---:|\n");
        std::optional<double> naive_rate;
        for (const auto& v : variants) {
            if (std::string_view{v.name} == "naive") naive_rate = median(v.rates);
        }
        for (const auto& v : variants) {
            const double rate = median(v.rates);
            std::string ratio = naive_rate ? fixed(rate / *naive_rate, 2) + "x" : "-";
            std::printf("| %s | %s | %s | %s | %s | %s |\n", v.name,
                        with_commas(static_cast<std::uint64_t>(rate)).c_str(), ratio.c_str(),
                        with_commas(static_cast<std::uint64_t>(median(v.written_per_msg) + 0.5)).c_str(),
                        with_commas(static_cast<std::uint64_t>(median(v.handed_per_msg) + 0.5)).c_str(),
                        fixed(median(v.store_mib), 1).c_str());
        }
        std::printf("\nbytes/msg are medians of /proc/self/io deltas over the timed loop divided by messages: "
                    "write_bytes counts whole page-cache folios dirtied (large folios inflate it), "
                    "wchar the bytes LMDB passed to pwrite\n");
        std::printf("every run ended with the reference totals: %s\n", describe(expected).c_str());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "apply_bench: %s\n", e.what());
        if (own_dir) std::filesystem::remove_all(base);
        return 1;
    }
}
