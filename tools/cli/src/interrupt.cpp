#include "interrupt.hpp"

#include <cstdio>
#include <memory>

namespace idem::cli::detail {

std::atomic<bool> stop_requested{false};

namespace {

extern "C" void on_stop_signal(int) { stop_requested.store(true); }

}  // namespace

stop_signals::stop_signals() {
    stop_requested.store(false);
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = static_cast<int>(SA_RESETHAND);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
}

stop_signals::~stop_signals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
}

lock_wait writer_wait(const std::string& tool, const arguments& a, const std::filesystem::path& db) {
    if (!a.flag("wait")) return {};
    auto told = std::make_shared<bool>(false);
    return [told, db, tool](const lock_holder& holder) {
        if (!*told) {
            std::fprintf(stderr, "%s: waiting for %s: it is being written by %s (Ctrl-C to give up)\n", tool.c_str(),
                         db.c_str(), describe(holder).c_str());
            *told = true;
        }
        return !stop_requested.load();
    };
}

}  // namespace idem::cli::detail
