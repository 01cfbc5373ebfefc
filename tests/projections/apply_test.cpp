// The apply path, one property per test case: redeliveries, republished events,
// effect keys, envelope identity, dead letters, handler failures, read-your-writes,
// key limits and restarts. Every expectation is computed aside from the store.

#include <idem/projections/store.hpp>

#include "fixtures.hpp"

#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace idem_test;
using idem::outcome_kind;

TEST_SUITE("apply") {

TEST_CASE("a redelivered message leaves every row unchanged") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());

    // Four ways a message can be identified: transport id, msgid attribute, both, neither.
    auto e1 = line("line-1", "order-1", 10);
    auto e2 = line("line-2", "order-2", 5);
    auto e3 = line("line-3", "order-1", 7);
    e3.msgid = "attr-3";
    auto e4 = line("line-4", "order-3", 2);
    std::vector<idem::delivery> first{deliver(e1, "msg-1"), deliver(e2, "msg-2"), deliver(e3), deliver(e4)};

    reference ref;
    ref.add("order-1", 10);
    ref.add("order-2", 5);
    ref.add("order-1", 7);
    ref.add("order-3", 2);

    SUBCASE("in a later batch") {
        auto outcomes = store.apply(first);
        CHECK(count(outcomes)[outcome_kind::applied] == 4);
        const auto before = dump(store.read(), "order-totals");
        REQUIRE(before == ref.rows);
        const auto inbox = store.inbox_size();

        auto again = store.apply(first);
        REQUIRE(again.size() == first.size());
        for (const auto& o : again) CHECK(o.kind == outcome_kind::duplicate_message);
        auto snap = store.read();
        CHECK(dump(snap, "order-totals") == ref.rows);
        CHECK(store.inbox_size() == inbox);
        CHECK(snap.consumer(consumer).inbox_size() == inbox);
        CHECK(snap.projection("order-totals").contributors("order-1") == 2);
    }
    SUBCASE("in the same batch") {
        std::vector<idem::delivery> doubled;
        for (const auto& d : first) {
            doubled.push_back(d);
            doubled.push_back(d);
        }
        auto outcomes = store.apply(doubled);
        REQUIRE(outcomes.size() == 8);
        for (std::size_t i = 0; i < outcomes.size(); ++i) {
            CAPTURE(i);
            CHECK(outcomes[i].kind == (i % 2 == 0 ? outcome_kind::applied : outcome_kind::duplicate_message));
        }
        CHECK(dump(store.read(), "order-totals") == ref.rows);
        CHECK(store.inbox_size() == 4);
    }
    SUBCASE("the msgid attribute and the transport id name the same message") {
        store.apply(first);
        const auto before = dump(store.read(), "order-totals");
        // The first event again, now carrying msgid "msg-1" (delivered as transport id before): the
        // same message.
        auto again = e1;
        again.msgid = "msg-1";
        CHECK(store.apply(deliver(again)).kind == outcome_kind::duplicate_message);
        // The same message with other content (same event id) is an id_conflict; the first effect stands.
        auto changed = e1;
        changed.msgid = "msg-1";
        changed.data = R"({"order_id":"order-1","amount":999})";
        CHECK(store.apply(deliver(changed)).why == idem::reason::id_conflict);
        CHECK(dump(store.read(), "order-totals") == before);
    }
}

TEST_CASE("the same event republished under a new message id is applied once") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    auto e1 = line("line-1", "order-1", 10);
    auto with_attr = e1;
    with_attr.msgid = "another-id";
    reference ref;
    ref.add("order-1", 10);

    SUBCASE("in a later batch") {
        CHECK(store.apply(deliver(e1, "msg-1")).kind == outcome_kind::applied);
        CHECK(store.apply(deliver(e1, "msg-1-republished")).kind == outcome_kind::duplicate_event);
        CHECK(store.apply(deliver(with_attr)).kind == outcome_kind::duplicate_event);
    }
    SUBCASE("in the same batch") {
        auto outcomes = store.apply(std::vector{deliver(e1, "msg-1"), deliver(e1, "msg-2"), deliver(with_attr)});
        REQUIRE(outcomes.size() == 3);
        CHECK(outcomes[0].kind == outcome_kind::applied);
        CHECK(outcomes[1].kind == outcome_kind::duplicate_event);
        CHECK(outcomes[2].kind == outcome_kind::duplicate_event);
    }
    auto snap = store.read();
    CHECK(dump(snap, "order-totals") == ref.rows);
    CHECK(snap.projection("order-totals").contributors("order-1") == 1);

    // The same id from another source is another event.
    CHECK(store.apply(deliver(line("line-1", "order-1", 3, std::nullopt, "/other-shop"), "msg-x")).kind ==
          outcome_kind::applied);
    ref.add("order-1", 3);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
}

