#pragma once

// What a consumer keeps, and for how long: the retention clock, the event-time horizon and
// the bounded prune steps that enforce them (docs/DESIGN.md, "Retention").

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace idem {

/// Which clock stamps inbox entries and measures their age.
enum class retention_clock {
    wall,   ///< the time each message was processed (a live source: its redeliveries come in wall time)
    event,  ///< the consumer's event time: the highest event time seen (a log: rebuilds are deterministic)
};

/// A source's redelivery bound: how long after a first delivery it may deliver the same message again.
struct redelivery_bound {
    std::chrono::nanoseconds bound{0};
    std::string what;  ///< how it follows from the source's settings, for messages ("AckWait 30s x MaxDeliver 5")
};

/// What a consumer keeps, and for how long (docs/DESIGN.md, "Retention").
struct retention_options {
    /// Message ids older than this (on the retention clock) are pruned from the inbox; unset: kept forever.
    std::optional<std::chrono::nanoseconds> inbox_retention{};
    /// The retention clock.
    retention_clock clock = retention_clock::wall;
    /// Contributing-set entries older than the event-time horizon (the highest event time seen
    /// minus this) are pruned, and an unsequenced event older than the horizon is dead-lettered
    /// as late_event. Unset: contributing sets are kept forever and no event is late.
    std::optional<std::chrono::nanoseconds> allowed_lateness{};
    /// The source's redelivery bound; the store refuses to open with an inbox_retention shorter than it.
    std::optional<redelivery_bound> source{};
    /// While the consumer's event time matters (allowed_lateness set, or an inbox_retention on the
    /// event clock), an event whose time is more than this ahead of the consumer's event time is
    /// dead-lettered as future_event and does not move it, unless `future_confirmations` such events
    /// agree (future_confirmations; see docs/DESIGN.md, "The event-time horizon"). Unset: any event time moves the clock.
    /// Measured in event time; the wall clock (now) is read only for events more than this past it.
    std::optional<std::chrono::nanoseconds> max_future_skew = std::chrono::hours(24);
    /// A jump forward is taken when this many events in a row of the jump agree: events more than
    /// max_future_skew ahead, within max_future_skew of each other; for a jump more than
    /// max_future_skew past the wall clock, from at least two distinct sources among them. The last
    /// of them moves the clock and is judged as usual; the ones before it were dead-lettered as future_event.
    std::uint32_t future_confirmations = 3;
    /// How far ahead, in event time, the source may re-send an event under a new id and a new time
    /// (a drop copy): its effect key must still be in the contributing sets then, so the store
    /// refuses to open with an allowed_lateness shorter than this. Unset: not declared.
    std::optional<std::chrono::nanoseconds> resend_within{};
    /// Each batch's transaction also removes up to this many expired entries (no extra commit,
    /// no extra fsync; 0: only store::prune removes them). On the event clock a batch removes
    /// all that expired, so a log run's state depends on the log alone, not on timing.
    std::size_t prune_per_batch = 1000;
    /// The wall clock, ns since the Unix epoch (tests replace it); unset: the system clock.
    std::function<std::uint64_t()> now{};
};

/// Limits of one prune step (store::prune): it holds the writer for at most this long.
struct prune_limits {
    std::size_t max_rows = 1000;                 ///< entries deleted per step at most
    std::chrono::microseconds max_time{1000};    ///< time per step at most (its commit comes on top)
    /// Prune inbox ids older than this instead of the configured inbox_retention (idem prune --older-than).
    std::optional<std::chrono::nanoseconds> older_than{};
};

/// What one prune step removed.
struct prune_result {
    std::size_t ids = 0;           ///< inbox entries removed
    std::size_t contributors = 0;  ///< contributing-set entries removed
    std::size_t changes = 0;       ///< change feed entries removed
    bool more = false;             ///< stopped at a limit: call again
};

}  // namespace idem
