#pragma once

// The trading domain: fills from venues become per-account positions.
//
//   order.filled {account, instrument, side, qty, price, exec_id}
//       ->  positions["account/instrument"] = {qty, avg_price, realized_pnl, cost}
//
// A venue may send the same execution twice under different event ids (a drop copy, a
// reconnect): the projection's effect key is the exec_id, so a fill counts once per row
// however it arrives. Quantities are integers and prices integer ticks, so positions
// are exact: `cost` is the exact signed cost of the open quantity (never rounded), and
// `avg_price` is only its display rounding.

#include <idem/projections/projection.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace idem::examples {

/// The name of the trading projection (its table is "proj/positions").
inline constexpr const char* positions_projection = "positions";

/// An execution reported by a venue: CloudEvents type `order.filled`.
struct fill {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "order.filled";

    std::string account;     ///< the trading account
    std::string instrument;  ///< the instrument's symbol
    std::string side;        ///< "buy" or "sell"
    std::int64_t qty = 0;    ///< units filled, > 0
    std::int64_t price = 0;  ///< price per unit in ticks
    std::string exec_id;     ///< the venue's execution id: the business idempotency key

    /// Returns the row this fill changes: "account/instrument".
    std::string key() const;
    /// Returns qty signed by side (buy > 0, sell < 0); throws std::invalid_argument for a
    /// side other than "buy"/"sell" or a qty <= 0.
    std::int64_t signed_qty() const;

    /// Reads or writes the payload's fields; the names are the JSON `data` object's.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(account), CEREAL_NVP(instrument), CEREAL_NVP(side), CEREAL_NVP(qty), CEREAL_NVP(price),
           CEREAL_NVP(exec_id));
    }
};

/// One row of `positions`: a net position with average-cost accounting.
///
/// - `qty` is signed: long > 0, short < 0, 0 flat.
/// - `cost` is the exact signed cost of the open quantity in ticks x units (same sign as
///   qty, 0 when flat).
/// - `avg_price` is cost / qty rounded to the nearest tick, halves away from zero; 0 when flat.
/// - Reducing an open position by c of its |qty| units releases cost x c / |qty| of its
///   cost, truncated toward zero (all of it when the position closes), and adds
///   c x price - released (long) or released - c x price (short) to `realized_pnl`. The
///   truncation's remainder stays in `cost`, so once a position is flat its realized PnL
///   is exactly its sales minus its purchases. A fill larger than the open quantity closes
///   it and opens the rest on the other side at the fill's price (a flip).
struct position {
    std::int64_t qty = 0;           ///< net units, signed
    std::int64_t avg_price = 0;     ///< display rounding of cost / qty, ticks
    std::int64_t realized_pnl = 0;  ///< profit realized by reducing fills, ticks x units
    std::int64_t cost = 0;          ///< exact signed cost of the open quantity, ticks x units

    /// Applies a fill. Throws std::invalid_argument for a bad side or qty <= 0, and
    /// std::overflow_error if a result leaves 64 bits; the position is then unchanged.
    void apply(const fill& f);
    /// Applies a signed quantity (buy > 0, sell < 0) at a price; same errors and guarantee.
    void apply(std::int64_t signed_qty, std::int64_t price);

    /// Reads or writes the state; the names are what `idem get` prints.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(qty), CEREAL_NVP(avg_price), CEREAL_NVP(realized_pnl), CEREAL_NVP(cost));
    }
};

/// Returns the key of an account's position in an instrument: "account/instrument".
std::string position_key(std::string_view account, std::string_view instrument);

/// Returns the `positions` projection: `order.filled` keyed "account/instrument", effect key exec_id.
idem::projection<position> positions();

}  // namespace idem::examples
