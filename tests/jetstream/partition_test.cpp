// Which partition a key belongs to: the server's FNV-1a hash of the subject token, and the
// reversible encoding of keys that are not one NATS token. The values are FNV-1a's published
// test vectors, not idem's own output; the scale-out test checks the mapping against a server.

#include <idem/sources/jetstream_partitions.hpp>
#include <idem/sources/jetstream_publish.hpp>

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

TEST_SUITE("partitions") {

TEST_CASE("a token's partition is FNV-1a of its bytes modulo N") {
    constexpr std::uint32_t all = 0xFFFFFFFFu;  // modulo 2^32-1 leaves these hashes unchanged
    CHECK(idem::jetstream::partition_of_token("a", all) == 0xe40c292cu);
    CHECK(idem::jetstream::partition_of_token("foobar", all) == 0xbf9cf968u);
    CHECK(idem::jetstream::partition_of_token("foobar", 7) == 0xbf9cf968u % 7);
    CHECK(idem::jetstream::partition_of_token("anything", 1) == 0);
}

TEST_CASE("a key that is not one NATS token is encoded before it is hashed") {
    SUBCASE("dots, wildcards, spaces and percent") {
        CHECK(idem::jetstream::partition_of("a.b", 1000) == idem::jetstream::partition_of_token("a%2Eb", 1000));
        CHECK(idem::jetstream::partition_of("x *>", 1000) == idem::jetstream::partition_of_token("x%20%2A%3E", 1000));
        CHECK(idem::jetstream::partition_of("5%", 1000) == idem::jetstream::partition_of_token("5%25", 1000));
    }
    SUBCASE("an empty key is the token 'events', and the key 'events' is '%65vents'") {
        CHECK(idem::jetstream::partition_of("", 1000) == idem::jetstream::partition_of_token("events", 1000));
        CHECK(idem::jetstream::partition_of("events", 1000) == idem::jetstream::partition_of_token("%65vents", 1000));
    }
    SUBCASE("a plain key is hashed as it is") {
        CHECK(idem::jetstream::partition_of("order-42", 16) == idem::jetstream::partition_of_token("order-42", 16));
    }
}

TEST_CASE("every key's token decodes back to the key, and only tokens the encoding makes decode") {
    using idem::jetstream::subject_of_token;
    using idem::jetstream::subject_token;
    const std::vector<std::string> keys = {"",       "events", "Events",   "a.b",  "a..b", ".",     "*",
                                           ">",      "x *>",   "%",        "%41",  "5%",    "%65vents",
                                           " ",      "tab\t", "caf\xc3\xa9", "\x7f", "order-42", "{subject}"};
    for (const auto& k : keys) {
        CAPTURE(k);
        const auto t = subject_token(k);
        CHECK(!t.empty());
        CHECK(t.find_first_of(".*> \t") == std::string::npos);  // one NATS token
        for (char c : t) CHECK((static_cast<unsigned char>(c) >= 0x21 && static_cast<unsigned char>(c) <= 0x7E));
        CHECK(subject_of_token(t) == k);
    }
    std::set<std::string> tokens;
    for (const auto& k : keys) tokens.insert(subject_token(k));
    CHECK(tokens.size() == keys.size());  // no two keys share a token
    for (const char* bad : {"a.b", "%4", "%zz", "%41", "%2e", "a b", "*", ">", "%"}) {
        CAPTURE(bad);
        CHECK(!subject_of_token(bad));
    }
}

TEST_CASE("keys spread over every partition") {
    std::set<std::uint32_t> seen;
    for (int i = 0; i < 200; ++i) seen.insert(idem::jetstream::partition_of("order-" + std::to_string(i), 8));
    CHECK(seen.size() == 8);
}

}  // TEST_SUITE
