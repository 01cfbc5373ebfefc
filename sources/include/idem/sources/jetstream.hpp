#pragma once

// The NATS JetStream source: a durable pull consumer whose messages the engine applies, each
// acknowledged only after the commit that recorded its outcome is durable.
//
//   idem::jetstream::source_options so;
//   so.servers = {"nats://127.0.0.1:4222"};
//   so.stream = "ORDERS";
//   so.consumer = "positions";            // the durable: created if missing, bound if it exists
//   idem::jetstream::source src{so};      // connects, sets the consumer up, reads its redelivery bound
//
//   idem::engine_options eo;
//   eo.store.path = "data";
//   eo.store.retention.inbox_retention = std::chrono::hours(24);
//   eo.store.retention.source = src.bound();  // the store refuses a retention shorter than the bound
//   idem::engine e{io.get_executor(), eo};
//   e.add(positions());
//   auto result = src.run(e);             // until stop(), or caught up with until_caught_up
//
// Identity: a message's id is its Nats-Msg-Id header, else the envelope's source + id; never the
// stream sequence (a republished event gets a new one). The stream sequence is the checkpoint
// ("nats:<stream>/<consumer>"), the highest one whose outcome is committed, in the same
// transaction as the change. Needs the meson feature `jetstream` (cnats).

#include <idem/engine/engine.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::jetstream {

/// The durable consumer's delivery settings. When the source creates the consumer, what is
/// unset takes the default given here; when it binds to an existing one, what is unset is
/// taken from it and what is set must match (a difference is refused, naming it: a consumer
/// is changed on purpose, not by starting a process with other flags).
struct consumer_settings {
    std::optional<std::chrono::nanoseconds> ack_wait{};  ///< redelivered if not acked within (default 30 s)
    std::optional<std::int64_t> max_deliver{};           ///< deliveries at most; -1: unlimited (default 5)
    /// Redelivery delays, replacing ack_wait after each delivery (the last one repeats); needs a
    /// max_deliver above their number. Default none.
    std::optional<std::vector<std::chrono::nanoseconds>> backoff{};
    std::optional<std::int64_t> max_ack_pending{};  ///< delivered and not acked at most: the engine's window (default 1000)
};

/// One acknowledgement, as it leaves (for tests and audits: on_ack).
struct ack_event {
    std::uint64_t stream_sequence = 0;
    std::uint64_t delivered = 0;     ///< which delivery of the message this was (1: the first)
    std::string message_id;          ///< the Nats-Msg-Id header, "" if none
    bool acked = true;               ///< false: nak'd (a storage failure; it will be redelivered)
    outcome result;                  ///< the committed outcome (acked) or none (nak'd)
    std::uint64_t durable_commit = 0;  ///< the engine's durable commit when the ack was sent
};

/// The broker went out of reach, or came back (for logs: source_options::on_broker).
struct broker_event {
    bool reachable = false;             ///< false: an outage began; true: it ended
    std::string failure;                ///< when it began: the failure that showed it
    std::chrono::nanoseconds lasted{0}; ///< when it ended: how long it lasted
    std::chrono::nanoseconds limit{0};  ///< how long an outage may last before the source gives up
};

/// How long a source (or a publisher) waits for a broker out of reach by default.
inline constexpr std::chrono::milliseconds default_broker_outage_limit{std::chrono::seconds(60)};

/// Options of a JetStream source.
struct source_options {
    std::vector<std::string> servers;  ///< nats://host:port, one or more of a cluster
    std::string stream;                ///< the stream to consume (must exist)
    std::string consumer;              ///< the durable consumer's name
    std::string filter_subject{};      ///< only these subjects ("" = the whole stream)
    /// A consumer the source creates delivers from this stream sequence (0 or 1: from the start);
    /// an existing one must not start later. For an owner that resumes from its checkpoint.
    std::uint64_t start_sequence = 0;
    /// The checkpoint's source name ("" = checkpoint_source(stream, consumer)): a partition keeps
    /// one name while the durable consumer that feeds it changes with each owner.
    std::string checkpoint_name{};
    consumer_settings settings{};
    /// The redelivery bound when the consumer's settings give none (max_deliver -1): how long
    /// after a first delivery the stream may deliver the same message again.
    std::optional<std::chrono::nanoseconds> redelivery_bound{};
    std::size_t fetch_batch = 256;                            ///< messages per fetch at most
    std::chrono::milliseconds fetch_wait{500};                ///< how long an empty fetch waits (below ack_wait)
    std::chrono::milliseconds nak_delay{1000};                ///< a storage failure's redelivery delay
    bool ack_sync = false;  ///< wait for the server to confirm each ack (a round trip per message)
    /// Resume although the stream went back behind the checkpoint (purged, deleted and
    /// recreated): the stream is taken as it is now and the checkpoint follows it.
    bool accept_stream_reset = false;
    /// Start although an earlier run stopped with errc::delivery_exhausted: the messages it
    /// named are taken as handled (published again, or given up), and its record is removed.
    /// Without it, run() refuses to start while that record is in the store's directory.
    bool accept_exhausted = false;
    /// Stop once the checkpoint has reached the stream's last sequence as it was when run() began.
    bool until_caught_up = false;
    /// With until_caught_up: how long the run waits, connected and with nothing delivered, for the
    /// consumer to reach that sequence before it stops with an error naming what it waited for
    /// (unset: twice the consumer's longest redelivery wait, AckWait or BackOff delay, and at
    /// least 60 s). A stream whose replicas disagree may never let it get there.
    std::optional<std::chrono::milliseconds> caught_up_wait{};
    /// With until_caught_up: told what the run waits for, every 5 s while nothing is delivered
    /// and it has not caught up (on the run's thread).
    std::function<void(const std::string&)> on_waiting{};
    /// Claim the durable consumer for this store while run() runs: a key in the KV bucket
    /// "idem-claims", renewed every quarter of claim_ttl, given up when run() returns; a second
    /// store on the same consumer is refused, naming the holder, and no ack is sent once the
    /// claim may have expired. Off for a partition, whose lease fences it.
    bool claim = true;
    /// How long a claim outlives its last renewal (a killed holder's): the bucket's TTL when it
    /// creates the bucket; an existing bucket keeps its own.
    std::chrono::milliseconds claim_ttl{10000};
    const std::atomic<bool>* stop = nullptr;  ///< checked between fetches: stops after the batch in hand, acked
    /// Called for every ack and nak just before it is sent, on the engine's executor.
    std::function<void(const ack_event&)> on_ack{};
    /// How long the broker may be out of reach (disconnected, refusing connections, its
    /// JetStream API timing out or without responders, its cluster without a leader) before
    /// the constructor or run() gives up with errc::broker_failed. Meanwhile the source
    /// reconnects and retries with back-off.
    std::chrono::milliseconds broker_outage_limit = default_broker_outage_limit;
    /// Called when the broker goes out of reach and when it is back, on the thread of the
    /// constructor or of run().
    std::function<void(const broker_event&)> on_broker{};
};

