#include <idem/storage/event_log.hpp>

#include "../common/temp_dir.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/envelope_record.hpp>
#include <idem/storage/error.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using idem::test::temp_dir;
namespace fs = std::filesystem;

namespace {

struct record {
    std::string body;
    std::uint64_t offset = 0;
    std::uint64_t end = 0;
    std::uint64_t line = 0;
};

std::string slurp(const fs::path& path) {
    std::ifstream in{path, std::ios::binary};
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& path, std::string_view bytes) {
    std::ofstream out{path, std::ios::binary | std::ios::trunc};
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Appends raw bytes with write(2), the way another process would.
void append_raw(const fs::path& path, std::string_view bytes) {
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    REQUIRE(fd >= 0);
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
}

std::vector<record> read_all(idem::log_reader& reader) {
    std::vector<record> out;
    idem::log_record r;
    while (reader.next(r)) out.push_back({std::string(r.body), r.offset, r.end, r.line});
    return out;
}

std::vector<record> read_all(const fs::path& path, idem::log_reader_options options = {}) {
    idem::log_reader reader{path, options};
    return read_all(reader);
}

std::vector<std::string> bodies(const std::vector<record>& records) {
    std::vector<std::string> out;
    for (const auto& r : records) out.push_back(r.body);
    return out;
}

void write_log(const fs::path& path, idem::log_format format, const std::vector<std::string>& records) {
    idem::log_writer writer{path, format};
    for (const auto& body : records) writer.write(body);
}

// The bytes of one binary record, as the writer lays it out (the file minus its 16-byte header).
std::string binary_record(const temp_dir& dir, const std::string& body) {
    auto scratch = dir / "scratch.bin";
    write_log(scratch, idem::log_format::binary, {body});
    return slurp(scratch).substr(16);
}

std::string envelope(int i) {
    return R"({"specversion":"1.0","id":"e-)" + std::to_string(i) +
           R"(","source":"/orders","type":"order.line_added","subject":"order-42","data":{"amount":)" +
           std::to_string(i * 10) + "}}";
}

std::vector<std::string> envelopes(int n) {
    std::vector<std::string> out;
    for (int i = 1; i <= n; ++i) out.push_back(envelope(i));
    return out;
}

// Bodies that stress the formats: unicode, escapes, an invalid JSON line, bytes no UTF-8 text has, a long line.
std::vector<std::string> awkward_bodies() {
    return {
        envelope(1),
        R"({"id":"ü-ß-日本-🙂","source":"/s","type":"t","data":"caf\u00e9 \"quoted\" back\\slash"})",
        R"({"id":"2","source":"/s","type":"t","data":"tab\there \/ \r\n escaped"})",
        "this is not JSON at all {",
        R"({"id":"3","source":"/s",)",
        "\xFF\xFE raw bytes \x01\x02 \xFF",
        "{\"id\":\"long\",\"data\":\"" + std::string(5u << 20, 'x') + "\"}",
        R"(  {"id":"padded","source":"/s","type":"t"}  )",
        envelope(2),
    };
}

}  // namespace

