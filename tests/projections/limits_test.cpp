// What a consumer refuses, and how a state reads as JSON: unknown types (by policy),
// oversized envelopes, invalid UTF-8, key functions that fail, subjects too long to track.

#include "fixtures.hpp"

using namespace idem_test;

TEST_CASE("an unknown type is ignored by default and dead-lettered as unknown_type when the consumer says so") {
    temp_dir dir;
    auto e = line("u-1", "order-1", 5);
    e.type = "order.shipped";
    {
        idem::store s{options(dir.env())};
        s.add(totals_by_order());
        CHECK(s.apply(deliver(e)).kind == idem::outcome_kind::ignored);
    }
    temp_dir other;
    auto o = options(other.env());
    o.unknown_types = idem::unknown_type_policy::dead_letter;
    idem::store s{o};
    s.add(totals_by_order());
    auto out = s.apply(deliver(e));
    CHECK(out.kind == idem::outcome_kind::dead_lettered);
    CHECK(out.why == idem::reason::unknown_type);
    CHECK(out.detail.find("order.shipped") != std::string::npos);
    auto letters = s.read().consumer(consumer).dead_letters();
    REQUIRE(letters.size() == 1);
    CHECK(letters[0].why == idem::reason::unknown_type);
    CHECK(letters[0].body == e.to_json());
}

TEST_CASE("an envelope over max_event_bytes is dead-lettered as too_large, with its size and the limit") {
    temp_dir dir;
    auto o = options(dir.env());
    o.max_event_bytes = 4096;
    idem::store s{o};
    s.add(totals_by_order());
    auto small = line("s-1", "order-1", 5);
    auto big = line("b-1", "order-1", 7);
    big.data = R"({"order_id":"order-1","amount":7,"note":")" + std::string(5000, 'x') + "\"}";
    std::vector<idem::delivery> batch{deliver(small), deliver(big)};
    auto out = s.apply(batch);
    CHECK(out[0].kind == idem::outcome_kind::applied);
    CHECK(out[1].kind == idem::outcome_kind::dead_lettered);
    CHECK(out[1].why == idem::reason::too_large);
    CHECK(out[1].detail.find("4096") != std::string::npos);
    auto row = s.read().get<order_total>("order-totals", "order-1");
    REQUIRE(row);
    CHECK(row->state.total == 5);
}

TEST_CASE("a body that is not UTF-8 is dead-lettered as invalid_utf8, not as invalid JSON") {
    temp_dir dir;
    idem::store s{options(dir.env())};
    s.add(totals_by_order());
    auto body = line("x-1", "order-1", 5).to_json();
    auto at = body.find("order-1");
    body.replace(at, 1, "\xC3\x28");  // a broken two-byte sequence
    auto out = s.apply(idem::delivery{body, {}});
    CHECK(out.kind == idem::outcome_kind::dead_lettered);
    CHECK(out.why == idem::reason::invalid_utf8);
    auto truncated = line("x-2", "order-1", 5).to_json();
    truncated.resize(truncated.size() / 2);
    CHECK(s.apply(idem::delivery{truncated, {}}).why == idem::reason::invalid_json);
}

