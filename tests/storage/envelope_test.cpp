#include <idem/storage/envelope.hpp>
#include <idem/storage/event_id.hpp>

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
    auto a = parse(R"({"specversion":"1.0","id":"e-1","source":"/s","type":"t","data":{"x":1}})");
    auto b = parse(R"(  { "data" : { "x" : 1 } ,
        "ext": "v", "specversion" : "1.0", "type":"t",   "source" : "/s", "id" : "e-1" }  )");
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
    CHECK(a.event_id() == "4:/a#bc");
    SUBCASE("append_event_id appends exactly the event id") {
        idem::envelope long_source;
        long_source.source = std::string(1234, 's');
        long_source.id = "x";
        std::string out = "kept:";
        idem::append_event_id(out, long_source.source, long_source.id);
        CHECK(out == "kept:" + long_source.event_id());
        CHECK(long_source.event_id() == "1234:" + long_source.source + "x");
    }
    SUBCASE("a transport id never aliases an event id") {
        idem::envelope c = a;
        c.msgid = a.event_id();
        CHECK(c.message_id() != a.message_id());
        CHECK(c.message_id() == idem::transport_message_id(a.event_id()));
    }
}

TEST_CASE("sequence is a decimal string or an integer, 1-based, and needs a subject") {
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":"x","sequence":7})").ev.sequence == 7u);
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":"x","sequence":"18446744073709551615"})").ev.sequence ==
          18446744073709551615ull);
    for (auto bad : {R"("abc")", R"("")", R"("12x")", R"(0)", R"("0")", R"(-3)", R"(1.5)", R"(true)", R"("-1")"}) {
        CAPTURE(bad);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":"x","sequence":)") + bad + "}");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_sequence);
    }
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","sequence":"2"})");
    CHECK_FALSE(p.ok);
    CHECK(p.err.why == idem::reason::invalid_sequence);
    // One past the largest: positive, and said to be too large rather than not positive.
    p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":"x","sequence":18446744073709551616})");
    CHECK(p.err.why == idem::reason::invalid_sequence);
    CHECK(p.err.detail == "attribute 'sequence' is 18446744073709551616, more than 18446744073709551615, the largest sequence");
    p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":"x","sequence":"18446744073709551616"})");
    CHECK(p.err.why == idem::reason::invalid_sequence);
    CHECK(p.err.detail ==
          "attribute 'sequence' is \"18446744073709551616\", more than 18446744073709551615, the largest sequence");
}

TEST_CASE("malformed events are rejected with a reason that names the cause") {
    struct bad_case {
        const char* text;
        idem::reason why;
        const char* mentions;
    };
    const bad_case cases[] = {
        {R"({"source":"s","type":"t"})", idem::reason::missing_id, "id"},
        {R"({"specversion":"1.0","id":"","source":"s","type":"t"})", idem::reason::missing_id, "id"},
        {R"({"specversion":"1.0","id":"1","type":"t"})", idem::reason::missing_source, "source"},
        {R"({"specversion":"1.0","id":"1","source":"s"})", idem::reason::missing_type, "type"},
        {R"({"specversion":"1.0","id":"1","source":"s","type":"")", idem::reason::invalid_json, ""},
        {R"({"specversion":"1.0","id":"1","source":"s","type":"t"} trailing)", idem::reason::invalid_json, "single JSON object"},
        {R"([1,2,3])", idem::reason::invalid_json, "object"},
        {R"()", idem::reason::invalid_json, ""},
        {R"(not json)", idem::reason::invalid_json, ""},
        {R"({"specversion":"1.0","id":17,"source":"s","type":"t"})", idem::reason::invalid_field, "id"},
        {R"({"specversion":"1.0","id":"1","id":"2","source":"s","type":"t"})", idem::reason::invalid_field, "twice"},
        {R"({"specversion":"0.3","id":"1","source":"s","type":"t"})", idem::reason::unsupported_specversion, "0.3"},
        {R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":})", idem::reason::invalid_json, ""},
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
        for (const char* value : {"17", "true", "{}", "[\"x\"]"}) {
            CAPTURE(name);
            CAPTURE(value);
            // The attribute under test replaces the valid one of the same name (no duplicate).
            std::string text = R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":"x")";
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

TEST_CASE("extensions and data are read only as far as needed, but must be valid JSON all the way down") {
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","ext":"x","n":-2147483648,"z":0,"b":true})").ok);
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":[true,false,null,"\u00e9",-0.0E+1]}})").ok);
    // Values the on-demand parser would skip without looking inside.
    for (const char* value : {"nul", "tru", "falsy", "1x2", "01", "-", "1.", "1e", "+1", ".5", "{\"a\":nul}",
                              "[1,fals]", "{\"a\":[1,{\"b\":1x}]}", "\"\\x\"", "[1,}]"}) {
        for (const char* attribute : {"ext", "data"}) {
            CAPTURE(value);
            CAPTURE(attribute);
            auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t",")") + attribute + "\":" + value + "}");
            CHECK_FALSE(p.ok);
            CHECK(p.err.why == idem::reason::invalid_json);
        }
    }
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","ext":nul})");
    CHECK(p.err.detail == "malformed value of attribute 'ext'");
    p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":nul}})");
    CHECK(p.err.detail == "attribute 'data' is not valid JSON");
}

