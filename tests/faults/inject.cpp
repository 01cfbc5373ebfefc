// A storage fault injector, loaded with LD_PRELOAD into a process under test: it makes the
// write and sync calls on files under one directory fail as a full or failing disk would,
// while a control file exists. Nothing else of the process is touched.
//
// Environment:
//   IDEM_FAULT_DIR      files whose path starts with this are affected (required)
//   IDEM_FAULT_CONTROL  calls fail only while this file exists (required)
//   IDEM_FAULT_ERRNO    ENOSPC (default) or EIO
//   IDEM_FAULT_OPS      which calls fail: "write", "sync" or "write,sync" (default)
//   IDEM_FAULT_SKIP     let this many affected calls succeed after the control file appears (default 0)
//   IDEM_FAULT_LIMIT    fail at most this many calls (default: no limit)
//   IDEM_FAULT_MODE     "before" (default): fail without doing anything, as a full disk refuses a
//                       write; "after": do the call, then report the error, as a write that
//                       reached the page cache but whose writeback failed
//   IDEM_FAULT_LOG      append one line per injected failure to this file
//   IDEM_FAULT_DSYNC    "1": only descriptors opened with O_DSYNC (LMDB writes its meta pages
//                       through one: this hits exactly the commit's last write)
//
// Intercepted: write, pwrite, pwrite64, writev, pwritev, pwritev64, fsync, fdatasync,
// sync_file_range, msync (msync has no descriptor: it fails whenever the control file exists).

// The real functions are looked up by name; keep glibc from renaming them to their 64-bit twins.
#undef _FILE_OFFSET_BITS

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

struct config {
    const char* dir = nullptr;
    std::size_t dir_length = 0;
    const char* control = nullptr;
    int error = ENOSPC;
    bool writes = true;
    bool syncs = true;
    bool after = false;
    long skip = 0;
    long limit = -1;
    bool dsync_only = false;
    const char* log = nullptr;
};

const config& settings() {
    static const config c = [] {
        config out;
        out.dir = std::getenv("IDEM_FAULT_DIR");
        out.dir_length = out.dir != nullptr ? std::strlen(out.dir) : 0;
        out.control = std::getenv("IDEM_FAULT_CONTROL");
        if (const char* e = std::getenv("IDEM_FAULT_ERRNO"); e != nullptr && std::strcmp(e, "EIO") == 0) out.error = EIO;
        if (const char* ops = std::getenv("IDEM_FAULT_OPS")) {
            out.writes = std::strstr(ops, "write") != nullptr;
            out.syncs = std::strstr(ops, "sync") != nullptr;
        }
        if (const char* m = std::getenv("IDEM_FAULT_MODE"); m != nullptr && std::strcmp(m, "after") == 0) out.after = true;
        if (const char* s = std::getenv("IDEM_FAULT_SKIP")) out.skip = std::strtol(s, nullptr, 10);
        if (const char* l = std::getenv("IDEM_FAULT_LIMIT")) out.limit = std::strtol(l, nullptr, 10);
        out.log = std::getenv("IDEM_FAULT_LOG");
        if (const char* d = std::getenv("IDEM_FAULT_DSYNC"); d != nullptr && std::strcmp(d, "1") == 0) out.dsync_only = true;
        return out;
    }();
    return c;
}

std::atomic<long> passed{0};    // affected calls let through since the control file appeared
std::atomic<long> injected{0};  // failures injected