TEST_CASE("two events with the same effect key apply once") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(idem::projection<position>("positions")
                  .on<fill>([](position& p, const fill& f) { p.qty += f.qty; })
                  .key([](const fill& f) { return f.account; })
                  .effect_key([](const fill& f) { return f.exec_id; }));

    // The venue sends exec X-1 twice under two event ids (and two sources), then X-2.
    std::vector<idem::delivery> fills{
        deliver(fill_event("f-1", "acct-1", "X-1", 100), "m-1"),
        deliver(fill_event("f-2", "acct-1", "X-1", 100, "/venue-a-replay"), "m-2"),
        deliver(fill_event("f-3", "acct-1", "X-2", 40), "m-3"),
    };
    // Reference: the sum over distinct exec ids.
    std::map<std::string, std::int64_t> by_exec{{"X-1", 100}, {"X-2", 40}};
    std::int64_t expected = 0;
    for (const auto& [exec, qty] : by_exec) expected += qty;

    std::vector<idem::outcome> outcomes;
    SUBCASE("in one batch") { outcomes = store.apply(fills); }
    SUBCASE("one per batch") {
        for (const auto& d : fills) outcomes.push_back(store.apply(d));
    }
    REQUIRE(outcomes.size() == 3);
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[1].kind == outcome_kind::duplicate_event);
    CHECK(outcomes[2].kind == outcome_kind::applied);
    auto row = store.read().get<position>("positions", "acct-1");
    REQUIRE(row);
    CHECK(row->state.qty == expected);
    CHECK(row->version == by_exec.size());
    CHECK(store.read().projection("positions").contributors("acct-1") == by_exec.size());
}

TEST_CASE("an event is recognised whatever its field order, whitespace and extra attributes") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    REQUIRE(store.apply(deliver(line("line-1", "order-1", 7), "msg-1")).kind == outcome_kind::applied);
    reference ref;
    ref.add("order-1", 7);

    std::string body;
    SUBCASE("reordered fields") {
        body = R"({"data":{"amount":7,"order_id":"order-1"},"subject":"order-1","type":"order.line_added",)"
               R"("source":"/orders","specversion":"1.0","id":"line-1"})";
    }
    SUBCASE("extra whitespace") {
        body = "\n {\n\t\"specversion\" : \"1.0\" ,\r\n  \"id\" :\"line-1\",  \"source\":  \"/orders\" ,\n"
               "  \"type\":\"order.line_added\", \"subject\" : \"order-1\",\n"
               "  \"data\" : { \"order_id\" : \"order-1\" , \"amount\" : 7 }  \n}\n  ";
    }
    SUBCASE("unknown extra attributes") {
        body = R"({"specversion":"1.0","id":"line-1","source":"/orders","type":"order.line_added",)"
               R"("traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","partition":3,)"
               R"("ext":"nested","flag":true,"unset":null,"subject":"order-1",)"
               R"("data":{"order_id":"order-1","amount":7}})";
    }
    CAPTURE(body);
    auto o = store.apply(idem::delivery{body, "msg-2"});
    CHECK(o.kind == outcome_kind::duplicate_event);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
    CHECK(store.read().consumer(consumer).dead_letters().empty());
}

