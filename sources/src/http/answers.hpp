#pragma once

// The bodies the HTTP source answers with: JSON, /readyz and /metrics. No Beast here.

#include <idem/engine/engine.hpp>
#include <idem/projections/store.hpp>

#include <array>
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
/// The HTTP server's own counters, for GET /metrics.
struct http_figures {
    std::array<std::uint64_t, 6> answers{};  ///< by class: 2xx, 400, 401, 413/431, other 4xx, 503
    std::uint64_t connections = 0, refused = 0, accept_failures = 0, timeouts = 0, in_flight = 0;
};
/// GET /metrics: the engine's metrics, the server's, and the store's inbox, dead letters and parked.
std::string metrics_text(const engine& eng, const http_figures& f);
/// GET /readyz: 200 "ready" while idle or running; 503 "stalled: <reason>" or "paused: <reason>".
std::pair<unsigned, std::string> readiness(const health_report& h);

}  // namespace idem::http::detail
