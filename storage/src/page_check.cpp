#include <idem/storage/page_check.hpp>

#include "data_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>

namespace idem {

namespace {

static_assert(std::endian::native == std::endian::little, "the walker reads LMDB's little-endian layout");

// LMDB 0.9.x's data file on a 64-bit build (mdb.c): MDB_page is pgno u64, pad u16,
// flags u16, lower u16, upper u16 (an overflow page keeps its page count, u32, where
// lower and upper are), then the node offsets. MDB_node is lo u16, hi u16, flags u16,
// ksize u16, key, data; lo|hi is a leaf's data size, lo|hi<<16|flags<<32 a branch's child.
constexpr std::size_t page_header = 16;
constexpr std::size_t node_header = 8;
constexpr std::size_t db_record = 48;  // MDB_db: pad u32, flags u16, depth u16, 4 x u64 counts, root u64
constexpr std::size_t meta_offset = page_header;
constexpr std::size_t meta_bytes = 136;  // MDB_meta: magic, version, address, mapsize, 2 x MDB_db, last page, txnid

constexpr std::uint16_t p_branch = 0x01;
constexpr std::uint16_t p_leaf = 0x02;
constexpr std::uint16_t p_overflow = 0x04;
constexpr std::uint16_t p_meta = 0x08;
constexpr std::uint16_t p_ignored = 0x10 | 0x8000;  // P_DIRTY and P_KEEP: in-memory marks, cleared before writing
constexpr std::uint16_t f_bigdata = 0x01;
constexpr std::uint16_t f_subdata = 0x02;
constexpr std::uint16_t f_dupdata = 0x04;
constexpr std::uint32_t lmdb_magic = 0xBEEFC0DE;
constexpr std::uint32_t lmdb_version = 1;
constexpr std::uint64_t no_root = ~std::uint64_t{0};
constexpr std::size_t max_key = 511;
constexpr unsigned max_depth = 32;  // LMDB's cursor stack

template <class T>
T load(const std::uint8_t* p) noexcept {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

std::string hex(std::uint64_t v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string num(std::uint64_t v) { return std::to_string(v); }

struct db_view {
    std::uint16_t flags = 0;
    std::uint16_t depth = 0;
    std::uint64_t branch = 0, leaf = 0, overflow = 0, entries = 0, root = no_root;
};

db_view parse_db(const std::uint8_t* p) noexcept {
    db_view d;
    d.flags = load<std::uint16_t>(p + 4);
    d.depth = load<std::uint16_t>(p + 6);
    d.branch = load<std::uint64_t>(p + 8);
    d.leaf = load<std::uint64_t>(p + 16);
    d.overflow = load<std::uint64_t>(p + 24);
    d.entries = load<std::uint64_t>(p + 32);
    d.root = load<std::uint64_t>(p + 40);
    return d;
}

struct meta_view {
    std::string bad;  // empty: valid
    std::uint64_t page_size = 0, map_size = 0, last_page = 0, txnid = 0;
    db_view free_db, main_db;
};

class file {
public:
    explicit file(const std::filesystem::path& p) : fd_(::open(p.c_str(), O_RDONLY | O_CLOEXEC)) {
        if (fd_ < 0) {
            error_ = errno;
            return;
        }
        struct stat st{};
        if (::fstat(fd_, &st) != 0) {
            error_ = errno;
        } else {
            size_ = static_cast<std::uint64_t>(st.st_size);
        }
    }
    ~file() {
        if (fd_ >= 0) ::close(fd_);
    }
    file(const file&) = delete;
    file& operator=(const file&) = delete;

    int error() const noexcept { return error_; }
    std::uint64_t size() const noexcept { return size_; }
    /// Reads exactly n bytes at offset; false if the file ends first or the read fails.
    bool read(std::uint64_t offset, std::uint8_t* out, std::size_t n) const {
        if (offset > size_ || n > size_ - offset) return false;
        std::size_t got = 0;
        while (got < n) {
            const auto r = ::pread(fd_, out + got, n - got, static_cast<off_t>(offset + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return false;
            got += static_cast<std::size_t>(r);
        }
        return true;
    }

private:
    int fd_ = -1;
    int error_ = 0;
    std::uint64_t size_ = 0;
};

meta_view read_meta(const file& f, unsigned index, std::uint64_t offset) {
    meta_view m;
    std::uint8_t buf[page_header + meta_bytes];
    if (!f.read(offset, buf, sizeof buf)) {
        m.bad = "cannot be read (the file ends at byte " + num(f.size()) + ")";
        return m;
    }
    const std::uint8_t* mp = buf + meta_offset;
    const auto flags = load<std::uint16_t>(buf + 10);
    m.page_size = load<std::uint32_t>(mp + 24);  // the free table's pad holds the page size
    m.map_size = load<std::uint64_t>(mp + 16);
    m.free_db = parse_db(mp + 24);
    m.main_db = parse_db(mp + 24 + db_record);
    m.last_page = load<std::uint64_t>(mp + 24 + 2 * db_record);
    m.txnid = load<std::uint64_t>(mp + 24 + 2 * db_record + 8);
    if ((flags & ~p_ignored) != p_meta) {
        m.bad = "flags " + hex(flags) + " are not a meta page's";
    } else if (load<std::uint64_t>(buf) != index) {
        m.bad = "header says page " + num(load<std::uint64_t>(buf));
    } else if (load<std::uint32_t>(mp) != lmdb_magic) {
        m.bad = "magic " + hex(load<std::uint32_t>(mp)) + " is not LMDB's 0xbeefc0de";
    } else if (load<std::uint32_t>(mp + 4) != lmdb_version) {
        m.bad = "data format version " + num(load<std::uint32_t>(mp + 4)) + " (LMDB 0.9 writes 1)";
    } else if (load<std::uint64_t>(mp + 8) != 0) {
        m.bad = "fixed map address " + hex(load<std::uint64_t>(mp + 8)) + " (idem never maps at a fixed address)";
    } else if (m.page_size < 512 || m.page_size > 32768 || !std::has_single_bit(m.page_size)) {
        m.bad = "page size " + num(m.page_size) + " is not a power of two from 512 to 32768";
    } else if (index == 1 && m.page_size != offset) {
        m.bad = "page size " + num(m.page_size) + " differs from meta page 0's " + num(offset);
    } else if (m.last_page < 1 || m.last_page >= m.map_size / m.page_size) {
        m.bad = "last page " + num(m.last_page) + " does not fit its map of " + num(m.map_size) + " bytes";
    } else if (m.main_db.flags != 0) {
        m.bad = "main table flags " + hex(m.main_db.flags) + " (idem opens it without flags)";
    } else if (m.free_db.depth > max_depth || m.main_db.depth > max_depth) {
        m.bad = "tree depth over " + num(max_depth);
    }
    return m;
}

class walker {
public:
    walker(environment_report& r, const file& f, std::size_t max_problems) : r_(r), f_(f), max_(max_problems) {}

    void problem(std::optional<std::uint64_t> page, std::string table, std::string what) {
        ++r_.problem_count;
        if (r_.problems.size() < max_) r_.problems.push_back({page, std::move(table), std::move(what)});
    }

    /// Walks every tree of the snapshot m describes and accounts for every page.
    void walk(const meta_view& m) {
        psize_ = m.page_size;
        last_ = m.last_page;
        r_.page_size = psize_;
        r_.pages = last_ + 1;
        r_.file_pages = f_.size() / psize_;
        r_.transaction = m.txnid;
        // A file shorter than its meta says is normal only where the end is free pages that
        // were never written; a page far past the end is no such thing.
        if (last_ + 1 > r_.file_pages + (std::uint64_t{1} << 20)) {
            problem(std::nullopt, "", "the meta page says the file uses " + num(last_ + 1) + " pages, it holds " +
                                          num(r_.file_pages) + ": truncated");
            return;
        }
        owner_.assign(static_cast<std::size_t>(last_ + 1), unseen);
        owner_[0] = owner_[1] = meta_owner;
        names_.clear();
        tree(kind::free_pages, "(free)", m.free_db, std::nullopt);
        tree(kind::main, "(main)", m.main_db, std::nullopt);
        for (std::size_t i = 0; i < named_.size(); ++i) {
            auto [name, db, page] = named_[i];
            tree(kind::named, name, db, page);
        }
        account_free();
        account_leaks();
    }

private:
    enum class kind { free_pages, main, named };
    static constexpr std::uint32_t unseen = 0;
    static constexpr std::uint32_t meta_owner = 1;
    static constexpr std::uint32_t free_owner = 2;
    static constexpr std::uint32_t first_table = 3;

    struct tree_state {
        kind k;
        std::string name;
        std::uint32_t owner;
        db_view db;
        table_check found;
    };

    std::string owner_name(std::uint32_t o) const {
        if (o == meta_owner) return "the meta pages";
        if (o == free_owner) return "the free list";
        return "table " + names_[o - first_table];
    }

    /// Claims page for a tree; false (reported) if another tree, the free list or a meta page has it.
    bool claim(tree_state& t, std::uint64_t page, std::optional<std::uint64_t> from, std::string_view role) {
        if (page < 2 || page > last_) {
            problem(from, t.name,
                    std::string(role) + " page " + num(page) + " is outside the file's pages 2.." + num(last_));
            return false;
        }
        auto& o = owner_[static_cast<std::size_t>(page)];
        if (o != unseen) {
            problem(from, t.name,
                    std::string(role) + " page " + num(page) + " is already used by " + owner_name(o) + " (a page is reached once)");
            return false;
        }
        o = t.owner;
        return true;
    }

    bool read_page(tree_state& t, std::uint64_t page, std::vector<std::uint8_t>& buf) {
        buf.resize(static_cast<std::size_t>(psize_));
        if (!f_.read(page * psize_, buf.data(), buf.size())) {
            problem(page, t.name,
                    "page lies past the end of the file (" + num(r_.file_pages) + " whole pages): the file was truncated");
            return false;
        }
        return true;
    }

    void tree(kind k, const std::string& name, const db_view& db, std::optional<std::uint64_t> from) {
        names_.push_back(name);
        tree_state t{k, name, static_cast<std::uint32_t>(first_table + names_.size() - 1), db, {}};
        t.found.name = name;
        t.found.root = db.root;
        t.found.depth = db.depth;
        if (db.root == no_root) {
            if (db.depth != 0 || db.entries != 0 || db.branch != 0 || db.leaf != 0 || db.overflow != 0) {
                problem(from, name, "an empty table's record has depth " + num(db.depth) + " and " + num(db.entries) +
                                        " entries");
            }
        } else if (db.depth == 0 || db.depth > max_depth) {
            problem(from, name, "the table's record gives depth " + num(db.depth));
        } else if (claim(t, db.root, from, "root")) {
            visit(t, db.root, 1, nullptr, nullptr);
            compare_counts(t);
        }
        r_.tables.push_back(t.found);
    }

    void compare_counts(tree_state& t) {
        auto check = [&](std::string_view what, std::uint64_t recorded, std::uint64_t found) {
            if (recorded != found) {
                problem(std::nullopt, t.name, "its record says " + num(recorded) + " " + std::string(what) +
                                                  ", the walk found " + num(found));
            }
        };
        check("branch pages", t.db.branch, t.found.branch_pages);
        check("leaf pages", t.db.leaf, t.found.leaf_pages);
        check("overflow pages", t.db.overflow, t.found.overflow_pages);
        check("entries", t.db.entries, t.found.entries);
    }

    /// Compares keys the way the table's comparator does: integers for the free list, else
    /// LMDB's default (memcmp over the shorter length, then the shorter first).
    static int compare(kind k, std::string_view a, std::string_view b) {
        if (k == kind::free_pages && a.size() == 8 && b.size() == 8) {
            const auto x = load<std::uint64_t>(reinterpret_cast<const std::uint8_t*>(a.data()));
            const auto y = load<std::uint64_t>(reinterpret_cast<const std::uint8_t*>(b.data()));
            return x < y ? -1 : x > y ? 1 : 0;
        }
        const int c = a.compare(b);
        return c < 0 ? -1 : c > 0 ? 1 : 0;
    }

    void visit(tree_state& t, std::uint64_t page, unsigned level, const std::string* lo, const std::string* hi) {
        std::vector<std::uint8_t> buf;
        if (!read_page(t, page, buf)) return;
        const std::uint8_t* p = buf.data();
        const auto at = std::optional<std::uint64_t>{page};
        if (load<std::uint64_t>(p) != page) {
            problem(at, t.name, "the page's header says page " + num(load<std::uint64_t>(p)));
            return;
        }
        const auto flags = static_cast<std::uint16_t>(load<std::uint16_t>(p + 10) & ~p_ignored);
        const bool branch = flags == p_branch;
        if (!branch && flags != p_leaf) {
            problem(at, t.name, "flags " + hex(flags) + " are neither a branch's nor a leaf's" +
                                    ((flags & 0x60) != 0 ? " (sub-pages or fixed-size duplicates: idem uses no dupsort)" : ""));
            return;
        }
        if (branch ? level >= t.db.depth : level != t.db.depth) {
            problem(at, t.name, std::string(branch ? "branch" : "leaf") + " page at level " + num(level) +
                                    " of a tree of depth " + num(t.db.depth));
            return;
        }
        const auto lower = load<std::uint16_t>(p + 12);
        const auto upper = load<std::uint16_t>(p + 14);
        if (lower < page_header || (lower - page_header) % 2 != 0 || lower > upper || upper > psize_) {
            problem(at, t.name, "free-space bounds " + num(lower) + ".." + num(upper) + " do not fit a page of " +
                                    num(psize_) + " bytes");
            return;
        }
        const std::size_t keys = (lower - page_header) / 2;
        if (keys == 0) {
            problem(at, t.name, std::string(branch ? "branch" : "leaf") + " page holds no node");
            return;
        }
        (branch ? t.found.branch_pages : t.found.leaf_pages) += 1;

        std::string prev;
        bool have_prev = false;
        std::vector<std::pair<std::uint64_t, std::string>> children;
        for (std::size_t i = 0; i < keys; ++i) {
            const std::size_t off = load<std::uint16_t>(p + page_header + 2 * i);
            if (off < upper || off % 2 != 0 || off + node_header > psize_) {
                problem(at, t.name, "node " + num(i) + " starts at offset " + num(off) + ", outside the node area " +
                                        num(upper) + ".." + num(psize_));
                return;
            }
            const std::uint8_t* n = p + off;
            const std::size_t ksize = load<std::uint16_t>(n + 6);
            const std::uint16_t nflags = load<std::uint16_t>(n + 4);
            if (off + node_header + ksize > psize_) {
                problem(at, t.name, "node " + num(i) + "'s key of " + num(ksize) + " bytes runs past the page");
                return;
            }
            if (ksize > max_key) {
                problem(at, t.name, "node " + num(i) + "'s key has " + num(ksize) + " bytes, over LMDB's " + num(max_key));
                return;
            }
            const std::string_view key(reinterpret_cast<const char*>(n + node_header), ksize);
            // A branch page's first key is never compared (LMDB ignores it).
            if (!branch || i != 0) {
                if (t.k == kind::free_pages && ksize != 8) {
                    problem(at, t.name, "node " + num(i) + "'s key has " + num(ksize) + " bytes (a transaction id has 8)");
                    return;
                }
                if (have_prev && compare(t.k, prev, key) >= 0) {
                    problem(at, t.name, "node " + num(i) + "'s key is not above the key before it (keys must ascend)");
                    return;
                }
                if ((lo && compare(t.k, key, *lo) < 0) || (hi && compare(t.k, key, *hi) >= 0)) {
                    problem(at, t.name, "node " + num(i) + "'s key lies outside the range its parent gives this page");
                    return;
                }
                prev.assign(key);
                have_prev = true;
            }
            if (branch) {
                const std::uint64_t child = load<std::uint16_t>(n) | std::uint64_t{load<std::uint16_t>(n + 2)} << 16 |
                                            std::uint64_t{nflags} << 32;
                children.emplace_back(child, i == 0 ? std::string() : std::string(key));
                continue;
            }
            ++t.found.entries;
            if (!leaf_node(t, page, i, n, off, ksize, nflags, key)) return;
        }
        for (std::size_t i = 0; i < children.size(); ++i) {
            const std::string* child_lo = i == 0 ? lo : &children[i].second;
            const std::string* child_hi = i + 1 < children.size() ? &children[i + 1].second : hi;
            if (claim(t, children[i].first, at, "node " + num(i) + "'s child")) {
                visit(t, children[i].first, level + 1, child_lo, child_hi);
            }
        }
    }

    bool leaf_node(tree_state& t, std::uint64_t page, std::size_t i, const std::uint8_t* n, std::size_t off,
                   std::size_t ksize, std::uint16_t nflags, std::string_view key) {
        const auto at = std::optional<std::uint64_t>{page};
        const std::uint64_t dsize = load<std::uint16_t>(n) | std::uint64_t{load<std::uint16_t>(n + 2)} << 16;
        const std::string where = "node " + num(i);
        if ((nflags & ~(f_bigdata | f_subdata | f_dupdata)) != 0) {
            problem(at, t.name, where + " has unknown flags " + hex(nflags));
            return false;
        }
        if ((nflags & f_dupdata) != 0) {
            problem(at, t.name, where + " holds duplicate data (a dupsort table): idem never writes one");
            return false;
        }
        const bool big = (nflags & f_bigdata) != 0;
        const bool sub = (nflags & f_subdata) != 0;
        const std::size_t stored = big ? 8 : static_cast<std::size_t>(dsize);
        if (off + node_header + ksize + stored > psize_) {
            problem(at, t.name, where + "'s data of " + num(dsize) + " bytes runs past the page");
            return false;
        }
        const std::uint8_t* data = n + node_header + ksize;
        if (t.k == kind::main) {
            if (!sub || big || dsize != db_record) {
                problem(at, t.name, where + " is not a table record (idem keeps only named tables in the main table)");
                return false;
            }
            const auto db = parse_db(data);
            if (db.flags != 0) {
                problem(at, t.name, "table '" + std::string(key) + "' has flags " + hex(db.flags) +
                                        " (idem opens every table without flags)");
                return false;
            }
            named_.emplace_back(std::string(key), db, page);
            return true;
        }
        if (sub) {
            problem(at, t.name, where + " claims to hold a table record outside the main table");
            return false;
        }
        std::vector<std::uint8_t> value;
        if (big) {
            const auto first = load<std::uint64_t>(data);
            if (!overflow(t, page, where, first, dsize)) return false;
            if (t.k == kind::free_pages) {
                value.resize(static_cast<std::size_t>(dsize));
                if (!f_.read(first * psize_ + page_header, value.data(), value.size())) {
                    problem(first, t.name, "overflow run cannot be read");
                    return false;
                }
            }
        } else if (t.k == kind::free_pages) {
            value.assign(data, data + dsize);
        }
        if (t.k == kind::free_pages) free_record(t, page, key, value);
        return true;
    }

    bool overflow(tree_state& t, std::uint64_t page, const std::string& where, std::uint64_t first,
                  std::uint64_t dsize) {
        if (!claim(t, first, page, where + "'s overflow")) return false;
        std::uint8_t h[page_header];
        if (!f_.read(first * psize_, h, sizeof h)) {
            problem(first, t.name, "overflow page lies past the end of the file (" + num(r_.file_pages) +
                                       " whole pages): the file was truncated");
            return false;
        }
        const auto flags = static_cast<std::uint16_t>(load<std::uint16_t>(h + 10) & ~p_ignored);
        const std::uint64_t pages = load<std::uint32_t>(h + 12);
        const std::uint64_t need = (page_header - 1 + dsize) / psize_ + 1;
        if (load<std::uint64_t>(h) != first) {
            problem(first, t.name, "the overflow page's header says page " + num(load<std::uint64_t>(h)));
        } else if (flags != p_overflow) {
            problem(first, t.name, "flags " + hex(flags) + " are not an overflow page's (reached from page " + num(page) + ")");
        } else if (pages < need || pages > last_ + 1 - first) {
            problem(first, t.name, "overflow run of " + num(pages) + " pages for " + num(dsize) + " bytes (needs " +
                                       num(need) + ", the file has pages up to " + num(last_) + ")");
        } else if ((first + pages) * psize_ > f_.size()) {
            problem(first, t.name, "overflow run of " + num(pages) + " pages runs past the end of the file (" +
                                       num(r_.file_pages) + " whole pages): the file was truncated");
        } else {
            t.found.overflow_pages += pages;
            for (std::uint64_t q = first + 1; q < first + pages; ++q) {
                if (!claim(t, q, first, "overflow run's")) return false;
            }
            return true;
        }
        return false;
    }

    void free_record(tree_state& t, std::uint64_t page, std::string_view key, const std::vector<std::uint8_t>& v) {
        const auto txn = load<std::uint64_t>(reinterpret_cast<const std::uint8_t*>(key.data()));
        if (v.size() < 8 || v.size() % 8 != 0) {
            problem(page, t.name, "free list of transaction " + num(txn) + " has " + num(v.size()) + " bytes");
            return;
        }
        const auto count = load<std::uint64_t>(v.data());
        if (count > v.size() / 8 - 1) {
            problem(page, t.name, "free list of transaction " + num(txn) + " says " + num(count) + " pages in " +
                                      num(v.size()) + " bytes");
            return;
        }
        for (std::uint64_t i = 0; i < count; ++i) {
            free_.push_back({load<std::uint64_t>(v.data() + 8 * (i + 1)), txn, page});
        }
    }

    void account_free() {
        for (const auto& [pg, txn, listed_on] : free_) {
            if (pg < 2 || pg > last_) {
                problem(listed_on, "(free)", "free list of transaction " + num(txn) + " lists page " + num(pg) +
                                                 ", outside the file's pages 2.." + num(last_));
                continue;
            }
            auto& o = owner_[static_cast<std::size_t>(pg)];
            if (o != unseen) {
                problem(pg, "(free)", "page is listed free (by transaction " + num(txn) + ") but used by " + owner_name(o));
                continue;
            }
            o = free_owner;
            ++r_.free_pages;
        }
    }

    void account_leaks() {
        for (std::uint64_t pg = 2; pg <= last_;) {
            if (owner_[static_cast<std::size_t>(pg)] != unseen) {
                ++pg;
                continue;
            }
            auto end = pg;
            while (end + 1 <= last_ && owner_[static_cast<std::size_t>(end + 1)] == unseen) ++end;
            problem(pg, "", (end == pg ? "page is" : "pages " + num(pg) + ".." + num(end) + " are") +
                                std::string(" neither used by a table nor listed free (leaked)"));
            pg = end + 1;
        }
    }

    struct free_entry {
        std::uint64_t page, txn, listed_on;
    };

    environment_report& r_;
    const file& f_;
    std::size_t max_;
    std::uint64_t psize_ = 0;
    std::uint64_t last_ = 0;
    std::vector<std::uint32_t> owner_;  // per page: unseen, meta, free, or the tree that reached it
    std::vector<std::string> names_;
    std::vector<std::tuple<std::string, db_view, std::uint64_t>> named_;  // name, record, main-table page
    std::vector<free_entry> free_;
};

/// Reads both meta pages; the second lies one page size in, found by meta 0 or, if that is
/// damaged, at the first size where a valid meta page is.
std::pair<meta_view, meta_view> read_metas(const file& f) {
    auto m0 = read_meta(f, 0, 0);
    if (m0.bad.empty()) {
        auto m1 = read_meta(f, 1, m0.page_size);
        if (m1.bad.empty()) return {m0, m1};
        // Meta page 1 where another page size puts it: meta page 0's size is the damaged one.
        for (std::uint64_t size : {4096u, 8192u, 16384u, 32768u, 512u, 1024u, 2048u}) {
            if (size == m0.page_size) continue;
            auto other = read_meta(f, 1, size);
            if (other.bad.empty()) {
                m0.bad = "page size " + num(m0.page_size) + ", but meta page 1 is found " + num(size) + " bytes in";
                return {m0, other};
            }
        }
        return {m0, m1};
    }
    meta_view m1;
    m1.bad = "cannot be found (meta page 0 is damaged and no page size finds it)";
    for (std::uint64_t size : {4096u, 8192u, 16384u, 32768u, 512u, 1024u, 2048u}) {
        auto m = read_meta(f, 1, size);
        if (m.bad.empty()) return {m0, m};
    }
    return {m0, m1};
}

/// Checks once; changed is set if a commit replaced the meta page walked meanwhile.
environment_report check_once(const std::filesystem::path& data, std::size_t max_problems, bool& changed) {
    environment_report r;
    r.file = data;
    file f{data};
    walker w{r, f, max_problems};
    if (f.error() != 0) {
        w.problem(std::nullopt, "", "cannot be read: " + std::generic_category().message(f.error()));
        return r;
    }
    const auto [m0, m1] = read_metas(f);
    if (!m0.bad.empty()) w.problem(0, "(meta)", "meta page 0: " + m0.bad);
    if (!m1.bad.empty()) w.problem(1, "(meta)", "meta page 1: " + m1.bad);
    const meta_view* use = nullptr;
    if (m0.bad.empty() && m1.bad.empty()) {
        use = m0.txnid < m1.txnid ? &m1 : &m0;  // LMDB's mdb_env_pick_meta
        const auto& older = use == &m0 ? m1 : m0;
        if (!detail::meta_pages_agree(use->txnid, use->last_page, older.txnid, older.last_page)) {
            w.problem(use == &m0 ? 0 : 1, "(meta)",
                      "the meta pages disagree: transaction " + num(use->txnid) + " with last page " +
                          num(use->last_page) + " against transaction " + num(older.txnid) + " with last page " +
                          num(older.last_page) + " (the two newest commits are consecutive and the newer never "
                          "uses fewer pages): one of them is damaged");
        }
    } else if (m0.bad.empty()) {
        use = &m0;
    } else if (m1.bad.empty()) {
        use = &m1;
    }
    if (!use) return r;
    w.walk(*use);
    const auto [a0, a1] = read_metas(f);
    const auto newest = std::max(a0.bad.empty() ? a0.txnid : 0, a1.bad.empty() ? a1.txnid : 0);
    changed = newest != use->txnid;
    return r;
}

}  // namespace

environment_report check_environment(const std::filesystem::path& path, std::size_t max_problems) {
    std::error_code ec;
    const auto data = std::filesystem::is_directory(path, ec) ? path / "data.mdb" : path;
    environment_report r;
    for (int attempt = 0; attempt < 3; ++attempt) {
        bool changed = false;
        r = check_once(data, max_problems, changed);
        if (!changed) return r;
    }
    // What the last walk found may be pages a commit reused under it: say so first.
    ++r.problem_count;
    r.problems.insert(r.problems.begin(), page_problem{std::nullopt, "",
                                                       "the file changed during three checks in a row: a writer is "
                                                       "committing; stop it and check again"});
    return r;
}

std::string to_string(const page_problem& p) {
    std::string out;
    if (p.page) out += "page " + std::to_string(*p.page);
    if (!p.table.empty()) out += (out.empty() ? "table " : " (table ") + p.table + (out.empty() ? "" : ")");
    return (out.empty() ? "" : out + ": ") + p.what;
}

std::string environment_report::first_problems(std::size_t n) const {
    std::string out;
    for (std::size_t i = 0; i < problems.size() && i < n; ++i) out += (i == 0 ? "" : "; ") + to_string(problems[i]);
    return out;
}

}  // namespace idem
