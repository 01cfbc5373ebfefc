// Event times, content fingerprints and durations: the canonical forms retention relies on.

#include <idem/storage/canonical.hpp>
#include <idem/storage/duration.hpp>

#include <doctest/doctest.h>

using namespace std::chrono_literals;

TEST_CASE("RFC 3339 event times parse to ns since the epoch, offsets and fractions included") {
    CHECK(idem::parse_event_time("1970-01-01T00:00:00Z") == 0u);
    CHECK(idem::parse_event_time("2026-12-02T09:30:00Z") == 1'796'203'800'000'000'000u);
    CHECK(idem::parse_event_time("2026-12-02T10:30:00+01:00") == idem::parse_event_time("2026-12-02T09:30:00Z"));
    CHECK(idem::parse_event_time("2026-12-02T09:30:00.5Z") == 1'796'203'800'500'000'000u);
    CHECK(idem::parse_event_time("2026-12-02T09:30:00.123456789Z") == 1'796'203'800'123'456'789u);
    CHECK(idem::parse_event_time("2024-02-29T00:00:00Z").has_value());
    for (const char* bad : {"", "2026-12-02", "2026-12-02T09:30:00", "2026-13-02T09:30:00Z", "2025-02-29T00:00:00Z",
                            "2026-12-02T25:00:00Z", "2026-12-02T09:30:00.Z", "2026-12-02T09:30:00Zjunk",
                            "1969-12-31T23:59:59Z", "2026-12-02T09:30:00+1:00", "2026-12-02 09:30:00Z"}) {
        CAPTURE(bad);
        CHECK_FALSE(idem::parse_event_time(bad).has_value());
    }
}

TEST_CASE("fingerprints ignore formatting and see every decoded change") {
    idem::envelope a;
    a.id = "1";
    a.source = "/s";
    a.type = "t";
    a.subject = "k";
    a.time = "2026-12-02T09:30:00Z";
    a.data = R"({"x":1,"y":[1,2,{"z":"q"}],"s":"a\u0062"})";
    auto b = a;
    b.data = "{ \"s\" : \"ab\", \"y\" : [1.0, 2, {\"z\":\"q\"}], \"x\" : 1 }";
    b.time = "2026-12-02T10:30:00+01:00";  // the same instant
    CHECK(idem::fingerprint(a) == idem::fingerprint(b));
    CHECK(idem::fingerprint(a) != 0u);

    auto changed = [&](auto edit) {
        auto c = a;
        edit(c);
        return idem::fingerprint(c) != idem::fingerprint(a);
    };
    CHECK(changed([](idem::envelope& e) { e.data = R"({"x":2,"y":[1,2,{"z":"q"}],"s":"ab"})"; }));
    CHECK(changed([](idem::envelope& e) { e.data = R"({"x":1,"y":[2,1,{"z":"q"}],"s":"ab"})"; }));
    CHECK(changed([](idem::envelope& e) { e.data = R"({"x":1,"y":[1,2,{"z":"q"}],"s":"ab","n":null})"; }));
    CHECK(changed([](idem::envelope& e) { e.data = R"({"x":"1","y":[1,2,{"z":"q"}],"s":"ab"})"; }));
    CHECK(changed([](idem::envelope& e) { e.subject = "k2"; }));
    CHECK(changed([](idem::envelope& e) { e.type = "t2"; }));
    CHECK(changed([](idem::envelope& e) { e.sequence = 3; }));
    CHECK(changed([](idem::envelope& e) { e.time = "2026-12-02T09:30:01Z"; }));
    CHECK(idem::fingerprint_bytes("abc") != idem::fingerprint_bytes("abd"));
}

TEST_CASE("fingerprints tell binary data from JSON data with the same bytes") {
    idem::envelope a;
    a.id = "1";
    a.source = "/s";
    a.type = "t";
    a.data = R"({"x":1})";
    auto b = a;
    b.data_binary = true;  // the same bytes, as data_base64 without a JSON content type
    CHECK(idem::fingerprint(a) != idem::fingerprint(b));
    auto c = b;
    c.data = R"({"x":2})";
    CHECK(idem::fingerprint(b) != idem::fingerprint(c));
    // The content type is not content: JSON data is the same whether or not it was declared.
    auto d = a;
    d.datacontenttype = "application/json";
    CHECK(idem::fingerprint(a) == idem::fingerprint(d));
}

TEST_CASE("durations parse and format as people write them") {
    CHECK(idem::parse_duration("7d") == std::chrono::nanoseconds(7 * 24h));
    CHECK(idem::parse_duration("1h30m") == std::chrono::nanoseconds(90min));
    CHECK(idem::parse_duration("250ms") == std::chrono::nanoseconds(250ms));
    CHECK(idem::parse_duration("10s") == std::chrono::nanoseconds(10s));
    for (const char* bad : {"", "h", "10", "1x", "-1h", "1h 2m", "99999999999999999999d"}) {
        CAPTURE(bad);
        CHECK_FALSE(idem::parse_duration(bad).has_value());
    }
    CHECK(idem::format_duration(90min) == "1h30m");
    CHECK(idem::format_duration(7 * 24h) == "7d");
    CHECK(idem::format_duration(250ms) == "250ms");
    CHECK(idem::format_duration(0s) == "0s");
}
