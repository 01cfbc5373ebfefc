#pragma once

// Setting a JetStream source up before it fetches: the durable consumer created or bound (its
// settings checked), the redelivery bound read from its configuration, and the stored
// checkpoint checked against the stream as it is now.

#include "connection.hpp"

#include <idem/sources/jetstream.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace idem::jetstream::detail {

/// The consumer's configuration as the server holds it, in the units idem uses.
struct consumer_config {
    std::chrono::nanoseconds ack_wait{0};
    std::int64_t max_deliver = -1;
    std::vector<std::chrono::nanoseconds> backoff;
    std::int64_t max_ack_pending = 0;
    std::string filter_subject;

    /// How long the server waits for an ack of delivery k (1-based) before delivering again.
    std::chrono::nanoseconds wait_after(std::int64_t k) const;
};

/// Creates the durable consumer if it does not exist, or binds to it and checks that what the
/// settings give matches it; returns its configuration.
consumer_config ensure_consumer(const connection& c, const source_options& o);

/// The configuration of a consumer as the server reported it, in idem's units.
consumer_config settings_of(const jsConsumerInfo& ci);

/// Returns the redelivery bound of a consumer with the source's nak delay, or throws
/// errc::invalid_argument when it is unbounded (max_deliver -1) and no explicit bound is given.
redelivery_bound bound_of(const consumer_config& cc, const source_options& o);

/// The stream as the checkpoint needs it.
struct stream_state {
    std::uint64_t first_sequence = 0;
    std::uint64_t last_sequence = 0;
    std::int64_t created = 0;  ///< ns since the epoch: a stream deleted and recreated has another
};

/// Reads the stream's state; throws errc::broker_failed naming the stream if it does not exist.
stream_state read_stream(const connection& c, const std::string& stream);

/// A checkpoint's detail: which incarnation of the stream its position counts in.
std::string checkpoint_detail(const stream_state& s);

/// Returns the sequence of the stream's first message after sequence `after` whose subject
/// matches filter (every subject when empty), or nullopt when there is none: what a consumer
/// with that filter would deliver next. Deleted messages and other subjects are skipped.
std::optional<std::uint64_t> next_matching(const connection& c, const std::string& stream, const std::string& filter,
                                           std::uint64_t after);

/// Why the stream no longer holds everything after position that a consumer has not yet been
/// given (recreated, purged or trimmed past it, or its last sequence below it), "" if it does.
std::string stream_change(const stream_state& now, std::uint64_t position, const std::string& detail,
                          const source_options& o);

/// Checks a stored checkpoint (position and detail) against the stream now: throws
/// errc::stream_changed when the stream went back behind it (recreated, or purged past it, or
/// its last sequence below it), naming both, unless accept is set.
void check_stream(const stream_state& now, std::uint64_t position, const std::string& detail,
                  const source_options& o, bool accept);

}  // namespace idem::jetstream::detail
