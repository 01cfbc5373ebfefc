#pragma once

// The totals JSON shared by domain_totals() (read from rows) and generate() (predicted):
// one formatter, so equal numbers always make equal text.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace idem::examples::detail {

/// Formats named integers as one compact JSON object, in the order given.
std::string format_totals(std::initializer_list<std::pair<const char*, std::int64_t>> fields);

}  // namespace idem::examples::detail
