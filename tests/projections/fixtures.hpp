#pragma once

// Shared helpers of the projections tests: a temporary directory that removes itself,
// the event and state types of the order examples, envelope and delivery builders,
// and a dump of a projection's rows for "nothing changed" comparisons.

#include <idem/projections/store.hpp>
#include <idem/storage/envelope.hpp>

#include <doctest/doctest.h>

#include "../common/temp_dir.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

namespace idem_test {

using idem::test::temp_dir;

/// The consumer every test uses.
inline constexpr const char* consumer = "projector";

/// Store options for a test: durability::none (speed) unless asked otherwise.
inline idem::store_options options(const std::filesystem::path& path, idem::durability sync = idem::durability::none) {
    idem::store_options o;
    o.path = path;
    o.consumer = consumer;
    o.sync = sync;
    return o;
}

// --- events and states ------------------------------------------------------

/// An order line: the amount is added to the order's total.
struct line_added {
    static constexpr const char* event_type = "order.line_added";
    std::string order_id;
    std::int64_t amount = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(amount));
    }
};

/// An order was opened (the order projections do not handle it).
struct order_created {
    static constexpr const char* event_type = "order.created";
    std::string order_id;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id));
    }
};

/// A trading fill: exec_id is the venue's idempotency key.
struct fill {
    static constexpr const char* event_type = "trade.fill";
    std::string account;
    std::string exec_id;
    std::int64_t qty = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(account), CEREAL_NVP(exec_id), CEREAL_NVP(qty));
    }
};

/// One order's read model; `sequences` records the stream positions in the order they were applied.
struct order_total {
    std::int64_t total = 0;
    std::int64_t lines = 0;
    std::vector<std::uint64_t> sequences;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(total, lines, sequences);
    }
};

/// A position: the sum of fill quantities of an account.
struct position {
    std::int64_t qty = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(qty);
    }
};

inline void add_line(order_total& t, const line_added& e, const idem::meta& m) {
    t.total += e.amount;
    t.lines += 1;
    if (m.sequence) t.sequences.push_back(*m.sequence);
}

/// "order-totals": rows keyed by the payload's order_id.
inline idem::projection<order_total> totals_by_order(std::string name = "order-totals") {
    return idem::projection<order_total>(std::move(name))
        .on<line_added>([](order_total& t, const line_added& e, const idem::meta& m) { add_line(t, e, m); })
        .key([](const line_added& e) { return e.order_id; });
}

/// "order-streams": rows keyed by the event's subject (the default key), one row per stream.
inline idem::projection<order_total> totals_by_subject(std::string name = "order-streams") {
    return idem::projection<order_total>(std::move(name))
        .on<line_added>([](order_total& t, const line_added& e, const idem::meta& m) { add_line(t, e, m); });
}

// --- envelopes and deliveries -----------------------------------------------

/// An order.line_added event for order (also its subject), with an optional stream sequence.
inline idem::envelope line(std::string id, const std::string& order, std::int64_t amount,
                           std::optional<std::uint64_t> sequence = std::nullopt, std::string source = "/orders") {
    idem::envelope e;
    e.id = std::move(id);
    e.source = std::move(source);
    e.type = line_added::event_type;
    e.subject = order;
    e.sequence = sequence;
    e.data = R"({"order_id":)";
    idem::append_json_string(e.data, order);
    e.data += R"(,"amount":)" + std::to_string(amount) + "}";
    return e;
}

/// An order.created event for order, with an optional stream sequence.
inline idem::envelope created(std::string id, const std::string& order,
                              std::optional<std::uint64_t> sequence = std::nullopt) {
    idem::envelope e;
    e.id = std::move(id);
    e.source = "/orders";
    e.type = order_created::event_type;
    e.subject = order;
    e.sequence = sequence;
    e.data = R"({"order_id":")" + order + R"("})";
    return e;
}

/// A trade.fill event.
inline idem::envelope fill_event(std::string id, const std::string& account, const std::string& exec_id,
                                 std::int64_t qty, std::string source = "/venue-a") {
    idem::envelope e;
    e.id = std::move(id);
    e.source = std::move(source);
    e.type = fill::event_type;
    e.subject = account;
    e.data = R"({"account":")" + account + R"(","exec_id":")" + exec_id + R"(","qty":)" + std::to_string(qty) + "}";
    return e;
}

/// A delivery of e's JSON with a transport message id ("" to let the envelope identify it).
inline idem::delivery deliver(const idem::envelope& e, std::string message_id = {}) {
    return idem::delivery{e.to_json(), std::move(message_id)};
}

// --- reading back -----------------------------------------------------------

/// What a test compares of a row: its state and its version.
struct row_summary {
    std::int64_t total = 0;
    std::int64_t lines = 0;
    std::uint64_t version = 0;
    std::vector<std::uint64_t> sequences;
    friend bool operator==(const row_summary&, const row_summary&) = default;
};

/// Every row of an order_total projection, by key.
inline std::map<std::string, row_summary> dump(const idem::snapshot& snap, std::string_view projection) {
    std::map<std::string, row_summary> out;
    snap.scan<order_total>(projection, [&](const idem::row<order_total>& r) {
        out[r.key] = row_summary{r.state.total, r.state.lines, r.version, r.state.sequences};
    });
    return out;
}

/// The reference: per order, the total and line count of the distinct events given.
struct reference {
    std::map<std::string, row_summary> rows;
    void add(const std::string& order, std::int64_t amount, std::optional<std::uint64_t> sequence = std::nullopt) {
        auto& r = rows[order];
        r.total += amount;
        r.lines += 1;
        r.version += 1;
        if (sequence) r.sequences.push_back(*sequence);
    }
};

/// Counts outcomes by kind.
inline std::map<idem::outcome_kind, std::size_t> count(const std::vector<idem::outcome>& outcomes) {
    std::map<idem::outcome_kind, std::size_t> out;
    for (const auto& o : outcomes) ++out[o.kind];
    return out;
}

}  // namespace idem_test

// Readable failure messages for the enums tests compare.
template <>
struct doctest::StringMaker<idem::outcome_kind> {
    static doctest::String convert(idem::outcome_kind k) { return std::string(idem::to_string(k)).c_str(); }
};
template <>
struct doctest::StringMaker<idem::reason> {
    static doctest::String convert(idem::reason r) { return std::string(idem::to_string(r)).c_str(); }
};
template <>
struct doctest::StringMaker<idem_test::row_summary> {
    static doctest::String convert(const idem_test::row_summary& r) {
        std::string s = "{total " + std::to_string(r.total) + ", lines " + std::to_string(r.lines) + ", version " +
                        std::to_string(r.version) + ", sequences [";
        for (std::size_t i = 0; i < r.sequences.size(); ++i) {
            if (i > 0) s += ",";
            s += std::to_string(r.sequences[i]);
        }
        return (s + "]}").c_str();
    }
};
template <>
struct doctest::StringMaker<std::map<std::string, idem_test::row_summary>> {
    static doctest::String convert(const std::map<std::string, idem_test::row_summary>& rows) {
        std::string s = "{";
        for (const auto& [k, v] : rows) {
            s += " " + k + ": " + doctest::StringMaker<idem_test::row_summary>::convert(v).c_str();
        }
        return (s + " }").c_str();
    }
};
