#include <idem/storage/page_check.hpp>

#include <idem/storage/lmdb.hpp>

#include "../common/temp_dir.hpp"

#include <doctest/doctest.h>

#include <lmdb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>

using idem::test::temp_dir;

namespace {

/// Builds an environment of several named tables: multi-level trees, overflow values (over a
/// page), an empty table, and free pages left by deleting a share of one table.
void build(const std::filesystem::path& path) {
    auto env = idem::environment::open(path, {.map_size = std::size_t{64} << 20, .sync = idem::durability::none});
    auto alpha = env->table("alpha");
    auto beta = env->table("beta");
    auto gamma = env->table("gamma");
    env->table("empty");
    {
        idem::write_txn w{*env};
        for (int i = 0; i < 6000; ++i) {
            char key[32];
            std::snprintf(key, sizeof key, "alpha-%06d", i);
            w.put(alpha, key, std::string(80, static_cast<char>('a' + i % 26)));
        }
        for (int i = 0; i < 300; ++i) {
            w.put(beta, "beta-" + std::to_string(1000 + i), std::string(static_cast<std::size_t>(6000 + i), static_cast<char>('0' + i % 10)));
        }
        for (std::uint32_t i = 0; i < 20000; ++i) {
            char key[4] = {static_cast<char>(i >> 24), static_cast<char>(i >> 16), static_cast<char>(i >> 8),
                           static_cast<char>(i)};
            w.put(gamma, std::string_view(key, 4), "value-" + std::to_string(i));
        }
        w.commit();
    }
    idem::write_txn w{*env};
    for (std::uint32_t i = 0; i < 20000; i += 3) {
        char key[4] = {static_cast<char>(i >> 24), static_cast<char>(i >> 16), static_cast<char>(i >> 8),
                       static_cast<char>(i)};
        w.del(gamma, std::string_view(key, 4));
    }
    w.commit();
}

std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::filesystem::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// LMDB's data file read independently of the walker, to pick pages to damage (mdb.c's layout).
struct image {
    std::string bytes;

    std::uint16_t u16(std::size_t at) const {
        std::uint16_t v;
        std::memcpy(&v, bytes.data() + at, 2);
        return v;
    }
    std::uint64_t u64(std::size_t at) const {
        std::uint64_t v;
        std::memcpy(&v, bytes.data() + at, 8);
        return v;
    }
    void put16(std::size_t at, std::uint16_t v) { std::memcpy(bytes.data() + at, &v, 2); }
    void put64(std::size_t at, std::uint64_t v) { std::memcpy(bytes.data() + at, &v, 8); }

    std::size_t page_size() const { return static_cast<std::size_t>(u64(16 + 24) & 0xffffffff); }
    std::size_t page(std::uint64_t p) const { return static_cast<std::size_t>(p) * page_size(); }
    /// Returns the meta page LMDB uses (the higher transaction id).
    unsigned newest_meta() const { return u64(16 + 128) < u64(page_size() + 16 + 128) ? 1 : 0; }
    /// Returns the byte offset of a meta page's MDB_meta.
    std::size_t meta(unsigned m) const { return page(m) + 16; }
    std::size_t node(std::uint64_t pg, std::size_t i) const { return page(pg) + u16(page(pg) + 16 + 2 * i); }
    std::size_t keys(std::uint64_t pg) const { return (u16(page(pg) + 12) - 16u) / 2; }
    std::uint64_t child(std::uint64_t pg, std::size_t i) const {
        const auto n = node(pg, i);
        return u16(n) | std::uint64_t{u16(n + 2)} << 16 | std::uint64_t{u16(n + 4)} << 32;
    }
    std::string_view key(std::uint64_t pg, std::size_t i) const { return {bytes.data() + node(pg, i) + 8, u16(node(pg, i) + 6)}; }
    bool is_branch(std::uint64_t pg) const { return (u16(page(pg) + 10) & 0x01) != 0; }

