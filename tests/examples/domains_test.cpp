// The example domains: their arithmetic against independent references, and their
// projections through a real store (effect keys, contributing sets, rejected events).

#include <idem/examples/domains.hpp>
#include <idem/cli/tool.hpp>

#include "../common/temp_dir.hpp"

#include <idem/storage/envelope.hpp>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstdint>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ex = idem::examples;
using idem::test::temp_dir;

namespace {

constexpr const char* consumer = "projector";

idem::store_options options(const std::filesystem::path& path) {
    idem::store_options o;
    o.path = path;
    o.consumer = consumer;
    o.sync = idem::durability::none;
    return o;
}

// One envelope as JSON text.
std::string envelope(const std::string& id, const std::string& source, const std::string& type,
                     const std::string& subject, std::uint64_t sequence, const std::string& data,
                     const std::string& msgid = "") {
    idem::envelope e;
    e.id = id;
    e.source = source;
    e.type = type;
    e.subject = subject;
    if (sequence != 0) e.sequence = sequence;
    e.msgid = msgid;
    e.data = data;
    return e.to_json();
}

std::string fill_data(const std::string& account, const std::string& instrument, const std::string& side,
                      std::int64_t qty, std::int64_t price, const std::string& exec_id) {
    return R"({"account":")" + account + R"(","instrument":")" + instrument + R"(","side":")" + side + R"(","qty":)" +
           std::to_string(qty) + R"(,"price":)" + std::to_string(price) + R"(,"exec_id":")" + exec_id + R"("})";
}

// A state as the JSON `idem get` prints (cereal's JSON archive through the state's serialize()).
template <class State>
std::string json_of(State& state) {
    std::ostringstream os;
    {
        cereal::JSONOutputArchive ar{os, cereal::JSONOutputArchive::Options::NoIndent()};
        state.serialize(ar);
    }
    // cereal's NoIndent still breaks lines: compact it the way `idem get` does.
    const std::string text = os.str();
    std::string compact(text.size(), '\0');
    std::size_t size = 0;
    REQUIRE(simdjson::minify(text.data(), text.size(), compact.data(), size) == simdjson::SUCCESS);
    compact.resize(size);
    return compact;
}

// A state read back from that JSON.
template <class State>
State from_json(const std::string& text) {
    std::istringstream is{text};
    cereal::JSONInputArchive ar{is};
    State state{};
    state.serialize(ar);
    return state;
}

}  // namespace

