#include <idem/storage/writer_lock.hpp>

#include <idem/storage/crash_point.hpp>
#include <idem/storage/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <system_error>
#include <thread>
#include <utility>

namespace idem {
namespace {

std::filesystem::path lock_path(const std::filesystem::path& dir) { return dir / writer_lock_file; }

// This process's command line with its arguments separated by spaces, at most 300 bytes.
std::string own_command() {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && text.back() == '\0') text.pop_back();
    for (auto& c : text) {
        if (c == '\0' || c == '\n') c = ' ';
    }
    if (text.size() > 300) text = text.substr(0, 297) + "...";
    return text;
}

// Whether fd is still the file at path: a rebuild may have swapped the directory meanwhile.
bool still_at(int fd, const std::filesystem::path& path) {
    struct stat held{};
    struct stat now{};
    if (::fstat(fd, &held) != 0 || ::stat(path.c_str(), &now) != 0) return false;
    return held.st_dev == now.st_dev && held.st_ino == now.st_ino;
}

[[noreturn]] void refuse(const std::filesystem::path& dir, const lock_holder& holder, bool waited) {
    throw_error(errc::store_locked, "the store " + dir.string() + " is being written by " + describe(holder) +
                                        (waited ? "; gave up waiting for it"
                                                : ": one writer per store; stop it first, or wait for it (--wait)"));
}

}  // namespace

writer_lock::writer_lock(const std::filesystem::path& dir, const lock_wait& wait) {
    const auto path = lock_path(dir);
    for (;;) {
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) {
            throw std::system_error(errno, std::system_category(), "cannot open the writer lock " + path.string());
        }
        while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            if (e == EINTR) continue;
            if (e != EWOULDBLOCK) {
                ::close(fd_);
                throw std::system_error(e, std::system_category(), "cannot lock " + path.string());
            }
            const auto who = holder(dir);
            if (!wait) {
                ::close(fd_);
                refuse(dir, who, false);
            }
            if (!wait(who)) {
                ::close(fd_);
                refuse(dir, who, true);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        if (still_at(fd_, path)) break;
        ::close(fd_);  // the directory was swapped while we waited: lock the store that is there now
    }
    // Who holds it, for the messages of writers that are refused. Best effort: on a full disk
    // the lock still holds, only the name is missing.
    const auto text = std::to_string(::getpid()) + "\n" + own_command() + "\n";
    if (::ftruncate(fd_, 0) == 0) {
        [[maybe_unused]] auto n = ::pwrite(fd_, text.data(), text.size(), 0);
    }
    crash_point("after_lock");
}

writer_lock::~writer_lock() {
    if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

writer_lock::writer_lock(writer_lock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

bool writer_lock::still_held(const std::filesystem::path& dir) const { return still_at(fd_, lock_path(dir)); }

bool writer_lock::held(const std::filesystem::path& dir) {
    const int fd = ::open(lock_path(dir).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    int rc = 0;
    while ((rc = ::flock(fd, LOCK_SH | LOCK_NB)) != 0 && errno == EINTR) {
    }
    const bool busy = rc != 0 && errno == EWOULDBLOCK;
    ::close(fd);
    return busy;
}

lock_holder writer_lock::holder(const std::filesystem::path& dir) {
    lock_holder h;
    std::ifstream in(lock_path(dir));
    std::string pid;
    if (std::getline(in, pid) && !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos &&
        pid.size() < 12) {
        h.pid = std::stoll(pid);
        std::getline(in, h.command);
    }
    return h;
}

std::string describe(const lock_holder& holder) {
    if (holder.pid == 0) return "another process";
    return "pid " + std::to_string(holder.pid) + (holder.command.empty() ? "" : " (" + holder.command + ")");
}

}  // namespace idem
