// Retention: one bounded prune step removes inbox ids past inbox_retention and contributing-set
// entries past the event-time horizon, oldest first; inside a batch's transaction or its own.

#include "store_internal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>

#include <algorithm>

namespace idem {

using detail::count_ns;

prune_result store::impl::prune_step(write_txn& txn, const prune_limits& limits, layout::clock_record clock,
                                     consumer_stats& stats, prune_steps& steps) {
    prune_result result;
    steps.clear();
    const auto deadline = std::chrono::steady_clock::now() + limits.max_time;
    std::size_t budget = limits.max_rows;
    const auto& r = options.retention;
    auto older_than = limits.older_than ? limits.older_than : r.inbox_retention;
    if (older_than) {
        ids->catch_up(txn);
        const auto now = r.clock == retention_clock::event ? clock.event_time : wall_now();
        const auto age = count_ns(*older_than);
        if (now > age) {
            auto step = ids->prune(txn, now - age, budget, deadline);
            result.ids = step.removed;
            result.more = step.more;
            budget -= step.removed;
            stats.pruned_ids += step.removed;
            steps.emplace_back(SIZE_MAX, step);
            // The contents of events that came under transport ids leave with the inbox, by its cutoff.
            event_contents->catch_up(txn);
            auto contents = event_contents->prune(txn, now - age, budget, deadline);
            result.more = result.more || contents.more;
            budget -= contents.removed;
            steps.emplace_back(event_contents_step, contents);
        }
    }
    if (r.allowed_lateness && clock.event_time > count_ns(*r.allowed_lateness)) {
        const auto horizon = clock.event_time - count_ns(*r.allowed_lateness);
        for (std::size_t p = 0; p < contributors.size() && budget > 0; ++p) {
            contributors[p]->catch_up(txn);
            auto step = contributors[p]->prune(txn, horizon, budget, deadline);
            if (step.removed == 0) continue;
            result.contributors += step.removed;
            result.more = result.more || step.more;
            budget -= step.removed;
            stats.pruned_contributors += step.removed;
            steps.emplace_back(p, step);
            // Below this the set may no longer prove an event new: an unsequenced event there is late.
            const auto key = layout::contrib_floor_key(projections[p]->name());
            const auto floor = std::max(layout::u64_or_zero(txn.get(meta, key)), step.newest_removed + 1);
            std::string value;
            codec::put_u64_le(value, floor);
            txn.put(meta, key, value);
        }
        if (budget == 0) result.more = true;
    }
    if (result.ids + result.contributors > 0) crash_point("during_prune");
    return result;
}

void store::impl::prune_in_batch(write_txn& txn, detail::batch_run& run,
                                 prune_steps& steps) {
    steps.clear();
    if (options.retention.prune_per_batch == 0) return;
    // The change feed is kept by wall time and commit count, whatever the inbox's clock.
    bool more = false;
    prune_changes(txn, run.commit(), options.retention.prune_per_batch,
                  std::chrono::steady_clock::now() + std::chrono::milliseconds(1), more);
    if (!retaining()) return;
    // On the event clock a batch removes everything that expired: then what a commit holds
    // depends only on the log and the batch boundaries, never on timing (a resumed or
    // repeated run gives the same inbox and the same outcomes).
    const bool event_clock = options.retention.clock == retention_clock::event;
    const auto limits = event_clock ? prune_limits{SIZE_MAX, std::chrono::hours(24), {}}
                                    : prune_limits{options.retention.prune_per_batch, std::chrono::milliseconds(1), {}};
    prune_run(txn, limits, run, steps);
}

prune_result store::impl::prune_run(write_txn& txn, const prune_limits& limits, detail::batch_run& run,
                                    prune_steps& steps) {
    // A prune inside a batch's transaction: the batch writes the floors with its clock record.
    auto result = prune_step(txn, limits, run.clock(), run.stats, steps);
    for (const auto& [p, step] : steps) {
        if (p == event_contents_step) continue;
        if (p == SIZE_MAX) {
            run.set_inbox_floor(step.newest_removed + 1);
        } else {
            run.set_contrib_floor(p, step.newest_removed + 1);
        }
    }
    return result;
}

prune_result store::prune(const prune_limits& limits) {
    auto& s = *impl_;
    impl::prune_steps steps;
    auto forget = [&] { s.forget_pruned(steps); };
    if (s.bulk) {
        try {
            auto result = s.prune_run(*s.bulk_txn, limits, *s.bulk, steps);
            forget();  // as spill() does: abandon_bulk() rebuilds the indexes from disk
            return result;
        } catch (...) {
            s.abandon_bulk();
            throw;
        }
    }
    prune_result result;
    s.env->write([&](write_txn& txn) {
        auto clock = layout::decode_clock(txn.get(s.meta, layout::clock_key(s.options.consumer)));
        auto stats = layout::decode_stats(txn.get(s.meta, layout::stats_key(s.options.consumer)));
        result = s.prune_step(txn, limits, clock, stats, steps);
        const auto budget = limits.max_rows - std::min(limits.max_rows, result.ids + result.contributors);
        result.changes = s.prune_changes(txn, layout::u64_or_zero(txn.get(s.meta, layout::commit_key)), budget,
                                         std::chrono::steady_clock::now() + limits.max_time, result.more);
        if (result.ids + result.contributors == 0) return;
        for (const auto& [p, step] : steps) {
            if (p == SIZE_MAX) clock.inbox_floor = std::max(clock.inbox_floor, step.newest_removed + 1);
        }
        txn.put(s.meta, layout::clock_key(s.options.consumer), layout::encode_clock(clock));
        txn.put(s.meta, layout::stats_key(s.options.consumer), layout::encode_stats(stats));
    });
    forget();
    return result;
}

void store::impl::forget_pruned(const prune_steps& steps) {
    for (const auto& [p, step] : steps) {
        (p == SIZE_MAX ? *ids : p == event_contents_step ? *event_contents : *contributors[p]).pruned(step);
    }
}

}  // namespace idem