    /// Returns the byte offset of a named table's MDB_db record in the main table's root leaf.
    std::size_t table(std::string_view name) const {
        const std::uint64_t root = u64(meta(newest_meta()) + 24 + 48 + 40);
        REQUIRE_FALSE(is_branch(root));
        for (std::size_t i = 0; i < keys(root); ++i) {
            if (key(root, i) == name) return node(root, i) + 8 + name.size();
        }
        FAIL("no table " << name);
        return 0;
    }
    std::uint64_t root(std::string_view name) const { return u64(table(name) + 40); }
    std::uint64_t leftmost_leaf(std::string_view name) const {
        auto pg = root(name);
        while (is_branch(pg)) pg = child(pg, 0);
        return pg;
    }
};

/// Checks the bytes as an environment's data.mdb in a directory of their own.
idem::environment_report check_bytes(const temp_dir& dir, const std::string& bytes) {
    std::filesystem::create_directories(dir / "damaged");
    write_file(dir / "damaged" / "data.mdb", bytes);
    std::filesystem::remove(dir / "damaged" / "lock.mdb");
    return idem::check_environment(dir / "damaged");
}

bool names_page(const idem::environment_report& r, std::uint64_t page) {
    return std::any_of(r.problems.begin(), r.problems.end(), [&](const auto& p) { return p.page == page; });
}

std::string first_problems(const idem::environment_report& r) {
    std::string out;
    for (std::size_t i = 0; i < r.problems.size() && i < 5; ++i) {
        const auto& p = r.problems[i];
        out += "\n  page " + (p.page ? std::to_string(*p.page) : std::string("-")) + " " + p.table + ": " + p.what;
    }
    return out;
}

/// Reads every entry of every table through LMDB, then commits a write (which reads the free
/// list), in a child process: returns true if it finished without an error or a signal.
bool lmdb_reads_everything(const std::filesystem::path& dir) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::alarm(30);
        MDB_env* env = nullptr;
        int rc = mdb_env_create(&env);
        if (rc == 0) rc = mdb_env_set_maxdbs(env, 16);
        if (rc == 0) rc = mdb_env_set_mapsize(env, std::size_t{64} << 20);
        if (rc == 0) rc = mdb_env_open(env, dir.c_str(), MDB_NOSYNC, 0644);
        MDB_txn* txn = nullptr;
        if (rc == 0) rc = mdb_txn_begin(env, nullptr, 0, &txn);
        MDB_dbi main = 0;
        if (rc == 0) rc = mdb_dbi_open(txn, nullptr, 0, &main);
        MDB_cursor* tables = nullptr;
        if (rc == 0) rc = mdb_cursor_open(txn, main, &tables);
        MDB_val k{}, v{};
        unsigned long sum = 0;
        for (int op = MDB_FIRST; rc == 0; op = MDB_NEXT) {
            rc = mdb_cursor_get(tables, &k, &v, static_cast<MDB_cursor_op>(op));
            if (rc != 0) break;
            std::string name(static_cast<const char*>(k.mv_data), k.mv_size);
            MDB_dbi t = 0;
            rc = mdb_dbi_open(txn, name.c_str(), 0, &t);
            MDB_cursor* c = nullptr;
            if (rc == 0) rc = mdb_cursor_open(txn, t, &c);
            MDB_val ek{}, ev{};
            for (int eop = MDB_FIRST; rc == 0; eop = MDB_NEXT) {
                rc = mdb_cursor_get(c, &ek, &ev, static_cast<MDB_cursor_op>(eop));
                if (rc != 0) break;
                for (std::size_t i = 0; i < ev.mv_size; ++i) sum += static_cast<const unsigned char*>(ev.mv_data)[i];
            }
            if (rc == MDB_NOTFOUND) rc = 0;
            if (c) mdb_cursor_close(c);
        }
        if (rc == MDB_NOTFOUND) rc = 0;
        MDB_dbi extra = 0;
        if (rc == 0) rc = mdb_dbi_open(txn, "extra", MDB_CREATE, &extra);
        std::string big(20000, 'x');
        MDB_val ek{5, const_cast<char*>("extra")}, ev{big.size(), big.data()};
        if (rc == 0) rc = mdb_put(txn, extra, &ek, &ev, 0);
        if (rc == 0) rc = mdb_txn_commit(txn);
        ::_exit(rc == 0 && sum != 1 ? 0 : 1);
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

TEST_SUITE("page check") {

TEST_CASE("a sound environment checks as sound, with every table's counts") {
    temp_dir dir;
    build(dir.env());
    const auto r = idem::check_environment(dir.env());
    INFO(first_problems(r));
    CHECK(r.sound());
    CHECK(r.page_size == static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)));
    CHECK(r.free_pages > 0);
    CHECK(r.pages <= r.file_pages);
    auto table = [&](std::string_view name) {
        auto it = std::find_if(r.tables.begin(), r.tables.end(), [&](const auto& t) { return t.name == name; });
        REQUIRE(it != r.tables.end());
        return *it;
    };
    CHECK(table("alpha").entries == 6000);
    CHECK(table("alpha").depth >= 2);
    CHECK(table("beta").entries == 300);
    CHECK(table("beta").overflow_pages >= 600);
    CHECK(table("gamma").entries == 20000 - 6667);
    CHECK(table("empty").entries == 0);
    CHECK(table("(main)").entries == 4);
    SUBCASE("a data file is checked as well as its directory") {
        CHECK(idem::check_environment(dir.env() / "data.mdb").sound());
    }
    SUBCASE("a directory without a data file is a problem, not an exception") {
        const auto missing = idem::check_environment(dir / "nowhere");
        CHECK_FALSE(missing.sound());
        REQUIRE(missing.problems.size() == 1);
        CHECK(missing.problems[0].what.find("No such file") != std::string::npos);
    }
}