TEST_CASE("an event without an id is dead-lettered and never deduplicated by content") {
    const std::vector<std::string> bodies{
        R"({"specversion":"1.0","source":"/orders","type":"order.line_added","data":{"order_id":"order-1","amount":5}})",
        R"({"specversion":"1.0","id":"","source":"/orders","type":"order.line_added","data":{"order_id":"order-1","amount":5}})",
    };
    std::string first_id;
    std::string second_id;
    std::string third_id;
    SUBCASE("without transport ids") {}
    SUBCASE("with distinct transport ids") {
        first_id = "t-1";
        second_id = "t-2";
        third_id = "t-3";
    }
    for (const auto& body : bodies) {
        CAPTURE(body);
        temp_dir dir;
        idem::store store{options(dir.env())};
        store.add(totals_by_order());

        auto good = line("line-1", "order-2", 11);
        auto outcomes =
            store.apply(std::vector{idem::delivery{body, first_id}, idem::delivery{body, second_id}, deliver(good)});
        REQUIRE(outcomes.size() == 3);
        for (std::size_t i = 0; i < 2; ++i) {
            CAPTURE(i);
            CHECK(outcomes[i].kind == outcome_kind::dead_lettered);
            CHECK(outcomes[i].why == idem::reason::missing_id);
        }
        CHECK(outcomes[2].kind == outcome_kind::applied);

        // A later identical body is dead-lettered again: content is no identity.
        auto later = store.apply(idem::delivery{body, third_id});
        CHECK(later.kind == outcome_kind::dead_lettered);
        CHECK(later.why == idem::reason::missing_id);

        auto snap = store.read();
        auto letters = snap.consumer(consumer).dead_letters();
        REQUIRE(letters.size() == 3);
        for (const auto& d : letters) {
            CHECK(d.why == idem::reason::missing_id);
            CHECK(d.body == body);
        }
        CHECK(letters[0].position < letters[1].position);
        CHECK(letters[1].position < letters[2].position);
        reference ref;
        ref.add("order-2", 11);
        CHECK(dump(snap, "order-totals") == ref.rows);  // no row for order-1
    }
}

TEST_CASE("malformed events are dead-lettered with their reason and the batch goes on") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());

    std::string body;
    idem::reason why = idem::reason::none;
    SUBCASE("missing source") {
        body = R"({"specversion":"1.0","id":"x-1","type":"order.line_added","data":{"order_id":"order-1","amount":5}})";
        why = idem::reason::missing_source;
    }
    SUBCASE("empty source") {
        body = R"({"specversion":"1.0","id":"x-1","source":"","type":"order.line_added","data":{"order_id":"order-1","amount":5}})";
        why = idem::reason::missing_source;
    }
    SUBCASE("missing type") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","data":{"order_id":"order-1","amount":5}})";
        why = idem::reason::missing_type;
    }
    SUBCASE("invalid JSON") {
        body = "this is not JSON";
        why = idem::reason::invalid_json;
    }
    SUBCASE("truncated JSON") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"ord)";
        why = idem::reason::invalid_json;
    }
    SUBCASE("a JSON array") {
        body = R"([{"id":"x-1","source":"/orders","type":"order.line_added"}])";
        why = idem::reason::invalid_json;
    }
    SUBCASE("an empty body") {
        body = "";
        why = idem::reason::invalid_json;
    }
    SUBCASE("trailing content after the object") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":1}} {})";
        why = idem::reason::invalid_json;
    }
    SUBCASE("an attribute twice") {
        body = R"({"specversion":"1.0","id":"x-1","id":"x-2","source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("an id that is not a string") {
        body = R"({"id":17,"source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("an unsupported specversion") {
        body = R"({"specversion":"0.3","id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":1}})";
        why = idem::reason::unsupported_specversion;
    }
    SUBCASE("sequence 0") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","subject":"o","sequence":0,"data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_sequence;
    }
    SUBCASE("a sequence without a subject") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","sequence":"3","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_sequence;
    }
    SUBCASE("data that does not decode as the event type") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":"lots"}})";
        why = idem::reason::decode_failed;
    }
    SUBCASE("an empty aggregate key") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"","amount":1}})";
        why = idem::reason::missing_key;
    }
    SUBCASE("no specversion") {
        body = R"({"id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":1}})";
        why = idem::reason::missing_specversion;
    }
    SUBCASE("a member twice inside data") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data":{"order_id":"o","amount":1,"amount":1000}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("a time that is not RFC 3339") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","time":"2026-12-02 10:00:00","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("an extension name that is not lower-case letters and digits") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","trace_id":"t","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("a control character in the subject") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","subject":"o\n","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("data and data_base64 together") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data_base64":"e30=","data":{"order_id":"o","amount":1}})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("data_base64 that is not base64") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","data_base64":"not base64!"})";
        why = idem::reason::invalid_field;
    }
    SUBCASE("binary data for a typed handler") {
        body = R"({"specversion":"1.0","id":"x-1","source":"/orders","type":"order.line_added","subject":"o","datacontenttype":"application/octet-stream","data_base64":"AAEC"})";
        why = idem::reason::decode_failed;
    }
    CAPTURE(body);

    auto outcomes = store.apply(std::vector{deliver(line("line-1", "order-1", 3), "m-1"), idem::delivery{body, "m-bad"},
                                            deliver(line("line-2", "order-1", 4), "m-2")});
    REQUIRE(outcomes.size() == 3);
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[1].kind == outcome_kind::dead_lettered);
    CHECK(outcomes[1].why == why);
    CHECK_FALSE(outcomes[1].detail.empty());
    CHECK(outcomes[2].kind == outcome_kind::applied);

    auto snap = store.read();
    reference ref;
    ref.add("order-1", 3);
    ref.add("order-1", 4);
    CHECK(dump(snap, "order-totals") == ref.rows);
    auto letters = snap.consumer(consumer).dead_letters();
    REQUIRE(letters.size() == 1);
    CHECK(letters[0].why == why);
    CHECK(letters[0].body == body);
    CHECK(letters[0].detail == outcomes[1].detail);
    CHECK(letters[0].time_ns > 0);
    // The transport id identifies the redelivery of a malformed message.
    CHECK(store.apply(idem::delivery{body, "m-bad"}).kind == outcome_kind::duplicate_message);
    CHECK(store.read().consumer(consumer).dead_letters().size() == 1);
}