TEST_SUITE("event_log") {

TEST_CASE("crc32c matches the published check values") {
    CHECK(idem::crc32c("123456789") == 0xE3069283u);
    CHECK(idem::crc32c("") == 0u);
    // RFC 3720 (iSCSI) appendix B.4
    CHECK(idem::crc32c(std::string(32, '\0')) == 0x8A9136AAu);
    CHECK(idem::crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
    std::string ascending;
    for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
    CHECK(idem::crc32c(ascending) == 0x46DD794Eu);
    CHECK(idem::detail::crc32c_portable("123456789") == 0xE3069283u);
    CHECK(idem::detail::crc32c_portable(ascending) == 0x46DD794Eu);

    SUBCASE("extending a checksum equals checksumming the concatenation") {
        CHECK(idem::crc32c("56789", idem::crc32c("1234")) == 0xE3069283u);
        CHECK(idem::detail::crc32c_portable("6789", idem::detail::crc32c_portable("12345")) == 0xE3069283u);
    }
    SUBCASE("the hardware and table paths agree at every length and alignment") {
        std::mt19937 rng{7};
        std::string data(4096, '\0');
        for (auto& c : data) c = static_cast<char>(rng());
        for (std::size_t start = 0; start < 9; ++start) {
            for (std::size_t len = 0; len + start <= data.size(); len += 1 + len / 3) {
                std::string_view piece(data.data() + start, len);
                REQUIRE(idem::crc32c(piece) == idem::detail::crc32c_portable(piece));
            }
        }
    }
}

TEST_CASE("format names and detection") {
    temp_dir dir;
    CHECK(idem::to_string(idem::log_format::jsonl) == "jsonl");
    CHECK(idem::to_string(idem::log_format::binary) == "binary");
    write_log(dir / "a.bin", idem::log_format::binary, {"{}"});
    write_log(dir / "a.jsonl", idem::log_format::jsonl, {"{}"});
    spit(dir / "empty", "");
    CHECK(idem::detect_log_format(dir / "a.bin") == idem::log_format::binary);
    CHECK(idem::detect_log_format(dir / "a.jsonl") == idem::log_format::jsonl);
    CHECK(idem::detect_log_format(dir / "empty") == idem::log_format::jsonl);
    try {
        (void)idem::detect_log_format(dir / "missing");
        FAIL("no error for a missing file");
    } catch (const std::system_error& e) {
        CHECK(e.code() == std::errc::no_such_file_or_directory);
        CHECK(std::string(e.what()).find((dir / "missing").string()) != std::string::npos);
    }
}

TEST_CASE("JSON Lines: offsets, line numbers, blank lines, CRLF and a torn last line") {
    temp_dir dir;
    auto path = dir / "log.jsonl";
    const std::string text = "{\"a\":1}\n\n  \t\n{\"b\":2}\r\nnot json\n\r\n{\"c\":3}";
    spit(path, text);

    idem::log_reader reader{path};
    CHECK(reader.format() == idem::log_format::jsonl);
    CHECK(reader.path() == path);
    CHECK(reader.size() == text.size());
    auto records = read_all(reader);
    REQUIRE(records.size() == 3);
    auto b = text.find("{\"b\"");
    auto n = text.find("not json");
    auto c = text.find("{\"c\"");
    CHECK(records[0].body == "{\"a\":1}");
    CHECK(records[0].offset == 0);
    CHECK(records[0].end == 8);
    CHECK(records[0].line == 1);
    CHECK(records[1].body == "{\"b\":2}");  // the \r is stripped
    CHECK(records[1].offset == b);
    CHECK(records[1].end == b + 9);
    CHECK(records[1].line == 4);
    CHECK(records[2].body == "not json");  // returned as it is: the apply path dead-letters it
    CHECK(records[2].offset == n);
    CHECK(records[2].line == 5);
    // No final newline: a torn tail, like a binary record cut short, not a record.
    REQUIRE(reader.torn_tail());
    CHECK(*reader.torn_tail() == c);
    CHECK(reader.torn_detail() == "line 7 at offset " + std::to_string(c) + ": 7 bytes without a newline at the end of the file");
    CHECK(reader.position() == records[2].end);  // the end of the last record returned
    idem::log_record again;
    CHECK_FALSE(reader.next(again));
}

TEST_CASE("JSON Lines: lines far longer than the read buffer") {
    temp_dir dir;
    auto path = dir / "long.jsonl";
    std::vector<std::string> lines = {"{\"short\":1}", "{\"x\":\"" + std::string(17u << 20, 'y') + "\"}",
                                      "{\"short\":2}", std::string(9u << 20, 'z')};
    std::string text;
    for (const auto& l : lines) text += l + "\n";
    spit(path, text);
    auto records = read_all(path);
    CHECK(bodies(records) == lines);
    REQUIRE(records.size() == 4);
    CHECK(records[2].offset == lines[0].size() + lines[1].size() + 2);
}

TEST_CASE("a JSON line over the record limit is corrupt_log, naming the file, the line and the offset") {
    temp_dir dir;
    auto path = dir / "huge.jsonl";
    spit(path, "{}\n");
    // A sparse run of zero bytes, no newline: a line one byte over the limit without writing it.
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(3 + std::uint64_t{idem::max_log_record} + 2)) == 0);
    idem::log_reader reader{path};
    idem::log_record r;
    REQUIRE(reader.next(r));
    CHECK(r.body == "{}");
    try {
        reader.next(r);
        FAIL("read a line longer than the record limit");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::corrupt_log);
        CHECK(std::string(e.what()) == path.string() + ": line 2 at offset 3: longer than the record limit of " +
                                           std::to_string(idem::max_log_record) + " bytes: corrupt event log");
    }
}

