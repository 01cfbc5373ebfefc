// The textbook case: order lines arrive with at-least-once delivery, and the
// `order-totals` read model must count every line exactly once.
//
//   orders [DIR]     applies a stream of order events with redeliveries and
//                    republished duplicates, then prints the totals it read back;
//                    then builds a second read model, totals per customer, from the
//                    first one's change feed through an engine subscription.
//                    DIR (default orders-data) must be new, empty, or the store an
//                    earlier run of this program left there; anything else is refused.

#include <idem/engine/engine.hpp>
#include <idem/examples/orders.hpp>
#include <idem/idem.hpp>
#include <idem/storage/store_dir.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
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

// --- the second read model: totals per customer, from the order totals' changes ---------------

// An order's row changed: what the chain delivers to the customer read model, as a CloudEvent
// of type idem.change.order-totals whose subject is the order and sequence the row's version.
struct order_changed {
    static constexpr const char* event_type = "idem.change.order-totals";
    std::int64_t total = 0;
    template <class A>
    void serialize(A& a) {
        a(CEREAL_NVP(total));
    }
};

// One customer's orders and their sum; an order's newest total replaces its previous one.
struct customer_total {
    std::map<std::string, std::int64_t> orders;
    std::int64_t total = 0;
    template <class A>
    void serialize(A& a) {
        a(CEREAL_NVP(orders), CEREAL_NVP(total));
    }
};

// Order N belongs to customer N % 10.
std::string customer_of(std::string_view order) {
    return "customer-" + std::to_string(std::stoi(std::string(order.substr(order.find('-') + 1))) % 10);
}

idem::projection<customer_total> customer_totals() {
    return idem::projection<customer_total>("customer-totals")
        .on<order_changed>([](customer_total& c, const order_changed& e, const idem::meta& m) {
            auto& order = c.orders[std::string(m.subject)];
            c.total += e.total - order;
            order = e.total;
        })
        .key([](const order_changed&, const idem::meta& m) { return customer_of(m.subject); });
}

// A change of an order's row as the event the customer read model applies. Its id names the
// store, the row and its version: delivered twice (a subscriber resumed from an older
// position), the inbox drops it; its sequence keeps an older version from replacing a newer one.
idem::delivery as_event(const idem::change& c, const std::string& store_id) {
    const auto state = idem::state_of(idem::examples::order_totals(), c);
    idem::envelope e;
    e.id = store_id + "/" + c.projection + "/" + c.key + "/" + std::to_string(c.version);
    e.source = "/orders/" + c.projection;
    e.type = order_changed::event_type;
    e.subject = c.key;
    e.sequence = c.version;
    e.data = R"({"total":)" + std::to_string(state.total) + "}";
    return {e.to_json(), e.id};
}

// How far the chain must follow: every order line submitted has completed, and the feed has
// passed the last commit one of them (or the batch phase) made. Touched on the io thread only.
struct progress {
    std::size_t submitted = 0;
    std::uint64_t until = 0;
};

// Follows the order totals' changes and applies each to the customer read model, in the same
// engine, until it has caught up with every order line submitted.
boost::asio::awaitable<void> chain(idem::engine& engine, idem::subscription& changes, const progress& p) {
    const auto store_id = engine.read().store_id();
    while (p.submitted > 0 || changes.position().commit < p.until) {
        auto [ec, batch] = co_await changes.async_next(boost::asio::use_awaitable);
        if (ec == std::errc::operation_canceled) continue;  // the last order line completed: look again
        if (ec) throw std::system_error(ec, changes.error_message());
        for (const auto& c : batch) {
            if (c.projection != "order-totals") continue;
            auto [applied, outcome] = co_await engine.async_apply(as_event(c, store_id), boost::asio::use_awaitable);
            if (applied) throw std::system_error(applied, "customer-totals");
        }
    }
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
    std::optional<idem::store> opened{idem::store_options{.path = dir, .consumer = "order-projector"}};
    auto& store = *opened;
    // order_totals() is idem::projection<order_total>("order-totals")
    //     .on<line_added>([](order_total& t, const line_added& e) { t.add(e); })   // total += amount, ++lines
    //     .key([](const line_added& e) { return e.order_id; })
    //     .state_version(2)                                                   // rows gained a currency
    //     .migrate<order_total_v1>(1, [](const order_total_v1& old) { return order_total{old.total, old.lines, "EUR"}; });
    store.add(idem::examples::order_totals().changes());  // its row changes go to the change feed
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
    std::optional<idem::snapshot> held{store.read()};
    auto& snap = *held;
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
    const auto last_commit = snap.commit();
    held.reset();  // the engine below opens the store again: no snapshot or writer of ours may be left
    opened.reset();

    // Chaining: an engine over the same store follows the order totals' change feed from its
    // start and builds totals per customer from it; order lines keep arriving meanwhile, and
    // their changes flow on to the customers as soon as their commits are durable.
    boost::asio::io_context io;
    idem::engine_options eo;
    eo.store = {.path = dir, .consumer = "order-projector", .gaps = idem::gap_policy::apply};  // versions skip
    idem::engine engine{io.get_executor(), eo};
    engine.add(idem::examples::order_totals().changes());
    engine.add(customer_totals());
    auto changes = engine.subscribe(std::uint64_t{0});
    progress p{0, last_commit};
    for (int i = 0; i < 200; ++i) {
        std::string order = "order-" + std::to_string(rng() % 100);
        auto amount = static_cast<std::int64_t>(rng() % 10000);
        expected[order] += amount;
        ++p.submitted;
        engine.async_apply({order_line(2, "late-line-" + std::to_string(i), order, amount).to_json(), ""},
                           [&](std::error_code ec, idem::outcome o) {
                               if (ec) throw std::system_error(ec, "order line");
                               p.until = std::max(p.until, o.commit);
                               // Its changes may have reached the chain already: wake it to see it is done.
                               if (--p.submitted == 0) changes.cancel();
                           });
    }
    std::exception_ptr failed;
    boost::asio::co_spawn(io, chain(engine, changes, p), [&](std::exception_ptr e) { failed = e; });
    io.run();  // until the chain has caught up
    if (failed) std::rethrow_exception(failed);

    std::map<std::string, std::int64_t> by_customer;
    for (const auto& [order, total] : expected) by_customer[customer_of(order)] += total;
    int wrong_customers = 0;
    auto after = engine.read();
    for (const auto& [customer, total] : by_customer) {
        auto row = after.get<customer_total>("customer-totals", customer);
        if (!row || row->state.total != total) ++wrong_customers;
    }
    std::printf("%zu customers from the order totals' changes, %d wrong totals\n", by_customer.size(), wrong_customers);
    return wrong == 0 && wrong_customers == 0 ? 0 : 1;
}
