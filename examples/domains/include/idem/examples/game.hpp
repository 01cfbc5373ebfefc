#pragma once

// The game domain: many player streams feed shared rows.
//
//   player.scored {match, player, points}  ->  leaderboard[match] = {points per player, total}
//   item.granted / item.consumed {player, item, count}  ->  inventory[player] = {items}
//
// A leaderboard row is fed by every player of the match, each with a stream of its own
// (subject = player), so the row cannot use one stream's sequence to spot a repeat: its
// contributing set (the event ids already counted) guards it. An inventory row is keyed by
// its player, the subject of its events, so its stream's sequence orders grants before the
// consumptions that spend them.

#include <idem/examples/detail/fields.hpp>
#include <idem/projections/projection.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace idem::examples {

/// The name of the leaderboard projection (its table is "proj/leaderboard").
inline constexpr const char* leaderboard_projection = "leaderboard";
/// The name of the inventory projection (its table is "proj/inventory").
inline constexpr const char* inventory_projection = "inventory";

/// A player scored in a match: CloudEvents type `player.scored`.
struct scored {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "player.scored";

    std::string match;        ///< the match, and the `leaderboard` row the score changes
    std::string player;       ///< who scored
    std::int64_t points = 0;  ///< points won (negative: a penalty)

    /// Reads or writes the payload's fields; the names are the JSON `data` object's.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(match), CEREAL_NVP(player), CEREAL_NVP(points));
    }
};

/// Items were granted to a player: CloudEvents type `item.granted`.
struct item_granted {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "item.granted";

    std::string player;      ///< the `inventory` row the grant changes
    std::string item;        ///< which item
    std::int64_t count = 0;  ///< how many, > 0

    /// Reads or writes the payload's fields; the names are the JSON `data` object's.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(player), CEREAL_NVP(item), CEREAL_NVP(count));
    }
};

/// A player used up items: CloudEvents type `item.consumed`.
struct item_consumed {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "item.consumed";

    std::string player;      ///< the `inventory` row the consumption changes
    std::string item;        ///< which item
    std::int64_t count = 0;  ///< how many, > 0

    /// Reads or writes the payload's fields; the names are the JSON `data` object's.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(player), CEREAL_NVP(item), CEREAL_NVP(count));
    }
};

/// One row of `leaderboard`: a match's points per player and in total.
struct scoreboard {
    std::map<std::string, std::int64_t> points;  ///< player -> points in this match
    std::int64_t total = 0;                      ///< sum of every player's points

    /// Adds a score; throws std::overflow_error if a sum leaves 64 bits.
    void add(const scored& s);

    /// Reads or writes the state; JSON: {"points":{"player":n,...},"total":n}.
    template <class Archive>
    void serialize(Archive& ar) {
        detail::counts_field(ar, "points", points);
        ar(CEREAL_NVP(total));
    }
};

/// One row of `inventory`: what a player holds. Items with a count of 0 are not listed.
struct holdings {
    std::map<std::string, std::int64_t> items;  ///< item -> count held, every count > 0

    /// Adds granted items; throws std::invalid_argument if count <= 0.
    void grant(const item_granted& g);
    /// Removes consumed items. Throws std::invalid_argument if count <= 0 or if the player
    /// holds fewer than count: an overdraw is rejected whole (the store dead-letters the
    /// event as handler_failed and the row stays unchanged), never clamped to zero.
    void consume(const item_consumed& c);

    /// Reads or writes the state; JSON: {"items":{"item":n,...}}.
    template <class Archive>
    void serialize(Archive& ar) {
        detail::counts_field(ar, "items", items);
    }
};

/// Returns the `leaderboard` projection: `player.scored` keyed by match.
idem::projection<scoreboard> leaderboard();
/// Returns the `inventory` projection: `item.granted` and `item.consumed` keyed by player.
idem::projection<holdings> inventory();

}  // namespace idem::examples