TEST_CASE("a log that cannot be read is refused, naming the file") {
    temp_dir dir;
    SUBCASE("a file that does not exist") {
        try {
            idem::log_reader reader{dir / "missing.jsonl"};
            FAIL("opened a missing log");
        } catch (const std::system_error& e) {
            CHECK(e.code() == std::errc::no_such_file_or_directory);
            CHECK(std::string(e.what()).find((dir / "missing.jsonl").string() + ": cannot open") == 0);
        }
    }
    SUBCASE("a directory") {
        try {
            idem::log_reader reader{dir.path()};
            FAIL("read a directory as a log");
        } catch (const std::system_error& e) {
            CHECK(e.code() == std::errc::is_a_directory);
            CHECK(std::string(e.what()).find(dir.path().string() + ": read at offset 0 failed") == 0);
        }
    }
    SUBCASE("a binary log resumed inside its header") {
        write_log(dir / "a.bin", idem::log_format::binary, {"{}"});
        try {
            idem::log_reader reader{dir / "a.bin", {.start = 5}};
            FAIL("resumed inside the header");
        } catch (const std::system_error& e) {
            CHECK(e.code() == idem::errc::invalid_argument);
            CHECK(std::string(e.what()).find("start offset 5 is inside the header") != std::string::npos);
        }
    }
}

TEST_CASE("a reader resumed at a record's end reads exactly the records after it") {
    temp_dir dir;
    auto format = idem::log_format::jsonl;
    SUBCASE("jsonl") { format = idem::log_format::jsonl; }
    SUBCASE("binary") { format = idem::log_format::binary; }
    auto path = dir / "log";
    auto expected = envelopes(50);
    write_log(path, format, expected);
    auto all = read_all(path);
    REQUIRE(bodies(all) == expected);
    for (std::size_t i = 0; i < all.size(); ++i) {
        auto rest = read_all(path, {.start = all[i].end, .start_line = all[i].line});
        REQUIRE(rest.size() == all.size() - i - 1);
        for (std::size_t j = 0; j < rest.size(); ++j) {
            CHECK(rest[j].body == all[i + 1 + j].body);
            CHECK(rest[j].offset == all[i + 1 + j].offset);
            CHECK(rest[j].line == all[i + 1 + j].line);
        }
    }
}

TEST_CASE("JSONL -> binary -> JSONL is byte-identical and every record survives") {
    temp_dir dir;
    auto original = awkward_bodies();
    std::string text;
    for (const auto& b : original) text += b + "\n";
    spit(dir / "in.jsonl", text);

    auto to_binary = idem::convert_log(dir / "in.jsonl", dir / "log.bin", idem::log_format::binary);
    CHECK(to_binary.records == original.size());
    CHECK_FALSE(to_binary.torn_tail);
    CHECK(idem::detect_log_format(dir / "log.bin") == idem::log_format::binary);
    std::size_t expected_size = 16;
    for (const auto& b : original) expected_size += binary_record(dir, b).size();  // as the writer lays each out
    CHECK(fs::file_size(dir / "log.bin") == expected_size);
    auto binary_records = read_all(dir / "log.bin");
    CHECK(bodies(binary_records) == original);
    REQUIRE(binary_records.size() == original.size());
    CHECK(binary_records.front().offset == 16);
    CHECK(binary_records.back().line == original.size());

    auto back = idem::convert_log(dir / "log.bin", dir / "out.jsonl", idem::log_format::jsonl);
    CHECK(back.records == original.size());
    CHECK(slurp(dir / "out.jsonl") == text);

    SUBCASE("converting a log onto itself is refused") {
        CHECK_THROWS_AS(idem::convert_log(dir / "log.bin", dir / "log.bin", idem::log_format::jsonl),
                        std::system_error);
        CHECK(bodies(read_all(dir / "log.bin")) == original);
    }
}

