#pragma once

// Partitioned consumption of one JetStream stream by several processes: the server maps
// `<prefix>.<key>` to `<prefix>.<partition>.<key>` (a `{{partition(N,1)}}` subject mapping), and
// each partition is applied by the one instance that holds its lease, into its own LMDB
// environment `<db>/p<k>`. Leases are keys of a NATS KV bucket, taken and renewed by
// compare-and-set on their revision and expired by the bucket's TTL; every commit of a partition
// is fenced by its lease (refused once the lease may have expired). See docs/SCALEOUT.md
// "Scale-out".
//
//   idem::jetstream::partitioned_options po;
//   po.source.servers = {"nats://127.0.0.1:4222"};
//   po.source.stream = "ORDERS";           // captures "orders.>", mapped to orders.<k>.<key>
//   po.source.consumer = "totals";
//   po.partitions = 8;
//   po.db = "data";                         // data/p0 ... data/p7, those this instance owns
//   po.add_projections = [](idem::store& s) { s.add(order_totals()); };
//   idem::jetstream::partitioned_consumer pc{po};
//   pc.run();                               // until stop(): take, renew, balance, give up

#include <idem/engine/engine.hpp>
#include <idem/sources/jetstream.hpp>
#include <idem/sources/partition_layout.hpp>  // partition_directory, the instance's directory

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

/// Returns the partition (0..partitions-1) the server's `{{partition(N,...)}}` mapping gives a
/// subject token: FNV-1a (32 bit) of the token's bytes modulo N, as nats-server computes it.
std::uint32_t partition_of_token(std::string_view token, std::uint32_t partitions);

/// Returns the partition of an aggregate key published by `idem publish` under `<prefix>.>`:
/// the key is first encoded as one subject token (percent-encoding '.', '*', '>', '%' and bytes
/// outside 0x21-0x7E, "events" when empty), then hashed as the server does.
std::uint32_t partition_of(std::string_view aggregate_key, std::uint32_t partitions);

/// Options of an instance of a partitioned group.
struct partitioned_options {
    /// The stream, the group's consumer name (each partition's durable is derived from it) and the
    /// delivery settings; filter_subject and start_sequence are set per partition.
    source_options source{};
    std::uint32_t partitions = 0;      ///< N: fixed for the life of the stream's mapping
    std::string instance;              ///< this instance's name in the lease bucket (unique in the group)
    std::filesystem::path db;          ///< the instance's directory: one environment per owned partition
    engine_options engine{};           ///< per partition; store.path is set to db / p<k>
    std::function<void(store&)> add_projections{};
    std::chrono::milliseconds lease_ttl{10000};  ///< a lease not renewed within expires
    /// A new owner without a copy of a partition that holds at least this many messages rebuilds
    /// the copy from the stream in one bulk build (no acks, one sync, renamed into place while
    /// the lease is held) before its durable consumer follows from there; below it, or 0, the
    /// durable consumer replays the partition through the live path (a commit per batch).
    std::uint64_t replay_threshold = 20000;
    std::size_t replay_memory_budget = std::size_t{256} << 20;  ///< the bulk build's row cache
    const std::atomic<bool>* stop = nullptr;  ///< checked every tick
    /// Stop by itself once every partition has an owner (or, given up on stop, a last owner
    /// that kept its copy) whose checkpoint reached the last sequence the stream held for that
    /// partition when run() started. Partitions given up that way are not taken again.
    bool until_caught_up = false;
    /// Called for every ack and nak of a partition just before it is sent (on_ack of source is unused).
    std::function<void(std::uint32_t partition, const ack_event&)> on_ack{};
    /// Told of every lease taken (true) and lost or given up (false), with why ("taken", "lost",
    /// "commit refused", "run ended", "rebalanced", "stopped"), on the run's thread.
    std::function<void(std::uint32_t partition, bool owned, std::uint64_t revision, std::string_view why)> on_lease{};
};

/// What an instance did.
struct partitioned_result {
    std::uint64_t taken = 0;     ///< leases taken
    std::uint64_t lost = 0;      ///< leases that expired or were taken over while held
    std::uint64_t given_up = 0;  ///< leases released (rebalancing, stop)
    std::uint64_t fetched = 0;   ///< messages fetched over all partition runs
    std::vector<std::uint32_t> owned_at_stop;  ///< held at the stop, and copies kept before: as DIR/owned
    bool caught_up = false;  ///< stopped by until_caught_up (not by stop())
};

/// One instance of a partitioned group.
class partitioned_consumer {
public:
    /// Connects and opens (or creates) the group's lease bucket; throws std::system_error naming
    /// the cause (errc::invalid_argument for bad options, errc::broker_failed).
    explicit partitioned_consumer(partitioned_options options);
    ~partitioned_consumer();
    partitioned_consumer(const partitioned_consumer&) = delete;
    partitioned_consumer& operator=(const partitioned_consumer&) = delete;

    /// Takes free partitions, applies them, renews their leases and balances them with the other
    /// live instances until stop; then stops every partition and gives its lease up. Throws the
    /// first error a partition's run ended with (its message names the partition), once every
    /// partition is stopped; a partition that ended on the loss of its lease (errc::lease_lost, or
    /// errc::broker_failed from a consumer its new owner deleted) goes on under its next owner.
    partitioned_result run();
    /// Returns what run() did, also after it threw (then up to the error and the stop).
    const partitioned_result& result() const;
    /// Asks run() to stop (thread-safe).
    void stop() noexcept;

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

/// One lease as the bucket holds it.
struct lease_owner {
    std::uint32_t partition = 0;
    std::string instance;  ///< "" when free
    std::uint64_t revision = 0;
    std::uint64_t checkpoint = 0;  ///< the owner's last published checkpoint (free: the last owner's, if kept)
    bool kept = false;  ///< free, given up on stop by an owner that keeps its copy up to checkpoint
    std::string kept_by;  ///< that owner, when kept
};

/// Reads the group's leases from its bucket: one entry per partition that has one.
std::vector<lease_owner> read_owners(const std::vector<std::string>& servers, const std::string& consumer);

/// Returns the name of a group's lease bucket: "idem-leases-<consumer>".
std::string lease_bucket(const std::string& consumer);

}  // namespace idem::jetstream
