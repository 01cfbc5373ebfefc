#include <idem/storage/envelope.hpp>

#include <doctest/doctest.h>

#include <string>

namespace {

struct parsed {
    bool ok = false;
    idem::envelope ev;
    idem::parse_error err;
};

parsed parse(std::string_view text) {
    static idem::envelope_parser parser;
    parsed p;
    p.ok = parser.parse(text, p.ev, p.err);
    return p;
}

}  // namespace

TEST_SUITE("envelope") {

TEST_CASE("the contract's example parses with every attribute") {
    auto p = parse(R"({"specversion":"1.0","id":"e-17","source":"/orders","type":"order.line_added",
 "subject":"order-42","sequence":"3","time":"2026-12-02T10:00:00Z",
 "msgid":"m-991","data":{"order_id":"order-42","amount":250}})");
    REQUIRE(p.ok);
    CHECK(p.ev.id == "e-17");
    CHECK(p.ev.source == "/orders");
    CHECK(p.ev.type == "order.line_added");
    CHECK(p.ev.subject == "order-42");
    CHECK(p.ev.sequence == 3u);
    CHECK(p.ev.time == "2026-12-02T10:00:00Z");
    CHECK(p.ev.msgid == "m-991");
    CHECK(p.ev.data == R"({"order_id":"order-42","amount":250})");
}

TEST_CASE("field order, whitespace and unknown attributes do not change identity") {
    auto a = parse(R"({"id":"e-1","source":"/s","type":"t","data":{"x":1}})");
    auto b = parse(R"(  { "data" : { "x" : 1 } ,
        "ext": {"nested": [1, 2, {"deep": true}]}, "type":"t",   "source" : "/s", "id" : "e-1" }  )");
    REQUIRE(a.ok);
    REQUIRE(b.ok);
    CHECK(a.ev.event_id() == b.ev.event_id());
    CHECK(a.ev.message_id() == b.ev.message_id());
}

TEST_CASE("event ids are unambiguous across source and id boundaries") {
    idem::envelope a;
    a.source = "/a#b";
    a.id = "c";
    idem::envelope b;
    b.source = "/a";
    b.id = "b#c";
    CHECK(a.event_id() != b.event_id());
    SUBCASE("a transport id never aliases an event id") {
        idem::envelope c = a;
        c.msgid = a.event_id();
        CHECK(c.message_id() != a.message_id());
        CHECK(c.message_id() == idem::transport_message_id(a.event_id()));
    }
}

TEST_CASE("sequence is a decimal string or an integer, 1-based, and needs a subject") {
    CHECK(parse(R"({"id":"1","source":"s","type":"t","subject":"x","sequence":7})").ev.sequence == 7u);
    CHECK(parse(R"({"id":"1","source":"s","type":"t","subject":"x","sequence":"18446744073709551615"})").ev.sequence ==
          18446744073709551615ull);
    for (auto bad : {R"("abc")", R"("")", R"("12x")", R"(0)", R"("0")", R"(-3)", R"(1.5)", R"(true)", R"("-1")"}) {
        CAPTURE(bad);
        auto p = parse(std::string(R"({"id":"1","source":"s","type":"t","subject":"x","sequence":)") + bad + "}");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_sequence);
    }
    auto p = parse(R"({"id":"1","source":"s","type":"t","sequence":"2"})");
    CHECK_FALSE(p.ok);
    CHECK(p.err.why == idem::reason::invalid_sequence);
}

TEST_CASE("malformed events are rejected with a reason that names the cause") {
    struct bad_case {
        const char* text;
        idem::reason why;
        const char* mentions;
    };
    const bad_case cases[] = {
        {R"({"source":"s","type":"t"})", idem::reason::missing_id, "id"},
        {R"({"id":"","source":"s","type":"t"})", idem::reason::missing_id, "id"},
        {R"({"id":"1","type":"t"})", idem::reason::missing_source, "source"},
        {R"({"id":"1","source":"s"})", idem::reason::missing_type, "type"},
        {R"({"id":"1","source":"s","type":"")", idem::reason::invalid_json, ""},
        {R"({"id":"1","source":"s","type":"t"} trailing)", idem::reason::invalid_json, "single JSON object"},
        {R"([1,2,3])", idem::reason::invalid_json, "object"},
        {R"()", idem::reason::invalid_json, ""},
        {R"(not json)", idem::reason::invalid_json, ""},
        {R"({"id":17,"source":"s","type":"t"})", idem::reason::invalid_field, "id"},
        {R"({"id":"1","id":"2","source":"s","type":"t"})", idem::reason::invalid_field, "twice"},
        {R"({"specversion":"0.3","id":"1","source":"s","type":"t"})", idem::reason::unsupported_specversion, "0.3"},
        {R"({"id":"1","source":"s","type":"t","data":{"a":})", idem::reason::invalid_json, ""},
    };
    for (const auto& c : cases) {
        CAPTURE(c.text);
        auto p = parse(c.text);
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == c.why);
        CHECK(p.err.detail.find(c.mentions) != std::string::npos);
    }
}

TEST_CASE("an attribute of the wrong JSON type is invalid_field, naming the attribute") {
    for (const char* name : {"id", "source", "type", "subject", "time", "msgid", "specversion"}) {
        for (const char* value : {"17", "null", "true", "{}", "[\"x\"]"}) {
            CAPTURE(name);
            CAPTURE(value);
            // The attribute under test replaces the valid one of the same name (no duplicate).
            std::string text = R"({"id":"1","source":"s","type":"t","subject":"x")";
            const std::string own = std::string("\"") + name + "\":";
            if (auto at = text.find(own); at != std::string::npos) {
                auto end = text.find(',', at);
                text.erase(at, end == std::string::npos ? text.size() - at : end - at + 1);
                if (text.back() == ',') text.pop_back();
            }
            text += std::string(",\"") + name + "\":" + value + "}";
            auto p = parse(text);
            CHECK_FALSE(p.ok);
            CHECK(p.err.why == idem::reason::invalid_field);
            CHECK(p.err.detail == std::string("attribute '") + name + "' must be a string");
        }
    }
}