TEST_CASE("a body that is not UTF-8 is invalid_utf8, wherever the bad byte is") {
    for (std::string text : {std::string("{\"specversion\":\"1.0\",\"id\":\"a\xFF\",\"source\":\"s\",\"type\":\"t\"}"),
                             std::string("{\"specversion\":\"1.0\",\"id\":\"a\",\"source\":\"s\",\"type\":\"t\",\"data\":\"\xC3\x28\"}"),
                             std::string("{\"specversion\":\"1.0\",\"id\":\"a\",\"source\":\"s\",\"type\":\"t\",\"x\xED\xA0\x80\":1}")}) {
        CAPTURE(text);
        auto p = parse(text);
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_utf8);
        CHECK(p.err.detail == "the body is not valid UTF-8");
    }
}

TEST_CASE("data of any JSON type is kept verbatim") {
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":42})").ev.data == "42");
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":"text"})").ev.data == R"("text")");
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":[1, 2]})").ev.data == "[1, 2]");
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t"})").ev.data == "null");
}

TEST_CASE("to_json round-trips, escaping what JSON needs") {
    idem::envelope e;
    e.id = "id \"quoted\" caf\u00e9";
    e.source = "/src\\path";
    e.type = "t/\u00e9";
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

TEST_CASE("null is an unset attribute") {
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":null,"time":null,"sequence":null,
                       "msgid":null,"datacontenttype":null,"dataschema":null,"ext":null,"data_base64":null})");
    REQUIRE(p.ok);
    CHECK(p.ev.subject.empty());
    CHECK(p.ev.time.empty());
    CHECK_FALSE(p.ev.sequence.has_value());
    CHECK(p.ev.msgid.empty());
    CHECK(p.ev.data == "null");
    CHECK_FALSE(p.ev.data_binary);
    // A required attribute set to null is missing; specversion null too.
    CHECK(parse(R"({"specversion":"1.0","id":null,"source":"s","type":"t"})").err.why == idem::reason::missing_id);
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":null,"type":"t"})").err.why == idem::reason::missing_source);
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":null})").err.why == idem::reason::missing_type);
    CHECK(parse(R"({"specversion":null,"id":"1","source":"s","type":"t"})").err.why ==
          idem::reason::missing_specversion);
    // Given twice is twice, null or not.
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","subject":null,"subject":"x"})").err.why ==
          idem::reason::invalid_field);
}

TEST_CASE("specversion is required") {
    auto p = parse(R"({"id":"1","source":"s","type":"t"})");
    CHECK_FALSE(p.ok);
    CHECK(p.err.why == idem::reason::missing_specversion);
    CHECK(idem::to_string(p.err.why) == "missing_specversion");
    CHECK(p.err.detail == R"(attribute 'specversion' is missing (CloudEvents 1.0 requires "specversion":"1.0"))");
    // An event missing more reports its identity first.
    CHECK(parse(R"({"source":"s","type":"t"})").err.why == idem::reason::missing_id);
    CHECK(parse(R"({"specversion":"","id":"1","source":"s","type":"t"})").err.why == idem::reason::unsupported_specversion);
}