TEST_CASE("a binary log cut anywhere inside its last record reports a torn tail") {
    temp_dir dir;
    auto path = dir / "log.bin";
    auto expected = envelopes(5);
    write_log(path, idem::log_format::binary, expected);
    const auto full = slurp(path);
    const auto all = read_all(path);
    REQUIRE(all.size() == 5);
    const std::size_t last_offset = all.back().offset;
    const std::size_t last_length = full.size() - 12 - last_offset;  // the payload: body length, body, attributes

    for (std::size_t kept = 1; kept < 12 + last_length; ++kept) {
        CAPTURE(kept);
        spit(path, std::string_view(full).substr(0, last_offset + kept));
        idem::log_reader reader{path};
        auto records = read_all(reader);
        REQUIRE(records.size() == 4);
        CHECK(bodies(records) == std::vector<std::string>(expected.begin(), expected.begin() + 4));
        REQUIRE(reader.torn_tail());
        CHECK(*reader.torn_tail() == last_offset);
        CHECK(reader.position() == last_offset);
        CHECK(reader.torn_detail().find("record at offset " + std::to_string(last_offset) + ": ") == 0);
        if (kept >= 12) {
            CHECK(reader.torn_detail().find("header says " + std::to_string(last_length) + " bytes, " +
                                            std::to_string(kept - 12) + " present") != std::string::npos);
        }
        idem::log_record r;
        CHECK_FALSE(reader.next(r));
    }

    SUBCASE("a complete last record failing its checksum is a torn tail too, not an error") {
        auto damaged = full;
        damaged[damaged.size() - 3] ^= 0x20;
        spit(path, damaged);
        idem::log_reader reader{path};
        CHECK(read_all(reader).size() == 4);
        REQUIRE(reader.torn_tail());
        CHECK(*reader.torn_tail() == last_offset);
        CHECK(reader.torn_detail().find("checksum mismatch") != std::string::npos);
    }
    SUBCASE("convert_log reports the torn tail and does not copy it") {
        spit(path, std::string_view(full).substr(0, full.size() - 7));
        auto result = idem::convert_log(path, dir / "out.jsonl", idem::log_format::jsonl);
        CHECK(result.records == 4);
        REQUIRE(result.torn_tail);
        CHECK(*result.torn_tail == last_offset);
        CHECK_FALSE(result.torn_detail.empty());
        CHECK(bodies(read_all(dir / "out.jsonl")) == std::vector<std::string>(expected.begin(), expected.begin() + 4));
    }
}

TEST_CASE("a damaged record in the middle of a binary log is an error naming the file and offset") {
    temp_dir dir;
    auto path = dir / "log.bin";
    auto expected = envelopes(10);
    expected[5] = "\xFF\xFF payload with record-magic-like bytes \xFF";
    write_log(path, idem::log_format::binary, expected);
    const auto good = read_all(path);
    REQUIRE(bodies(good) == expected);
    const auto victim = good[3];
    auto damaged = slurp(path);

    std::string cause;
    SUBCASE("a flipped payload byte") {
        damaged[victim.offset + 12 + 5] ^= 0x01;
        cause = "checksum mismatch";
    }
    SUBCASE("a flipped record magic") {
        damaged[victim.offset + 1] ^= 0x40;
        cause = "bad record magic";
    }
    SUBCASE("a length made smaller") {
        damaged[victim.offset + 4] = static_cast<char>(damaged[victim.offset + 4] - 3);
        cause = "checksum mismatch";
    }
    SUBCASE("a length beyond the limit") {
        damaged[victim.offset + 7] = '\x7F';
        cause = "more than the record limit";
    }
    spit(path, damaged);

    {
        idem::log_reader reader{path};
        idem::log_record r;
        for (int i = 0; i < 3; ++i) REQUIRE(reader.next(r));
        try {
            reader.next(r);
            FAIL("no error for a corrupt record");
        } catch (const std::system_error& e) {
            CHECK(e.code() == idem::errc::corrupt_log);
            std::string what = e.what();
            CAPTURE(what);
            CHECK(what.find(path.string() + ": corrupt record at offset " + std::to_string(victim.offset) + ": ") == 0);
            CHECK(what.find(cause) != std::string::npos);
        }
    }
    {
        idem::log_reader reader{path, {.skip_bad = true}};
        auto records = read_all(reader);
        auto rest = expected;
        rest.erase(rest.begin() + 3);
        CHECK(bodies(records) == rest);
        CHECK(reader.skipped() == 1);
        CHECK_FALSE(reader.torn_tail());
        REQUIRE(records.size() == rest.size());
        CHECK(records[3].offset == good[4].offset);
    }
    {
        auto result = idem::convert_log(path, dir / "out.jsonl", idem::log_format::jsonl, true);
        CHECK(result.records == 9);
        CHECK(result.skipped == 1);
    }
}