TEST_CASE("JSON data sent as data_base64 reaches the handler as that JSON, and is the same content as data") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    // {"order_id":"order-1","amount":7}
    const std::string as_base64 =
        R"({"specversion":"1.0","id":"line-1","source":"/orders","type":"order.line_added","subject":"order-1",)"
        R"("datacontenttype":"application/json","data_base64":"eyJvcmRlcl9pZCI6Im9yZGVyLTEiLCJhbW91bnQiOjd9"})";
    REQUIRE(store.apply(idem::delivery{as_base64, "msg-1"}).kind == outcome_kind::applied);
    reference ref;
    ref.add("order-1", 7);
    CHECK(dump(store.read(), "order-totals") == ref.rows);

    auto plain = line("line-1", "order-1", 7);
    plain.datacontenttype = "application/json";
    // The same message again, its data spelled as JSON: a redelivery, not other content.
    CHECK(store.apply(deliver(plain, "msg-1")).kind == outcome_kind::duplicate_message);
    // The same event under another message id: already applied.
    CHECK(store.apply(deliver(plain, "msg-2")).kind == outcome_kind::duplicate_event);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
    CHECK(store.read().consumer(consumer).dead_letters().empty());

    SUBCASE("bytes without a JSON content type are not guessed at: the typed handler refuses them") {
        const std::string untyped =
            R"({"specversion":"1.0","id":"line-2","source":"/orders","type":"order.line_added","subject":"order-1",)"
            R"("data_base64":"eyJvcmRlcl9pZCI6Im9yZGVyLTEiLCJhbW91bnQiOjd9"})";
        auto o = store.apply(idem::delivery{untyped, "msg-3"});
        CHECK(o.kind == outcome_kind::dead_lettered);
        CHECK(o.why == idem::reason::decode_failed);
        CHECK(o.detail ==
              "event (source '/orders', id 'line-2'), projection 'order-totals': data does not decode as "
              "order.line_added: it is binary (data_base64 of 33 bytes, no datacontenttype), and a typed handler "
              "takes JSON data only");
        CHECK(dump(store.read(), "order-totals") == ref.rows);
    }
}

TEST_CASE("a body that starts with a UTF-8 byte order mark is applied") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    const auto body = "\xEF\xBB\xBF" + line("line-1", "order-1", 5).to_json();
    CHECK(store.apply(idem::delivery{body, "msg-1"}).kind == outcome_kind::applied);
    reference ref;
    ref.add("order-1", 5);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
}

