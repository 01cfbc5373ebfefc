#pragma once

// A chaos schedule: the steps one seeded run takes (batches of deliveries, each perhaps
// crashed; inbox prunes; reopens), how a seed makes one, and how a step reads.

#include <idem/storage/envelope.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace idem::testing::detail {

/// One distinct event of the input.
struct event {
    std::string body;        ///< as given
    envelope env;            ///< parsed
    std::size_t number = 0;  ///< its envelope's number in the input, from 1 (a log's record number)
};

/// Which copy of an event a delivery carries.
enum class copy_kind : std::uint8_t {
    original,         ///< the envelope as given
    same_message_id,  ///< the envelope as given again: the inbox sees it
    new_message_id,   ///< the same event re-encoded under a new transport message id
    resent,           ///< the same payload, subject and sequence under a new event id and message id
};

/// One delivery of a schedule.
struct delivery_step {
    std::size_t event = 0;  ///< index into the events
    copy_kind kind = copy_kind::original;
    std::uint32_t copy = 0;  ///< the copy's number (its ids), distinct per event
};

/// What happens to a step's batch or prune.
enum class crash_kind : std::uint8_t {
    none,
    before_commit,  ///< in-process: handlers ran, the commit is refused; reopen, redeliver
    after_commit,   ///< in-process: committed, the acknowledgement lost; reopen, redeliver
    killed,         ///< a forked child running it is killed with SIGKILL at `point`; reopen, redeliver
};

enum class step_kind : std::uint8_t { deliver, prune, reopen };

/// One step of a schedule.
struct step {
    step_kind kind = step_kind::deliver;
    std::vector<delivery_step> batch{};  ///< deliver: one write transaction
    crash_kind crash = crash_kind::none;
    std::string point{};  ///< killed: the crash point
};

/// What a generator may use.
struct generate_options {
    bool resends = true;
    bool forked_crashes = false;
};

/// Makes the schedule of seed over events (deterministic: the same seed gives the same schedule).
std::vector<step> generate(std::uint64_t seed, const std::vector<event>& events, const generate_options& o);

/// Returns the body a delivery carries.
std::string body_of(const event& e, const delivery_step& d);

/// Describes a step in one line ("deliver [...] then crash before the commit; reopen; redeliver"),
/// each delivery by its event's id and source, its envelope's number in the input, type,
/// subject and sequence, so it can be found in the log.
std::string describe(const step& s, const std::vector<event>& events);

/// Returns the number of deliveries in steps.
std::size_t deliveries(const std::vector<step>& steps);

}  // namespace idem::testing::detail
