#pragma once

// Failover by replay: a partition's new owner that has no copy rebuilds it from the stream
// through the offline rebuild path (one bulk build, one sync) instead of through its durable
// consumer (a commit and an fsync per batch of at most MaxAckPending), when the partition holds
// enough messages for that to pay. The messages up to the partition's last sequence at the start
// are read through an ephemeral pull consumer without acks, applied into "<db>/p<k>.bulk" with
// the live path's identity rules and checkpoint (source name, stream sequence, the stream's
// incarnation), synced once and renamed to "<db>/p<k>" while the lease is still held. The live
// path then opens that copy and resumes after its checkpoint.

#include "connection.hpp"

#include <idem/projections/store.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace idem::jetstream::detail {

/// One partition to replay.
struct replay_request {
    std::vector<std::string> servers;
    std::string stream;
    std::string filter_subject;   ///< the partition's subjects, "<prefix>.<k>.>"
    std::string checkpoint_name;  ///< the checkpoint source the live path resumes from
    /// The options the live path opens the copy with (path: "<db>/p<k>", the lease's fence).
    store_options copy;
    std::function<void(store&)> add_projections;
    std::uint64_t threshold = 0;  ///< replay only when at least this many messages are pending (0: never)
    std::size_t memory_budget = std::size_t{256} << 20;  ///< the bulk build's row cache
    const std::atomic<bool>* stop = nullptr;             ///< abandons the build (nothing is left in place)
    /// Whether the lease is still held, asked right before the copy is renamed into place.
    std::function<bool()> still_held;
};

/// What a replay did.
struct replay_result {
    bool replayed = false;        ///< false: a copy exists, the partition is empty or below the threshold
    bool stopped = false;         ///< the stop flag was set: nothing was put in place, nothing more to do
    std::uint64_t messages = 0;   ///< messages applied
    std::uint64_t checkpoint = 0; ///< the copy's checkpoint (the last stream sequence applied)
};

/// The directory a replay builds partition copy `path` in: "<path>.bulk".
std::filesystem::path replay_directory(const std::filesystem::path& path);

/// Replays the partition into request.copy.path if it has no copy there and enough messages
/// are pending. A stop returns (stopped) and a lost lease throws (errc::lease_lost), both
/// leaving neither the copy nor a half-built directory; a kill leaves the build directory,
/// which the next replay removes first.
replay_result replay_partition(const replay_request& request);

}  // namespace idem::jetstream::detail
