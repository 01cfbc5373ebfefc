// The generator: its logs fed line by line through real stores end exactly where it says,
// and a seed always gives the same bytes.

#include <idem/examples/gen.hpp>

#include "../common/temp_dir.hpp"

#include <idem/examples/domains.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/envelope.hpp>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace ex = idem::examples;
using idem::test::temp_dir;

namespace {

constexpr const char* consumer = "projector";

/// Configures a store as the `idem` tool does (the generator's prediction assumes it).
void configure_like_the_tool(idem::store_options& o) {
    o.unknown_types = idem::unknown_type_policy::dead_letter;
    o.max_event_bytes = std::size_t{1} << 20;
}

std::vector<ex::defect> defects_the_store_knows() { return ex::every_defect(); }

// Every defect share on, high enough to hit every path in 20k events.
ex::gen_options options_for(const std::string& domain, std::uint64_t seed) {
    ex::gen_options o;
    o.domain = domain;
    o.events = 20'000;
    o.aggregates = 2'000;
    o.redeliver = 0.10;
    o.republish = 0.05;
    o.reissue = 0.03;
    o.reorder = 0.05;
    o.malformed = 0.01;
    o.defects = defects_the_store_knows();
    o.seed = seed;
    return o;
}

struct fed {
    ex::gen_result predicted;
    std::map<std::string, std::uint64_t> outcomes;
    std::map<std::string, std::uint64_t> reasons;
    std::uint64_t parked = 0;
    std::string totals;
};

// Generates a log and feeds every line to a fresh store on disk, in batches of 500.
fed generate_and_apply(const ex::gen_options& o, const std::filesystem::path& dir) {
    idem::store_options so;
    so.path = dir;
    so.consumer = consumer;
    so.sync = idem::durability::none;
    configure_like_the_tool(so);
    idem::store store{so};
    ex::add_all(store);

    std::vector<idem::delivery> batch;
    batch.reserve(500);
    auto flush = [&] {
        store.apply(batch);
        batch.clear();
    };
    fed f;
    f.predicted = ex::generate(o, [&](std::string_view line) {
        batch.push_back({std::string(line), ""});
        if (batch.size() == 500) flush();
    });
    if (!batch.empty()) flush();

    auto snap = store.read();
    const auto stats = snap.consumer(consumer).stats();
    for (std::size_t k = 0; k < idem::outcome_kinds; ++k) {
        f.outcomes[std::string(idem::to_string(static_cast<idem::outcome_kind>(k)))] = stats.outcomes[k];
    }
    f.outcomes["released"] = stats.released;
    for (const auto& d : snap.consumer(consumer).dead_letters()) ++f.reasons[std::string(idem::to_string(d.why))];
    f.parked = snap.consumer(consumer).parked();
    f.totals = ex::domain_totals(snap, o.domain);

    // The rows agree with themselves, whatever the prediction says.
    if (o.domain == "game") {
        snap.scan<ex::scoreboard>(ex::leaderboard_projection, [](const idem::row<ex::scoreboard>& r) {
            std::int64_t sum = 0;
            for (const auto& [player, points] : r.state.points) sum += points;
            REQUIRE(sum == r.state.total);
        });
        snap.scan<ex::holdings>(ex::inventory_projection, [](const idem::row<ex::holdings>& r) {
            for (const auto& [item, count] : r.state.items) REQUIRE(count > 0);
        });
    } else if (o.domain == "trading") {
        snap.scan<ex::position>(ex::positions_projection, [](const idem::row<ex::position>& r) {
            REQUIRE((r.state.qty == 0) == (r.state.cost == 0));
            if (r.state.qty != 0) {
                // avg_price is cost / qty to the nearest tick.
                const auto twice_error = 2 * (r.state.avg_price * r.state.qty - r.state.cost);
                const auto q = r.state.qty < 0 ? -r.state.qty : r.state.qty;
                REQUIRE(twice_error <= q);
                REQUIRE(twice_error >= -q);
            }
        });
    }
    return f;
}

std::string concatenated(const ex::gen_options& o, ex::gen_result& result) {
    std::string out;
    result = ex::generate(o, [&](std::string_view line) {
        out.append(line);
        out.push_back('\n');
    });
    return out;
}

}  // namespace