TEST_CASE("a handler that throws leaves every row of the event untouched") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    // "order-audit" counts lines per order too, and refuses amount 13.
    auto audit = idem::projection<order_total>("order-audit")
                     .on<line_added>([](order_total& t, const line_added& e) {
                         if (e.amount == 13) throw std::runtime_error("amount 13 is cursed");
                         t.total += e.amount;
                         t.lines += 1;
                     })
                     .key([](const line_added& e) { return e.order_id; });
    SUBCASE("the throwing projection runs last") {
        store.add(totals_by_order());
        store.add(std::move(audit));
    }
    SUBCASE("the throwing projection runs first") {
        store.add(std::move(audit));
        store.add(totals_by_order());
    }

    REQUIRE(store.apply(deliver(line("line-0", "order-1", 100), "m-0")).kind == outcome_kind::applied);
    auto outcomes = store.apply(std::vector{
        deliver(line("line-1", "order-1", 10), "m-1"),
        deliver(line("line-2", "order-1", 13), "m-2"),  // throws in order-audit
        deliver(line("line-3", "order-2", 13), "m-3"),  // throws; order-2 has no row yet
        deliver(line("line-4", "order-1", 5), "m-4"),
    });
    reference ref;
    ref.add("order-1", 100);
    ref.add("order-1", 10);
    ref.add("order-1", 5);

    REQUIRE(outcomes.size() == 4);
    CHECK(outcomes[0].kind == outcome_kind::applied);
    CHECK(outcomes[3].kind == outcome_kind::applied);
    for (std::size_t i : {std::size_t{1}, std::size_t{2}}) {
        CAPTURE(i);
        CHECK(outcomes[i].kind == outcome_kind::dead_lettered);
        CHECK(outcomes[i].why == idem::reason::handler_failed);
        CHECK(outcomes[i].detail.find("amount 13 is cursed") != std::string::npos);
    }
    auto snap = store.read();
    CHECK(dump(snap, "order-totals") == ref.rows);
    CHECK(dump(snap, "order-audit") == ref.rows);
    CHECK(snap.projection("order-totals").contributors("order-1") == 3);
    CHECK(snap.projection("order-totals").contributors("order-2") == 0);
    auto letters = snap.consumer(consumer).dead_letters();
    REQUIRE(letters.size() == 2);
    for (const auto& d : letters) {
        CHECK(d.why == idem::reason::handler_failed);
        CHECK(d.detail.find("amount 13 is cursed") != std::string::npos);
    }
    CHECK(letters[0].message_id.find("m-2") != std::string::npos);
    CHECK(letters[1].message_id.find("m-3") != std::string::npos);
}

namespace {

// A state that counts its copies (moves are free and not counted).
struct counted {
    static inline std::size_t copies = 0;
    std::int64_t total = 0;
    std::int64_t lines = 0;
    counted() = default;
    counted(const counted& o) : total(o.total), lines(o.lines) { ++copies; }
    counted(counted&&) noexcept = default;
    counted& operator=(const counted& o) {
        total = o.total;
        lines = o.lines;
        ++copies;
        return *this;
    }
    counted& operator=(counted&&) noexcept = default;
    template <class A>
    void serialize(A& a) {
        a(CEREAL_NVP(total), CEREAL_NVP(lines));
    }
};

// Refuses amount 13 before it changes anything.
void add_checked(counted& c, const line_added& e) {
    if (e.amount == 13) throw std::runtime_error("amount 13 is cursed");
    c.total += e.amount;
    c.lines += 1;
}

struct copies_run {
    std::size_t copies = 0;
    std::vector<idem::outcome> outcomes;
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> rows;  // key -> total, lines
};

// Applies lines (orders o0..o4, amounts i % 20, so some are 13) through one projection.
copies_run run_lines(idem::projection<counted> p, const std::vector<std::string>& keys) {
    temp_dir dir;
    idem::store store{options(dir.env())};
    const auto name = p.name();
    store.add(std::move(p));
    std::vector<idem::delivery> batch;
    for (int i = 0; i < 100; ++i) batch.push_back(deliver(line("l-" + std::to_string(i), "o" + std::to_string(i % 5), i % 20)));
    counted::copies = 0;
    copies_run r;
    r.outcomes = store.apply(batch);
    r.outcomes.push_back(store.apply(batch.front()));  // a redelivery: nothing to copy either way
    r.copies = counted::copies;
    auto snap = store.read();
    for (const auto& k : keys) {
        if (auto row = snap.get<counted>(name, k)) r.rows[k] = {row->state.total, row->state.lines};
    }
    return r;
}

}  // namespace

