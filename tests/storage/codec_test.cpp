#include <idem/storage/codec.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <system_error>
#include <string>
#include <vector>

using namespace std::string_literals;
namespace codec = idem::codec;

TEST_SUITE("codec") {

TEST_CASE("u64 keys sort numerically") {
    std::vector<std::uint64_t> values{0, 1, 255, 256, 65535, 1ull << 40, ~0ull};
    for (std::size_t i = 1; i < values.size(); ++i) {
        CHECK(codec::u64_key(values[i - 1]) < codec::u64_key(values[i]));
        CHECK(codec::get_u64_be(codec::u64_key(values[i])) == values[i]);
    }
}

TEST_CASE("row keys keep aggregate order and no aggregate aliases another's entries") {
    std::vector<std::string> aggregates{"", "a", "a\0"s, "a\0b"s, "a\x01", "ab", "b", "\0"s, "\xff"};
    std::sort(aggregates.begin(), aggregates.end());
    for (std::size_t i = 1; i < aggregates.size(); ++i) {
        CHECK(codec::row_key(aggregates[i - 1]) < codec::row_key(aggregates[i]));
    }
    for (const auto& a : aggregates) {
        auto row = codec::row_key(a);
        auto contributor = codec::contributor_key(a, "effect-1");
        auto end = codec::after_contributors(a);
        CHECK(row < contributor);
        CHECK(contributor < end);
        for (const auto& other : aggregates) {
            if (other == a) continue;
            // Another aggregate's row never falls inside a's contributor range.
            auto r = codec::row_key(other);
            CHECK_FALSE((r > row && r < end));
        }
        auto decoded = codec::decode_table_key(row);
        REQUIRE(decoded);
        CHECK(decoded->is_row);
        CHECK(decoded->aggregate == a);
        auto dc = codec::decode_table_key(contributor);
        REQUIRE(dc);
        CHECK_FALSE(dc->is_row);
        CHECK(dc->aggregate == a);
        CHECK(dc->effect == "effect-1");
    }
}

TEST_CASE("effect keys with zero bytes decode exactly") {
    auto key = codec::contributor_key("agg\0x"s, "e\0f\xff"s);
    auto decoded = codec::decode_table_key(key);
    REQUIRE(decoded);
    CHECK(decoded->aggregate == "agg\0x"s);
    CHECK(decoded->effect == "e\0f\xff"s);
}

TEST_CASE("a row record round-trips and a foreign one is refused") {
    std::string out;
    codec::encode_row(out, {.state_version = 3, .applied = 42, .highest_sequence = 7}, "state-bytes");
    auto r = codec::decode_row(out);
    CHECK(r.header.state_version == 3);
    CHECK(r.header.applied == 42);
    CHECK(r.header.highest_sequence == 7);
    CHECK(r.state == "state-bytes");
    SUBCASE("too short") { CHECK_THROWS_AS(codec::decode_row("abc"), std::system_error); }
    SUBCASE("unknown layout version") {
        out[0] = 9;
        CHECK_THROWS_AS(codec::decode_row(out), std::system_error);
    }
    SUBCASE("its checksum matched") { CHECK(r.checked); }
}

TEST_CASE("a bit flipped anywhere in a row record is found by its checksum") {
    std::string good;
    codec::encode_row(good, {.state_version = 2, .applied = 27, .highest_sequence = 0}, std::string("\x1b\0\0\0", 4));
    for (std::size_t bit = 0; bit < 8 * good.size(); ++bit) {
        auto bad = good;
        bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
        CHECK_THROWS_AS(codec::decode_row(bad), std::system_error);
    }
}

TEST_CASE("a row record written before rows carried a checksum reads, unchecked") {
    std::string old;
    old.push_back('\x01');
    codec::put_u32_le(old, 3);
    codec::put_u64_le(old, 42);
    codec::put_u64_le(old, 7);
    old += "state-bytes";
    const auto r = codec::decode_row(old);
    CHECK(r.header.state_version == 3);
    CHECK(r.header.applied == 42);
    CHECK(r.header.highest_sequence == 7);
    CHECK(r.state == "state-bytes");
    CHECK_FALSE(r.checked);
}

}  // TEST_SUITE
