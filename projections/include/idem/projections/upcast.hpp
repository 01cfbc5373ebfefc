#pragma once

// Event upcasting: reading an old event as a new one. A step lifts the data of one version
// of an event type to the next version (and may rename the type); a store chains the steps of
// a type and lifts every event before its handlers see it, on every path (live, consume,
// rebuild, verify). The version of an event is envelope::schema_version() (its `dataschema`).
// The event's identity is untouched: its message id, event id, sequence and default effect
// key stay those of the event as delivered, so an event and its republication at a newer
// version are the same event.
//
//   store.upcast(idem::upcast_step<line_added_v1, line_added>(
//       "order.line_added", 1, [](const line_added_v1& e) { return line_added{e.order_id, {e.amount, "EUR"}}; }));

#include <idem/projections/projection.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace idem {

/// One step of an event type's chain: lifts `data` of (type, from) to (to_type, from + 1).
struct upcaster {
    std::string type;     ///< the CloudEvents type it reads
    std::uint32_t from = 1;  ///< the version it reads; it writes version from + 1
    std::string to_type;  ///< the type it writes ("" = the same type)
    /// The data's JSON text at `from` -> the JSON text at from + 1. A pure function; what it
    /// throws dead-letters the event as upcast_failed (with its message).
    std::function<std::string(std::string_view data)> lift;
};

/// A typed step: decodes From from the data (its cereal serialize(), as a handler's event is
/// decoded), calls fn(const From&) -> To and writes To as JSON through its serialize().
template <class From, class To, class F>
upcaster upcast_step(std::string type, std::uint32_t from, F fn, std::string to_type = {}) {
    upcaster u{std::move(type), from, std::move(to_type), {}};
    u.lift = [fn = std::move(fn)](std::string_view data) {
        auto decoded = detail::decode_event<From>(data);
        const To lifted = fn(*static_cast<const From*>(decoded.get()));
        std::string out;
        detail::write_json(lifted, out);
        return out;
    };
    return u;
}

}  // namespace idem
