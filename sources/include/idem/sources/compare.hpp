#pragma once

// Two environments compared row by row: how verify tells a store from a build of its logs.

#include <idem/projections/store.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace idem {

/// One projection's rows summarized.
struct projection_digest {
    std::string projection;
    std::uint64_t rows = 0;
    std::uint64_t digest = 0;  ///< over keys, versions and encoded states, in key order
};

/// The first difference between two environments, if any.
struct comparison {
    std::vector<projection_digest> left, right;
    std::optional<std::string> first_difference;  ///< names the projection and the row
};

/// Compares the named projections of two environments row by row.
comparison compare(const std::filesystem::path& left, const std::filesystem::path& right,
                   const std::vector<std::string>& projections);
/// The same over two snapshots (the paths name them in the difference).
comparison compare(const snapshot& left, const std::filesystem::path& left_name, const snapshot& right,
                   const std::filesystem::path& right_name, const std::vector<std::string>& projections);

}  // namespace idem
