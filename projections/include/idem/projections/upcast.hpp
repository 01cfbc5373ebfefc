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
#include <memory>
#include <string>
#include <string_view>
#include <typeindex>

namespace idem {

/// One step of an event type's chain: lifts `data` of (type, from) to (to_type, from + 1).
struct upcaster {
    std::string type;        ///< the CloudEvents type it reads
    std::uint32_t from = 1;  ///< the version it reads; it writes version from + 1
    std::string to_type;     ///< the type it writes ("" = the same type)
    /// The data's JSON text at `from` -> the JSON text at from + 1. A pure function; what it
    /// throws dead-letters the event as upcast_failed (with its message).
    std::function<std::string(std::string_view data)> lift;

    /// A typed step (upcast_step) also lifts decoded events, so that a chain of typed steps
    /// decodes the data once and hands the last one's result to the handlers that take its
    /// type, writing no JSON in between.
    struct typed {
        std::type_index from = typeid(void);  ///< the event type it reads
        std::type_index to = typeid(void);    ///< the event type it returns
        std::function<std::shared_ptr<const void>(std::string_view data)> decode;  ///< data -> from
        std::function<std::shared_ptr<const void>(const void* event)> lift;        ///< from -> to
        std::function<std::string(const void* event)> encode;                      ///< to -> JSON
    };
    typed objects{};  ///< empty functions: the step reads and writes JSON only
};

/// A typed step: decodes From from the data (its cereal serialize(), as a handler's event is
/// decoded), calls fn(const From&) -> To, and hands To on (written as JSON through its
/// serialize() where a JSON step or a handler of another type needs it).
template <class From, class To, class F>
upcaster upcast_step(std::string type, std::uint32_t from, F fn, std::string to_type = {}) {
    upcaster u{std::move(type), from, std::move(to_type), {}, {}};
    u.objects.from = typeid(From);
    u.objects.to = typeid(To);
    u.objects.decode = &detail::decode_event<From>;
    u.objects.lift = [fn](const void* event) -> std::shared_ptr<const void> {
        return std::make_shared<const To>(fn(*static_cast<const From*>(event)));
    };
    u.objects.encode = [](const void* event) {
        std::string out;
        detail::write_json(*static_cast<const To*>(event), out);
        return out;
    };
    u.lift = [lift = u.objects.lift, encode = u.objects.encode](std::string_view data) {
        auto decoded = detail::decode_event<From>(data);
        return encode(lift(decoded.get()).get());
    };
    return u;
}

}  // namespace idem
