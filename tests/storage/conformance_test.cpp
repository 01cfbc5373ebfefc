#include <idem/storage/envelope.hpp>

#include <doctest/doctest.h>
#include <simdjson.h>

#include <cstdio>
#include <fstream>
#include <string>

// The CloudEvents 1.0 structured-mode JSON examples of the spec and the test vectors of the
// official SDKs (tests/storage/cloudevents/cases.jsonl, each naming the repository and file
// it came from), each with the spec's verdict. idem must reach that verdict on every case,
// except where it deliberately differs: such a case names the difference and the reason
// idem gives instead, and is counted apart.

namespace {

std::string hex(std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    std::string out;
    for (char c : bytes) {
        const auto u = static_cast<unsigned char>(c);
        out.push_back(digits[u >> 4]);
        out.push_back(digits[u & 0xF]);
    }
    return out;
}

std::string_view field(simdjson::dom::object o, const char* name) {
    std::string_view s;
    return o[name].get(s) == simdjson::SUCCESS ? s : std::string_view{};
}

}  // namespace

TEST_SUITE("cloudevents conformance") {

TEST_CASE("every example of the spec and the SDKs gets the spec's verdict, or idem's documented one") {
    std::ifstream in{IDEM_CLOUDEVENTS_CASES};
    REQUIRE(in.good());
    simdjson::dom::parser json;
    idem::envelope_parser parser;
    std::size_t total = 0;
    std::size_t as_spec = 0;
    std::size_t differs = 0;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        simdjson::dom::object c;
        REQUIRE(json.parse(line).get(c) == simdjson::SUCCESS);
        const auto name = field(c, "name");
        const std::string body{field(c, "body")};
        const auto expect = field(c, "expect");
        const auto difference = field(c, "differs");
        CAPTURE(name);
        CAPTURE(field(c, "from"));
        CAPTURE(body);
        REQUIRE((expect == "valid" || expect == "invalid"));
        ++total;

        idem::envelope ev;
        idem::parse_error err;
        const bool ok = parser.parse(body, ev, err);
        CAPTURE(err.detail);
        if (!difference.empty()) {
            // idem refuses what the spec accepts, for the reason given.
            CHECK(expect == "valid");
            CHECK_FALSE(ok);
            CHECK(idem::to_string(err.why) == field(c, "idem"));
            ++differs;
            continue;
        }
        bool agrees = ok == (expect == "valid");
        CHECK(ok == (expect == "valid"));
        if (!ok) {
            CHECK(idem::to_string(err.why) == field(c, "reason"));
            agrees = agrees && idem::to_string(err.why) == field(c, "reason");
        } else {
            bool binary = false;
            if (c["binary"].get(binary) == simdjson::SUCCESS) {
                CHECK(ev.data_binary == binary);
                agrees = agrees && ev.data_binary == binary;
            }
            if (const auto data = field(c, "data"); c["data"].error() == simdjson::SUCCESS) {
                CHECK(ev.data == data);
                agrees = agrees && ev.data == data;
            }
            if (const auto data = field(c, "data_hex"); !data.empty()) {
                CHECK(hex(ev.data) == data);
                agrees = agrees && hex(ev.data) == data;
            }
            for (const char* attribute : {"subject", "time"}) {
                if (c[attribute].error() == simdjson::SUCCESS) {
                    const auto& got = std::string_view(attribute) == "subject" ? ev.subject : ev.time;
                    CHECK(got == field(c, attribute));
                    agrees = agrees && got == field(c, attribute);
                }
            }
        }
        if (agrees) ++as_spec;
    }
    std::printf("CloudEvents conformance: %zu of %zu cases as the spec says, %zu where idem deliberately differs "
                "(docs/DESIGN.md), %zu in all\n",
                as_spec, total - differs, differs, total);
    CHECK(total >= 60);
    CHECK(as_spec == total - differs);
    CHECK(differs <= 2);
}

}  // TEST_SUITE
