// The prefetch schedule of a batch: while one delivery applies, what later ones will read is
// brought into cache, a stage per level of dependent loads, so that deliver() finds its items,
// hash arrays, index slots and entries there instead of stalling on a miss each.

#include "store_internal.hpp"

namespace idem::detail {

void batch_run::prefetch_ahead(std::span<const std::unique_ptr<item>> batch, std::size_t i) const noexcept {
    constexpr std::size_t ahead = 8;  // deliveries whose index slots are fetched while earlier ones apply
    if (i + 3 * ahead < batch.size()) prefetch_item(*batch[i + 3 * ahead]);
    if (i + 2 * ahead < batch.size()) prefetch_parts(*batch[i + 2 * ahead]);
    if (i + ahead + ahead / 2 < batch.size()) prefetch_slots(*batch[i + ahead + ahead / 2]);
    if (i + ahead < batch.size()) prefetch(*batch[i + ahead]);
}

// A batch was prepared on another thread: its items are in that core's cache, and each
// dependent load prefetch() makes (the item, its parts, their hash arrays) would stall on a
// miss of its own. These bring them in over earlier deliveries, one level per stage.
void batch_run::prefetch_item(const item& d) noexcept {
    __builtin_prefetch(&d.err.why);
    __builtin_prefetch(&d.message_hash);
    __builtin_prefetch(&d.ev.sequence);
    __builtin_prefetch(&d.parts);
}

void batch_run::prefetch_parts(const item& d) noexcept {
    if (d.err.why != reason::none) return;
    for (const auto& pt : d.parts) {
        __builtin_prefetch(pt.contributor_hashes.data());
        __builtin_prefetch(pt.key_hashes.data());
    }
}

// The batch's row and stream tables: their slots first, so that prefetch() reads each slot
// from cache to find the entry it fetches.
void batch_run::prefetch_slots(const item& d) const noexcept {
    if (d.err.why != reason::none) return;
    if (d.ev.sequence) streams_.prefetch_slot(d.subject_hash);
    for (const auto& pt : d.parts) {
        if (pt.projection < rows_.size()) {
            for (auto h : pt.key_hashes) rows_[pt.projection].prefetch_slot(h);
        }
        for (auto h : pt.key_hashes) s_.journals[pt.projection]->prefetch_slot(h);
    }
}

void batch_run::prefetch(const item& d) const noexcept {
    if (d.err.why != reason::none) return;
    s_.ids->prefetch(d.message_hash);
    if (!d.event_key.empty()) {
        s_.ids->prefetch(d.event_key_hash);
        s_.event_contents->prefetch(d.event_key_hash);
    } else {
        s_.event_contents->prefetch(d.message_hash);
    }
    if (d.ev.sequence) streams_.prefetch(d.subject_hash);
    for (const auto& pt : d.parts) {
        for (auto h : pt.contributor_hashes) s_.contributors[pt.projection]->prefetch(h);
        if (pt.projection < rows_.size()) {
            for (auto h : pt.key_hashes) rows_[pt.projection].prefetch(h);
        }
        for (auto h : pt.key_hashes) s_.journals[pt.projection]->prefetch(h);
    }
}

}  // namespace idem::detail
