#pragma once

// A realistic event-log generator for the example domains, with the exact results a
// store must reach on it.
//
// generate() writes CloudEvents 1.0 envelopes (JSON, one per sink call) the way a
// broker delivers them: events carry `subject` and `sequence` (their stream position),
// `time` advances, some carry a transport `msgid`; a share is redelivered, republished
// under a new message id, reissued under a new event id, delivered late (out of
// order), and a share of defect lines of every kind is mixed in. As it writes, it runs
// the store's documented semantics over what it wrote and returns the final counters,
// the dead-letter reasons and the domain totals a store must end with.
//
// The prediction assumes what `idem` does: every line is delivered as it is, with no
// transport message id beside it (`idem::delivery{line, ""}`: the envelope's `msgid`,
// else its event id, is the message id), in order, to one consumer holding the four
// example projections (add_all) of a fresh database, with the default gap policy
// (park), `unknown_types = dead_letter` and `max_event_bytes = 1 MiB`. Batch sizes do
// not matter.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace idem::examples {

/// The kinds of defect line generate() mixes in, and what a store does with each.
enum class defect : std::uint8_t {
    truncated,         ///< a line cut short -> invalid_json
    invalid_json,      ///< an attribute name without quotes -> invalid_json
    missing_id,        ///< no `id` -> missing_id
    missing_source,    ///< no `source` -> missing_source
    missing_type,      ///< no `type` -> missing_type
    wrong_field_type,  ///< `"id":5` -> invalid_field
    unknown_type,      ///< a type no projection handles -> unknown_type
    oversized,         ///< over 1 MiB (a large `data.note`) -> too_large
    invalid_utf8,      ///< bytes that are not UTF-8 in a string -> invalid_utf8
    key_too_long,      ///< an aggregate key of over 600 bytes -> key_too_long
    undecodable,       ///< `data` with a number given as "x" -> decode_failed
    rejected,          ///< a payload the handler refuses -> handler_failed (trading: side "hold"
                       ///< or qty 0; game: consuming more than any player holds; not in orders)
};

/// Returns the stable text of a defect kind ("truncated", ...).
std::string_view to_string(defect d) noexcept;

/// Returns every defect kind, in declaration order.
std::vector<defect> every_defect();

/// What to generate.
struct gen_options {
    std::string domain = "trading";      ///< trading | game | orders
    std::uint64_t events = 1'000'000;    ///< distinct domain events
    std::uint64_t aggregates = 100'000;  ///< trading: positions; game: matches (a tenth) + players; orders: orders
    double redeliver = 0.10;             ///< share of lines re-sent later unchanged (same msgid) -> duplicate_message
    double republish = 0.02;             ///< share of events re-sent later under a new msgid -> duplicate_event
    double reissue = 0.01;               ///< trading: share of fills re-sent by a drop copy under a new event id,
                                         ///< same exec_id, no sequence; game: share of scores re-sent under a new
                                         ///< event id at the same stream position
    double reorder = 0.02;               ///< share of events delivered 1-3 positions of their stream late -> parked
    double malformed = 0.001;            ///< share of events followed by a defect line (kinds in turn)
    std::vector<defect> defects = every_defect();  ///< the defect kinds to cycle through
    std::uint64_t seed = 1;                        ///< same options and seed -> byte-identical output
    std::string key_prefix;                        ///< prepended to every aggregate key: several sources, one store
};

/// What a store must end with after consuming the generated lines.
struct gen_result {
    std::uint64_t lines = 0;   ///< lines written
    std::uint64_t events = 0;  ///< distinct domain events among them
    /// Final counters: applied, duplicate_message, duplicate_event, parked, dead_lettered,
    /// ignored (consumer_stats::outcomes) and released (consumer_stats::released).
    std::map<std::string, std::uint64_t> outcomes;
    std::map<std::string, std::uint64_t> dead_letter_reasons;  ///< reason text -> dead letters (nonzero only)
    std::uint64_t parked_left = 0;                             ///< events still parked at the end
    std::string totals_json;  ///< the domain's totals, as domain_totals() reads them from the rows
};

/// Generates a log: calls sink once per envelope (JSON text, no newline), in delivery
/// order, and returns the results a store must reach on it. Deterministic for a given
/// gen_options. Throws std::invalid_argument for an unknown domain or a share outside [0, 1].
gen_result generate(const gen_options& o, const std::function<void(std::string_view line)>& sink);

/// Returns the result as one compact JSON object (what `idem gen` prints).
std::string to_json(const gen_result& r);

}  // namespace idem::examples
