#pragma once

// What the operator's actions on a store take and report: redrive() of dead letters, release() of
// parked streams, migrate_rows(), the parked streams they look at and the audit they leave.
// store.hpp declares the actions.

#include <idem/projections/delivery.hpp>
#include <idem/storage/envelope.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace idem {

/// What redrive() applies again: dead letters matching every filter given.
struct redrive_options {
    std::optional<reason> why{};                  ///< only dead letters with this reason
    std::optional<std::string> event_id{};        ///< only this event's (envelope::event_id())
    std::optional<std::uint64_t> position{};      ///< only the dead letter at this position
    /// Sequenced events are refused unless set: their stream moved past them when they were
    /// dead-lettered. When set, they are applied to every row that does not hold them yet,
    /// except rows of their own stream that already hold a later sequence; the stream is unchanged.
    bool out_of_order = false;
    std::string note{};                           ///< why the operator redrives (kept in the audit)
};

/// What redrive() did with one dead letter.
struct redriven {
    std::uint64_t position = 0;   ///< the dead letter's position (removed unless refused)
    reason was = reason::none;    ///< its reason
    std::string message_id;       ///< as stored ('m' transport id or 'e' event id)
    bool refused = false;         ///< left as it was (see detail)
    outcome result{};             ///< applied, duplicate_event or dead_lettered (with its new reason)
};

/// What one redrive() did.
struct redrive_result {
    std::vector<redriven> items{};
    std::size_t applied = 0, duplicates = 0, dead_lettered = 0, refused = 0;
    std::uint64_t commit = 0;  ///< 0: nothing was written
};

/// What release() does with the events parked on one stream.
struct release_options {
    bool drop = false;   ///< dead-letter them as released_dropped instead of applying them
    std::string note{};  ///< why the operator releases (kept in the audit)
};

/// A run of missing sequences, from..to inclusive.
struct sequence_range {
    std::uint64_t from = 0, to = 0;
    friend bool operator==(const sequence_range&, const sequence_range&) = default;
};

/// What one release() did.
struct release_result {
    std::string subject;
    std::uint64_t highest_before = 0;         ///< the stream's highest applied sequence before
    std::uint64_t highest_after = 0;          ///< and after
    std::vector<sequence_range> skipped{};    ///< sequences given up on (never applied)
    std::vector<std::uint64_t> released{};    ///< parked sequences applied (or dead-lettered by their handlers)
    std::vector<std::uint64_t> dropped{};     ///< parked sequences dead-lettered as released_dropped
    std::uint64_t commit = 0;
};

/// What one migrate_rows() did, so far (also passed to its progress function).
struct migrate_result {
    std::uint64_t rows = 0;       ///< rows rewritten at their projection's current state version
    std::uint64_t commits = 0;    ///< transactions it took
    std::uint64_t remaining = 0;  ///< rows of an older state version still to rewrite
};

/// One parked stream: what it waits for.
struct parked_stream {
    std::string subject;
    std::uint64_t highest = 0;                ///< highest sequence applied (or skipped)
    std::vector<sequence_range> missing{};    ///< the gaps before and between parked events
    std::vector<std::uint64_t> sequences{};   ///< the parked sequences, ascending
    std::uint64_t oldest_ns = 0;              ///< when the oldest parked event was recorded (inbox stamp; 0: unknown)
};

/// What one set_event_time_back() did.
struct event_clock_result {
    std::uint64_t before = 0;        ///< the consumer's event time before (ns since the Unix epoch)
    std::uint64_t after = 0;         ///< and after
    std::uint64_t dropped_jump = 0;  ///< the pending jump it dropped: its lowest time (0: none pending)
    std::size_t dropped_votes = 0;   ///< the events that had voted for it
    std::uint64_t commit = 0;
};

/// One operator action recorded in the store ("audit/<consumer>").
struct operator_action {
    std::uint64_t position = 0;
    std::uint64_t time_ns = 0;               ///< wall clock, ns since the Unix epoch
    std::uint64_t commit = 0;                ///< the commit that made it
    std::string action;                      ///< "release", "release_drop", "redrive", "event_clock"
    std::string stream;                      ///< the subject released ("" for a redrive)
    std::vector<sequence_range> skipped{};   ///< sequences given up on
    std::vector<std::uint64_t> sequences{};  ///< released or dropped sequences; redriven dead-letter positions
    std::string note;                        ///< the operator's reason
    std::string summary;                     ///< what happened, in words
    /// Whether it changed what the store holds (a pause or a resume does not; a rebuild from the
    /// logs loses nothing by leaving it out).
    bool changes_state() const { return action != "pause" && action != "resume"; }
};

}  // namespace idem
