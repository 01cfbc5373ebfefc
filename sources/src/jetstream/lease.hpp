#pragma once

// The lease bucket of a partitioned group: one NATS KV bucket, "idem-leases-<consumer>", whose
// TTL is the lease time. Key "p.<k>" is partition k's lease, its value "<instance> <checkpoint>";
// key "i.<instance>" says the instance is alive. Every change of a lease is a compare-and-set
// on its revision (kvStore_Create for an absent or deleted key, kvStore_Update with the last
// revision otherwise), so two instances never both succeed in taking or renewing one lease.
// A released lease is written as "-" (free) by compare-and-set, never deleted: a delete is not
// conditional and could remove the lease another instance took meanwhile.
//
// A copy kept by a stopped instance is recorded in a second bucket without TTL,
// "idem-kept-<consumer>" (a lease's own key expires with the TTL): key "p.<k>", value
// "<instance> <checkpoint>", written on stop before the lease is given up, deleted by whoever
// takes the lease next. read() reports it on a free lease (kept, with that checkpoint).

#include "connection.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace idem::jetstream::detail {

/// Whether a failed conditional KV write means "the key moved" (another revision: not ours, not
/// free) rather than a lost broker.
bool kv_conflict(natsStatus s);

/// Opens the KV bucket cfg.Bucket, creating it with cfg if it is missing (timeouts of a cluster
/// that has just started are retried for 30 s); returns whether it existed.
bool open_or_create_bucket(kvStore** kv, jsCtx* js, kvConfig& cfg);
/// Opens the KV bucket name whose keys live ttl (0: forever), creating it (history 1, replicas,
/// file storage) if it is missing. Returns the TTL a bucket that already existed keeps (it wins
/// over ttl); nullopt when it was created here or its status cannot be read.
std::optional<std::chrono::nanoseconds> open_ttl_bucket(kvStore** kv, jsCtx* js, const std::string& name,
                                                        std::chrono::milliseconds ttl, int replicas);

/// A lease's content as read from the bucket.
struct lease_entry {
    std::string instance;  ///< "" when free (released, or absent)
    std::uint64_t checkpoint = 0;
    std::uint64_t revision = 0;  ///< 0 when absent or deleted
    bool kept = false;  ///< free, given up on stop: its last owner keeps a copy up to checkpoint
    std::string kept_by;  ///< that owner, when kept
};

class lease_bucket {
public:
    /// Opens the group's bucket, creating it with the given TTL if it does not exist; an
    /// existing bucket keeps its TTL (returned by ttl()).
    lease_bucket(const connection& c, const std::string& consumer, std::chrono::milliseconds ttl, int replicas);
    /// Opens an existing bucket only (for reading); throws errc::broker_failed naming it if missing.
    lease_bucket(const connection& c, const std::string& consumer);
    ~lease_bucket();
    lease_bucket(const lease_bucket&) = delete;
    lease_bucket& operator=(const lease_bucket&) = delete;

    std::chrono::milliseconds ttl() const noexcept { return ttl_; }

    /// Reads partition k's lease.
    lease_entry read(std::uint32_t k);
    /// Takes partition k's lease if it is absent or free; returns its new revision, or nothing
    /// when another instance holds it (or took it first).
    std::optional<std::uint64_t> try_take(std::uint32_t k, const std::string& instance, std::uint64_t checkpoint);
    /// Renews a held lease by compare-and-set on its revision; returns the new revision, or
    /// nothing when it is no longer ours (expired, taken over). Throws on a broker failure
    /// (the lease's state is then unknown: the caller's fence decides).
    std::optional<std::uint64_t> renew(std::uint32_t k, const std::string& instance, std::uint64_t checkpoint,
                                       std::uint64_t revision);
    /// Marks a held lease free by compare-and-set; returns the new revision, or nothing when it
    /// was no longer ours (or the broker did not answer).
    std::optional<std::uint64_t> release(std::uint32_t k, std::uint64_t revision);
    /// Records instance's copy of k as kept up to checkpoint, then marks the lease free by
    /// compare-and-set on revision (revision 0: the lease expired, only the record is written);
    /// when the lease was no longer ours, the record goes again and nothing is returned.
    std::optional<std::uint64_t> release(std::uint32_t k, std::uint64_t revision, const std::string& instance,
                                         std::uint64_t checkpoint);
    /// Says that instance is alive (renewed with the leases).
    void heartbeat(const std::string& instance);
    /// Says that instance stopped (its heartbeat key is removed at once).
    void leave(const std::string& instance);
    /// Returns the instances alive now (their heartbeat has not expired); throws on a broker
    /// failure, after at most the connection's request timeout.
    std::vector<std::string> live_instances();

private:
    void unkeep(std::uint32_t k);
    jsCtx* js_ = nullptr;  // the connection's, which outlives the bucket
    kvStore* kv_ = nullptr;
    kvStore* kept_ = nullptr;  // the kept copies (nullptr when reading a group that has none)
    std::string name_;
    std::chrono::milliseconds ttl_{0};
};

}  // namespace idem::jetstream::detail
