#pragma once

// How the commands write numbers and times for people (stderr lines and progress bars).

#include <chrono>
#include <cstdint>
#include <string>

namespace idem::cli::detail {

/// Returns n with thousands separated by commas: 1,234,567.
std::string with_commas(std::uint64_t n);

/// Returns v with a fixed count of decimals ("%.*f").
std::string fixed(double v, int decimals);

/// Returns d in seconds.
double seconds(std::chrono::steady_clock::duration d);

}  // namespace idem::cli::detail
