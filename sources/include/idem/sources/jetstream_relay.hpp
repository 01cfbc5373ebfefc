#pragma once

// The transactional outbox to NATS JetStream (`idem relay`): a store's change feed (docs/CHANGES.md)
// published to a stream, each row change one message, so that other services (another idem
// among them) follow a read model as it changes. The store's commit is the outbox: a change is
// recorded in the transaction that made it, and the relay, a reader in any process, publishes it.
//
//   idem::jetstream::relay_options ro;
//   ro.servers = {"nats://127.0.0.1:4222"};
//   ro.db = "orders.db";
//   ro.stream = "CHANGES";
//   ro.prefix = "changes";                 // subjects changes.<projection>.<key>
//   ro.projections = {&order_totals};      // renders each row's state as JSON
//   auto r = idem::jetstream::relay(ro);   // until caught up (ro.follow: until *ro.stop)
//
// A row change becomes a CloudEvents 1.0 JSON envelope, published to subject
// `<prefix>.<projection token>.<key token>` (tokens as subject_token() makes them: bytes outside
// 0x21-0x7E and '.', '*', '>', '%' percent-encoded, "%2E" for a dot; "events" for an empty text,
// "%65vents" for "events" itself; subject_of_token() reverses it):
//
//   {"specversion":"1.0","id":"<store id>/<projection>/<key>/<version>",
//    "source":"idem://<store id>/<projection>","type":"idem.change.<projection>",
//    "subject":"<key>","sequence":<version>,"time":"<commit time, RFC 3339>",
//    "datacontenttype":"application/json","idemposition":"<commit>.<index>","data":<state JSON>}
//
// with header Nats-Msg-Id = the id, percent-encoded as `idem publish` encodes ids (bytes outside
// 0x21-0x7E and '%'). `sequence` is the row's version: a downstream idem orders a key's changes
// by it; versions skip when one commit changed a row more than once, so the downstream must apply
// gaps (`idem consume --gaps apply`, gap_policy::apply), not park them: an older version coming
// after a newer one is then a duplicate, and the newer state wins.
//
// A reset entry (a rebuild replaced the projection's rows) becomes an event of type
// `idem.reset.<projection>` on subject `<prefix>.<projection token>`, without subject or
// sequence, id "<store id>/<projection>/reset/<commit>.<index>", data
// {"projection":...,"position":...}: a downstream that keeps the rows re-reads them (a dump of
// the store, then the changes after that position); one that does not handle the type
// dead-letters it (the `idem` tool's consumers), so the reset is never passed over silently.
//
// Position: the relay keeps none of its own (the store has one writer, and the relay only reads
// it). It starts after the position the stream itself says was published: the smallest
// `idemposition` among the stream's last 2 x max_pending messages on `<prefix>.>` (a failed
// publish resent later may have been stored after up to a window of later ones; the relay does
// not send past a failure until it is resent), so nothing published is lost across a kill, and
// what is published again is dropped by the stream's Duplicates window (counted in `duplicates`)
// or, past it, by the downstream's inbox and sequence. The stream should hold only the relay's
// subjects. A stream whose messages name another store is refused; an empty one starts at the
// oldest entry the feed keeps. A feed pruned past the stream's position is errc::changes_pruned:
// the downstream must be seeded anew.
//
// Publishing goes through the same window as `idem publish` (max_pending acks outstanding, a
// failed publish sent again under its id until acked or retry_for has passed, never skipped).
// Needs the meson feature `jetstream` (cnats).

#include <idem/projections/snapshot.hpp>
#include <idem/sources/jetstream_publish.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace idem::jetstream {

/// What to relay, where.
struct relay_options : stream_publishing {
    /// nats://host:port, one or more of a cluster; an entry may hold several, comma-separated.
    std::vector<std::string> servers;
    std::filesystem::path db;                ///< the store whose change feed is published
    std::string stream;                      ///< the stream (created with subject "<prefix>.>" if missing)
    std::string prefix;                      ///< the subjects' first tokens (no wildcard)
    std::optional<std::string> projection;   ///< only this projection's changes (unset: all)
    /// The projections whose states are published (their JSON): a row change of a projection not
    /// among them is errc::invalid_argument naming it.
    std::vector<const projection_base*> projections;
    bool follow = false;                     ///< keep publishing new commits until *stop
    const std::atomic<bool>* stop = nullptr; ///< set to stop after the acks in flight (may be null)
    std::chrono::milliseconds poll{100};     ///< following, how often an idle feed is read again
    std::size_t read_limit = 1000;           ///< entries read per step, whole commits
};

/// What a relay did.
struct relay_result {
    std::string store_id;              ///< the store relayed
    std::string resumed_after;         ///< the position the stream held at the start ("": none, from the oldest kept)
    std::string last_position;         ///< the last entry read ("": none)
    std::uint64_t entries = 0;         ///< feed entries read (all projections)
    std::uint64_t changes = 0;         ///< row changes published
    std::uint64_t resets = 0;          ///< reset events published
    std::uint64_t published = 0;       ///< messages acknowledged by the stream (stored + duplicates)
    std::uint64_t stored = 0;          ///< of them, stored as new messages
    std::uint64_t duplicates = 0;      ///< of them, dropped by the stream's Duplicates window
    std::uint64_t retries = 0;         ///< publishes sent again after a failure or a missing ack
    std::uint64_t first_sequence = 0;  ///< the lowest stream sequence stored by this run (0: none)
    std::uint64_t last_sequence = 0;   ///< the highest stream sequence stored by this run (0: none)
    bool stream_created = false;       ///< the stream did not exist and was created
    std::chrono::nanoseconds duplicates_window{0};  ///< the stream's Duplicates window
    std::chrono::nanoseconds elapsed{0};
};

/// Publishes the change feed of options.db to options.stream from where the stream says it
/// stopped, until the feed is read to its end (or, following, until *options.stop), then waits
/// for the acks in flight.
///
/// Throws std::system_error: errc::invalid_argument for a prefix, stream or projection that cannot
/// be used, or a stream holding another store's changes (naming them); errc::changes_pruned when
/// the feed no longer holds the entries after the stream's position; errc::broker_failed when no
/// server answers or a publish still fails after retry_for (naming the position); the store's
/// errors naming the path.
relay_result relay(const relay_options& options);

}  // namespace idem::jetstream