TEST_SUITE("trading") {
    TEST_CASE("a position that flips from long to short realizes exactly its closed part") {
        ex::position p;
        p.apply(10, 100);
        p.apply(5, 103);
        CHECK(p.qty == 15);
        CHECK(p.cost == 1515);
        CHECK(p.avg_price == 101);
        CHECK(p.realized_pnl == 0);

        // Sell 20 at 110: closes the 15 long (1650 - 1515 = 135), opens 5 short at 110.
        p.apply(-20, 110);
        CHECK(p.qty == -5);
        CHECK(p.cost == -550);
        CHECK(p.avg_price == 110);
        CHECK(p.realized_pnl == 135);

        // Buy back 2 at 100: 2 x (110 - 100) = 20 more.
        p.apply(2, 100);
        CHECK(p.qty == -3);
        CHECK(p.cost == -330);
        CHECK(p.realized_pnl == 155);

        // Buy 3 at 120: a loss of 30 closes it flat.
        p.apply(3, 120);
        CHECK(p.qty == 0);
        CHECK(p.cost == 0);
        CHECK(p.avg_price == 0);
        CHECK(p.realized_pnl == 125);
    }

    TEST_CASE("the average price rounds halves away from zero and a partial close keeps the exact cost") {
        SUBCASE("long") {
            ex::position p;
            p.apply(1, 100);
            p.apply(1, 101);
            CHECK(p.avg_price == 101);  // 100.5
            p.apply(1, 100);
            CHECK(p.cost == 301);
            CHECK(p.avg_price == 100);  // 100.33
            p.apply(-1, 110);           // releases 301 / 3 = 100 (truncated)
            CHECK(p.realized_pnl == 10);
            CHECK(p.cost == 201);
            CHECK(p.avg_price == 101);  // 100.5
            p.apply(-2, 110);           // the rest of the cost goes with the rest of the units
            CHECK(p.realized_pnl == 10 + 220 - 201);
            CHECK(p.cost == 0);
        }
        SUBCASE("short") {
            ex::position p;
            p.apply(-1, 100);
            p.apply(-1, 101);
            CHECK(p.qty == -2);
            CHECK(p.cost == -201);
            CHECK(p.avg_price == 101);
            p.apply(1, 90);  // releases -201 / 2 = -100 (truncated toward zero): 100 - 90
            CHECK(p.realized_pnl == 10);
            CHECK(p.cost == -101);
            CHECK(p.avg_price == 101);
        }
        SUBCASE("negative prices") {
            ex::position p;
            p.apply(2, -37);
            CHECK(p.cost == -74);
            CHECK(p.avg_price == -37);
            p.apply(1, -36);
            CHECK(p.avg_price == -37);  // -36.67
        }
    }

    TEST_CASE("realized PnL plus the open cost always equals the cash flow") {
        // Independent reference: the cash paid and received, fill by fill. At every step
        // realized_pnl - cost == -(sum of signed qty x price), and flat means realized == cash.
        std::mt19937_64 rng{7};
        for (int round = 0; round < 200; ++round) {
            ex::position p;
            std::int64_t cash = 0;
            std::int64_t net = 0;
            for (int i = 0; i < 50; ++i) {
                auto qty = static_cast<std::int64_t>(rng() % 300) + 1;
                if (rng() % 2 == 0) qty = -qty;
                auto price = static_cast<std::int64_t>(rng() % 2000) + 9000;
                p.apply(qty, price);
                cash -= qty * price;
                net += qty;
                REQUIRE(p.qty == net);
                REQUIRE(p.realized_pnl - p.cost == cash);
                REQUIRE(((p.qty > 0 && p.cost > 0) || (p.qty < 0 && p.cost < 0) || (p.qty == 0 && p.cost == 0)));
            }
            if (net != 0) p.apply(-net, 10'000);
            cash += net * 10'000;
            CHECK(p.qty == 0);
            CHECK(p.cost == 0);
            CHECK(p.realized_pnl == cash);
        }
    }

    TEST_CASE("a fill with a bad side or quantity is refused and changes nothing") {
        ex::position p;
        p.apply(5, 100);
        const auto before = json_of(p);
        ex::fill f{"acct-1", "ES", "hold", 3, 100, "x-1"};
        CHECK_THROWS_AS(p.apply(f), std::invalid_argument);
        f.side = "buy";
        f.qty = 0;
        CHECK_THROWS_AS(p.apply(f), std::invalid_argument);
        f.qty = -2;
        CHECK_THROWS_AS(p.apply(f), std::invalid_argument);
        ex::position big;
        big.apply(2, std::int64_t{1} << 61);
        CHECK_THROWS_AS(big.apply(2, std::int64_t{1} << 61), std::overflow_error);
        CHECK(big.qty == 2);
        CHECK(json_of(p) == before);
    }

    TEST_CASE("the positions projection counts an execution once, whatever event carries it") {
        temp_dir dir;
        idem::store store{options(dir.path())};
        ex::add_all(store);
        const std::string key = "acct-1/ES";
        auto d1 = fill_data("acct-1", "ES", "buy", 10, 100, "XNAS-1");
        auto d2 = fill_data("acct-1", "ES", "sell", 4, 120, "XNAS-2");
        std::vector<idem::delivery> batch{
            {envelope("f-1", "/venue/xnas", "order.filled", key, 1, d1), ""},
            {envelope("f-2", "/venue/xnas", "order.filled", key, 2, d2), ""},
            // A drop copy re-sends exec XNAS-2 under its own event id, without a sequence.
            {envelope("dc-9", "/dropcopy/xnas", "order.filled", key, 0, d2), ""},
            {envelope("f-3", "/venue/xnas", "order.filled", key, 3, fill_data("acct-1", "ES", "hold", 1, 1, "XNAS-3")),
             ""},
        };
        auto out = store.apply(batch);
        CHECK(out[0].kind == idem::outcome_kind::applied);
        CHECK(out[1].kind == idem::outcome_kind::applied);
        CHECK(out[2].kind == idem::outcome_kind::duplicate_event);
        CHECK(out[3].kind == idem::outcome_kind::dead_lettered);
        CHECK(out[3].why == idem::reason::handler_failed);
        CHECK(out[3].detail.find("side must be \"buy\" or \"sell\"") != std::string::npos);

        auto row = store.read().get<ex::position>(ex::positions_projection, key);
        REQUIRE(row);
        CHECK(row->state.qty == 6);
        CHECK(row->state.cost == 600);
        CHECK(row->state.realized_pnl == 80);
        CHECK(row->version == 2);
        CHECK(json_of(row->state) == R"({"qty":6,"avg_price":100,"realized_pnl":80,"cost":600})");
    }
}

TEST_SUITE("game") {
    TEST_CASE("a leaderboard fed by several player streams counts each score once") {
        temp_dir dir;
        idem::store store{options(dir.path())};
        ex::add_all(store);
        auto score = [](const std::string& player, std::int64_t points) {
            return R"({"match":"match-1","player":")" + player + R"(","points":)" + std::to_string(points) + "}";
        };
        std::vector<idem::delivery> batch{
            {envelope("s-1", "/match-server/eu-1", "player.scored", "alice", 1, score("alice", 10), "m-1"), ""},
            {envelope("s-2", "/match-server/eu-1", "player.scored", "bob", 1, score("bob", 7)), ""},
            {envelope("s-3", "/match-server/eu-1", "player.scored", "alice", 2, score("alice", 5)), ""},
            {envelope("s-4", "/match-server/eu-1", "player.scored", "carol", 1, score("carol", -2)), ""},
            // Republished under a new message id: the same event, already in the row.
            {envelope("s-2", "/match-server/eu-1", "player.scored", "bob", 1, score("bob", 7), "m-77"), ""},
            // Redelivered: the same message.
            {envelope("s-1", "/match-server/eu-1", "player.scored", "alice", 1, score("alice", 10), "m-1"), ""},
        };
        auto out = store.apply(batch);
        CHECK(out[0].kind == idem::outcome_kind::applied);
        CHECK(out[1].kind == idem::outcome_kind::applied);
        CHECK(out[2].kind == idem::outcome_kind::applied);
        CHECK(out[3].kind == idem::outcome_kind::applied);
        CHECK(out[4].kind == idem::outcome_kind::duplicate_event);
        CHECK(out[5].kind == idem::outcome_kind::duplicate_message);

        // The same score published again by a second, unsequenced path still counts once:
        // the row's contributing set holds its event id.
        auto again =
            store.apply({envelope("s-3", "/match-server/eu-1", "player.scored", "", 0, score("alice", 5), "m-78"), ""});
        CHECK(again.kind == idem::outcome_kind::duplicate_event);

        auto row = store.read().get<ex::scoreboard>(ex::leaderboard_projection, "match-1");
        REQUIRE(row);
        CHECK(row->state.total == 20);
        CHECK(row->state.points == std::map<std::string, std::int64_t>{{"alice", 15}, {"bob", 7}, {"carol", -2}});
        CHECK(row->version == 4);
        CHECK(json_of(row->state) == R"({"points":{"alice":15,"bob":7,"carol":-2},"total":20})");
    }

    TEST_CASE("an inventory refuses an overdraw whole and forgets items used up") {
        ex::holdings h;
        h.grant({"p", "potion", 3});
        h.grant({"p", "sword", 1});
        h.consume({"p", "potion", 2});
        CHECK(h.items == std::map<std::string, std::int64_t>{{"potion", 1}, {"sword", 1}});
        CHECK_THROWS_AS(h.consume({"p", "potion", 2}), std::invalid_argument);
        CHECK_THROWS_AS(h.consume({"p", "shield", 1}), std::invalid_argument);
        CHECK_THROWS_AS(h.grant({"p", "potion", 0}), std::invalid_argument);
        CHECK_THROWS_AS(h.consume({"p", "potion", -1}), std::invalid_argument);
        CHECK(h.items == std::map<std::string, std::int64_t>{{"potion", 1}, {"sword", 1}});
        h.consume({"p", "sword", 1});
        CHECK(h.items == std::map<std::string, std::int64_t>{{"potion", 1}});
        CHECK(json_of(h) == R"({"items":{"potion":1}})");
        ex::holdings none;
        CHECK(json_of(none) == R"({"items":{}})");
    }

    TEST_CASE("an inventory orders a player's stream and dead-letters an overdraw") {
        temp_dir dir;
        idem::store store{options(dir.path())};
        ex::add_all(store);
        auto items = [](const std::string& item, std::int64_t count) {
            return R"({"player":"p-1","item":")" + item + R"(","count":)" + std::to_string(count) + "}";
        };
        std::vector<idem::delivery> batch{
            // The consumption arrives first: parked until the grant it spends is applied.
            {envelope("i-2", "/inventory", "item.consumed", "p-1", 2, items("gem", 2)), ""},
            {envelope("i-1", "/inventory", "item.granted", "p-1", 1, items("gem", 3)), ""},
            {envelope("i-3", "/inventory", "item.consumed", "p-1", 3, items("gem", 5)), ""},
            {envelope("i-4", "/inventory", "item.granted", "p-1", 4, items("key", 1)), ""},
        };
        auto out = store.apply(batch);
        CHECK(out[0].kind == idem::outcome_kind::parked);
        CHECK(out[1].kind == idem::outcome_kind::applied);
        CHECK(out[2].kind == idem::outcome_kind::dead_lettered);
        CHECK(out[2].why == idem::reason::handler_failed);
        CHECK(out[3].kind == idem::outcome_kind::applied);
        auto snap = store.read();
        auto row = snap.get<ex::holdings>(ex::inventory_projection, "p-1");
        REQUIRE(row);
        CHECK(row->state.items == std::map<std::string, std::int64_t>{{"gem", 1}, {"key", 1}});
        CHECK(row->version == 3);
        CHECK(snap.consumer(consumer).stats().released == 1);
    }

    TEST_CASE("states read back from the JSON they print") {
        ex::scoreboard b;
        b.add({"m", "a", 3});
        b.add({"m", "b", 4});
        auto back = from_json<ex::scoreboard>(json_of(b));
        CHECK(back.points == b.points);
        CHECK(back.total == 7);
        auto empty = from_json<ex::holdings>(R"({"items":{}})");
        CHECK(empty.items.empty());
    }
}

TEST_SUITE("orders") {
    TEST_CASE("order totals count each line once across redeliveries and republishing") {
        temp_dir dir;
        idem::store store{options(dir.path())};
        ex::add_all(store);
        auto line = [](std::int64_t amount) {
            return R"({"order_id":"order-7","amount":)" + std::to_string(amount) + "}";
        };
        std::vector<idem::delivery> batch{
            {envelope("l-1", "/shop/web", "order.line_added", "order-7", 1, line(250)), ""},
            {envelope("l-2", "/shop/web", "order.line_added", "order-7", 2, line(-50)), ""},
            {envelope("l-1", "/shop/web", "order.line_added", "order-7", 1, line(250)), ""},
            {envelope("l-2", "/shop/web", "order.line_added", "order-7", 2, line(-50), "m-2"), ""},
            {envelope("l-3", "/shop/web", "order.line_added", "order-7", 3, R"({"order_id":"order-7","amount":"x"})"),
             ""},
        };
        auto out = store.apply(batch);
        CHECK(out[2].kind == idem::outcome_kind::duplicate_message);
        CHECK(out[3].kind == idem::outcome_kind::duplicate_event);
        CHECK(out[4].why == idem::reason::decode_failed);
        auto snap = store.read();
        auto row = snap.get<ex::order_total>(ex::order_totals_projection, "order-7");
        REQUIRE(row);
        CHECK(row->state.total == 200);
        CHECK(row->state.lines == 2);
        CHECK(row->state.currency == "EUR");  // version 1 lines: lifted to version 2 in EUR
        CHECK(json_of(row->state) == R"({"total":200,"lines":2,"currency":"EUR"})");
        CHECK(ex::domain_totals(snap, "orders") == R"({"orders":1,"lines":2,"total":200})");
        CHECK(ex::domain_totals(snap, "trading") == R"({"positions":0,"fills":0,"qty":0,"cost":0,"realized_pnl":0})");
        CHECK_THROWS_AS(ex::domain_totals(snap, "chess"), std::invalid_argument);
    }
}

TEST_CASE("orders: a store written at state version 1 is read, changed and migrated by version 2 code") {
    temp_dir dir;
    const auto db = dir.path() / "v1";
    {
        // The code as it was: rows {total, lines} at state version 1, events at version 1.
        idem::store old{options(db)};
        old.add(idem::projection<ex::order_total_v1>(ex::order_totals_projection)
                    .on<ex::line_added_v1>("order.line_added",
                                           [](ex::order_total_v1& t, const ex::line_added_v1& e) {
                                               t.total += e.amount;
                                               ++t.lines;
                                           })
                    .key([](const ex::line_added_v1& e) { return e.order_id; }));
        std::vector<idem::delivery> batch;
        for (int i = 0; i < 40; ++i) {
            const auto order = "order-" + std::to_string(i % 8);
            batch.push_back({envelope("old-" + std::to_string(i), "/shop", "order.line_added", order, 0,
                                      R"({"order_id":")" + order + R"(","amount":)" + std::to_string(10 + i) + "}"),
                             ""});
        }
        for (const auto& o : old.apply(batch)) REQUIRE(o.kind == idem::outcome_kind::applied);
    }
    // Reference: per order, the sum of 10 + i over i = order, order + 8, ...
    std::int64_t expected_total = 0;
    for (int i = 0; i < 40; ++i) expected_total += 10 + i;
    {
        idem::store now{options(db)};
        ex::add_all(now);
        auto snap = now.read();
        CHECK(snap.raw_row(ex::order_totals_projection, "order-3")->state_version == 1);
        CHECK(ex::domain_totals(snap, "orders") ==
              R"({"orders":8,"lines":40,"total":)" + std::to_string(expected_total) + "}");
        CHECK(snap.get(ex::order_totals(), "order-3")->state.currency == "EUR");
        CHECK_THROWS_AS(snap.get<ex::order_total>(ex::order_totals_projection, "order-3"), std::system_error);
        // A version 2 line in another currency on a version 1 (EUR) order is dead-lettered.
        idem::envelope usd;
        usd.id = "new-1";
        usd.source = "/shop";
        usd.type = "order.line_added";
        usd.dataschema = ex::line_added::dataschema;
        usd.data = R"({"order_id":"order-3","amount":{"minor":5,"currency":"USD"}})";
        auto out = now.apply(std::vector<idem::delivery>{{usd.to_json(), ""}});
        CHECK(out[0].why == idem::reason::handler_failed);
        CHECK(out[0].detail.find("the order is in EUR, the line in USD") != std::string::npos);
    }
    // `idem migrate` over the example tool rewrites every row at version 2.
    idem::cli::tool tool{"idem"};
    tool.add(ex::order_totals()).upcast(ex::order_line_upcaster());
    CHECK(tool.run({"migrate", "--db", db.string(), "--step", "3"}) == 0);
    auto snap = idem::snapshot::open(db);
    std::int64_t total = 0;
    snap.scan<ex::order_total>(ex::order_totals_projection, [&](const idem::row<ex::order_total>& r) {
        CHECK(r.state.currency == "EUR");
        total += r.state.total;
    });
    CHECK(total == expected_total);
}