template <class F>
F real(const char* name) {
    return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

using write_fn = ssize_t (*)(int, const void*, size_t);
using pwrite_fn = ssize_t (*)(int, const void*, size_t, off_t);
using pwrite64_fn = ssize_t (*)(int, const void*, size_t, off64_t);
using writev_fn = ssize_t (*)(int, const struct iovec*, int);
using pwritev_fn = ssize_t (*)(int, const struct iovec*, int, off_t);
using pwritev64_fn = ssize_t (*)(int, const struct iovec*, int, off64_t);
using sync_fn = int (*)(int);
using range_fn = int (*)(int, off64_t, off64_t, unsigned int);
using msync_fn = int (*)(void*, size_t, int);

bool under_dir(int fd) {
    const auto& c = settings();
    if (c.dir == nullptr || c.dir_length == 0) return false;
    char link[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    char target[4096];
    const auto n = ::readlink(link, target, sizeof target - 1);
    if (n <= 0) return false;
    if (static_cast<std::size_t>(n) < c.dir_length || std::memcmp(target, c.dir, c.dir_length) != 0) return false;
    return !c.dsync_only || (::fcntl(fd, F_GETFL) & O_DSYNC) == O_DSYNC;
}

void note(const char* call, int fd) {
    const auto& c = settings();
    if (c.log == nullptr) return;
    static const auto raw_write = real<write_fn>("write");
    const int out = ::open(c.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (out < 0) return;
    char line[128];
    const int n = std::snprintf(line, sizeof line, "%s fd %d: %s\n", call, fd, c.error == EIO ? "EIO" : "ENOSPC");
    if (n > 0) (void)raw_write(out, line, static_cast<std::size_t>(n));
    ::close(out);
}

// Whether this call must fail: it is of a failing kind, on an affected file, while the control
// file exists, past the calls to skip and within the limit.
bool fail_now(bool sync_call, int fd, const char* call) {
    const auto& c = settings();
    if (c.control == nullptr || (sync_call ? !c.syncs : !c.writes)) return false;
    if (fd >= 0 && !under_dir(fd)) return false;
    if (::access(c.control, F_OK) != 0) {
        passed = 0;
        return false;
    }
    if (passed.fetch_add(1) < c.skip) return false;
    if (c.limit >= 0 && injected.fetch_add(1) >= c.limit) return false;
    if (c.limit < 0) ++injected;
    note(call, fd);
    return true;
}

template <class R, class Call>
R faulty(bool sync_call, int fd, const char* name, Call&& call) {
    if (!fail_now(sync_call, fd, name)) return call();
    if (settings().after) (void)call();
    errno = settings().error;
    return -1;
}

}  // namespace

extern "C" {

ssize_t write(int fd, const void* buf, size_t n) {
    static const auto next = real<write_fn>("write");
    return faulty<ssize_t>(false, fd, "write", [&] { return next(fd, buf, n); });
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t off) {
    static const auto next = real<pwrite_fn>("pwrite");
    return faulty<ssize_t>(false, fd, "pwrite", [&] { return next(fd, buf, n, off); });
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off64_t off) {
    static const auto next = real<pwrite64_fn>("pwrite64");
    return faulty<ssize_t>(false, fd, "pwrite64", [&] { return next(fd, buf, n, off); });
}

ssize_t writev(int fd, const struct iovec* iov, int count) {
    static const auto next = real<writev_fn>("writev");
    return faulty<ssize_t>(false, fd, "writev", [&] { return next(fd, iov, count); });
}

ssize_t pwritev(int fd, const struct iovec* iov, int count, off_t off) {
    static const auto next = real<pwritev_fn>("pwritev");
    return faulty<ssize_t>(false, fd, "pwritev", [&] { return next(fd, iov, count, off); });
}

ssize_t pwritev64(int fd, const struct iovec* iov, int count, off64_t off) {
    static const auto next = real<pwritev64_fn>("pwritev64");
    return faulty<ssize_t>(false, fd, "pwritev64", [&] { return next(fd, iov, count, off); });
}

int fsync(int fd) {
    static const auto next = real<sync_fn>("fsync");
    return faulty<int>(true, fd, "fsync", [&] { return next(fd); });
}

int fdatasync(int fd) {
    static const auto next = real<sync_fn>("fdatasync");
    return faulty<int>(true, fd, "fdatasync", [&] { return next(fd); });
}

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags) {
    static const auto next = real<range_fn>("sync_file_range");
    return faulty<int>(true, fd, "sync_file_range", [&] { return next(fd, off, n, flags); });
}

int msync(void* addr, size_t n, int flags) {
    static const auto next = real<msync_fn>("msync");
    return faulty<int>(true, -1, "msync", [&] { return next(addr, n, flags); });
}

}  // extern "C"
