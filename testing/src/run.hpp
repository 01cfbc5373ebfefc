#pragma once

// Running a chaos schedule against real stores: the reference (each event once, in order),
// a schedule's live store (its crashes, reopens and prunes), the rebuild of its delivered
// log, and the rows each ends with.

#include "schedule.hpp"

#include <idem/projections/store.hpp>

#include <atomic>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace idem::testing::detail {

/// One row as compared: its version and its state as JSON.
struct row_image {
    std::uint64_t version = 0;
    std::string state;
    friend bool operator==(const row_image&, const row_image&) = default;
};

/// Every row of every projection, by (projection, key).
using rows_image = std::map<std::pair<std::string, std::string>, row_image>;

/// What the runs share: the projections, the store options and where stores go.
struct run_context {
    std::vector<std::shared_ptr<const projection_base>> projections;
    std::vector<std::function<void(store&)>> installers;
    std::function<void(store_options&)> configure;
    std::filesystem::path directory;  ///< an existing directory the runs make their stores in
    bool rebuild = true;
    const std::atomic<bool>* stop = nullptr;  ///< when it becomes true, the runs throw operation_canceled
};

/// Throws std::system_error(operation_canceled) if c.stop asks the run to stop.
void check_stop(const run_context& c);

/// Applies each of events[which] once, in that order, to a fresh store and returns its rows.
rows_image run_reference(const run_context& c, const std::vector<event>& events, const std::vector<std::size_t>& which);

/// What a schedule ended with.
struct schedule_rows {
    rows_image live;
    std::optional<rows_image> rebuilt;  ///< set when c.rebuild
    std::size_t kills = 0;              ///< forked children killed at their crash point
};

/// Runs steps against a fresh store (and rebuilds its delivered log); throws what the store throws.
schedule_rows run_schedule(const run_context& c, const std::vector<event>& events, const std::vector<step>& steps);

/// Returns the events a schedule delivers, ascending (its reference applies exactly these).
std::vector<std::size_t> events_of(const std::vector<step>& steps);

}  // namespace idem::testing::detail
