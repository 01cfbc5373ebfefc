// Event upcasting: three versions of an event type (the third under a new type name) lifted
// to the version the handlers take, identically for every version mix; a republication at a
// newer version under a new message id applied once; steps that repeat a version or leave a
// gap refused; an upcaster that throws, and events older or newer than the chain, dead-lettered
// as upcast_failed. Real LMDB environments; rows are compared with references computed here.

#include <idem/projections/store.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;
using idem::reason;

namespace {

// Version 2 of order.line_added: the amount with its currency.
struct money {
    std::int64_t minor = 0;
    std::string currency;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(minor), CEREAL_NVP(currency));
    }
};
struct line_added_v2 {
    std::string order_id;
    money amount;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(amount));
    }
};
// Version 3, renamed order.line_recorded: flat again, in cents and currency.
struct line_recorded {
    std::string order_id;
    std::int64_t cents = 0;
    std::string currency;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(cents), CEREAL_NVP(currency));
    }
};

struct order_money {
    std::int64_t cents = 0;
    std::int64_t lines = 0;
    std::string currencies;  // every currency seen, in order
    template <class Archive>
    void serialize(Archive& ar) {
        ar(cents, lines, currencies);
    }
};

idem::projection<order_money> money_by_order() {
    return idem::projection<order_money>("order-money")
        .on<line_recorded>("order.line_recorded",
                           [](order_money& m, const line_recorded& e) {
                               m.cents += e.cents;
                               m.lines += 1;
                               m.currencies += e.currency;
                           })
        .key([](const line_recorded& e) { return e.order_id; });
}

void add_chain(idem::store& s) {
    s.upcast(idem::upcast_step<line_added, line_added_v2>("order.line_added", 1, [](const line_added& e) {
        return line_added_v2{e.order_id, money{e.amount, "EUR"}};
    }));
    s.upcast(idem::upcast_step<line_added_v2, line_recorded>(
        "order.line_added", 2,
        [](const line_added_v2& e) { return line_recorded{e.order_id, e.amount.minor, e.amount.currency}; },
        "order.line_recorded"));
}

/// One order line at schema version 1, 2 or 3 (the same line whichever version it is written at).
idem::envelope versioned(int version, std::string id, const std::string& order, std::int64_t cents,
                         const std::string& currency) {
    auto e = line(std::move(id), order, cents);
    if (version == 1) return e;  // no dataschema: version 1, always in EUR
    if (version == 2) {
        e.dataschema = "urn:idem:example:order.line_added:2";
        e.data = R"({"order_id":")" + order + R"(","amount":{"minor":)" + std::to_string(cents) +
                 R"(,"currency":")" + currency + R"("}})";
        return e;
    }
    e.type = "order.line_recorded";
    e.dataschema = "https://example.com/schemas/order.line_recorded/v3";
    e.data = R"({"order_id":")" + order + R"(","cents":)" + std::to_string(cents) + R"(,"currency":")" + currency +
             R"("})";
    return e;
}

struct money_row {
    std::int64_t cents = 0;
    std::int64_t lines = 0;
    std::string currencies;
    std::uint64_t version = 0;
    friend bool operator==(const money_row&, const money_row&) = default;
};

std::map<std::string, money_row> money_rows(const idem::snapshot& snap) {
    std::map<std::string, money_row> out;
    snap.scan<order_money>("order-money", [&](const idem::row<order_money>& r) {
        out[r.key] = money_row{r.state.cents, r.state.lines, r.state.currencies, r.version};
    });
    return out;
}

}  // namespace

TEST_CASE("schema versions are read from dataschema's last segment, 1 without one") {
    idem::envelope e;
    CHECK(e.schema_version() == 1);
    e.dataschema = "urn:idem:example:order.line_added:2";
    CHECK(e.schema_version() == 2);
    e.dataschema = "https://example.com/schemas/order/v3";
    CHECK(e.schema_version() == 3);
    e.dataschema = "https://example.com/schemas/order/V12";
    CHECK(e.schema_version() == 12);
    e.dataschema = "https://example.com/schemas/order.json";
    CHECK(e.schema_version() == 1);
    e.dataschema = "urn:x:99999999999";  // past 32 bits: read whole
    CHECK(e.schema_version() == 99999999999ull);
    e.dataschema = "urn:x:18446744073709551615";
    CHECK(e.schema_version() == UINT64_MAX);
    e.dataschema = "urn:x:18446744073709551616";  // past 64 bits: no version, never a smaller one
    CHECK_FALSE(e.schema_version().has_value());
    e.dataschema = "urn:x:0";
    CHECK_FALSE(e.schema_version().has_value());
    e.dataschema = "urn:x:v000";
    CHECK_FALSE(e.schema_version().has_value());
}

