#pragma once

// `verify --store`: the structural check of an environment's data file (page_check), then,
// only if the structure is sound, a pass through idem's own readers that checks every row's
// checksum and decodes every row of the tool's projections, the consumer's dead letters,
// counters, checkpoints, inbox, parked events and contributing sets, so damage a codec or a
// checksum can see is reported too (a damaged row is named by projection and key).

#include <idem/projections/projection.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace idem::cli::detail {

/// Checks the store at db; prints the report as JSON on stdout and a verdict on stderr.
/// Returns the exit status: 0 sound, 2 damaged.
int verify_store(const std::string& tool, const std::filesystem::path& db, const std::string& consumer,
                 const std::vector<std::shared_ptr<const projection_base>>& projections);

}  // namespace idem::cli::detail
