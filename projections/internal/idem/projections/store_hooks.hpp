#pragma once

// What the library, its tools and its tests reach behind the public API of a store: the
// environment it writes, a snapshot of an environment opened elsewhere, and the hook called
// before each commit. Not installed.

#include <idem/projections/store.hpp>
#include <idem/storage/lmdb.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

namespace idem::detail {

/// The friend of store and snapshot that the functions below go through.
struct store_access {
    static const std::shared_ptr<environment>& env(const store& s) noexcept;
    static snapshot snapshot_of(std::shared_ptr<environment> env);
};

/// A fence that also hears the commit number: what set_before_commit() puts in
/// store_options::fence (wrapping the fence already there), so that the public options carry
/// no hook of their own. Called as a plain fence (a replay asking before each batch), it is the
/// fence it wraps.
struct commit_hook {
    std::function<void()> fence{};
    std::function<void(std::uint64_t commit)> before_commit{};
    void operator()() const {
        if (fence) fence();
    }
};

/// Sets the function called inside the write transaction right before each commit, with the
/// commit number; throwing aborts the batch (tests inject storage failures and observe commit order).
inline void set_before_commit(store_options& o, std::function<void(std::uint64_t commit)> fn) {
    if (auto* hook = o.fence.target<commit_hook>()) {
        hook->before_commit = std::move(fn);
        return;
    }
    o.fence = commit_hook{std::move(o.fence), std::move(fn)};
}

/// Calls the fence of o and then its before-commit hook, if they are set.
inline void before_commit(const store_options& o, std::uint64_t commit) {
    if (const auto* hook = o.fence.target<commit_hook>()) {
        if (hook->fence) hook->fence();
        if (hook->before_commit) hook->before_commit(commit);
    } else if (o.fence) {
        o.fence();
    }
}

/// Returns the environment a store writes.
inline const std::shared_ptr<environment>& store_env(const store& s) noexcept { return store_access::env(s); }

/// Takes a snapshot of an environment opened outside a store (a reader process that keeps one
/// open). A snapshot of an open store comes from store::read().
inline snapshot snapshot_of(std::shared_ptr<environment> env) { return store_access::snapshot_of(std::move(env)); }

}  // namespace idem::detail
