#pragma once

// Comparing a schedule's rows with the reference's.

#include "run.hpp"

#include <idem/testing.hpp>

#include <optional>
#include <string>

namespace idem::testing::detail {

/// Returns the first row, in (projection, key) order, where actual differs from expected.
std::optional<chaos_difference> first_difference(const rows_image& expected, const rows_image& actual,
                                                 const std::string& where);

}  // namespace idem::testing::detail