TEST_CASE("a dataschema naming version 0 or a version past what the code knows is refused, never read as 1") {
    // Each of these carries a version-1 payload (the amount alone): read as version 1 it would be
    // applied. The chain knows versions 1 and 2 of order.line_added (3 is order.line_recorded).
    const std::vector<std::pair<std::string, std::string>> cases{
        {"urn:idem:example:order.line_added:4294967297", "'order.line_added' version 4294967297 is newer than this code"},
        {"urn:idem:example:order.line_added:1733500000000",
         "'order.line_added' version 1733500000000 is newer than this code"},
        {"urn:idem:example:order.line_added:18446744073709551617", "names a version past 2^64 - 1"},
        {"urn:idem:example:order.line_added:0", "names version 0, and versions start at 1"},
        {"https://example.com/schemas/order/v4", "'order.line_added' version 4 is newer than this code"},
    };
    temp_dir dir;
    idem::store s{options(dir.path() / "s")};
    s.add(money_by_order());
    add_chain(s);
    std::vector<idem::delivery> batch;
    for (std::size_t i = 0; i < cases.size(); ++i) {
        auto e = versioned(1, "bad-" + std::to_string(i), "o1", 100, "EUR");
        e.dataschema = cases[i].first;
        batch.push_back(deliver(e));
    }
    batch.push_back(deliver(versioned(1, "good", "o1", 7, "EUR")));
    auto outcomes = s.apply(batch);
    REQUIRE(outcomes.size() == cases.size() + 1);
    for (std::size_t i = 0; i < cases.size(); ++i) {
        CAPTURE(cases[i].first);
        CHECK(outcomes[i].kind == outcome_kind::dead_lettered);
        CHECK(outcomes[i].why == reason::upcast_failed);
        CHECK(outcomes[i].detail.find(cases[i].second) != std::string::npos);
        CHECK(outcomes[i].detail.find(cases[i].first) != std::string::npos);  // names the dataschema
    }
    CHECK(outcomes.back().kind == outcome_kind::applied);
    // Only the version-1 line without a dataschema counts (the reference: one line of 7 EUR).
    CHECK(money_rows(s.read()) == std::map<std::string, money_row>{{"o1", {7, 1, "EUR", 1}}});
    auto snap = s.read();
    CHECK(snap.consumer(consumer).dead_letters().size() == cases.size());
}

TEST_CASE("dataschema survives parsing and to_json") {
    auto e = versioned(2, "a", "o1", 250, "USD");
    idem::envelope_parser parser;
    idem::envelope back;
    idem::parse_error err;
    REQUIRE(parser.parse(e.to_json(), back, err));
    CHECK(back.dataschema == "urn:idem:example:order.line_added:2");
    CHECK(back.schema_version() == 2);
}

TEST_CASE("events of three versions give the rows of the events all written at the newest") {
    temp_dir dir;
    std::mt19937_64 rng{20261204};
    std::vector<idem::envelope> events;
    std::map<std::string, money_row> ref;
    for (int i = 0; i < 600; ++i) {
        const auto order = "o" + std::to_string(rng() % 23);
        const auto cents = static_cast<std::int64_t>(rng() % 10000);
        const int version = static_cast<int>(rng() % 3) + 1;
        const std::string currency = version == 1 ? "EUR" : (rng() % 2 ? "USD" : "EUR");
        events.push_back(versioned(version, "e" + std::to_string(i), order, cents, currency));
        auto& r = ref[order];
        r.cents += cents;
        r.lines += 1;
        r.currencies += currency;
        r.version += 1;
    }
    idem::store s{options(dir.path() / "mixed")};
    s.add(money_by_order());
    add_chain(s);
    std::vector<idem::delivery> batch;
    for (const auto& e : events) batch.push_back(deliver(e));
    auto outcomes = s.apply(batch);
    CHECK(count(outcomes)[outcome_kind::applied] == events.size());
    CHECK(money_rows(s.read()) == ref);
}

