#pragma once

// The JSON bodies the HTTP source answers with. No Beast here.

#include <idem/engine/health.hpp>
#include <idem/projections/store.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace idem::http::detail {

/// One event's result: the engine's error, or its committed outcome.
struct event_result {
    std::error_code error;
    outcome result;
};

/// Returns whether an outcome is answered as a dead letter (400 outside a batch): it is one, or
/// it is a retry of a message whose first delivery was one, which gets that delivery's answer.
bool answered_as_dead_letter(const outcome& o) noexcept;

/// Returns {"outcomes":[{"outcome","commit","reason","detail"}...],"durable_commit":N}; a retry
/// of a dead-lettered message is "dead_lettered" with the first delivery's reason.
std::string outcomes_json(const std::vector<event_result>& results, std::uint64_t durable_commit);
/// Returns {"error":text}.
std::string error_json(std::string_view text);
/// Returns {"key","version","state"} of a row, as `idem get` prints it.
std::string row_json(const projection_base& p, const snapshot::raw_row_view& r);
/// GET /readyz: 200 "ready" while idle or running; 503 "stalled: <reason>" or "paused: <reason>".
std::pair<unsigned, std::string> readiness(const health_report& h);

}  // namespace idem::http::detail