TEST_CASE("damage at chosen places is reported on the page it is on") {
    temp_dir dir;
    build(dir.env());
    const image good{read_file(dir.env() / "data.mdb")};
    const auto ps = good.page_size();
    const auto alpha_root = good.root("alpha");
    REQUIRE(good.is_branch(alpha_root));
    const auto leaf = good.leftmost_leaf("alpha");
    REQUIRE(good.keys(leaf) > 5);
    const unsigned m = good.newest_meta();
    image d = good;
    std::optional<std::uint64_t> page;  // none: the problem is the table's, not a page's

    SUBCASE("meta page 0's magic") { d.bytes[16] ^= 0x01; page = 0; }
    SUBCASE("meta page 1's version") { d.bytes[ps + 16 + 4] ^= 0x02; page = 1; }
    SUBCASE("the page size in meta page 0") { d.put16(16 + 24, static_cast<std::uint16_t>(ps / 2)); page = 0; }
    SUBCASE("the newest meta's last page, beyond its map") { d.put64(d.meta(m) + 120, std::uint64_t{1} << 40); page = m; }
    SUBCASE("the newest meta's main root, on another page") {
        d.put64(d.meta(m) + 24 + 48 + 40, alpha_root);
        page = alpha_root;
    }
    SUBCASE("a branch page's child page number, out of range") {
        d.put16(d.node(alpha_root, 1) + 2, 0x7fff);
        page = alpha_root;
    }
    SUBCASE("a branch page's child page number, a sibling's") {
        const auto sibling = good.child(alpha_root, 2);
        const auto n = d.node(alpha_root, 1);
        d.put16(n, static_cast<std::uint16_t>(sibling));
        d.put16(n + 2, static_cast<std::uint16_t>(sibling >> 16));
        d.put16(n + 4, static_cast<std::uint16_t>(sibling >> 32));
        page = alpha_root;
    }
    SUBCASE("a branch page's flags") { d.put16(d.page(alpha_root) + 10, 0x02); page = alpha_root; }
    SUBCASE("a leaf's node offset, inside the header") { d.put16(d.page(leaf) + 16 + 2 * 3, 0x0011); page = leaf; }
    SUBCASE("a leaf's node offset, at the page's end") {
        d.put16(d.page(leaf) + 16 + 2 * 3, static_cast<std::uint16_t>(ps - 2));
        page = leaf;
    }
    SUBCASE("a leaf's free-space bounds") { d.put16(d.page(leaf) + 12, 0xfff0); page = leaf; }
    SUBCASE("a leaf node's key size") { d.put16(d.node(leaf, 2) + 6, 0x1000); page = leaf; }
    SUBCASE("a leaf node's data size") { d.put16(d.node(leaf, 2) + 2, 0x0100); page = leaf; }
    SUBCASE("a key, out of order") { d.bytes[d.node(leaf, 3) + 8] = '\xff'; page = leaf; }
    SUBCASE("a leaf's page number in its header") { d.bytes[d.page(leaf)] ^= 0x40; page = leaf; }
    SUBCASE("an overflow page's header") {
        const auto beta_leaf = good.leftmost_leaf("beta");
        const auto n = good.node(beta_leaf, 0);
        REQUIRE((good.u16(n + 4) & 0x01) != 0);
        const auto first = good.u64(n + 8 + good.u16(n + 6));
        SUBCASE("its run length") { d.put16(d.page(first) + 12, 1); }
        SUBCASE("its flags") { d.put16(d.page(first) + 10, 0x02); }
        SUBCASE("its page number") { d.bytes[d.page(first) + 1] ^= 0x10; }
        page = first;
    }
    SUBCASE("a table's record: its entry count") {
        d.put64(d.table("gamma") + 32, 1);
    }
    const auto r = check_bytes(dir, d.bytes);
    INFO(first_problems(r));
    CHECK_FALSE(r.sound());
    if (page) CHECK(names_page(r, *page));
}