TEST_CASE("an event republished at a newer version under a new message id is applied once") {
    temp_dir dir;
    idem::store s{options(dir.path() / "s")};
    s.add(money_by_order());
    add_chain(s);
    auto v1 = versioned(1, "e1", "o1", 250, "EUR");
    auto v3 = versioned(3, "e1", "o1", 250, "EUR");  // the same event (source, id), rewritten
    auto outcomes = s.apply(std::vector<idem::delivery>{deliver(v1, "m-1")});
    CHECK(outcomes[0].kind == outcome_kind::applied);
    outcomes = s.apply(std::vector<idem::delivery>{deliver(v3, "m-2")});
    CHECK(outcomes[0].kind == outcome_kind::duplicate_event);
    CHECK(money_rows(s.read()) == std::map<std::string, money_row>{{"o1", {250, 1, "EUR", 1}}});
}

TEST_CASE("upcasters that repeat a version or leave a gap are refused, naming the type") {
    temp_dir dir;
    idem::store s{options(dir.path() / "s")};
    auto same = [](const line_added& e) { return e; };
    s.upcast(idem::upcast_step<line_added, line_added>("t", 1, same));
    CHECK_THROWS_WITH_AS(s.upcast(idem::upcast_step<line_added, line_added>("t", 1, same)),
                         doctest::Contains("two upcasters from 't' version 1"), std::system_error);
    CHECK_THROWS_WITH_AS(s.upcast(idem::upcast_step<line_added, line_added>("t", 3, same)),
                         doctest::Contains("upcasters of 't' have a gap: version 2 has none"), std::system_error);
    CHECK_THROWS_WITH_AS(s.upcast(idem::upcaster{"u", 1, "", {}}), doctest::Contains("'u' version 1"),
                         std::system_error);
    s.upcast(idem::upcast_step<line_added, line_added>("t", 2, same));  // no gap now
}

TEST_CASE("an upcaster that throws, and versions outside the chain, are dead-lettered as upcast_failed") {
    temp_dir dir;
    idem::store s{options(dir.path() / "s")};
    s.add(money_by_order());
    s.upcast(idem::upcast_step<line_added, line_added_v2>("order.line_added", 1, [](const line_added& e) {
        if (e.amount < 0) throw std::runtime_error("negative amount " + std::to_string(e.amount));
        return line_added_v2{e.order_id, money{e.amount, "EUR"}};
    }));
    s.upcast(idem::upcast_step<line_added_v2, line_recorded>(
        "order.line_added", 2,
        [](const line_added_v2& e) { return line_recorded{e.order_id, e.amount.minor, e.amount.currency}; },
        "order.line_recorded"));
    auto newer = versioned(3, "e3", "o1", 5, "EUR");
    newer.dataschema = "urn:x:order.line_recorded:4";
    auto older = versioned(2, "e4", "o1", 5, "EUR");
    older.type = "order.line_recorded";
    older.dataschema = "urn:x:2";  // line_recorded begins at version 3
    auto outcomes = s.apply(std::vector<idem::delivery>{deliver(versioned(1, "e1", "o1", -5, "EUR")),
                                                        deliver(versioned(1, "e2", "o1", 7, "EUR")), deliver(newer),
                                                        deliver(older)});
    REQUIRE(outcomes.size() == 4);
    CHECK(outcomes[0].kind == outcome_kind::dead_lettered);
    CHECK(outcomes[0].why == reason::upcast_failed);
    CHECK(outcomes[0].detail.find("upcaster from 'order.line_added' version 1 threw: negative amount -5") !=
          std::string::npos);
    CHECK(outcomes[1].kind == outcome_kind::applied);  // processing goes on
    CHECK(outcomes[2].why == reason::upcast_failed);
    CHECK(outcomes[2].detail.find("'order.line_recorded' version 4 is newer than this code, which knows up to version 3") !=
          std::string::npos);
    CHECK(outcomes[3].why == reason::upcast_failed);
    CHECK(outcomes[3].detail.find("'order.line_recorded' version 2 has no upcaster") != std::string::npos);
    CHECK(money_rows(s.read()) == std::map<std::string, money_row>{{"o1", {7, 1, "EUR", 1}}});
    // Data that does not decode as the version a typed step reads is a decode failure, as it
    // would be for a handler.
    auto bad = versioned(1, "e5", "o1", 5, "EUR");
    bad.data = R"({"order_id":"o1","amount":"five"})";
    auto out = s.apply(deliver(bad));
    CHECK(out.why == reason::decode_failed);
    CHECK(out.detail.find("data does not decode as order.line_added (version 1): ") != std::string::npos);
}
