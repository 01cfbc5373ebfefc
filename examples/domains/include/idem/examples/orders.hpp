#pragma once

// The orders domain, the textbook case: order lines arrive with at-least-once delivery,
// and the `order-totals` read model must count every line exactly once.
//
//   order.line_added {order_id, amount: {minor, currency}}  ->  order-totals[order_id] = {total, lines, currency}
//
// Amounts are integers in minor units (cents), so every total is exact. The domain has evolved
// once, as the worked example of schema evolution: version 1 of order.line_added (no
// dataschema) carried a bare amount, always in EUR, and rows of state version 1 had no
// currency. One upcaster lifts version 1 events; one migration reads version 1 rows.

#include <idem/projections/projection.hpp>
#include <idem/projections/upcast.hpp>

#include <cstdint>
#include <string>

namespace idem::examples {

/// The name of the orders projection (its table is "proj/order-totals").
inline constexpr const char* order_totals_projection = "order-totals";

/// An amount of money: minor units (may be negative: a refund line) and its ISO 4217 currency.
struct money {
    std::int64_t minor = 0;
    std::string currency;

    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(minor), CEREAL_NVP(currency));
    }
};

/// An order line was added: CloudEvents type `order.line_added`, version 2 (its envelope's
/// dataschema is `urn:idem:example:order.line_added:2`).
struct line_added {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "order.line_added";
    /// The dataschema of this version.
    static constexpr const char* dataschema = "urn:idem:example:order.line_added:2";

    std::string order_id;  ///< the order, and the `order-totals` row the line changes
    money amount;          ///< the line's amount

    /// Reads or writes the payload's fields; the names are the JSON `data` object's.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(amount));
    }
};

/// Version 1 of `order.line_added` (no dataschema): the amount in minor units, always EUR.
struct line_added_v1 {
    std::string order_id;
    std::int64_t amount = 0;

    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(amount));
    }
};

/// One row of `order-totals`: the sum of an order's lines, how many there were, and their currency.
struct order_total {
    /// The state version of this layout (rows of version 1 are migrated from order_total_v1).
    static constexpr std::uint32_t state_version = 2;

    std::int64_t total = 0;  ///< sum of the amounts, minor units
    std::int64_t lines = 0;  ///< number of lines counted
    std::string currency;    ///< the currency of every line ("" before the first)

    /// Adds a line; throws std::overflow_error if the total leaves 64 bits, std::invalid_argument
    /// for a line in another currency than the order's (the event is dead-lettered).
    void add(const line_added& line);

    /// Reads or writes the state; the names are what `idem get` prints.
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(total), CEREAL_NVP(lines), CEREAL_NVP(currency));
    }
};

/// A row of `order-totals` at state version 1.
struct order_total_v1 {
    std::int64_t total = 0;
    std::int64_t lines = 0;

    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(total), CEREAL_NVP(lines));
    }
};

/// Returns the `order-totals` projection: `order.line_added` (version 2) keyed by order_id, at
/// state version 2, reading version 1 rows as EUR.
idem::projection<order_total> order_totals();

/// Returns the upcaster of `order.line_added` version 1 to version 2 (the amount in EUR).
idem::upcaster order_line_upcaster();

/// The name of the downstream copy of `order-totals` (its table is "proj/order-totals-copy").
inline constexpr const char* order_totals_copy_projection = "order-totals-copy";

/// A row of `order-totals` changed in an upstream store: what `idem relay` publishes, CloudEvents
/// type `idem.change.order-totals`, subject the order, sequence the row's version, data the row.
struct order_total_changed {
    /// The CloudEvents type this payload travels under.
    static constexpr const char* event_type = "idem.change.order-totals";

    std::int64_t total = 0;
    std::int64_t lines = 0;
    std::string currency;

    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(total), CEREAL_NVP(lines), CEREAL_NVP(currency));
    }
};

/// Returns the `order-totals-copy` projection: another service's read model fed by an upstream
/// store's changes (`idem relay`), each order's latest `order-totals` row, keyed by the event's
/// subject. Consumed with gap_policy::apply (versions skip), an older version arriving after a
/// newer one is a duplicate, so the row is the newest state whatever the delivery order.
idem::projection<order_total> order_totals_copy();

}  // namespace idem::examples