TEST_CASE("subject, datacontenttype and dataschema are non-empty when present; dataschema is an absolute URI") {
    for (const char* attribute : {"subject", "datacontenttype", "dataschema"}) {
        CAPTURE(attribute);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t",")") + attribute + R"(":""})");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail == std::string("attribute '") + attribute + "' must not be empty");
    }
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","dataschema":"urn:x:1"})").ok);
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","dataschema":"/schemas/1"})");
    CHECK(p.err.why == idem::reason::invalid_field);
    CHECK(p.err.detail == R"(attribute 'dataschema' must be an absolute URI, got "/schemas/1")");
}

TEST_CASE("time is an RFC 3339 timestamp") {
    for (const char* time : {"2026-12-02T10:00:00Z", "2026-12-02t10:00:00z", "2026-12-02T10:00:00.123456789+05:30",
                             "1937-01-01T12:00:27.87+00:20", "2024-02-29T23:59:60Z", "0001-01-01T00:00:00-23:59"}) {
        CAPTURE(time);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","time":")") + time + "\"}");
        CHECK(p.ok);
        CHECK(p.ev.time == time);
    }
    for (const char* time : {"yesterday", "", "2026-12-02 10:00:00Z", "2026-12-02T10:00Z", "2026-12-02T10:00:00",
                             "2026-12-02T10:00:00.Z", "2026-12-02T10:00:00+0100", "2026-12-02T10:00:00+01",
                             "2026-13-02T10:00:00Z", "2026-02-29T10:00:00Z", "2026-12-32T10:00:00Z",
                             "2026-12-02T24:00:00Z", "2026-12-02T10:60:00Z", "2026-12-02T10:00:61Z",
                             "2026-12-02T10:00:00+24:00", "26-12-02T10:00:00Z", "2026-12-02T10:00:00ZZ",
                             "2026-12-02", "+2026-12-02T10:00:00Z"}) {
        CAPTURE(time);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","time":")") + time + "\"}");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail.find("attribute 'time' is not an RFC 3339 timestamp") == 0);
    }
}

TEST_CASE("extension names are lower-case letters and digits; values a string, a boolean or a 32-bit integer") {
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","a1":"x","b":false,"c":-7,"abcdefghijklmnopqrstuvwxyz":1})").ok);
    for (const char* name : {"Ext", "a_b", "a-b", "", "é", "a b"}) {
        CAPTURE(name);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t",")") + name + R"(":"v"})");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail == std::string("extension attribute name '") + name +
                                  "' is not made of lower-case letters a-z and digits 0-9");
    }
    for (const char* value : {"2147483648", "-2147483649", "1.5", "1e3", "{}", "[1]", "{\"a\":1}"}) {
        CAPTURE(value);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","ext":)") + value + "}");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail.find("extension attribute 'ext' must be") == 0);
    }
}

TEST_CASE("an extension given twice is invalid_field, however many extensions there are") {
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","ext":"a","other":1,"ext":"b"})");
    CHECK_FALSE(p.ok);
    CHECK(p.err.why == idem::reason::invalid_field);
    CHECK(p.err.detail == "attribute 'ext' appears twice");
    std::string many = R"({"specversion":"1.0","id":"1","source":"s","type":"t")";
    for (int i = 0; i < 40; ++i) many += ",\"e" + std::to_string(i) + "\":" + std::to_string(i);
    CHECK(parse(many + "}").ok);
    p = parse(many + R"(,"e17":"again"})");
    CHECK(p.err.why == idem::reason::invalid_field);
    CHECK(p.err.detail == "attribute 'e17' appears twice");
    // An escaped name is the same name.
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","ext":"a","\u0065xt":"b"})").err.why ==
          idem::reason::invalid_field);
}

