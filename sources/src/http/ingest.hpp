#pragma once

// What a POST /events request carries, as deliveries for the engine: the request's signature
// checked against the configured senders, then its CloudEvents read in the binding's mode
// (structured, binary, batched) or its webhook body wrapped by the sender's mapping. No
// Beast here: the server hands over the header fields and the raw body bytes.

#include <idem/projections/store.hpp>
#include <idem/sources/http.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::http::detail {

/// A request's header fields as received.
struct header_list {
    std::vector<std::pair<std::string_view, std::string_view>> fields;

    /// Returns the first field called name (case-insensitive), or nullopt.
    std::optional<std::string_view> get(std::string_view name) const;
};

/// The deliveries of a request, or why it is refused before anything is applied.
struct ingest {
    unsigned status = 0;             ///< 0: apply deliveries; else the answer (400, 401, 415)
    std::string error;               ///< names the request's fault when status is set
    std::vector<delivery> deliveries;
    bool batch = false;              ///< a CloudEvents batch: answered with one outcome per event
    std::string sender;              ///< the webhook sender whose signature matched ("" unsigned)
};

/// Reads a POST /events request. now is the wall clock in seconds since the epoch.
ingest read_events(const header_list& headers, std::string_view body, const std::vector<webhook_secret>& senders,
                   std::chrono::seconds now);

/// Returns text with its %XX escapes decoded (a malformed escape is kept as it is).
std::string percent_decode(std::string_view text);

}  // namespace idem::http::detail