TEST_CASE("a handler that cannot leave a half-changed state runs on the row itself when the event changes one row") {
    std::vector<std::string> orders{"o0", "o1", "o2", "o3", "o4"};
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> want;  // the lines that are not 13
    for (int i = 0; i < 100; ++i) {
        if (i % 20 == 13) continue;
        auto& w = want["o" + std::to_string(i % 5)];
        w.first += i % 20;
        w.second += 1;
    }
    auto by_order = [](const line_added& e) { return e.order_id; };

    // On a copy: one per event handled (the 5 that throw too).
    auto plain = run_lines(idem::projection<counted>("plain").on<line_added>(add_checked).key(by_order), orders);
    CHECK(plain.copies == 100);
    CHECK(plain.rows == want);

    // Declared with the strong guarantee: in place, and a throw still dead-letters with the row unchanged.
    auto strong = run_lines(
        idem::projection<counted>("strong").on<line_added>(add_checked, idem::strong_guarantee).key(by_order), orders);
    CHECK(strong.copies == 0);
    CHECK(strong.rows == want);
    std::size_t dead = 0;
    for (const auto& o : strong.outcomes) dead += o.kind == outcome_kind::dead_lettered;
    CHECK(dead == 5);
    CHECK(strong.outcomes.back().kind == outcome_kind::duplicate_message);

    // noexcept: in place without saying so.
    auto nothrow = run_lines(idem::projection<counted>("nothrow")
                                 .on<line_added>([](counted& c, const line_added& e) noexcept {
                                     c.total += e.amount;
                                     c.lines += 1;
                                 })
                                 .key(by_order),
                             orders);
    CHECK(nothrow.copies == 0);

    // An event that changes two rows runs on copies: when the handler throws on its second row
    // (whichever that is), the first row is left as it was.
    std::string seen;  // the id of the event whose first row the handler saw last
    auto two_rows = run_lines(idem::projection<counted>("two-rows")
                                  .on<line_added>(
                                      [&seen](counted& c, const line_added& e, const idem::meta& m) {
                                          if (e.amount == 13 && m.id == seen) throw std::runtime_error("cursed");
                                          seen = m.id;
                                          c.total += e.amount;
                                          c.lines += 1;
                                      },
                                      idem::strong_guarantee)
                                  .key([](const line_added& e) { return std::vector<std::string>{e.order_id, "all"}; }),
                              {"o0", "o1", "o2", "o3", "o4", "all"});
    CHECK(two_rows.copies == 2 * 100);
    auto want_all = want;
    for (const auto& [k, w] : want) {
        want_all["all"].first += w.first;
        want_all["all"].second += w.second;
    }
    CHECK(two_rows.rows == want_all);
}

