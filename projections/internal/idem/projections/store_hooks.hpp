#pragma once

// What the library, its tools and its tests reach behind the public API of a store: the
// environment it writes, a snapshot of an environment opened elsewhere, and the hook called
// before each commit. Not installed.

#include <idem/projections/store.hpp>
#include <idem/storage/lmdb.hpp>

#include <cstdint>
#include <functional>
#include <memory>

namespace idem::detail {

/// The friend of store, store_options and snapshot that the functions below go through.
struct store_access {
    static std::function<void(std::uint64_t)>& before_commit(store_hooks& h) noexcept { return h.before_commit_; }
    static const std::function<void(std::uint64_t)>& before_commit(const store_hooks& h) noexcept {
        return h.before_commit_;
    }
    static const std::shared_ptr<environment>& env(const store& s) noexcept;
    static snapshot snapshot_of(std::shared_ptr<environment> env);
};

/// Sets the function called inside the write transaction right before each commit, with the
/// commit number; throwing aborts the batch (tests inject storage failures and observe commit order).
inline void set_before_commit(store_options& o, std::function<void(std::uint64_t commit)> fn) {
    store_access::before_commit(o.hooks) = std::move(fn);
}

/// Calls the fence of o and then its before-commit hook, if they are set.
inline void before_commit(const store_options& o, std::uint64_t commit) {
    if (o.fence) o.fence();
    if (const auto& fn = store_access::before_commit(o.hooks)) fn(commit);
}

/// Returns the environment a store writes.
inline const std::shared_ptr<environment>& store_env(const store& s) noexcept { return store_access::env(s); }

/// Takes a snapshot of an environment opened outside a store (a reader process that keeps one
/// open). A snapshot of an open store comes from store::read().
inline snapshot snapshot_of(std::shared_ptr<environment> env) { return store_access::snapshot_of(std::move(env)); }

}  // namespace idem::detail
