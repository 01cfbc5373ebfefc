// The textbook case: order lines arrive with at-least-once delivery, and the
// `order-totals` read model must count every line exactly once.
//
//   orders [DIR]     applies a stream of order events with redeliveries and
//                    republished duplicates, then prints the totals it read back.

#include <idem/examples/orders.hpp>
#include <idem/idem.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

// The event payload (line_added: {order_id, amount}, decoded from the envelope's `data`
// by its cereal serialize()) and the read model (order_total: {total, lines}, one row per
// order) live in the examples library: <idem/examples/orders.hpp>.
using idem::examples::order_total;

int main(int argc, char** argv) {
    std::filesystem::path dir = argc > 1 ? argv[1] : "orders-data";
    std::filesystem::remove_all(dir);

    // The projection: what an event does to its row, and which row that is.
    idem::store store{{.path = dir, .consumer = "order-projector"}};
    // order_totals() is idem::projection<order_total>("order-totals")
    //     .on<line_added>([](order_total& t, const line_added& e) { t.add(e); })   // total += amount, ++lines
    //     .key([](const line_added& e) { return e.order_id; });
    store.add(idem::examples::order_totals());

    // 10,000 distinct order lines over 100 orders; the expected totals are computed aside.
    std::mt19937_64 rng{42};
    std::vector<idem::envelope> events;
    std::map<std::string, std::int64_t> expected;
    for (int i = 0; i < 10000; ++i) {
        idem::envelope e;
        e.id = "line-" + std::to_string(i);
        e.source = "/orders";
        e.type = idem::examples::line_added::event_type;
        std::string order = "order-" + std::to_string(rng() % 100);
        auto amount = static_cast<std::int64_t>(rng() % 10000);
        e.data = R"({"order_id":")" + order + R"(","amount":)" + std::to_string(amount) + "}";
        expected[order] += amount;
        events.push_back(std::move(e));
    }

    // Deliver them the way brokers do: in batches, with 10% redelivered (same message id)
    // and 5% republished under a new message id (same event id).
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
        if (rng() % 20 == 0) batch.push_back({events[i].to_json(), "republished-" + std::to_string(i)});
        if (batch.size() >= 500) flush();
    }
    flush();

    // Read the totals back from a snapshot and check them against the reference.
    auto snap = store.read();
    int wrong = 0;
    for (const auto& [order, total] : expected) {
        auto row = snap.get<order_total>("order-totals", order);
        if (!row || row->state.total != total) ++wrong;
    }
    for (const auto& r : snap.rows<order_total>("order-totals")) {
        if (r.key == "order-1" || r.key == "order-42" || r.key == "order-99") {
            std::printf("%-9s total=%lld lines=%lld version=%llu\n", r.key.c_str(),
                        static_cast<long long>(r.state.total), static_cast<long long>(r.state.lines),
                        static_cast<unsigned long long>(r.version));
        }
    }
    std::printf("delivered %zu messages for %zu events: applied=%zu duplicate_message=%zu duplicate_event=%zu\n",
                delivered, events.size(), counts[idem::outcome_kind::applied],
                counts[idem::outcome_kind::duplicate_message], counts[idem::outcome_kind::duplicate_event]);
    std::printf("%zu orders, %d wrong totals\n", expected.size(), wrong);
    return wrong == 0 ? 0 : 1;
}