TEST_CASE("key functions that throw or find no key dead-letter the event and leave every row untouched") {
    temp_dir dir;
    idem::store s{options(dir.env())};
    s.add(totals_by_order());
    s.add(idem::projection<order_total>("checked")
              .on<line_added>([](order_total& t, const line_added& e, const idem::meta& m) { add_line(t, e, m); })
              .key([](const line_added& e) {
                  if (e.amount < 0) throw std::invalid_argument("no key for a negative amount");
                  return e.order_id;
              })
              .effect_key([](const line_added& e) { return e.amount == 0 ? std::string() : std::to_string(e.amount); }));
    s.add(totals_by_subject());
    auto without_subject = line("k-3", "order-1", 3);
    without_subject.subject.clear();
    std::vector<idem::delivery> batch{deliver(line("k-1", "order-1", -1)), deliver(line("k-2", "order-1", 0)),
                                      deliver(without_subject), deliver(line("k-4", "order-1", 4))};
    auto out = s.apply(batch);
    REQUIRE(out.size() == 4);
    CHECK(out[0].why == idem::reason::handler_failed);
    CHECK(out[0].detail == "event (source '/orders', id 'k-1'), projection 'checked': key function threw: "
                           "no key for a negative amount");
    CHECK(out[1].why == idem::reason::missing_key);
    CHECK(out[1].detail == "event (source '/orders', id 'k-2'), projection 'checked': the effect key is empty");
    CHECK(out[2].why == idem::reason::missing_key);
    CHECK(out[2].detail ==
          "event (source '/orders', id 'k-3'), projection 'order-streams': no aggregate key (the event has no subject)");
    CHECK(out[3].kind == idem::outcome_kind::applied);
    // All or nothing: the projections that could key the rejected events did not apply them.
    auto snap = s.read();
    reference expect;
    expect.add("order-1", 4);
    CHECK(dump(snap, "order-totals") == expect.rows);
    CHECK(dump(snap, "checked") == expect.rows);
    CHECK(snap.consumer(consumer).dead_letter_count() == 3);
}

TEST_CASE("a subject too long to track its stream is dead-lettered as key_too_long") {
    temp_dir dir;
    idem::store s{options(dir.env())};
    s.add(totals_by_order());
    auto e = line("long-1", "order-1", 5, 1);
    e.subject = std::string(600, 's');
    auto out = s.apply(deliver(e));
    CHECK(out.kind == idem::outcome_kind::dead_lettered);
    CHECK(out.why == idem::reason::key_too_long);
    CHECK(out.detail == "event (source '/orders', id 'long-1'): subject of 600 bytes is too long to track its stream "
                        "(limit ~500 bytes)");
    CHECK_FALSE(s.read().get<order_total>("order-totals", "order-1"));
}

TEST_CASE("a row written by a newer state version is refused, not misread") {
    temp_dir dir;
    auto versioned = [](std::uint32_t v) {
        return idem::projection<order_total>("order-totals")
            .on<line_added>([](order_total& t, const line_added& e, const idem::meta& m) { add_line(t, e, m); })
            .key([](const line_added& e) { return e.order_id; })
            .state_version(v);
    };
    {
        idem::store newer{options(dir.env())};
        newer.add(versioned(2));
        REQUIRE(newer.apply(deliver(line("v-1", "order-1", 5))).kind == idem::outcome_kind::applied);
    }
    idem::store older{options(dir.env())};
    older.add(versioned(1));
    try {
        older.apply(deliver(line("v-2", "order-1", 7)));
        FAIL("applied to a row of a newer state version");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::state_version_mismatch);
        CHECK(std::string(e.what()).find("projection 'order-totals': row has state version 2, this code knows up to 1") !=
              std::string::npos);
    }
    auto row = older.read().raw_row("order-totals", "order-1");
    REQUIRE(row);
    CHECK(row->version == 1);  // the failed batch left nothing behind
}

TEST_CASE("a consumer name that is empty or holds '/' is refused") {
    temp_dir dir;
    for (const char* name : {"", "a/b"}) {
        auto o = options(dir.env());
        o.consumer = name;
        const auto says = "consumer name '" + std::string(name) + "' must be non-empty without '/'";
        CHECK_THROWS_WITH_AS(idem::store{o}, doctest::Contains(says.c_str()), std::system_error);
    }
}

namespace {
struct scoreboard {
    std::int64_t total = 0;
    std::string name;
    std::map<std::string, std::int64_t> points;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(total), CEREAL_NVP(name), CEREAL_NVP(points));
    }
};
}  // namespace

TEST_CASE("a state renders as compact JSON named by its serialize()") {
    idem::projection<scoreboard> p{"scores"};
    auto box = p.make_state();
    auto& s = static_cast<idem::detail::typed_state<scoreboard>&>(*box).value;
    s.total = -42;
    s.name = "say \"hi\"\n";
    s.points = {{"a", 1}, {"b", 9000000000}};
    std::string json;
    p.write_json(*box, json);
    CHECK(json == R"({"total":-42,"name":"say \"hi\"\n","points":[{"key":"a","value":1},{"key":"b","value":9000000000}]})");
}