TEST_CASE("a truncated data file is reported") {
    temp_dir dir;
    build(dir.env());
    const auto good = read_file(dir.env() / "data.mdb");
    const auto ps = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    SUBCASE("to half") {
        const auto r = check_bytes(dir, good.substr(0, good.size() / 2));
        INFO(first_problems(r));
        CHECK_FALSE(r.sound());
        CHECK(first_problems(r).find("truncated") != std::string::npos);
    }
    SUBCASE("to the meta pages") { CHECK_FALSE(check_bytes(dir, good.substr(0, 2 * ps)).sound()); }
    SUBCASE("inside meta page 1") { CHECK_FALSE(check_bytes(dir, good.substr(0, ps + 100)).sound()); }
    SUBCASE("to nothing") { CHECK_FALSE(check_bytes(dir, std::string()).sound()); }
    SUBCASE("anywhere: reported, or LMDB reads everything") {
        std::mt19937_64 rng{11};
        for (int i = 0; i < 40; ++i) {
            const auto cut = static_cast<std::size_t>(rng() % (good.size() / ps)) * ps;
            const auto r = check_bytes(dir, good.substr(0, cut));
            if (r.sound()) {
                INFO("cut at " << cut);
                CHECK(lmdb_reads_everything(dir / "damaged"));
            }
        }
    }
}

TEST_CASE("a random flip anywhere is reported, or LMDB still reads every entry") {
    temp_dir dir;
    build(dir.env());
    const auto good = read_file(dir.env() / "data.mdb");
    std::mt19937_64 rng{2026};
    int reported = 0;
    int sound = 0;
    for (int i = 0; i < 300; ++i) {
        auto bytes = good;
        const int flips = i % 4 == 3 ? 8 : 1;  // every fourth, a run of bytes
        const auto at = static_cast<std::size_t>(rng() % (bytes.size() - 8));
        for (int j = 0; j < flips; ++j) {
            bytes[at + static_cast<std::size_t>(j)] ^= static_cast<char>(1 + rng() % 255);
        }
        const auto r = check_bytes(dir, bytes);
        if (!r.sound()) {
            ++reported;
            continue;
        }
        ++sound;
        INFO("flip at byte " << at << " (page " << at / 4096 << ")");
        CHECK(lmdb_reads_everything(dir / "damaged"));
    }
    MESSAGE(reported << " flips reported, " << sound << " left a sound structure");
    CHECK(reported > 0);
}

}  // TEST_SUITE
