#pragma once

// The JSON bodies the HTTP source answers with. No Beast here.

#include <idem/projections/store.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace idem::http::detail {

/// One event's result: the engine's error, or its committed outcome.
struct event_result {
    std::error_code error;
    outcome result;
};

/// Returns {"outcomes":[{"outcome","commit","reason","detail"}...],"durable_commit":N}.
std::string outcomes_json(const std::vector<event_result>& results, std::uint64_t durable_commit);
/// Returns {"error":text}.
std::string error_json(std::string_view text);
/// Returns {"key","version","state"} of a row, as `idem get` prints it.
std::string row_json(const projection_base& p, const snapshot::raw_row_view& r);

}  // namespace idem::http::detail
