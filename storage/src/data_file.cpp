#include "data_file.hpp"

#include <idem/storage/crash_point.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/page_check.hpp>

#include <lmdb.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <vector>

namespace idem::detail {
namespace {

// The on-disk layout of an LMDB meta page (liblmdb 0.9, 64-bit): a 16-byte page header
// (page number u64, pad u16, flags u16, lower u16, upper u16), then MDB_meta: magic u32,
// version u32, fixed address u64, map size u64, two MDB_db records of 48 bytes (free pages,
// main), the last page used u64, the transaction id u64. The first MDB_db's pad is the page size.
constexpr std::size_t page_header = 16;
constexpr std::uint16_t p_meta = 0x08;
constexpr std::uint32_t meta_magic = 0xBEEFC0DE;
constexpr std::uint32_t data_version = 1;
constexpr std::size_t db_record = 48;
constexpr std::size_t meta_dbs = page_header + 24;
constexpr std::size_t meta_last_page = meta_dbs + 2 * db_record;
constexpr std::size_t meta_txn = meta_last_page + 8;
constexpr std::uint64_t no_page = ~std::uint64_t{0};

template <class T>
T load(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

class fd_guard {
public:
    explicit fd_guard(int fd) : fd_(fd) {}
    ~fd_guard() {
        if (fd_ >= 0) ::close(fd_);
    }
    fd_guard(const fd_guard&) = delete;
    fd_guard& operator=(const fd_guard&) = delete;
    int get() const noexcept { return fd_; }

private:
    int fd_;
};

[[noreturn]] void damaged(const std::filesystem::path& file, const std::string& what) {
    throw_error(errc::store_damaged,
                file.string() + ": " + what +
                    "; the store cannot be used. Restore it from a backup, or rebuild it from its logs "
                    "(idem rebuild); `idem verify --store` describes the damage");
}

struct meta_page {
    bool valid = false;
    std::string problem;
    std::uint32_t page_size = 0;
    std::uint64_t roots[2] = {no_page, no_page};
    std::uint64_t last_page = 0;
    std::uint64_t txn = 0;
};

meta_page read_meta(const unsigned char* page, std::uint64_t number) {
    meta_page m;
    const auto pgno = load<std::uint64_t>(page);
    const auto flags = load<std::uint16_t>(page + 10);
    if (pgno != number || (flags & p_meta) == 0) {
        m.problem = "page " + std::to_string(number) + " is not a meta page";
        return m;
    }
    if (load<std::uint32_t>(page + page_header) != meta_magic) {
        m.problem = "meta page " + std::to_string(number) + " has no LMDB magic";
        return m;
    }
    if (load<std::uint32_t>(page + page_header + 4) != data_version) {
        m.problem = "meta page " + std::to_string(number) + " has an unknown LMDB data version";
        return m;
    }
    m.page_size = load<std::uint32_t>(page + meta_dbs);
    for (std::size_t i = 0; i < 2; ++i) m.roots[i] = load<std::uint64_t>(page + meta_dbs + i * db_record + 40);
    m.last_page = load<std::uint64_t>(page + meta_last_page);
    m.txn = load<std::uint64_t>(page + meta_txn);
    const bool power_of_two = m.page_size != 0 && (m.page_size & (m.page_size - 1)) == 0;
    if (!power_of_two || m.page_size < 512 || m.page_size > 65536) {
        m.problem = "meta page " + std::to_string(number) + " names an impossible page size";
        return m;
    }
    m.valid = true;
    return m;
}

std::uint64_t page_size_of_system() { return static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)); }

void fsync_path(const std::filesystem::path& p, int flags) {
    fd_guard fd{::open(p.c_str(), flags | O_CLOEXEC)};
    if (fd.get() < 0 || ::fsync(fd.get()) != 0) {
        throw std::system_error(errno, std::system_category(), "cannot sync " + p.string());
    }
}

}  // namespace

