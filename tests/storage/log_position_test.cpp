#include <idem/storage/log_position.hpp>

#include "../common/temp_dir.hpp"

#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <string>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

using idem::test::temp_dir;
namespace fs = std::filesystem;

namespace {

void spit(const fs::path& path, std::string_view bytes, std::ios::openmode mode = std::ios::trunc) {
    std::ofstream out{path, std::ios::binary | mode};
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The position a reader that consumed the first `offset` bytes of path would checkpoint.
idem::log_position consumed(const fs::path& path, std::uint64_t offset) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    auto p = idem::position_in(fd, path, offset);
    ::close(fd);
    return p;
}

// Lines of distinct text, long enough that the digest's 4 KiB window lies inside them.
std::string lines(int from, int to) {
    std::string out;
    for (int i = from; i < to; ++i) out += "{\"n\":" + std::to_string(i) + ",\"pad\":\"" + std::string(80, 'x') + "\"}\n";
    return out;
}

}  // namespace

TEST_SUITE("log_position") {

TEST_CASE("a log position survives its encoding, and an offset-only value still reads") {
    idem::log_position p{.offset = 123456, .file = idem::file_identity{7, 99}, .digest_length = 4096,
                         .digest = 0xdeadbeef, .finished = true};
    auto value = idem::encode_log_position(p);
    auto back = idem::decode_log_position(value);
    CHECK(back.offset == p.offset);
    REQUIRE(back.file);
    CHECK(*back.file == *p.file);
    CHECK(back.digest_length == 4096);
    CHECK(back.digest == 0xdeadbeef);
    CHECK(back.finished);

    std::string old(value.data(), 8);  // what a checkpoint held before identities were stored
    auto offset_only = idem::decode_log_position(old);
    CHECK(offset_only.offset == 123456);
    CHECK_FALSE(offset_only.file);

    CHECK_THROWS_AS(idem::decode_log_position(value.substr(0, 12)), std::system_error);
}

TEST_CASE("a checkpoint is checked against the file now at the log's path") {
    temp_dir dir;
    const auto log = dir / "live.jsonl";
    spit(log, lines(0, 100));
    const auto at = consumed(log, fs::file_size(log));

    SUBCASE("the same file, grown: ok, the lag is what was appended") {
        spit(log, lines(100, 120), std::ios::app);
        auto c = idem::check_log_position(log, at);
        CHECK(c.state == idem::log_state::ok);
        CHECK(c.lag_bytes == lines(100, 120).size());
    }
    SUBCASE("the same file cut shorter (copytruncate): truncated, naming the offset and the size") {
        fs::resize_file(log, 0);
        spit(log, lines(100, 110), std::ios::app);
        auto c = idem::check_log_position(log, at);
        CHECK(c.state == idem::log_state::truncated);
        CHECK(c.lag_bytes == lines(100, 110).size());
        CHECK(c.detail.find(log.string()) == 0);
        CHECK(c.detail.find("checkpoint at offset " + std::to_string(at.offset)) != std::string::npos);
        CHECK(c.detail.find("now " + std::to_string(lines(100, 110).size()) + " bytes") != std::string::npos);
    }
    SUBCASE("the same file rewritten in place, as long or longer: replaced") {
        auto text = lines(0, 100);
        text[text.size() - 10] = 'y';
        {
            std::fstream f{log, std::ios::in | std::ios::out | std::ios::binary};
            f.write(text.data(), static_cast<std::streamsize>(text.size()));
        }
        CHECK(idem::check_log_position(log, at).state == idem::log_state::replaced);
    }
    SUBCASE("rotated by rename, the old file beside the new one: rotated, both counted in the lag") {
        spit(log, lines(100, 105), std::ios::app);
        fs::rename(log, dir / "live.jsonl.1");
        spit(log, lines(200, 230));
        auto c = idem::check_log_position(log, at);
        CHECK(c.state == idem::log_state::rotated);
        REQUIRE(c.old_file);
        CHECK(*c.old_file == dir / "live.jsonl.1");
        CHECK(c.lag_bytes == lines(100, 105).size() + lines(200, 230).size());
    }
    SUBCASE("rotated twice: the file written after the old one is named, a compressed one is not") {
        fs::rename(log, dir / "live.jsonl.2");
        spit(dir / "live.jsonl.1", lines(100, 130));
        spit(dir / "live.jsonl.3.gz", "\x1f\x8b not a log");
        spit(log, lines(200, 230));
        const auto old_time = fs::last_write_time(dir / "live.jsonl.2");
        fs::last_write_time(dir / "live.jsonl.1", old_time + std::chrono::seconds{5});
        fs::last_write_time(dir / "live.jsonl.3.gz", old_time + std::chrono::seconds{5});
        auto c = idem::check_log_position(log, at);
        CHECK(c.state == idem::log_state::rotated);
        REQUIRE(c.later_rotations.size() == 1);
        CHECK(c.later_rotations[0] == dir / "live.jsonl.1");
        CHECK(c.detail.find("rotated more than once") != std::string::npos);
        CHECK(c.lag_bytes == lines(100, 130).size() + lines(200, 230).size());
    }
    SUBCASE("rotated, and the old file truncated since: truncated, naming the old file") {
        fs::rename(log, dir / "live.jsonl.1");
        fs::resize_file(dir / "live.jsonl.1", 10);
        spit(log, lines(200, 230));
        auto c = idem::check_log_position(log, at);
        CHECK(c.state == idem::log_state::truncated);
        CHECK(c.detail.find((dir / "live.jsonl.1").string()) == 0);
    }
    SUBCASE("rotated and the old file gone: replaced, unless it was finished") {
        fs::rename(log, dir / "gone");
        spit(log, lines(200, 230));
        fs::remove(dir / "gone");
        auto c = idem::check_log_position(log, at);
        CHECK(c.state == idem::log_state::replaced);
        CHECK(c.detail.find("rotated away, or replaced") != std::string::npos);
        auto finished = at;
        finished.finished = true;
        auto f = idem::check_log_position(log, finished);
        CHECK(f.state == idem::log_state::rotated);
        CHECK(f.lag_bytes == lines(200, 230).size());
    }
    SUBCASE("another file holding the same bytes (a copy put back): ok") {
        fs::copy_file(log, dir / "copy");
        fs::remove(log);
        fs::rename(dir / "copy", log);
        CHECK(idem::check_log_position(log, at).state == idem::log_state::ok);
    }
    SUBCASE("nothing at the path: missing") {
        fs::remove(log);
        CHECK(idem::check_log_position(log, at).state == idem::log_state::missing);
    }
    SUBCASE("an offset-only checkpoint is checked by size alone") {
        idem::log_position old{.offset = at.offset};
        CHECK(idem::check_log_position(log, old).state == idem::log_state::ok);
        fs::resize_file(log, at.offset - 1);
        CHECK(idem::check_log_position(log, old).state == idem::log_state::truncated);
    }
}

TEST_CASE("a reader's position knows its file, and notices the file changing under it") {
    temp_dir dir;
    const auto log = dir / "live.jsonl";
    spit(log, lines(0, 60));
    idem::log_reader reader{log, {.follow = true}};
    idem::log_record r;
    while (reader.next(r)) {
    }
    auto at = reader.where();
    CHECK(at.offset == fs::file_size(log));
    CHECK(at.file == idem::try_identity_of(log));
    CHECK(reader.still_holds(at));
    spit(log, lines(60, 61), std::ios::app);
    CHECK(reader.still_holds(at));
    fs::resize_file(log, 0);
    spit(log, lines(100, 200), std::ios::app);  // longer than before, other bytes
    CHECK_FALSE(reader.still_holds(at));
}

TEST_CASE("a reader checks a position in its open file as a resume checks a checkpoint") {
    temp_dir dir;
    const auto log = dir / "live.jsonl";
    spit(log, lines(10, 70));
    idem::log_reader reader{log, {.follow = true}};
    idem::log_record r;
    while (reader.next(r)) {
    }
    const auto at = reader.where();
    REQUIRE(reader.try_where().has_value());
    CHECK(reader.try_where()->digest == at.digest);
    CHECK(reader.check(at).state == idem::log_state::ok);
    const auto same_length = lines(30, 90);
    REQUIRE(same_length.size() == at.offset);
    SUBCASE("rewritten in place, the same length") {
        std::fstream out{log, std::ios::binary | std::ios::in | std::ios::out};
        out.write(same_length.data(), static_cast<std::streamsize>(same_length.size()));
        out.close();
        auto check = reader.check(at);
        CHECK(check.state == idem::log_state::replaced);
        CHECK(check.detail == log.string() + ": checkpoint at offset " + std::to_string(at.offset) + ", the file is " +
                                  std::to_string(at.offset) +
                                  " bytes but the bytes before the offset are not the ones consumed (rewritten in place)");
        CHECK(check_log_position(log, at).detail == check.detail);  // what a resume says
        CHECK(reader.try_where().has_value());
    }
    SUBCASE("cut short") {
        fs::resize_file(log, 100);
        CHECK(reader.check(at).state == idem::log_state::truncated);
        CHECK_FALSE(reader.try_where().has_value());
    }
    SUBCASE("renamed away: the open file is checked, wherever it is") {
        fs::rename(log, dir / "live.jsonl.1");
        spit(log, same_length);
        CHECK(reader.check(at).state == idem::log_state::ok);
    }
}

}  // TEST_SUITE