TEST_CASE("time is kept as given: the parser does not judge it") {
    for (const char* time : {"2026-12-02T10:00:00Z", "yesterday", ""}) {
        CAPTURE(time);
        auto p = parse(std::string(R"({"id":"1","source":"s","type":"t","time":")") + time + "\"}");
        REQUIRE(p.ok);
        CHECK(p.ev.time == time);
    }
}

TEST_CASE("extensions and data are read only as far as needed, but must be valid JSON all the way down") {
    CHECK(parse(R"({"id":"1","source":"s","type":"t","ext":{"a":[1,{"b":null}]},"n":-1.5e400,"z":0})").ok);
    CHECK(parse(R"({"id":"1","source":"s","type":"t","data":{"a":[true,false,null,"\u00e9",-0.0E+1]}})").ok);
    // Values the on-demand parser would skip without looking inside.
    for (const char* value : {"nul", "tru", "falsy", "1x2", "01", "-", "1.", "1e", "+1", ".5", "{\"a\":nul}",
                              "[1,fals]", "{\"a\":[1,{\"b\":1x}]}", "\"\\x\"", "[1,}]"}) {
        for (const char* attribute : {"ext", "data"}) {
            CAPTURE(value);
            CAPTURE(attribute);
            auto p = parse(std::string(R"({"id":"1","source":"s","type":"t",")") + attribute + "\":" + value + "}");
            CHECK_FALSE(p.ok);
            CHECK(p.err.why == idem::reason::invalid_json);
        }
    }
    auto p = parse(R"({"id":"1","source":"s","type":"t","ext":nul})");
    CHECK(p.err.detail == "malformed value of attribute 'ext'");
    p = parse(R"({"id":"1","source":"s","type":"t","data":{"a":nul}})");
    CHECK(p.err.detail == "attribute 'data' is not valid JSON");
}

TEST_CASE("a body that is not UTF-8 is invalid_utf8, wherever the bad byte is") {
    for (std::string text : {std::string("{\"id\":\"a\xFF\",\"source\":\"s\",\"type\":\"t\"}"),
                             std::string("{\"id\":\"a\",\"source\":\"s\",\"type\":\"t\",\"data\":\"\xC3\x28\"}"),
                             std::string("{\"id\":\"a\",\"source\":\"s\",\"type\":\"t\",\"x\xED\xA0\x80\":1}")}) {
        CAPTURE(text);
        auto p = parse(text);
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_utf8);
        CHECK(p.err.detail == "the body is not valid UTF-8");
    }
}

TEST_CASE("data of any JSON type is kept verbatim") {
    CHECK(parse(R"({"id":"1","source":"s","type":"t","data":42})").ev.data == "42");
    CHECK(parse(R"({"id":"1","source":"s","type":"t","data":"text"})").ev.data == R"("text")");
    CHECK(parse(R"({"id":"1","source":"s","type":"t","data":[1, 2]})").ev.data == "[1, 2]");
    CHECK(parse(R"({"id":"1","source":"s","type":"t"})").ev.data == "null");
}

TEST_CASE("to_json round-trips, escaping what JSON needs") {
    idem::envelope e;
    e.id = "id \"quoted\"\n";
    e.source = "/src\\path";
    e.type = "t\x01";
    e.subject = "subj";
    e.sequence = 12;
    e.time = "2026-12-02T10:00:00Z";
    e.msgid = "m-1";
    e.data = R"({"k":[1,2]})";
    auto p = parse(e.to_json());
    REQUIRE(p.ok);
    CHECK(p.ev.id == e.id);
    CHECK(p.ev.source == e.source);
    CHECK(p.ev.type == e.type);
    CHECK(p.ev.subject == e.subject);
    CHECK(p.ev.sequence == e.sequence);
    CHECK(p.ev.time == e.time);
    CHECK(p.ev.msgid == e.msgid);
    CHECK(p.ev.data == e.data);
}

}  // TEST_SUITE

TEST_CASE("JSON strings keep UTF-8 and escape bytes outside a complete sequence, so the output always parses") {
    std::string out;
    idem::append_json_string(out, "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
    CHECK(out == "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
    out.clear();
    idem::append_json_string(out, std::string("a\xFF" "b\xC3" "c\x01\"\\\n", 9));
    CHECK(out == R"("a\u00ffb\u00c3c\u0001\"\\\n")");
    out.clear();
    idem::append_json_string(out, "\xE2\x82");  // a sequence cut short at the end
    CHECK(out == R"("\u00e2\u0082")");
    // Ill-formed sequences: overlong, surrogate, past U+10FFFF.
    out.clear();
    idem::append_json_string(out, "\xC0\x80|\xE0\x80\x80|\xED\xA0\x80|\xF4\x90\x80\x80");
    CHECK(out == R"("\u00c0\u0080|\u00e0\u0080\u0080|\u00ed\u00a0\u0080|\u00f4\u0090\u0080\u0080")");
    // Whatever the bytes, the result is a JSON document the parser accepts.
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    idem::envelope e;
    e.id = all;
    e.source = "/s";
    e.type = "t";
    CHECK(parse(e.to_json()).ok);
}
