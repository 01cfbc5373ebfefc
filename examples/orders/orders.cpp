// The textbook case: order lines arrive with at-least-once delivery, and the
// `order-totals` read model must count every line exactly once.
//
//   orders [DIR]     applies a stream of order events with redeliveries and
//                    republished duplicates, then prints the totals it read back.
//                    DIR (default orders-data) must be new, empty, or the store an
//                    earlier run of this program left there; anything else is refused.

#include <idem/examples/orders.hpp>
#include <idem/idem.hpp>
#include <idem/storage/store_dir.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

// The event payload (line_added: {order_id, amount: {minor, currency}}, decoded from the
// envelope's `data` by its cereal serialize()) and the read model (order_total: {total, lines,
// currency}, one row per order) live in the examples library: <idem/examples/orders.hpp>.
using idem::examples::order_total;

namespace {

// One order line, written at version 1 (no dataschema, a bare amount in EUR) or version 2.
idem::envelope order_line(int version, const std::string& id, const std::string& order, std::int64_t amount) {
    idem::envelope e;
    e.id = id;
    e.source = "/orders";
    e.type = idem::examples::line_added::event_type;
    if (version == 1) {
        e.data = R"({"order_id":")" + order + R"(","amount":)" + std::to_string(amount) + "}";
    } else {
        e.dataschema = idem::examples::line_added::dataschema;
        e.data = R"({"order_id":")" + order + R"(","amount":{"minor":)" + std::to_string(amount) +
                 R"(,"currency":"EUR"}})";
    }
    return e;
}

constexpr const char* usage = "usage: orders [DIR]   (DIR: a new or empty directory, default orders-data)\n";

// Whether dir holds the store an earlier run of this program made: a store's files and
// nothing else (idem::foreign_files), with this program's consumer and projection in it.
bool holds_our_store(const std::filesystem::path& dir) {
    if (!idem::foreign_files(dir).empty()) return false;
    try {
        auto snap = idem::snapshot::open(dir);
        std::size_t rows = 0;
        snap.scan_raw("order-totals", [&](const idem::snapshot::raw_row_view&) { ++rows; });
        return rows > 0 && snap.consumer("order-projector").stats().batches > 0;
    } catch (const std::exception&) {
        return false;  // not a store, or not this program's
    }
}

// Makes dir ready for a fresh store. An example is copied into real programs, so it deletes
// nothing it did not make: a directory holding anything else is refused, untouched.
bool prepare(const std::filesystem::path& dir) {
    if (!std::filesystem::exists(dir) || (std::filesystem::is_directory(dir) && std::filesystem::is_empty(dir))) {
        return true;
    }
    if (std::filesystem::is_directory(dir) && holds_our_store(dir)) {
        idem::remove_store_dir(dir);  // removes only a store's files, and refuses anything more
        return true;
    }
    std::fprintf(stderr, "orders: %s exists and is not a store this program made; not touching it "
                         "(give a new or empty directory)\n", dir.c_str());
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    std::filesystem::path dir = "orders-data";
    if (argc > 2) {
        std::fputs(usage, stderr);
        return 2;
    }
    if (argc == 2) {
        const std::string_view arg = argv[1];
        if (arg == "-h" || arg == "--help") {
            std::fputs(usage, stdout);
            return 0;
        }
        if (arg.starts_with("-")) {
            std::fprintf(stderr, "orders: unknown option '%s'\n%s", argv[1], usage);
            return 2;
        }
        dir = arg;
    }
    if (!prepare(dir)) return 2;

    // The projection: what an event does to its row, and which row that is.
    idem::store store{{.path = dir, .consumer = "order-projector"}};
    // order_totals() is idem::projection<order_total>("order-totals")
    //     .on<line_added>([](order_total& t, const line_added& e) { t.add(e); })   // total += amount, ++lines
    //     .key([](const line_added& e) { return e.order_id; })
    //     .state_version(2)                                                   // rows gained a currency
    //     .migrate<order_total_v1>(1, [](const order_total_v1& old) { return order_total{old.total, old.lines, "EUR"}; });
    store.add(idem::examples::order_totals());
    // Version 1 events are read as version 2 before the handler sees them:
    // idem::upcast_step<line_added_v1, line_added>("order.line_added", 1,
    //     [](const line_added_v1& v1) { return line_added{v1.order_id, money{v1.amount, "EUR"}}; });
    store.upcast(idem::examples::order_line_upcaster());

    // 10,000 distinct order lines over 100 orders, half written at version 1 and half at
    // version 2; the expected totals are computed aside.
    std::mt19937_64 rng{42};
    std::vector<idem::envelope> events;
    std::vector<idem::envelope> rewritten;  // each event at the other version
    std::map<std::string, std::int64_t> expected;
    for (int i = 0; i < 10000; ++i) {
        std::string order = "order-" + std::to_string(rng() % 100);
        auto amount = static_cast<std::int64_t>(rng() % 10000);
        const int version = 1 + static_cast<int>(rng() % 2);
        events.push_back(order_line(version, "line-" + std::to_string(i), order, amount));
        rewritten.push_back(order_line(3 - version, "line-" + std::to_string(i), order, amount));
        expected[order] += amount;
    }

    // Deliver them the way brokers do: in batches, with 10% redelivered (same message id)
    // and 5% republished under a new message id (same event id), at the other version.
    std::vector<idem::delivery> batch;
    std::size_t delivered = 0;
    std::map<idem::outcome_kind, std::size_t> counts;
    auto flush = [&] {
        for (const auto& o : store.apply(batch)) ++counts[o.kind];
        delivered += batch.size();
        batch.clear();
    };
    for (std::size_t i = 0; i < events.size(); ++i) {
        batch.push_back({events[i].to_json(), "msg-" + std::to_string(i)});
        if (rng() % 10 == 0) batch.push_back({events[i].to_json(), "msg-" + std::to_string(i)});
        if (rng() % 20 == 0) batch.push_back({rewritten[i].to_json(), "republished-" + std::to_string(i)});
        if (batch.size() >= 500) flush();
    }
    flush();

    // Read the totals back from a snapshot and check them against the reference.
    auto snap = store.read();
    int wrong = 0;
    for (const auto& [order, total] : expected) {
        auto row = snap.get<order_total>("order-totals", order);  // rows at state version 2
        if (!row || row->state.total != total) ++wrong;
    }
    for (const auto& r : snap.rows<order_total>("order-totals")) {
        if (r.key == "order-1" || r.key == "order-42" || r.key == "order-99") {
            std::printf("%-9s total=%lld %s lines=%lld version=%llu\n", r.key.c_str(),
                        static_cast<long long>(r.state.total), r.state.currency.c_str(),
                        static_cast<long long>(r.state.lines), static_cast<unsigned long long>(r.version));
        }
    }
    std::printf("delivered %zu messages for %zu events: applied=%zu duplicate_message=%zu duplicate_event=%zu\n",
                delivered, events.size(), counts[idem::outcome_kind::applied],
                counts[idem::outcome_kind::duplicate_message], counts[idem::outcome_kind::duplicate_event]);
    std::printf("%zu orders, %d wrong totals\n", expected.size(), wrong);
    return wrong == 0 ? 0 : 1;
}
