#pragma once

// A temporary directory per test, removed with everything in it: the test suites' real
// LMDB environments and log files live in one.

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>

namespace idem::test {

/// A fresh directory under the system temporary directory, removed with everything in it on destruction.
class temp_dir {
public:
    temp_dir() {
        static std::atomic<unsigned> counter{0};
        std::random_device entropy;
        const auto base = std::filesystem::temp_directory_path();
        for (;;) {
            path_ = base / ("idem-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
                            std::to_string(entropy()));
            std::error_code ec;
            if (std::filesystem::create_directory(path_, ec)) break;
            if (ec) throw std::system_error(ec, "cannot create " + path_.string());
        }
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    /// Returns the directory.
    const std::filesystem::path& path() const noexcept { return path_; }
    /// Returns a path inside it.
    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
    /// Returns the LMDB environment directory inside it.
    std::filesystem::path env() const { return path_ / "env"; }

private:
    std::filesystem::path path_;
};

}  // namespace idem::test
