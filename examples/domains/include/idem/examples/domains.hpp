#pragma once

// The example domains in one include: orders, trading and game, their projections, and
// the totals a user can check a database against.
//
//   idem::store store{{.path = "data"}};
//   idem::examples::add_all(store);                        // every example projection
//   store.add(idem::examples::positions());                // or only the ones you need

#include <idem/examples/game.hpp>
#include <idem/examples/orders.hpp>
#include <idem/examples/trading.hpp>
#include <idem/projections/store.hpp>

#include <array>
#include <string>
#include <string_view>

namespace idem::examples {

/// The example domains' names, as `idem gen --domain` takes them.
inline constexpr std::array<std::string_view, 3> domain_names{"trading", "game", "orders"};

/// Adds the example projections to a store as the `idem` tool has them (order-totals, positions,
/// leaderboard, inventory, and order-totals-copy fed by relayed changes), recording their
/// changes in the change feed if changes (as the tool's do).
void add_all(idem::store& s, bool changes = false);

/// Returns a domain's totals over a snapshot's rows as compact JSON, the same text
/// generate() predicts in gen_result::totals_json:
/// - trading: {"positions":rows,"fills":applied fills,"qty":sum,"cost":sum,"realized_pnl":sum}
/// - game: {"matches":rows,"scores":applied scores,"points":sum of totals,
///          "players":inventory rows,"item_events":applied item events,"items":items held}
/// - orders: {"orders":rows,"lines":sum,"total":sum}
/// A projection the database does not hold counts as empty. Throws std::invalid_argument
/// for an unknown domain.
std::string domain_totals(const idem::snapshot& snap, std::string_view domain);

}  // namespace idem::examples
