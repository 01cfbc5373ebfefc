#include <idem/storage/store_dir.hpp>

#include <idem/storage/error.hpp>
#include <idem/storage/writer_lock.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace idem {

std::vector<std::string> foreign_files(const std::filesystem::path& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        const auto name = e.path().filename().string();
        // idem.health: what a running consumer last said of its health (idem stats reads it);
        // idem.pause: an operator's pause (idem pause).
        const bool ours = name == "data.mdb" || name == "lock.mdb" || name == writer_lock_file ||
                          name == "idem.health" || name == "idem.health.tmp" || name == "idem.pause" ||
                          name.starts_with("idem.pause.tmp") ||
                          (name.starts_with(".create-") && e.is_directory());
        if (!ours) out.push_back(name);
    }
    std::sort(out.begin(), out.end());
    return out;
}

void remove_store_dir(const std::filesystem::path& dir) {
    if (!std::filesystem::exists(dir)) return;
    if (!std::filesystem::is_directory(dir)) {
        throw_error(errc::invalid_argument, dir.string() + ": is not a directory; not removing it");
    }
    if (auto other = foreign_files(dir); !other.empty()) {
        std::string names;
        for (std::size_t i = 0; i < other.size() && i < 5; ++i) names += (i ? ", " : "") + other[i];
        if (other.size() > 5) names += ", ...";
        throw_error(errc::invalid_argument,
                    dir.string() + ": holds files that are not part of an idem store (" + names + "); not removing it");
    }
    std::filesystem::remove_all(dir);
}

void remove_leftovers(const std::filesystem::path& dir, std::string_view infix) {
    const auto prefix = dir.filename().string() + std::string(infix);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir.parent_path(), ec)) {
        const auto name = e.path().filename().string();
        if (!name.starts_with(prefix) || !e.is_directory()) continue;
        const auto pid = name.substr(prefix.size());
        if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
        if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // still running
        if (writer_lock::held(e.path()) || !foreign_files(e.path()).empty()) continue;
        std::filesystem::remove_all(e.path(), ec);
    }
}

void sync_dir(const std::filesystem::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw std::system_error(errno, std::system_category(), "cannot open directory " + dir.string());
    const int rc = ::fsync(fd);
    const int saved = errno;
    ::close(fd);
    if (rc != 0) throw std::system_error(saved, std::system_category(), "cannot sync directory " + dir.string());
}

}  // namespace idem
