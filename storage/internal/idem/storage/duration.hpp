#pragma once

// Durations as people write them: "7d", "1h", "90m", "30s", "250ms", "1h30m".

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

/// Parses a duration: one or more <integer><unit> with units d, h, m, s, ms, us, ns; nullopt if it is not one.
std::optional<std::chrono::nanoseconds> parse_duration(std::string_view text) noexcept;

/// Formats a duration in the largest units that keep it exact ("7d", "1h30m", "250ms"; "0s").
std::string format_duration(std::chrono::nanoseconds d);

}  // namespace idem
