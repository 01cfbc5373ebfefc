#include <idem/storage/duration.hpp>

#include <array>
#include <cstdint>
#include <ctime>
#include <utility>

namespace idem {
namespace {

using namespace std::chrono_literals;

constexpr std::array<std::pair<std::string_view, std::chrono::nanoseconds>, 7> units{{
    {"d", 24h}, {"h", 1h}, {"ms", 1ms}, {"us", 1us}, {"ns", 1ns}, {"m", 1min}, {"s", 1s},
}};

}  // namespace

std::optional<std::chrono::nanoseconds> parse_duration(std::string_view s) noexcept {
    if (s.empty()) return std::nullopt;
    std::chrono::nanoseconds total{0};
    while (!s.empty()) {
        std::int64_t n = 0;
        std::size_t i = 0;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
            if (n > (INT64_MAX - 9) / 10) return std::nullopt;
            n = n * 10 + (s[i] - '0');
            ++i;
        }
        if (i == 0) return std::nullopt;
        s.remove_prefix(i);
        bool matched = false;
        for (const auto& [name, unit] : units) {  // "ms" before "m"
            if (s.starts_with(name)) {
                if (n > INT64_MAX / unit.count()) return std::nullopt;
                total += unit * n;
                s.remove_prefix(name.size());
                matched = true;
                break;
            }
        }
        if (!matched) return std::nullopt;
    }
    return total;
}

std::string format_duration(std::chrono::nanoseconds d) {
    if (d.count() == 0) return "0s";
    std::string out;
    if (d.count() < 0) {
        out = "-";
        d = -d;
    }
    constexpr std::array<std::pair<std::string_view, std::chrono::nanoseconds>, 7> order{{
        {"d", 24h}, {"h", 1h}, {"m", 1min}, {"s", 1s}, {"ms", 1ms}, {"us", 1us}, {"ns", 1ns},
    }};
    for (const auto& [name, unit] : order) {
        if (d >= unit) {
            out += std::to_string(d / unit);
            out += name;
            d %= unit;
        }
    }
    return out;
}

std::uint64_t wall_clock_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
}

std::string format_utc(std::uint64_t ns) {
    if (ns == 0) return "-";
    auto t = static_cast<std::time_t>(ns / 1'000'000'000);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

}  // namespace idem
