#pragma once

// Shrinking a failing chaos schedule: drop steps, deliveries and crashes, and plain copies
// for duplicates, while the schedule still fails, so the report shows a short one.

#include "schedule.hpp"

#include <idem/testing.hpp>

#include <functional>
#include <optional>
#include <vector>

namespace idem::testing::detail {

/// Runs a schedule and returns its first difference from its reference, if any.
using failure_test = std::function<std::optional<chaos_difference>(const std::vector<step>&)>;

/// A shrunk schedule and the difference it still shows.
struct shrunk {
    std::vector<step> steps;
    chaos_difference difference;
};

/// Shrinks steps (which fail with difference) trying at most max_runs candidates.
shrunk shrink(std::vector<step> steps, chaos_difference difference, const failure_test& fails, std::size_t max_runs);

}  // namespace idem::testing::detail
