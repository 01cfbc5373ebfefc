#include <idem/storage/crash_point.hpp>

#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>

namespace idem::detail {
namespace {

struct armed_point {
    std::string name;
    std::atomic<std::uint64_t> nth{0};  // 0: not armed
    std::atomic<std::uint64_t> hits{0};

    armed_point() {
        const char* spec = std::getenv("IDEM_CRASH_AT");
        if (spec == nullptr) return;
        std::string_view s{spec};
        auto colon = s.rfind(':');
        std::uint64_t n = 0;
        if (colon == std::string_view::npos ||
            std::from_chars(s.data() + colon + 1, s.data() + s.size(), n).ec != std::errc{} || n == 0) {
            std::fprintf(stderr, "idem: IDEM_CRASH_AT='%s' is not <point>:<N> with N >= 1; ignored\n", spec);
            return;
        }
        name = std::string(s.substr(0, colon));
        nth = n;
    }
};

armed_point& point() {
    static armed_point p;
    return p;
}

}  // namespace

bool crash_points_armed() noexcept { return point().nth.load(std::memory_order_relaxed) != 0; }

void arm_crash_point(std::string_view name, std::uint64_t nth) {
    auto& p = point();
    p.nth.store(0, std::memory_order_relaxed);
    p.name = std::string(name);
    p.hits.store(0, std::memory_order_relaxed);
    p.nth.store(nth, std::memory_order_relaxed);
}

void crash_point_hit(std::string_view name) noexcept {
    auto& p = point();
    if (name != p.name) return;
    if (p.hits.fetch_add(1, std::memory_order_relaxed) + 1 == p.nth.load(std::memory_order_relaxed)) {
        ::kill(::getpid(), SIGKILL);
        ::_exit(137);  // not reached
    }
}

}  // namespace idem::detail