TEST_CASE("binary records carry what parsing their body gives, and only for a valid envelope") {
    temp_dir dir;
    auto bodies = awkward_bodies();
    const std::vector<std::string> more = {
        R"({"specversion":"1.0","id":"s-1","source":"\/escaped\/source","type":"t","subject":"ord\u00e9r","sequence":7,"time":"2026-12-02T10:00:00.5+01:00","data":{"b":1,"a":[1,2.5,"x"]}})",
        R"({"specversion":"1.0","id":"b-1","source":"/s","type":"t","datacontenttype":"application/json","data_base64":"eyJhIjoxfQ=="})",
        R"({"specversion":"1.0","id":"b-2","source":"/s","type":"t","datacontenttype":"application/octet-stream","data_base64":"AAEC/w=="})",
        "\xEF\xBB\xBF" R"({"specversion":"1.0","id":"bom","source":"/s","type":"t","msgid":"m-1","dataschema":"urn:x:t:2"})",
        R"({"specversion":"1.0","id":"n","source":"/s","type":"t","subject":null,"time":null,"ext1":"v","data":null})",
        R"({"specversion":"1.0","id":"dup","source":"/s","type":"t","id":"again"})",
        R"({"specversion":"1.0","id":"seq","source":"/s","type":"t","sequence":3})",  // a sequence needs a subject
    };
    bodies.insert(bodies.end(), more.begin(), more.end());
    const auto path = dir / "log.bin";
    write_log(path, idem::log_format::binary, bodies);
    idem::log_reader reader{path};
    idem::log_record r;
    idem::envelope_parser parser;
    std::size_t i = 0, valid = 0;
    while (reader.next(r)) {
        REQUIRE(i < bodies.size());
        CAPTURE(i);
        CHECK(r.body == bodies[i]);
        idem::envelope parsed, stored;
        idem::parse_error err;
        if (!parser.parse(r.body, parsed, err)) {
            CHECK(r.attributes.empty());
        } else {
            ++valid;
            std::uint64_t fingerprint = 0;
            REQUIRE(idem::decode_envelope_attributes(r.attributes, r.body, stored, fingerprint));
            CHECK(fingerprint == idem::fingerprint(parsed));
            CHECK(stored.id == parsed.id);
            CHECK(stored.source == parsed.source);
            CHECK(stored.type == parsed.type);
            CHECK(stored.subject == parsed.subject);
            CHECK(stored.sequence == parsed.sequence);
            CHECK(stored.time == parsed.time);
            CHECK(stored.msgid == parsed.msgid);
            CHECK(stored.datacontenttype == parsed.datacontenttype);
            CHECK(stored.dataschema == parsed.dataschema);
            CHECK(stored.data == parsed.data);
            CHECK(stored.data_binary == parsed.data_binary);
        }
        ++i;
    }
    CHECK(i == bodies.size());
    CHECK(valid == 2 + more.size() - 2);  // envelope(1), envelope(2), and the added bodies but "dup" and "seq"

    SUBCASE("attributes of other rules or damaged are not used: the body is parsed instead") {
        idem::envelope ev;
        idem::parse_error err;
        REQUIRE(parser.parse(more[0], ev, err));
        std::string attributes;
        idem::encode_envelope_attributes(attributes, more[0], ev, 42);
        idem::envelope out;
        std::uint64_t fingerprint = 0;
        REQUIRE(idem::decode_envelope_attributes(attributes, more[0], out, fingerprint));
        CHECK(fingerprint == 42);
        auto other = attributes;
        other[0] = static_cast<char>(idem::envelope_rules_revision + 1);
        CHECK_FALSE(idem::decode_envelope_attributes(other, more[0], out, fingerprint));
        CHECK_FALSE(idem::decode_envelope_attributes(attributes.substr(0, attributes.size() - 1), more[0], out, fingerprint));
        CHECK_FALSE(idem::decode_envelope_attributes(attributes + "x", more[0], out, fingerprint));
        CHECK_FALSE(idem::decode_envelope_attributes(attributes, more[0].substr(0, 10), out, fingerprint));
    }
}

TEST_CASE("a binary record's payload meets the record limit: the body's length field counts") {
    temp_dir dir;
    idem::log_writer writer{dir / "log.bin", idem::log_format::binary};
    const std::string body(idem::max_log_record - 3, 'x');  // fits alone, not with its 4-byte length
    try {
        writer.write(body);
        FAIL("wrote a record over the limit");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::invalid_argument);
        CHECK(std::string(e.what()).find("more than the record limit of " +
                                         std::to_string(idem::max_log_record - 4)) != std::string::npos);
    }
    writer.write(envelope(1));
    writer.flush();
    CHECK(bodies(read_all(dir / "log.bin")) == std::vector<std::string>{envelope(1)});
}

