#pragma once

// How commits reach the disk: the one storage setting a store's options name.

namespace idem {

/// How the environment syncs commits to disk.
enum class durability {
    full,      ///< every commit is fsync'ed before it returns: acknowledged means durable
    periodic,  ///< as full for each commit; the engine paces commits to at most one per interval
    none,      ///< no fsync at all (rebuilds, tests): a power loss may lose recent commits
};

}  // namespace idem