TEST_CASE("data nested deeper than 1000 levels is invalid_json, however deep: the check does not recurse past it") {
    auto nested = [](std::size_t levels) { return std::string(levels, '[') + std::string(levels, ']'); };
    const std::string head = R"({"specversion":"1.0","id":"1","source":"s","type":"t",)";
    CHECK(parse(head + R"("data":)" + nested(1000) + "}").ok);
    // 30,000 levels overflowed a log reader thread's stack while the walk recursed once per level.
    for (std::size_t levels : {std::size_t{1001}, std::size_t{30'000}}) {
        CAPTURE(levels);
        auto p = parse(head + R"("data":{"a":)" + nested(levels - 1) + "}}");
        CHECK(p.err.why == idem::reason::invalid_json);
        CHECK(p.err.detail == "attribute 'data' is nested deeper than 1000 levels");
        p = parse(head + R"("ext":)" + nested(levels) + "}");
        CHECK(p.err.why == idem::reason::invalid_json);
        CHECK(p.err.detail == "the value of attribute 'ext' is nested deeper than 1000 levels");
    }
}

TEST_CASE("a String attribute holds no control character or noncharacter") {
    for (const char* value : {"a\\u0000b", "a\\nb", "a\\tb", "a\\u001fb", "a\\u007fb", "a\\u0080b", "a\\u009fb",
                              "a\\ufdd0b", "a\\ufffeb", "a\\uffffb", "a\\ud83f\\udffeb"}) {
        for (const char* attribute : {"id", "source", "type", "subject", "msgid", "datacontenttype", "ext"}) {
            CAPTURE(value);
            CAPTURE(attribute);
            std::string text = R"({"specversion":"1.0","id":"1","source":"s","type":"t")";
            if (std::string_view(attribute) == "id" || std::string_view(attribute) == "source" ||
                std::string_view(attribute) == "type") {
                text = R"({"specversion":"1.0")";
                for (const char* other : {"id", "source", "type"}) {
                    if (std::string_view(other) != attribute) text += std::string(",\"") + other + "\":\"x\"";
                }
            }
            auto p = parse(text + ",\"" + attribute + "\":\"" + value + "\"}");
            CHECK_FALSE(p.ok);
            CHECK(p.err.why == idem::reason::invalid_field);
            CHECK(p.err.detail.find("which a CloudEvents String may not hold") != std::string::npos);
        }
    }
    auto p = parse(R"({"specversion":"1.0","id":"a\nb","source":"s","type":"t"})");
    CHECK(p.err.detail ==
          "attribute 'id' holds U+000A at byte 1, which a CloudEvents String may not hold (control characters, noncharacters)");
    // An unpaired surrogate is no character at all.
    CHECK_FALSE(parse(R"({"specversion":"1.0","id":"a\udead","source":"s","type":"t"})").ok);
    CHECK_FALSE(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","ext":"\ud800x"})").ok);
    // What is allowed: printable text in any script, U+00A0 and on, paired surrogates; data is not an attribute.
    CHECK(parse(R"({"specversion":"1.0","id":"caf\u00e9 \u00a0 \ud83d\ude00 日本","source":"s","type":"t","data":"a\nb"})").ok);
}

TEST_CASE("data and data_base64 are mutually exclusive") {
    for (const char* data : {R"({"a":1})", "null"}) {
        CAPTURE(data);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"e30=","data":)") +
                       data + "}");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail == "members 'data' and 'data_base64' are mutually exclusive (the payload is one or the other)");
    }
}

