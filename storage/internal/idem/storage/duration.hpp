#pragma once

// Durations as people write them: "7d", "1h", "90m", "30s", "250ms", "1h30m".

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

/// Parses a duration: one or more <integer><unit> with units d, h, m, s, ms, us, ns; nullopt if it is not one.
std::optional<std::chrono::nanoseconds> parse_duration(std::string_view text) noexcept;

/// Formats a duration in the largest units that keep it exact ("7d", "1h30m", "250ms"; "0s").
std::string format_duration(std::chrono::nanoseconds d);

/// Returns the wall clock: ns since the Unix epoch.
std::uint64_t wall_clock_ns();

/// Formats a time (ns since the Unix epoch) as RFC 3339 UTC to the second ("2026-12-02T10:00:03Z"); "-" for 0 (none).
std::string format_utc(std::uint64_t ns);

}  // namespace idem