TEST_CASE("a binary log written before records carried attributes is read, and appended to, as it is") {
    temp_dir dir;
    const auto path = dir / "old.bin";
    // The earlier layout: flags 0, each payload the body alone.
    std::string bytes{"IDEMLOG\0\x01\0\0\0\0\0\0\0", 16};
    auto put_u32 = [](std::string& out, std::uint32_t v) {
        for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
    };
    const auto old_bodies = envelopes(3);
    for (const auto& body : old_bodies) {
        std::string length;
        put_u32(length, static_cast<std::uint32_t>(body.size()));
        put_u32(bytes, 0xFE52D1FFu);
        bytes += length;
        put_u32(bytes, idem::crc32c(body, idem::crc32c(length)));
        bytes += body;
    }
    spit(path, bytes);
    {
        idem::log_reader reader{path};
        idem::log_record r;
        std::size_t n = 0;
        while (reader.next(r)) {
            CHECK(r.body == old_bodies[n++]);
            CHECK(r.attributes.empty());
        }
        CHECK(n == 3);
    }
    {
        idem::log_writer writer{path, idem::log_format::binary, true};
        writer.write(envelope(4));
    }
    auto all = read_all(path);
    REQUIRE(all.size() == 4);
    CHECK(all.back().body == envelope(4));
    const auto after = slurp(path);
    CHECK(after.substr(0, bytes.size()) == bytes);  // header (flags 0) and records untouched
    CHECK(after.size() == bytes.size() + 12 + envelope(4).size());  // appended in the file's own layout
}

TEST_CASE("a binary log with a wrong header is refused, naming the file") {
    temp_dir dir;
    auto path = dir / "log.bin";
    write_log(path, idem::log_format::binary, {"{}"});
    auto bytes = slurp(path);
    std::string expect;
    SUBCASE("another version") {
        bytes[8] = 2;
        expect = "version 2";
    }
    SUBCASE("unknown flags") {
        bytes[12] = 2;  // flag 1 (records carry attributes) is known
        expect = "unknown binary log flags 0x00000002";
    }
    SUBCASE("a damaged magic") {
        bytes[7] = 'X';
        expect = "magic";
    }
    // A flipped bit anywhere in the magic: still a binary log, refused as damaged (it was taken
    // for JSON Lines: garbage lines, or one torn tail and exit 0).
    for (std::size_t at = 0; at < 8; ++at) {
        for (int bit = 0; bit < 8; ++bit) {
            SUBCASE(("bit " + std::to_string(bit) + " of magic byte " + std::to_string(at)).c_str()) {
                bytes[at] = static_cast<char>(bytes[at] ^ (1 << bit));
                expect = "bad binary log magic";
            }
        }
    }
    SUBCASE("a header cut short") {
        bytes.resize(11);
        expect = "cut short";
    }
    spit(path, bytes);
    try {
        idem::log_reader reader{path};
        FAIL("opened a log with a wrong header");
    } catch (const std::system_error& e) {
        CHECK(e.code() == idem::errc::format_mismatch);
        std::string what = e.what();
        CAPTURE(what);
        CHECK(what.find(path.string()) == 0);
        CHECK(what.find(expect) != std::string::npos);
    }
    CHECK_THROWS_AS(idem::log_writer(path, idem::log_format::binary, true), std::system_error);
}

TEST_CASE("the writer refuses records that would not read back unchanged") {
    temp_dir dir;
    auto path = dir / "log.jsonl";
    idem::log_writer writer{path, idem::log_format::jsonl};
    writer.write("{}");
    auto refused = [&](std::string_view body) {
        try {
            writer.write(body);
        } catch (const std::system_error& e) {
            CHECK(e.code() == idem::errc::invalid_argument);
            std::string what = e.what();
            CHECK(what.find(path.string() + ": record 2") == 0);
            return true;
        }
        return false;
    };
    CHECK(refused("{\"a\":\n1}"));
    CHECK(refused(""));
    CHECK(refused("  \t"));
    CHECK(refused("{}\r"));
    writer.write("{\"ok\":true}");
    writer.flush();
    CHECK(slurp(path) == "{}\n{\"ok\":true}\n");
    CHECK(writer.records() == 2);

    SUBCASE("a binary log stores the same bodies verbatim") {
        std::vector<std::string> odd = {"{\"a\":\n1}", "", "  \t", "{}\r"};
        write_log(dir / "odd.bin", idem::log_format::binary, odd);
        CHECK(bodies(read_all(dir / "odd.bin")) == odd);
    }
}

