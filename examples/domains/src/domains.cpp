#include <idem/examples/domains.hpp>

#include "totals.hpp"

#include <idem/storage/error.hpp>

#include <stdexcept>
#include <type_traits>
#include <system_error>

namespace idem::examples {

namespace detail {

std::string format_totals(std::initializer_list<std::pair<const char*, std::int64_t>> fields) {
    std::string out = "{";
    for (const auto& [name, value] : fields) {
        if (out.size() > 1) out.push_back(',');
        out.push_back('"');
        out.append(name);
        out.append("\":");
        out.append(std::to_string(value));
    }
    out.push_back('}');
    return out;
}

}  // namespace detail

void add_all(idem::store& s, bool changes) {
    s.add(order_totals().changes(changes));
    s.upcast(order_line_upcaster());
    s.add(positions().changes(changes));
    s.add(leaderboard().changes(changes));
    s.add(inventory().changes(changes));
    s.add(order_totals_copy().changes(changes));
}

namespace {

// Scans a projection's rows; a database that never held the projection has none.
template <class State, class F>
void scan_rows(const idem::snapshot& snap, const char* projection, F&& fn) {
    try {
        if constexpr (std::is_same_v<State, order_total>) {
            snap.scan(order_totals(), fn);  // through its migrations: version 1 rows too
        } else {
            snap.scan<State>(projection, fn);
        }
    } catch (const std::system_error& e) {
        if (e.code() != idem::errc::unknown_projection) throw;
    }
}

}  // namespace

std::string domain_totals(const idem::snapshot& snap, std::string_view domain) {
    if (domain == "trading") {
        std::int64_t rows = 0, fills = 0, qty = 0, cost = 0, pnl = 0;
        scan_rows<position>(snap, positions_projection, [&](const idem::row<position>& r) {
            ++rows;
            fills += static_cast<std::int64_t>(r.version);
            qty += r.state.qty;
            cost += r.state.cost;
            pnl += r.state.realized_pnl;
        });
        return detail::format_totals(
            {{"positions", rows}, {"fills", fills}, {"qty", qty}, {"cost", cost}, {"realized_pnl", pnl}});
    }
    if (domain == "game") {
        std::int64_t matches = 0, scores = 0, points = 0, players = 0, item_events = 0, items = 0;
        scan_rows<scoreboard>(snap, leaderboard_projection, [&](const idem::row<scoreboard>& r) {
            ++matches;
            scores += static_cast<std::int64_t>(r.version);
            points += r.state.total;
        });
        scan_rows<holdings>(snap, inventory_projection, [&](const idem::row<holdings>& r) {
            ++players;
            item_events += static_cast<std::int64_t>(r.version);
            for (const auto& [item, count] : r.state.items) items += count;
        });
        return detail::format_totals({{"matches", matches},
                                      {"scores", scores},
                                      {"points", points},
                                      {"players", players},
                                      {"item_events", item_events},
                                      {"items", items}});
    }
    if (domain == "orders") {
        std::int64_t orders = 0, lines = 0, total = 0;
        scan_rows<order_total>(snap, order_totals_projection, [&](const idem::row<order_total>& r) {
            ++orders;
            lines += r.state.lines;
            total += r.state.total;
        });
        return detail::format_totals({{"orders", orders}, {"lines", lines}, {"total", total}});
    }
    throw std::invalid_argument("unknown domain '" + std::string(domain) + "' (trading, game or orders)");
}

}  // namespace idem::examples