TEST_CASE("data_base64 is decoded: JSON under a JSON content type, bytes otherwise") {
    // {"order_id":"o-1","amount":5}
    const std::string json_b64 = "eyJvcmRlcl9pZCI6Im8tMSIsImFtb3VudCI6NX0=";
    for (const char* type : {"application/json", "application/json; charset=utf-8", "text/json",
                             "application/cloudevents+json", "Application/JSON"}) {
        CAPTURE(type);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":")") + json_b64 +
                       R"(","datacontenttype":")" + type + "\"}");
        REQUIRE(p.ok);
        CHECK_FALSE(p.ev.data_binary);
        CHECK(p.ev.data == R"({"order_id":"o-1","amount":5})");
        CHECK(p.ev.datacontenttype == type);
    }
    // No content type: no assumption of JSON (the JSON format, 3.1.2).
    for (const char* type : {"", R"(,"datacontenttype":"text/plain")", R"(,"datacontenttype":"application/jsonx")",
                             R"(,"datacontenttype":"json")"}) {
        CAPTURE(type);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":")") + json_b64 +
                       "\"" + type + "}");
        REQUIRE(p.ok);
        CHECK(p.ev.data_binary);
        CHECK(p.ev.data == R"({"order_id":"o-1","amount":5})");
    }
    // Declared JSON but not JSON (or not JSON idem takes): kept as bytes.
    for (const char* bytes_b64 : {"PGEvPg==", "eyJhIjoxLCJhIjoyfQ==", "", "MSAy", "/w=="}) {  // <a/>, {"a":1,"a":2}, , 1 2, \xff
        CAPTURE(bytes_b64);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"application/json","data_base64":")") +
                       bytes_b64 + "\"}");
        REQUIRE(p.ok);
        CHECK(p.ev.data_binary);
    }
    // Every byte value, with and without padding.
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AAEC/f7/"})");
    REQUIRE(p.ok);
    CHECK(p.ev.data == std::string("\x00\x01\x02\xfd\xfe\xff", 6));
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AAE"})").ev.data ==
          std::string("\x00\x01", 2));
    for (const char* bad : {"e30", "e30==", "e3=0", "e30=\\n", "e 30=", "e30-", "e30_", "=", "a", "abcde"}) {
        CAPTURE(bad);
        p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":")") + bad + "\"}");
        if (std::string_view(bad) == "e30") {
            CHECK(p.ok);  // unpadded
            continue;
        }
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail == "attribute 'data_base64' is not valid base64 (RFC 4648)");
    }
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":3})").err.why ==
          idem::reason::invalid_field);
}

TEST_CASE("a member named twice inside data is refused, at any depth, naming it and where") {
    struct bad_case {
        const char* data;
        const char* detail;
    };
    for (const auto& c : {bad_case{R"({"a":1,"a":2})", "attribute 'data' names member 'a' twice (in data)"},
                          bad_case{R"({"x":{"y":[0,{"b":1,"c":2,"b":3}]}})",
                                   "attribute 'data' names member 'b' twice (in data.x.y[1])"},
                          bad_case{R"([{"k":1,"\u006b":2}])", "attribute 'data' names member 'k' twice (in data[0])"}}) {
        CAPTURE(c.data);
        auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":)") + c.data + "}");
        CHECK_FALSE(p.ok);
        CHECK(p.err.why == idem::reason::invalid_field);
        CHECK(p.err.detail == c.detail);
    }
    std::string wide = "{";
    for (int i = 0; i < 100; ++i) wide += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + std::to_string(i);
    CHECK(parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":)") + wide + "}}").ok);
    auto p = parse(std::string(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":)") + wide + ",\"k42\":0}}");
    CHECK(p.err.detail == "attribute 'data' names member 'k42' twice (in data)");
    // The same name in different objects is fine.
    CHECK(parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}})").ok);
}

TEST_CASE("a leading UTF-8 byte order mark is skipped") {
    auto p = parse("\xEF\xBB\xBF{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"t\"}");
    CHECK(p.ok);
    CHECK(p.ev.id == "1");
    // Only one, and only at the start.
    CHECK(parse("\xEF\xBB\xBF\xEF\xBB\xBF{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"t\"}").err.why ==
          idem::reason::invalid_json);
}

TEST_CASE("to_json writes binary data as data_base64 with its content type") {
    auto p = parse(R"({"specversion":"1.0","id":"1","source":"s","type":"t","datacontenttype":"image/png","data_base64":"iVBORw0K"})");
    REQUIRE(p.ok);
    const auto again = parse(p.ev.to_json());
    REQUIRE(again.ok);
    CHECK(again.ev.data_binary);
    CHECK(again.ev.data == p.ev.data);
    CHECK(again.ev.datacontenttype == "image/png");
    CHECK(p.ev.to_json().find(R"("data_base64":"iVBORw0K")") != std::string::npos);
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
    // Whatever the bytes, the result is a JSON document: the parser reads it, and refuses
    // it only for the control characters a CloudEvents String may not hold.
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    idem::envelope e;
    e.id = all;
    e.source = "/s";
    e.type = "t";
    const auto p = parse(e.to_json());
    CHECK(p.err.why == idem::reason::invalid_field);
    CHECK(p.err.detail.find("attribute 'id' holds U+0000") == 0);
    e.id = all.substr(0x20, 0x7F - 0x20) + all.substr(0xA0);  // printable ASCII, stray bytes past the C1 controls
    CHECK(parse(e.to_json()).ok);
}
