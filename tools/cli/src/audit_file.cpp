#include "audit_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace idem::cli::detail {

audit_file::audit_file(const std::string& path, const std::string& option)
    : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw std::system_error(errno, std::system_category(), "option '--" + option + "': " + path);
}

audit_file::~audit_file() { ::close(fd_); }

void audit_file::write_line(std::string line) {
    line += '\n';
    std::scoped_lock lock{m_};
    // An audit line that cannot be written is not a reason to stop consuming: the audit is a
    // test's and an operator's instrument, not part of the apply path.
    (void)!::write(fd_, line.data(), line.size());
}

}  // namespace idem::cli::detail