data_file_meta check_data_file(const std::filesystem::path& dir) {
    const auto file = dir / "data.mdb";
    fd_guard fd{::open(file.c_str(), O_RDONLY | O_CLOEXEC)};
    if (fd.get() < 0) throw std::system_error(errno, std::system_category(), "cannot open " + file.string());
    // The meta pages first, then the size: a live store only grows, so a writer committing
    // meanwhile cannot make a sound file look short.
    std::vector<unsigned char> buf(2 * 65536);
    const auto got = ::pread(fd.get(), buf.data(), buf.size(), 0);
    if (got < 0) throw std::system_error(errno, std::system_category(), "cannot read " + file.string());
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (ec) throw std::system_error(ec, "cannot read the size of " + file.string());
    if (size == 0) {
        damaged(file, "the file is empty (a store's data lost, or a store never created completely by an older "
                      "idem); if no data is expected here, delete it to start a new store");
    }
    // The first meta page tells the page size; buf holds as much as the largest pages need.
    const auto n = static_cast<std::uint64_t>(got);
    if (n < page_header + meta_txn + 8) {
        damaged(file, "the file is " + std::to_string(size) + " bytes, shorter than an LMDB meta page");
    }
    const auto first = read_meta(buf.data(), 0);
    const std::uint64_t page = first.valid ? first.page_size : page_size_of_system();
    if (n < 2 * page) {
        damaged(file, "the file is " + std::to_string(size) + " bytes, shorter than its two meta pages (" +
                          std::to_string(2 * page) + " bytes): it was cut short");
    }
    const auto second = read_meta(buf.data() + page, 1);
    if (!first.valid && !second.valid) {
        damaged(file, first.problem + " and " + second.problem + ": not an LMDB file, or both meta pages are damaged");
    }
    // LMDB opens with the newer valid meta page; a damaged one must not be silently outvoted.
    if (!first.valid || !second.valid) damaged(file, first.valid ? second.problem : first.problem);
    const auto& m = first.txn >= second.txn ? first : second;
    const auto& older = &m == &first ? second : first;
    if (!meta_pages_agree(m.txn, m.last_page, older.txn, older.last_page)) {
        damaged(file, "its meta pages disagree (transaction " + std::to_string(m.txn) + " with last page " +
                          std::to_string(m.last_page) + ", transaction " + std::to_string(older.txn) +
                          " with last page " + std::to_string(older.last_page) +
                          "): the two newest commits are consecutive and the newer never uses fewer pages, so one "
                          "meta page is damaged");
    }
    const std::uint64_t pages = size / m.page_size;
    for (auto root : m.roots) {
        if (root != no_page && (root > m.last_page || root >= pages)) {
            damaged(file, "the newest commit (transaction " + std::to_string(m.txn) + ") has a tree root at page " +
                              std::to_string(root) + ", but the file is " + std::to_string(size) + " bytes (" +
                              std::to_string(pages) + " pages): it was cut short or overwritten");
        }
    }
    if (m.last_page >= pages) {  // the file is shorter than (last page + 1) pages, without overflowing
        // LMDB may leave the tail pages unwritten when they are free; anything else reachable
        // past the end would be a SIGBUS. Rare, so the whole walk decides.
        const auto report = check_environment(dir, 1);
        if (!report.sound()) {
            const auto& p = report.problems.front();
            damaged(file, "the file is " + std::to_string(size) + " bytes, shorter than its last page " +
                              std::to_string(m.last_page) + " needs, and " +
                              (p.page ? "page " + std::to_string(*p.page) + ": " : std::string()) + p.what);
        }
    }
    return {m.page_size, m.last_page, m.txn, size};
}

void create_data_file(const std::filesystem::path& dir) {
    // Leftovers of killed creations: only the writer (who holds the lock) creates, so any are stale.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        if (e.path().filename().string().starts_with(".create-")) std::filesystem::remove_all(e.path(), ec);
    }
    const auto file = dir / "data.mdb";
    if (std::filesystem::exists(file)) return;
    const auto aside = dir / (".create-" + std::to_string(::getpid()));
    std::filesystem::create_directory(aside, ec);
    if (ec) throw std::system_error(ec, "cannot create " + aside.string());
    try {
        MDB_env* env = nullptr;
        if (int rc = mdb_env_create(&env); rc != 0) throw_lmdb(rc, "cannot create an LMDB environment");
        // No lock file: nothing else opens this private directory. Opening writes both meta pages.
        const int rc = mdb_env_open(env, aside.c_str(), MDB_NOLOCK, 0644);
        mdb_env_close(env);
        if (rc != 0) throw_lmdb(rc, "cannot create the store's data file in " + aside.string());
        fsync_path(aside / "data.mdb", O_RDONLY);
        crash_point("during_create");
        std::filesystem::rename(aside / "data.mdb", file);
        std::filesystem::remove_all(aside);
        fsync_path(dir, O_RDONLY | O_DIRECTORY);
    } catch (...) {
        std::filesystem::remove_all(aside, ec);
        throw;
    }
}

void reserve_lock_file(const std::filesystem::path& dir, unsigned max_readers) {
    const auto file = dir / "lock.mdb";
    fd_guard fd{::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
    if (fd.get() < 0) {
        if (errno == EACCES || errno == EROFS) return;  // a reader on a read-only store: LMDB decides
        throw std::system_error(errno, std::system_category(), "cannot open " + file.string());
    }
    std::error_code ec;
    auto size = std::filesystem::file_size(file, ec);
    if (ec) throw std::system_error(ec, "cannot read the size of " + file.string());
    if (size == 0) {
        // What LMDB sizes a new lock file to: reader slots of 64 bytes after a 192-byte header
        // (one slot inside it), rounded up to whole pages. Never grown when it exists: processes
        // that have it mapped already would not see slots past their own mapping.
        const auto page = page_size_of_system();
        size = (std::uint64_t{max_readers} * 64 + 128 + page - 1) / page * page;
    }
    if (int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(size)); rc != 0 && rc != EOPNOTSUPP) {
        throw std::system_error(rc, std::system_category(), "cannot reserve space for " + file.string());
    }
}

}  // namespace idem::detail