TEST_SUITE("gen") {
    TEST_CASE("a generated log fed through a real store ends exactly as predicted") {
        for (std::string domain : {"trading", "game", "orders"}) {
            for (std::uint64_t seed : {std::uint64_t{1}, std::uint64_t{2}}) {
                CAPTURE(domain);
                CAPTURE(seed);
                temp_dir dir;
                const auto o = options_for(domain, seed);
                auto f = generate_and_apply(o, dir.path());
                const auto& p = f.predicted;
                CHECK(f.outcomes == p.outcomes);
                CHECK(f.reasons == p.dead_letter_reasons);
                CHECK(f.parked == p.parked_left);
                CHECK(f.totals == p.totals_json);

                // The log exercised what it claims to: every path and every defect kind.
                CHECK(p.events == 20'000);
                CHECK(p.outcomes.at("applied") > 15'000);
                CHECK(p.outcomes.at("duplicate_message") > 1'000);
                CHECK(p.outcomes.at("duplicate_event") > 500);
                CHECK(p.outcomes.at("parked") > 50);
                CHECK(p.outcomes.at("released") == p.outcomes.at("parked"));
                CHECK(p.parked_left == 0);
                std::set<std::string> reasons{"invalid_json",  "missing_id",   "missing_source", "missing_type",
                                              "invalid_field", "key_too_long", "decode_failed", "unknown_type",
                                              "too_large",     "invalid_utf8"};
                if (domain != "orders") reasons.insert("handler_failed");
                for (const auto& r : reasons) {
                    CAPTURE(r);
                    CHECK(p.dead_letter_reasons.count(r) == 1);
                }
            }
        }
    }

    TEST_CASE("the same options give byte-identical logs and results") {
        for (std::string domain : {"trading", "game", "orders"}) {
            CAPTURE(domain);
            auto o = options_for(domain, 42);
            ex::gen_result a, b;
            const auto first = concatenated(o, a);
            const auto second = concatenated(o, b);
            CHECK(first == second);
            CHECK(ex::to_json(a) == ex::to_json(b));
            CHECK(a.lines == static_cast<std::uint64_t>(std::count(first.begin(), first.end(), '\n')));
            o.seed = 43;
            ex::gen_result c;
            CHECK(concatenated(o, c) != first);
        }
    }

    TEST_CASE("generated envelopes are CloudEvents with streams, times and message ids") {
        ex::gen_options o;
        o.domain = "trading";
        o.events = 2'000;
        o.aggregates = 100;
        o.malformed = 0;
        std::vector<std::string> lines;
        auto r = ex::generate(o, [&](std::string_view line) { lines.emplace_back(line); });
        REQUIRE(lines.size() == r.lines);
        idem::envelope_parser parser;
        std::size_t with_msgid = 0, sequenced = 0;
        std::string last_time;
        for (const auto& line : lines) {
            idem::envelope e;
            idem::parse_error err;
            REQUIRE(parser.parse(line, e, err));
            CHECK(e.type == "order.filled");
            CHECK(e.source.starts_with(e.sequence ? "/venue/" : "/dropcopy/"));
            CHECK(!e.subject.empty());
            CHECK(e.time.size() == 27);  // 2026-12-02T09:30:00.000000Z
            if (!e.msgid.empty()) ++with_msgid;
            if (e.sequence) ++sequenced;
        }
        CHECK(with_msgid > lines.size() / 3);
        CHECK(sequenced > lines.size() * 9 / 10);
        CHECK(lines.front().starts_with(R"({"specversion":"1.0","id":"fill-1-1","source":"/venue/)"));
    }

    TEST_CASE("transport ids are unique per domain, event ids per seed") {
        auto ids_of = [](const std::string& domain, std::uint64_t seed) {
            ex::gen_options o;
            o.domain = domain;
            o.events = 2'000;
            o.aggregates = 100;
            o.malformed = 0;
            o.seed = seed;
            std::set<std::string> msgids, events;
            idem::envelope_parser parser;
            ex::generate(o, [&](std::string_view line) {
                idem::envelope e;
                idem::parse_error err;
                REQUIRE(parser.parse(line, e, err));
                if (!e.msgid.empty()) msgids.insert(e.msgid);
                events.insert(e.event_id());
            });
            return std::pair{msgids, events};
        };
        auto disjoint = [](const std::set<std::string>& a, const std::set<std::string>& b) {
            return std::none_of(a.begin(), a.end(), [&](const std::string& x) { return b.contains(x); });
        };
        const auto trading = ids_of("trading", 1), orders = ids_of("orders", 1), orders2 = ids_of("orders", 2);
        CHECK(!trading.first.empty());
        CHECK(disjoint(trading.first, orders.first));
        CHECK(disjoint(trading.second, orders.second));
        CHECK(disjoint(orders.second, orders2.second));
        CHECK(!disjoint(orders.first, orders2.first));  // one domain numbers its messages alike: the inbox scopes them
        CHECK(orders.first.begin()->starts_with("orders-m-"));
        ex::gen_options o;
        o.domain = "orders";
        o.events = 100;
        o.aggregates = 10;
        o.malformed = 0;
        o.key_prefix = "b-";
        idem::envelope_parser parser;
        ex::generate(o, [&](std::string_view line) {
            idem::envelope e;
            idem::parse_error err;
            REQUIRE(parser.parse(line, e, err));
            CHECK(e.subject.starts_with("b-order-"));
        });
    }

    TEST_CASE("bad options are refused") {
        ex::gen_options o;
        o.events = 10;
        o.domain = "chess";
        CHECK_THROWS_AS(ex::generate(o, [](std::string_view) {}), std::invalid_argument);
        o.domain = "orders";
        o.redeliver = 1.5;
        CHECK_THROWS_AS(ex::generate(o, [](std::string_view) {}), std::invalid_argument);
    }

    TEST_CASE("the result prints as one JSON object") {
        ex::gen_options o;
        o.domain = "orders";
        o.events = 100;
        o.aggregates = 10;
        auto r = ex::generate(o, [](std::string_view) {});
        auto text = ex::to_json(r);
        CHECK(text.starts_with(R"({"lines":)"));
        CHECK(text.find(R"("outcomes":{"applied":)") != std::string::npos);
        CHECK(text.find(R"("totals":{"orders":)") != std::string::npos);
        simdjson::dom::parser parser;
        simdjson::dom::element doc;
        REQUIRE(parser.parse(text).get(doc) == simdjson::SUCCESS);
        CHECK(doc["outcomes"]["released"].get_uint64().value() == r.outcomes.at("released"));
    }
}
