#pragma once

// The change feed (docs/CHANGES.md): the row changes each commit made, recorded in the commit's
// own transaction, read back in commit order by position. A projection records its changes when
// it opts in (projection::changes()); the feed is retained by age and/or commits.

#include <chrono>
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

/// What an entry of the feed says.
enum class change_kind : std::uint8_t {
    row = 1,    ///< a row's state after the commit (its version, its encoded state)
    reset = 2,  ///< re-read the whole projection as of this commit (a rebuild replaced its rows)
};

/// Returns "row" or "reset".
std::string_view to_string(change_kind k) noexcept;

/// Where an entry sits: its commit, and its place among that commit's entries.
struct change_position {
    std::uint64_t commit = 0;
    std::uint32_t index = 0;
    auto operator<=>(const change_position&) const = default;
    /// "COMMIT.INDEX", as Server-Sent Events' ids and `idem changes` print it.
    std::string to_string() const;
    /// Reads "COMMIT" (after every entry of that commit) or "COMMIT.INDEX"; nullopt if malformed.
    static std::optional<change_position> parse(std::string_view text);
};

/// One entry of the feed.
struct change {
    change_position position;
    change_kind kind = change_kind::row;
    std::string projection;
    std::string key;                  ///< the row (empty for a reset)
    std::uint64_t version = 0;        ///< the row's version after the commit (versions rise, and may skip)
    std::uint32_t state_version = 0;  ///< the format version of state
    std::string state;                ///< the row's encoded state (projection_base::load reads it)
    std::uint64_t time_ns = 0;        ///< when the commit was made (wall clock, ns since the Unix epoch)
};

/// How long the feed keeps entries (store_options::changes). An entry goes when either limit
/// passes it, whole commits at a time, in bounded steps with each batch and store::prune.
struct change_retention {
    /// Entries of commits made longer ago than this go (unset: kept whatever their age).
    std::optional<std::chrono::nanoseconds> max_age = std::chrono::hours(24 * 7);
    /// Only the entries of the last this many commits are kept (unset: however many).
    std::optional<std::uint64_t> keep_commits{};
};

/// What the feed holds (snapshot::change_feed()).
struct change_feed_info {
    std::uint64_t entries = 0;
    std::uint64_t first_commit = 0;   ///< the oldest commit with entries (0: none)
    std::uint64_t last_commit = 0;    ///< the newest commit with entries (0: none)
    std::uint64_t pruned_through = 0; ///< entries of commits up to this one were pruned (0: none)
    std::uint64_t oldest_time_ns = 0; ///< when first_commit was made (0: none)
};

}  // namespace idem