TEST_CASE("appending continues a log of the same format") {
    temp_dir dir;
    SUBCASE("binary") {
        auto path = dir / "log.bin";
        write_log(path, idem::log_format::binary, {"{\"n\":1}"});
        {
            idem::log_writer writer{path, idem::log_format::binary, true};
            writer.write("{\"n\":2}");
        }
        CHECK(bodies(read_all(path)) == std::vector<std::string>{"{\"n\":1}", "{\"n\":2}"});
        CHECK_THROWS_AS(idem::log_writer(path, idem::log_format::jsonl, true), std::system_error);
    }
    SUBCASE("jsonl whose last line was torn: the torn line stays a record of its own") {
        auto path = dir / "log.jsonl";
        spit(path, "{\"n\":1}\n{\"n\":");
        {
            idem::log_writer writer{path, idem::log_format::jsonl, true};
            writer.write("{\"n\":3}");
        }
        CHECK(bodies(read_all(path)) == std::vector<std::string>{"{\"n\":1}", "{\"n\":", "{\"n\":3}"});
        CHECK_THROWS_AS(idem::log_writer(path, idem::log_format::binary, true), std::system_error);
    }
    SUBCASE("binary whose last record was torn: the torn record is cut, the log stays readable") {
        auto path = dir / "torn.bin";
        write_log(path, idem::log_format::binary, {"{\"n\":1}", "{\"n\":2}"});
        std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
        {
            idem::log_writer writer{path, idem::log_format::binary, true};
            writer.write("{\"n\":3}");
        }
        idem::log_reader reader{path};
        idem::log_record r;
        std::vector<std::string> got;
        while (reader.next(r)) got.emplace_back(r.body);
        CHECK(got == std::vector<std::string>{"{\"n\":1}", "{\"n\":3}"});
        CHECK_FALSE(reader.torn_tail().has_value());
        CHECK(reader.skipped() == 0);
    }
    SUBCASE("a missing file is created") {
        auto path = dir / "new.bin";
        {
            idem::log_writer writer{path, idem::log_format::binary, true};
            writer.write("{}");
            writer.sync();
        }
        CHECK(bodies(read_all(path)) == std::vector<std::string>{"{}"});
    }
}

TEST_CASE("following a log: an incomplete last record is held back until it is complete") {
    temp_dir dir;
    SUBCASE("jsonl") {
        auto path = dir / "log.jsonl";
        spit(path, "{\"n\":1}\n{\"n\":");
        idem::log_reader reader{path, {.follow = true}};
        idem::log_record r;
        REQUIRE(reader.next(r));
        CHECK(r.body == "{\"n\":1}");
        CHECK_FALSE(reader.next(r));
        CHECK_FALSE(reader.next(r));  // asking again does not latch or return the fragment
        CHECK_FALSE(reader.torn_tail());
        append_raw(path, "2}");
        CHECK_FALSE(reader.next(r));
        append_raw(path, "\n{\"n\":3}\n");
        REQUIRE(reader.next(r));
        CHECK(r.body == "{\"n\":2}");
        CHECK(r.offset == 8);
        REQUIRE(reader.next(r));
        CHECK(r.body == "{\"n\":3}");
        CHECK_FALSE(reader.next(r));
    }
    SUBCASE("binary, cut inside the header and inside the payload") {
        auto path = dir / "log.bin";
        write_log(path, idem::log_format::binary, {"{\"n\":1}"});
        auto second = binary_record(dir, "{\"n\":2}");
        idem::log_reader reader{path, {.follow = true}};
        idem::log_record r;
        REQUIRE(reader.next(r));
        CHECK(r.body == "{\"n\":1}");
        CHECK_FALSE(reader.next(r));
        append_raw(path, second.substr(0, 5));
        CHECK_FALSE(reader.next(r));
        append_raw(path, second.substr(5, 10));
        CHECK_FALSE(reader.next(r));
        CHECK_FALSE(reader.torn_tail());
        append_raw(path, second.substr(15));
        REQUIRE(reader.next(r));
        CHECK(r.body == "{\"n\":2}");
        CHECK(r.line == 2);
        CHECK_FALSE(reader.next(r));
    }
}

