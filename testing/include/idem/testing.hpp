#pragma once

// The chaos test kit: checks that a user's projections keep idem's promise (a delivery's
// effect happens once) under what brokers really do. It applies every distinct event once,
// in order, into a fresh store (the reference), then runs seeded schedules against fresh
// stores: duplicates under the same message id and under new ones, events re-sent under a
// new event id, reordering within streams (gaps park and release) and across them, crashes
// before and after commits followed by a reopen (optionally a forked child killed with
// SIGKILL at a crash point), inbox pruning in between, and a rebuild from the delivered log.
// Every row (state and version) must equal the reference's; on a difference the schedule is
// shrunk to a short one that still fails. Envelopes that do not parse (as real logs hold) are
// dead letters wherever they are delivered and change no row: they are counted and left out of
// the schedules.
//
//   TEST_CASE("order totals survive duplicates, reordering, crashes and pruning") {
//       idem::testing::chaos kit;
//       kit.add(idem::examples::order_totals());
//       kit.upcast(idem::examples::order_line_upcaster());
//       auto report = kit.run(envelopes);  // CloudEvents JSON texts
//       CHECK_MESSAGE(report.ok(), report.explain());
//   }
//
// Stores are real LMDB environments, unsynced (a process crash loses nothing the page cache
// holds), in a temporary directory that the run removes: $TMPDIR if set, else /dev/shm (memory)
// where it can be written, else the system temporary directory.

#include <idem/projections/projection.hpp>
#include <idem/projections/store.hpp>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace idem::testing {

/// How a chaos run behaves.
struct chaos_options {
    std::size_t schedules = 100;  ///< seeded schedules to run
    std::uint64_t seed = 1;       ///< schedule i runs with seed + i (a report names its seed)
    /// Re-send events under a new event id with the same payload, subject and sequence (a drop
    /// copy, an outbox replayed): only a stream sequence or an effect key taken from the payload
    /// makes them duplicates. Turn off for sources that never change an event's id.
    bool resends = true;
    /// Also kill forked children with SIGKILL at the store's crash points (after_decode,
    /// mid_batch, before_commit, after_commit, during_prune); in-process crashes always run.
    bool forked_crashes = false;
    bool rebuild = true;                ///< also rebuild each schedule's delivered log and compare it
    /// Schedules run at once, each on a thread of its own with stores of its own (0: one per
    /// core). The default, 1, runs them on the calling thread: more runs the projections'
    /// handlers on that many threads at once, which only handlers without shared state allow.
    /// The failure reported is the first in seed order whatever the number. forked_crashes runs
    /// one at a time (a child is forked from one thread).
    std::size_t workers = 1;
    std::size_t max_shrink_runs = 400;  ///< schedules tried while shrinking a failure
    std::filesystem::path directory{};  ///< where the stores go (default: see the file comment)
    /// Called after each schedule that passed with (schedules done, schedules to run), on the calling thread.
    std::function<void(std::size_t, std::size_t)> progress{};
    /// When set and it becomes true, run() stops at its next step and throws std::system_error
    /// (std::errc::operation_canceled), having removed its stores (a Ctrl-C handler sets it).
    const std::atomic<bool>* stop = nullptr;
};

/// The first row where a schedule's store differs from the reference.
struct chaos_difference {
    std::string where;                              ///< "live store" or "rebuild from the delivered log"
    std::string projection;                         ///< the projection's name
    std::string key;                                ///< the row's aggregate key
    std::optional<std::uint64_t> expected_version;  ///< the reference's (nullopt: no such row)
    std::optional<std::uint64_t> actual_version;    ///< the schedule's (nullopt: no such row)
    std::string expected_state;                     ///< the reference's state as JSON ("" without a row)
    std::string actual_state;                       ///< the schedule's state as JSON ("" without a row)
};

/// What a chaos run found: ok(), or the seed, the shrunk schedule and the first differing row.
struct chaos_report {
    std::size_t events = 0;     ///< distinct events given
    std::size_t malformed = 0;  ///< envelopes that do not parse: dead letters, left out of the schedules
    std::string first_malformed{};  ///< the first of them: its number (from 1) and why it does not parse
    std::size_t schedules = 0;  ///< schedules run (up to and including a failing one)
    std::size_t kills =
        0;  ///< forked children killed with SIGKILL at a crash point (forked_crashes; not while shrinking)
    std::uint64_t seed = 0;                        ///< the failing schedule's seed
    std::size_t steps_before = 0;                  ///< the failing schedule's steps before shrinking
    std::size_t deliveries_before = 0;             ///< ... and its deliveries
    std::vector<std::string> steps{};              ///< the shrunk schedule, one readable step each
    std::size_t deliveries = 0;                    ///< deliveries in the shrunk schedule
    bool confirmed = false;                        ///< the shrunk schedule failed again when run once more
    std::optional<chaos_difference> difference{};  ///< set when a schedule failed

    /// Returns whether every schedule matched the reference.
    bool ok() const noexcept { return !difference.has_value(); }
    /// Returns a printable explanation: the schedules run, or the seed, steps, row and both states.
    std::string explain() const;
};

/// Runs a user's projections through seeded chaos schedules (see the file comment).
class chaos {
public:
    explicit chaos(chaos_options options = {});
    ~chaos();
    chaos(const chaos&) = delete;
    chaos& operator=(const chaos&) = delete;

    /// Adds a projection (kept as a prototype: every store the kit opens gets a copy).
    template <class State>
    chaos& add(projection<State> p) {
        auto proto = std::make_shared<projection<State>>(std::move(p));
        return add_projection(proto, [proto](store& s) { s.add(projection<State>(*proto)); });
    }
    /// Adds a projection by prototype and the function that adds a copy to a store (idem::cli::tool's form).
    chaos& add_projection(std::shared_ptr<const projection_base> prototype, std::function<void(store&)> install);
    /// Adds an event upcasting step to every store the kit opens (as store::upcast).
    chaos& upcast(upcaster step);
    /// Adjusts the options of every store the kit opens (gap policy, consumer, retention); the kit
    /// then sets the path, durability::none, a clock of its own and, if unset, a 1 s inbox retention.
    chaos& configure(std::function<void(store_options&)> fn);

    /// Runs the reference and the schedules over envelopes (CloudEvents JSON texts; a repeated
    /// event id counts once; one that does not parse is counted in the report and left out).
    /// Throws std::invalid_argument if no envelope parses, and std::system_error on a storage
    /// failure or when options.stop asked it to stop.
    chaos_report run(std::span<const std::string> envelopes) const;
    /// Describes the schedule seed makes for envelopes, one readable step each (reproducing a report).
    std::vector<std::string> schedule(std::span<const std::string> envelopes, std::uint64_t seed) const;

    struct impl;  ///< opaque: projections, options

private:
    std::unique_ptr<impl> impl_;
};

}  // namespace idem::testing