TEST_CASE("every outcome names the commit that recorded it, and checkpoints commit with the batch") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    CHECK(store.read().commit() == 0);
    CHECK(store.last_commit() == 0);
    CHECK_FALSE(store.read().checkpoint(consumer, "log-a"));

    std::uint64_t previous = 0;
    for (std::uint64_t b = 0; b < 5; ++b) {
        CAPTURE(b);
        std::vector<idem::delivery> batch{
            deliver(line("line-" + std::to_string(b), "order-1", 1), "m-" + std::to_string(b)),
            deliver(line("line-" + std::to_string(b), "order-1", 1), "m-" + std::to_string(b)),  // duplicate
            idem::delivery{"{}", ""},                                                         // dead letter
        };
        // Only even batches carry a checkpoint of log-a, odd ones one of log-b.
        idem::checkpoint at{b % 2 == 0 ? "log-a" : "log-b", 100 * (b + 1)};
        auto outcomes = store.apply(batch, at);
        auto snap = store.read();
        REQUIRE(outcomes.size() == 3);
        for (const auto& o : outcomes) CHECK(o.commit == snap.commit());
        CHECK(snap.commit() > previous);
        CHECK(store.last_commit() == snap.commit());
        previous = snap.commit();
        CHECK(snap.checkpoint(consumer, at.source) == at.position);
        CHECK(snap.consumer(consumer).stats().batches == b + 1);
    }
    auto snap = store.read();
    CHECK(snap.checkpoint(consumer, "log-a") == 500);
    CHECK(snap.checkpoint(consumer, "log-b") == 400);
    CHECK_FALSE(snap.checkpoint("another-consumer", "log-a"));
    // A batch without a checkpoint leaves them as they are.
    store.apply(deliver(line("line-x", "order-1", 1), "m-x"));
    CHECK(store.read().checkpoint(consumer, "log-a") == 500);
    CHECK(store.read().commit() == previous + 1);
    auto stats = store.read().consumer(consumer).stats();
    CHECK(stats.outcomes[static_cast<std::size_t>(outcome_kind::applied)] == 6);
    CHECK(stats.outcomes[static_cast<std::size_t>(outcome_kind::duplicate_message)] == 5);
    CHECK(stats.outcomes[static_cast<std::size_t>(outcome_kind::dead_lettered)] == 5);
}

TEST_CASE("an aggregate key over LMDB's limit is dead-lettered, never truncated") {
    temp_dir dir;
    idem::store store{options(dir.env())};
    store.add(totals_by_order());
    const std::string long_key(600, 'k');
    auto e = line("line-1", long_key, 5);
    e.subject = "short-subject";
    auto outcomes = store.apply(std::vector{deliver(e, "m-1"), deliver(line("line-2", "order-1", 2), "m-2")});
    REQUIRE(outcomes.size() == 2);
    CHECK(outcomes[0].kind == outcome_kind::dead_lettered);
    CHECK(outcomes[0].why == idem::reason::key_too_long);
    CHECK(outcomes[0].detail.find("order-totals") != std::string::npos);
    CHECK(outcomes[1].kind == outcome_kind::applied);

    auto snap = store.read();
    reference ref;
    ref.add("order-1", 2);
    CHECK(dump(snap, "order-totals") == ref.rows);  // no row under any prefix of the long key
    auto letters = snap.consumer(consumer).dead_letters();
    REQUIRE(letters.size() == 1);
    CHECK(letters[0].why == idem::reason::key_too_long);
    CHECK(letters[0].detail.find("order-totals") != std::string::npos);
}

TEST_CASE("a reopened store keeps deduplicating") {
    temp_dir dir;
    auto e1 = line("line-1", "order-1", 10);
    auto e2 = line("line-2", "order-1", 20);
    auto e3 = line("line-3", "order-1", 30);
    reference ref;
    ref.add("order-1", 10);
    ref.add("order-1", 20);
    std::map<std::string, row_summary> before;

    auto durability = idem::durability::none;
    SUBCASE("without sync") {}
    SUBCASE("with full durability") { durability = idem::durability::full; }
    {
        idem::store store{options(dir.env(), durability)};
        store.add(totals_by_order());
        store.apply(std::vector{deliver(e1, "msg-1"), deliver(e2)});
        before = dump(store.read(), "order-totals");
        REQUIRE(before == ref.rows);
    }
    idem::store store{options(dir.env(), durability)};
    store.add(totals_by_order());
    CHECK(store.inbox_size() == 2);
    CHECK(store.apply(deliver(e1, "msg-1")).kind == outcome_kind::duplicate_message);
    CHECK(store.apply(deliver(e2)).kind == outcome_kind::duplicate_message);
    CHECK(store.apply(deliver(e1, "msg-1-again")).kind == outcome_kind::duplicate_event);
    CHECK(store.apply(deliver(e2, "msg-2-again")).kind == outcome_kind::duplicate_event);
    CHECK(dump(store.read(), "order-totals") == before);
    CHECK(store.apply(deliver(e3, "msg-3")).kind == outcome_kind::applied);
    ref.add("order-1", 30);
    CHECK(dump(store.read(), "order-totals") == ref.rows);
}

}  // TEST_SUITE
