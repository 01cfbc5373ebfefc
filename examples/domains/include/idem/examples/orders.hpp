#pragma once

// The orders domain, the textbook case: order lines arrive with at-least-once delivery,
// and the `order-totals` read model must count every line exactly once.
//
//   order.line_added {order_id, amount}  ->  order-totals[order_id] = {total, lines}
//
// Amounts are integers in minor units (cents), so every total is exact.

#include <idem/projections/projection.hpp>

#include <cstdint>
#include <string>

namespace idem::examples {

/// The name of the orders projection (its table is "proj/order-totals").
inline constexpr const char* order_totals_projection = "order-totals";

/// An order line was added: CloudEvents type `order.line_added`.
struct line_added {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "order.line_added";

    std::string order_id;     ///< the order, and the `order-totals` row the line changes
    std::int64_t amount = 0;  ///< the line's amount in minor units (may be negative: a refund line)

    /// Reads or writes the payload's fields; the names are the JSON `data` object's.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(amount));
    }
};

/// One row of `order-totals`: the sum of an order's lines and how many there were.
struct order_total {
    std::int64_t total = 0;  ///< sum of the amounts, minor units
    std::int64_t lines = 0;  ///< number of lines counted

    /// Adds a line; throws std::overflow_error if the total leaves 64 bits.
    void add(const line_added& line);

    /// Reads or writes the state; the names are what `idem get` prints.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(total), CEREAL_NVP(lines));
    }
};

/// Returns the `order-totals` projection: `order.line_added` keyed by order_id.
idem::projection<order_total> order_totals();

}  // namespace idem::examples
