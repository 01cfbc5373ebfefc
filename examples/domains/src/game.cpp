#include <idem/examples/game.hpp>

#include <stdexcept>

namespace idem::examples {

void scoreboard::add(const scored& s) {
    // Compute both sums before storing either, so a throw leaves the row as it was.
    auto it = points.find(s.player);
    const std::int64_t player_points = detail::checked_add(it == points.end() ? 0 : it->second, s.points, "points");
    const std::int64_t new_total = detail::checked_add(total, s.points, "match total");
    points[s.player] = player_points;
    total = new_total;
}

void holdings::grant(const item_granted& g) {
    if (g.count <= 0) {
        throw std::invalid_argument("grant of '" + g.item + "' to '" + g.player + "': count must be > 0, got " +
                                    std::to_string(g.count));
    }
    auto it = items.find(g.item);
    const std::int64_t held = detail::checked_add(it == items.end() ? 0 : it->second, g.count, "item count");
    items[g.item] = held;
}

void holdings::consume(const item_consumed& c) {
    if (c.count <= 0) {
        throw std::invalid_argument("use of '" + c.item + "' by '" + c.player + "': count must be > 0, got " +
                                    std::to_string(c.count));
    }
    auto it = items.find(c.item);
    const std::int64_t held = it == items.end() ? 0 : it->second;
    if (held < c.count) {
        throw std::invalid_argument("'" + c.player + "' holds " + std::to_string(held) + " of '" + c.item +
                                    "', cannot consume " + std::to_string(c.count));
    }
    if (held == c.count) {
        items.erase(it);
    } else {
        it->second = held - c.count;
    }
}

idem::projection<scoreboard> leaderboard() {
    return idem::projection<scoreboard>(leaderboard_projection)
        .on<scored>([](scoreboard& b, const scored& s) { b.add(s); }, idem::strong_guarantee)
        .key([](const scored& s) { return s.match; });
}

idem::projection<holdings> inventory() {
    return idem::projection<holdings>(inventory_projection)
        .on<item_granted>([](holdings& h, const item_granted& g) { h.grant(g); }, idem::strong_guarantee)
        .on<item_consumed>([](holdings& h, const item_consumed& c) { h.consume(c); }, idem::strong_guarantee)
        .key([](const item_granted& g) { return g.player; })
        .key([](const item_consumed& c) { return c.player; });
}

}  // namespace idem::examples
