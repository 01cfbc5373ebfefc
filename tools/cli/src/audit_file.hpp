#pragma once

// An append-only file of JSON lines that a killed process leaves complete: each line goes out
// in one write(2) on an O_APPEND descriptor, so nothing waits in a user-space buffer and lines
// written from several threads never interleave. The `--ack-log` audits of `consume --nats`
// write through it.

#include <mutex>
#include <string>

namespace idem::cli::detail {

class audit_file {
public:
    /// Opens (creating, appending to) path; option names the command-line option in the error.
    audit_file(const std::string& path, const std::string& option);
    ~audit_file();
    audit_file(const audit_file&) = delete;
    audit_file& operator=(const audit_file&) = delete;

    /// Appends line and a newline, in one write. Safe from any thread.
    void write_line(std::string line);

private:
    int fd_;
    std::mutex m_;
};

}  // namespace idem::cli::detail
