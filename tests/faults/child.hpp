#pragma once

// Runs a process under the LD_PRELOAD fault injector (inject.cpp) and waits for it, killing it
// after a time limit so that a hang fails the test instead of stalling the run.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace idem_faults {

/// How the injector makes calls fail (see inject.cpp for the meaning of each field).
struct injection {
    std::string error = "ENOSPC";  ///< ENOSPC or EIO
    std::string ops = "write,sync";
    std::string mode = "before";  ///< before: the call does nothing; after: it is done, then fails
    long skip = 0;
    long limit = -1;
    bool dsync_only = false;  ///< only descriptors opened with O_DSYNC (LMDB's meta page writes)

    std::string describe() const {
        return error + " on " + ops + " (" + mode + "), skip " + std::to_string(skip) +
               (limit >= 0 ? ", limit " + std::to_string(limit) : std::string()) + (dsync_only ? ", O_DSYNC only" : "");
    }
};

/// How a child ended.
struct exit_status {
    bool finished = false;  ///< exited by itself within the time limit
    int code = -1;          ///< its exit code, or -signal if a signal ended it
};

/// Returns the injector library's path (the test's environment names it).
inline std::string injector_library() {
    const char* lib = std::getenv("IDEM_FAULTS_LIB");
    return lib != nullptr ? lib : "";
}

/// Runs program with args; the injector is preloaded when preload is true, its settings taken from
/// inj, the affected directory `dir` and the control file `control`. Output goes to out_file.
inline exit_status run(const std::string& program, const std::vector<std::string>& args, bool preload,
                       const injection& inj, const std::filesystem::path& dir, const std::filesystem::path& control,
                       const std::vector<std::string>& extra_env, const std::filesystem::path& out_file,
                       std::chrono::seconds limit = std::chrono::seconds{120}) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
        std::string var = *e;
        if (var.starts_with("LD_PRELOAD=") || var.starts_with("IDEM_FAULT_") || var.starts_with("ASAN_OPTIONS=")) continue;
        env.push_back(std::move(var));
    }
    // A sanitizer runtime wants to be first in the library list; the preloaded injector comes first.
    std::string asan = "ASAN_OPTIONS=verify_asan_link_order=0";
    if (const char* a = std::getenv("ASAN_OPTIONS")) asan += std::string(":") + a;
    env.push_back(asan);
    if (preload) {
        env.push_back("LD_PRELOAD=" + injector_library());
        env.push_back("IDEM_FAULT_DIR=" + dir.string());
        env.push_back("IDEM_FAULT_CONTROL=" + control.string());
        env.push_back("IDEM_FAULT_ERRNO=" + inj.error);
        env.push_back("IDEM_FAULT_OPS=" + inj.ops);
        env.push_back("IDEM_FAULT_MODE=" + inj.mode);
        env.push_back("IDEM_FAULT_SKIP=" + std::to_string(inj.skip));
        env.push_back("IDEM_FAULT_LIMIT=" + std::to_string(inj.limit));
        env.push_back(std::string("IDEM_FAULT_DSYNC=") + (inj.dsync_only ? "1" : "0"));
        env.push_back("IDEM_FAULT_LOG=" + (out_file.parent_path() / "injected.log").string());
    }
    for (const auto& e : extra_env) env.push_back(e);
    std::vector<std::string> argv_strings{program};
    for (const auto& a : args) argv_strings.push_back(a);
    auto pointers = [](std::vector<std::string>& strings) {
        std::vector<char*> out;
        for (auto& s : strings) out.push_back(s.data());
        out.push_back(nullptr);
        return out;
    };
    auto argv = pointers(argv_strings);
    auto envp = pointers(env);
    posix_spawn_file_actions_t actions;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawn_file_actions_addopen(&actions, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t child = 0;
    const int rc = ::posix_spawn(&child, program.c_str(), &actions, nullptr, argv.data(), envp.data());
    ::posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return {};
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(child, &status, WNOHANG) == child) {
            return {true, WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status)};
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{5});
    }
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    return {false, -SIGKILL};
}

/// Returns a file's text ("" if it does not exist).
inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream in{p};
    std::ostringstream out;
    out << in.rdbuf();
    return out.str();
}

/// Returns the number of lines of a file (0 if it does not exist).
inline std::size_t lines(const std::filesystem::path& p) {
    std::ifstream in{p};
    std::size_t n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    return n;
}

}  // namespace idem_faults