TEST_CASE("a follower decides the format from the first bytes that arrive, not from an empty file") {
    temp_dir dir;
    auto path = dir / "live.log";
    write_log(dir / "all.bin", idem::log_format::binary, {"{\"n\":1}", "{\"n\":2}"});
    const auto binary = slurp(dir / "all.bin");
    spit(path, "");
    idem::log_record r;
    SUBCASE("a binary log arriving in pieces, its header cut short first") {
        idem::log_reader reader{path, {.follow = true}};
        CHECK_FALSE(reader.format_known());
        CHECK_FALSE(reader.next(r));
        append_raw(path, binary.substr(0, 3));
        CHECK_FALSE(reader.next(r));
        append_raw(path, binary.substr(3, 9));  // 12 bytes: more than the magic, less than the header
        CHECK_FALSE(reader.next(r));
        CHECK_FALSE(reader.format_known());
        append_raw(path, binary.substr(12));
        REQUIRE(reader.next(r));
        CHECK(reader.format() == idem::log_format::binary);
        CHECK(r.body == "{\"n\":1}");
        CHECK(r.offset == 16);
        REQUIRE(reader.next(r));
        CHECK(r.body == "{\"n\":2}");
    }
    SUBCASE("JSON Lines: decided by its first byte") {
        idem::log_reader reader{path, {.follow = true}};
        append_raw(path, "{\"n\":1}\n");
        REQUIRE(reader.next(r));
        CHECK(reader.format() == idem::log_format::jsonl);
        CHECK(r.body == "{\"n\":1}");
    }
    SUBCASE("an expected format wins: jsonl is taken at once, binary refused when it arrives") {
        idem::log_reader jsonl{path, {.follow = true, .format = idem::log_format::jsonl}};
        CHECK(jsonl.format_known());
        idem::log_reader expecting_jsonl{path, {.follow = true, .format = idem::log_format::jsonl}};
        idem::log_reader expecting_binary{path, {.follow = true, .format = idem::log_format::binary}};
        append_raw(path, "{\"n\":1}\n");
        CHECK_THROWS_AS(expecting_binary.next(r), std::system_error);
        REQUIRE(expecting_jsonl.next(r));
    }
    SUBCASE("not following, an empty file is an empty JSON Lines log") {
        idem::log_reader reader{path};
        CHECK(reader.format_known());
        CHECK_FALSE(reader.next(r));
        CHECK_FALSE(reader.torn_tail());
    }
}

TEST_CASE("following a log while another thread appends reads every record exactly once") {
    temp_dir dir;
    auto format = idem::log_format::jsonl;
    SUBCASE("jsonl") { format = idem::log_format::jsonl; }
    SUBCASE("binary") { format = idem::log_format::binary; }
    auto path = dir / "log";
    const auto expected = envelopes(3000);
    // Each record's bytes, made by a writer elsewhere, then appended in two pieces so the reader sees halves.
    std::vector<std::string> raw;
    {
        write_log(dir / "all", format, expected);
        auto all = read_all(dir / "all");
        auto bytes = slurp(dir / "all");
        for (const auto& r : all) {
            raw.push_back(bytes.substr(r.offset, r.end - r.offset));
        }
        spit(path, bytes.substr(0, all.front().offset));  // the header only, for binary
    }
    std::atomic<bool> done{false};
    std::thread appender([&] {
        int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
        for (std::size_t i = 0; i < raw.size(); ++i) {
            auto half = raw[i].size() / 2;
            (void)!::write(fd, raw[i].data(), half);
            if (i % 100 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
            (void)!::write(fd, raw[i].data() + half, raw[i].size() - half);
        }
        ::close(fd);
        done = true;
    });
    struct joiner {
        std::thread& t;
        ~joiner() {
            if (t.joinable()) t.join();
        }
    } join_on_exit{appender};
    idem::log_reader reader{path, {.follow = true}};
    std::vector<std::string> seen;
    idem::log_record r;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (seen.size() < expected.size() && std::chrono::steady_clock::now() < deadline) {
        if (reader.next(r)) {
            seen.emplace_back(r.body);
        } else {
            std::this_thread::yield();
        }
    }
    appender.join();
    CHECK(done);
    CHECK_FALSE(reader.next(r));
    CHECK(seen == expected);
    CHECK_FALSE(reader.torn_tail());
}

}  // TEST_SUITE
