#pragma once

// The on-disk layout of an instance of a partitioned group (`consume --partitions`), in one place
// for the consumer that writes it and the readers (`idem dump`) that read it without cnats:
//
//   DIR/owned        the partitions the instance owns (held, or kept on its stop), one number a
//                    line, replaced atomically
//   DIR/p<k>         partition k's environment
//   DIR/p<k>.replay  the copy of partition k must be replayed, not resumed (a refused commit)

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace idem::jetstream {

/// Returns the name of partition k's environment under an instance's directory: "p<k>".
std::string partition_directory(std::uint32_t k);

/// Returns the marker, under an instance's directory, saying that partition k's copy must be replayed.
std::filesystem::path replay_marker(const std::filesystem::path& dir, std::uint32_t k);

/// Returns the partitions DIR/owned lists, in the file's order; nullopt when there is no such file.
std::optional<std::vector<std::uint32_t>> read_owned(const std::filesystem::path& dir);

/// Replaces DIR/owned with ks, sorted, through a rename (a reader sees the old list or the new).
void write_owned(const std::filesystem::path& dir, std::vector<std::uint32_t> ks);

}  // namespace idem::jetstream