/// What a run did.
struct source_result {
    std::uint64_t fetched = 0;      ///< messages received (redeliveries included)
    std::uint64_t redelivered = 0;  ///< of them, deliveries after the first
    std::uint64_t acked = 0;
    std::uint64_t nakked = 0;
    std::array<std::uint64_t, outcome_kinds> outcomes{};  ///< acked messages by outcome
    std::uint64_t last_sequence = 0;  ///< the checkpoint when the run ended (the stored one if nothing came)
    std::uint64_t disconnects = 0;    ///< times the connection to the broker was lost (and regained)
    std::uint64_t broker_outages = 0; ///< times the broker was out of reach and waited for (broker_event)
    std::chrono::nanoseconds elapsed{0};
};

/// A JetStream source: one durable pull consumer applied through one engine.
class source {
public:
    /// Connects, checks that the stream exists, creates the durable consumer or binds to it
    /// (refusing settings that differ), and computes the redelivery bound. Throws
    /// std::system_error (errc::broker_failed, errc::invalid_argument) naming the cause.
    explicit source(source_options options);
    ~source();
    source(const source&) = delete;
    source& operator=(const source&) = delete;

    /// How long after its first delivery a message may be delivered again, from the consumer's
    /// settings (AckWait x MaxDeliver, or the BackOff delays, plus the naks' delays), as read at
    /// construction and again when run() ends (the consumer may have been changed meanwhile).
    const redelivery_bound& bound() const;

    /// Fetches and applies until stop, until caught up, or a fatal error. Refuses an engine whose
    /// inbox retention is shorter than bound(); stops with errc::stream_changed when the stream
    /// went back behind the stored checkpoint (unless accept_stream_reset), at start or while it
    /// runs (a delivery past a hole: the stream no longer holds what lies between the last
    /// message given to this run and it; that delivery and the rest of its fetch are not
    /// applied), and with
    /// errc::delivery_exhausted when a message reached max_deliver without a committed outcome;
    /// then it records the messages in the store's directory (exhausted_record()), and later
    /// runs refuse to start with errc::delivery_exhausted until accept_exhausted is set.
    /// With claim set, refuses (errc::invalid_argument, naming the holder) a consumer another
    /// store claims, and stops with errc::lease_lost if another store takes the claim over.
    /// With until_caught_up, stops with an error once it waited caught_up_wait in vain.
    /// Everything handed to the engine is acked (or nak'd) before it returns.
    source_result run(engine& e);

    /// What the last run() did: its result, also when it threw (what it did up to the error).
    const source_result& result() const;

    /// Asks run() to stop after the batch in hand (thread-safe).
    void stop() noexcept;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

/// Splits a server list "URL[,URL...]" into its URLs; throws errc::invalid_argument for an empty entry.
std::vector<std::string> split_servers(std::string_view list);

/// Closes the NATS client library (cnats' nats_CloseAndWait): its threads are joined and its
/// memory freed, waiting at most timeout. For an application that is done with NATS, after
/// every source and publisher is destroyed (the library never calls it itself: an embedding
/// application may use cnats on its own). Returns false if it timed out or was not open.
bool close_nats_library(std::chrono::milliseconds timeout = std::chrono::seconds(5)) noexcept;

/// The file in a store's directory where run() records messages that reached MaxDeliver
/// without a committed outcome: "jetstream-exhausted.<checkpoint source, made a file name>".
std::filesystem::path exhausted_record(const std::filesystem::path& store, const std::string& checkpoint_source);

/// The checkpoint source name of a stream's consumer: "nats:<stream>/<consumer>".
std::string checkpoint_source(const std::string& stream, const std::string& consumer);

}  // namespace idem::jetstream
