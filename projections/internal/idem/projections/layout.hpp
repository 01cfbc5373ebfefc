#pragma once

// The on-disk layout of a store, in one place: every table name, meta key and record codec.
// It mirrors the storage-layout table of docs/RUNTIME.md one to one; change both together.
// Integers are little-endian unless a key needs big-endian order; a length-prefixed string
// is [u32 LE length][bytes]. Not installed: the library, its tools and its tests read it.

#include <idem/projections/changes.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/codec.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem::layout {

// --- meta ---------------------------------------------------------------------------------

/// The format a store is written in. 2: inbox entries carry a fingerprint, commit and outcome;
/// 3: changed rows go to a journal first; 4: inbox entries carry the event's identity too, and
/// transport ids are keyed by their transport.
inline constexpr std::uint32_t storage_format = 4;
/// The table of single values.
inline constexpr std::string_view meta_table = "meta";
/// meta: the storage format, u32 LE.
inline constexpr std::string_view format_key = "format";
/// meta: the last commit number, u64 LE.
inline constexpr std::string_view commit_key = "commit";
/// meta: the store's identity, 32 hex digits, made with the store (a rebuild's store keeps its
/// predecessor's): what a change feed reader checks it still reads.
inline constexpr std::string_view store_id_key = "store-id";
/// meta: set in a backup: "<the copied store's id> <the commit copied>" (the copy has an id of its
/// own: its next commits are not the copied store's).
inline constexpr std::string_view copied_from_key = "copied-from";
/// meta: the change feed's last pruned position (commit u64 LE, index u32 LE): a reader after an
/// earlier position would miss entries.
inline constexpr std::string_view changes_pruned_key = "changes-pruned";
/// meta: a consumer's durable counters (consumer_stats).
std::string stats_key(std::string_view consumer);
/// meta, in a backup: a consumer's checkpoint for a source as it was copied (its value), so that
/// a source resuming the copy's own checkpoint is told apart from one that has moved on since.
std::string copied_checkpoint_key(std::string_view consumer, std::string_view source);
/// meta: a consumer's retention clock (clock_record).
std::string clock_key(std::string_view consumer);
/// meta: the event time below which a projection's contributing sets were pruned, ns, u64 LE.
std::string contrib_floor_key(std::string_view projection);
/// meta: a projection's row journals' epoch and fold cursor.
std::string journal_key(std::string_view projection);

// --- tables -------------------------------------------------------------------------------

/// The change feed: change_key(commit, index) -> change record (encode_change).
inline constexpr std::string_view changes_table = "changes";
/// When each commit with feed entries was made: commit (u64 BE) -> wall time ns, u64 LE.
inline constexpr std::string_view change_times_table = "change-times";

/// A consumer's inbox: an id_log of message ids (inbox_entry values).
std::string inbox_table(std::string_view consumer);
/// A projection's rows: esc(key) 00 00 -> row record (codec::encode_row).
std::string rows_table(std::string_view projection);
/// One of a projection's two row journals (parity 0 or 1).
std::string journal_table(std::string_view projection, std::uint64_t parity);
/// A projection's contributing sets: an id_log of esc(key) 00 01 <effect key>.
std::string contrib_table(std::string_view projection);
/// A consumer's streams: subject -> highest sequence processed, u64 LE.
std::string streams_table(std::string_view consumer);
/// A consumer's parked events: parked_key -> parked value.
std::string parked_table(std::string_view consumer);
/// A consumer's dead letters: position (u64 BE) -> dead-letter record.
std::string dead_letter_table(std::string_view consumer);
/// A consumer's transport collisions: position (u64 BE) -> dead-letter record.
std::string collision_table(std::string_view consumer);
/// The event ids of a consumer's deliveries under transport ids (event_ids.hpp).
std::string event_ids_table(std::string_view consumer);
/// The same events' contents: an id_log of `e<event id>` (the key a delivery without a transport
/// id has in the inbox) with 3 extra words: [stamp][content fingerprint][commit << 8 | outcome]
/// [shape: hash of type, schema version and sequence]. A new message id finds here (or in the
/// inbox) whether its event id was processed with other content; pruned with the inbox, by the
/// same cutoff.
std::string event_contents_table(std::string_view consumer);
/// A consumer's operator actions: position (u64 BE) -> audit record.
std::string audit_table(std::string_view consumer);
/// A consumer's checkpoints: source name -> checkpoint value.
std::string checkpoint_table(std::string_view consumer);

// --- values -------------------------------------------------------------------------------

/// Returns a u64 LE value, or 0 if absent or short.
std::uint64_t u64_or_zero(std::optional<std::string_view> v);
/// Encodes a u64 LE value.
std::string u64_value(std::uint64_t v);
/// Appends a length-prefixed string.
void put_str(std::string& out, std::string_view s);
/// Takes a length-prefixed string off the front of in (throws corrupt_record if truncated).
std::string_view take_str(std::string_view& in);
/// Takes a u64 LE off the front of in (throws corrupt_record if truncated).
std::uint64_t take_u64(std::string_view& in);
/// Takes a u32 LE off the front of in (throws corrupt_record if truncated).
std::uint32_t take_u32(std::string_view& in);

/// A consumer's retention clock: [highest event time seen][inbox floor], ns, u64 LE each; then
/// [pending jump: lowest time][n: events that agree on it][their n identities] (absent in stores
/// written before); then [m: the sources among them][their m source identities] (absent in stores
/// written before: no source counted yet).
struct clock_record {
    std::uint64_t event_time = 0;
    std::uint64_t inbox_floor = 0;
    std::uint64_t jump_time = 0;            ///< events far ahead of event_time that may be a real jump: their lowest time
    std::vector<std::uint64_t> jump_votes;  ///< the identities of the distinct events that agree on it (empty: none)
    std::vector<std::uint64_t> jump_sources;  ///< the distinct sources of those events (source_identity)
};
// --- the change feed ------------------------------------------------------------------------

/// A feed key: commit (u64 BE), index (u32 BE), so the table is in feed order.
std::string change_key(change_position at);
/// Reads a feed key (throws corrupt_record if it is not one).
change_position decode_change_key(std::string_view key);
/// A feed record: [kind u8][version u64][state version u32][str projection][str key][state bytes].
void encode_change(std::string& out, change_kind kind, std::uint64_t version, std::uint32_t state_version,
                   std::string_view projection, std::string_view key, std::string_view state);
/// Reads a feed entry (throws corrupt_record naming its position if it does not decode).
change decode_change(std::string_view key, std::string_view value);
/// meta changes_pruned_key's value: [commit u64][index u32] (none: nothing pruned).
std::string encode_position(change_position at);
change_position decode_position(std::optional<std::string_view> v);

clock_record decode_clock(std::optional<std::string_view> v);
std::string encode_clock(const clock_record& c);

/// A consumer's counters: outcome_kinds u64 then released, batches, late_events, id_conflicts,
/// pruned_ids, pruned_contributors, transport_collisions, future_events (older stores: fewer).
consumer_stats decode_stats(std::optional<std::string_view> v);
std::string encode_stats(const consumer_stats& s);

/// Where a dead letter was read: a source ("": none kept), and its line and byte offset there.
struct dead_letter_origin {
    std::string_view source{};
    std::uint64_t line = 0;
    std::uint64_t offset = 0;
};
/// A dead letter: [reason u8][time u64][message id][detail] (strings length-prefixed), then, when
/// the reason byte's 0x40 bit is set, its origin [source][line u64][offset u64]; then the envelope.
/// A too_large one keeps [size u64][digest u64] and its first dead_letter_prefix bytes, marked by
/// the reason byte's top bit (reasons stay below 64). Records without the 0x40 bit (written before
/// origins were kept) read with an empty source. digest: body_digest(body), where the caller has it.
std::string encode_dead_letter(reason why, std::string_view detail, std::string_view message_id,
                               std::string_view body, std::uint64_t time_ns, const dead_letter_origin& at = {},
                               std::optional<std::uint64_t> digest = {});
dead_letter decode_dead_letter(std::uint64_t position, std::string_view v);

/// A parked event's key: esc(subject) 00 01 <sequence u64 BE>.
std::string parked_key(std::string_view subject, std::uint64_t sequence);
/// Splits a parked key into (subject, sequence); nullopt if it is not one.
std::optional<std::pair<std::string, std::uint64_t>> decode_parked_key(std::string_view key);
/// A parked event's value: [u32 LE 0xFFFFFFFF][version u8 = 1][message id][event id] (length-prefixed)
/// then the envelope as received. Stores written before hold [message id] then the envelope:
/// their first word is the message id's length, which never reaches 0xFFFFFFFF.
std::string encode_parked(std::string_view message_id, std::string_view event_id, std::string_view body);
/// One decoded parked value.
struct parked_value {
    std::string_view message_id;  ///< the inbox key it was recorded under when parked
    std::optional<std::string_view> event_id;  ///< what a duplicate check compares (absent in older stores)
    std::string_view body;                     ///< the envelope as received
};
/// Decodes a parked value of either version (throws corrupt_record if truncated or of a newer version).
parked_value decode_parked_value(std::string_view v);
/// Splits a parked value into (message id, envelope).
std::pair<std::string_view, std::string_view> decode_parked(std::string_view v);

/// A checkpoint's value: the position (u64 LE), then what the source checks on resume.
std::string encode_checkpoint(std::uint64_t position, std::string_view detail);

/// An operator action: [time u64][commit u64][action][stream][note][summary] (length-prefixed)
/// [u32 n][n x (from u64, to u64)][u32 m][m x u64].
std::string encode_action(const operator_action& a);
operator_action decode_action(std::uint64_t position, std::string_view v);

// --- the inbox ----------------------------------------------------------------------------

/// An inbox entry (an id_log value with 3 extra words): [stamp u64][content fingerprint u64]
/// [commit << 8 | outcome u64][event identity u64, or for a message id that is the event id itself
/// (`e...`) the event's shape: a hash of its type, schema version and sequence][message id]. The
/// writer stages it through id_log; readers decode it here.
inline constexpr std::size_t inbox_extra_words = 3;
/// Bytes before the message id.
inline constexpr std::size_t inbox_header = 8 * (1 + inbox_extra_words);

/// Packs the commit number and outcome of the first delivery into one word: [commit:56]
/// [reason:5][outcome:3], the reason when it was dead-lettered (a reason past 31 is kept as none).
/// Entries recorded before reasons were kept have none there, which they read as.
inline std::uint64_t inbox_word(std::uint64_t commit, outcome_kind k, reason why) {
    static_assert(outcome_kinds <= 8, "an outcome kind takes 3 bits of the inbox word");
    const auto r = k == outcome_kind::dead_lettered ? static_cast<std::uint64_t>(why) : 0;
    return commit << 8 | (r < 32 ? r : 0) << 3 | static_cast<std::uint64_t>(k);
}
/// The commit, first outcome and reason an inbox word holds (inbox_word).
inline std::uint64_t inbox_commit(std::uint64_t word) { return word >> 8; }
inline outcome_kind inbox_outcome(std::uint64_t word) { return static_cast<outcome_kind>(word & 7); }
inline reason inbox_reason(std::uint64_t word) { return static_cast<reason>((word >> 3) & 31); }

/// An inbox entry's extra words, as the id_log entry carries them (stamp and key aside).
using inbox_words = std::array<std::uint64_t, inbox_extra_words>;

/// What the inbox keeps of the first delivery under a key: its extra words, named.
struct inbox_first {
    std::uint64_t fingerprint = 0;  ///< of the content first delivered (0: none was known)
    std::uint64_t commit = 0;       ///< the commit that recorded it
    outcome_kind outcome = outcome_kind::applied;  ///< what it did
    reason why = reason::none;                     ///< dead_lettered: why
    /// What tells another event under the same key from this one again: under a transport key
    /// the event's identity (event_identity); under an event key (is_event_key) the event's
    /// shape, since the key is the identity itself.
    std::uint64_t event_mark = 0;
};

/// Packs a first delivery into its extra words: [fingerprint][inbox_word][event_mark].
inline inbox_words encode_inbox_first(const inbox_first& f) {
    return {f.fingerprint, inbox_word(f.commit, f.outcome, f.why), f.event_mark};
}
/// Unpacks the extra words encode_inbox_first wrote.
inline inbox_first decode_inbox_first(const inbox_words& w) {
    return {w[0], inbox_commit(w[1]), inbox_outcome(w[1]), inbox_reason(w[1]), w[2]};
}

/// One decoded inbox value.
struct inbox_entry {
    consumer_view::inbox_record record;
    std::string_view message_id;
};

/// Decodes a stored inbox value; nullopt if it is too short to be one.
std::optional<inbox_entry> decode_inbox_entry(std::string_view v);

/// An inbox entry's event identity: the event id's hash, never 0 (0 marks a delivery without one).
std::uint64_t event_identity(std::string_view event_id);
/// Returns a CloudEvents source's identity (the hash the clock record keeps of a jump's sources).
std::uint64_t source_identity(std::string_view source);

/// Whether an inbox key is a transport id ('m' unnamed transport, 't' named), not an event id ('e').
inline bool is_transport_key(std::string_view key) noexcept { return key.starts_with('m') || key.starts_with('t'); }
/// Whether an inbox key is an event's own id ('e' then its source and id): the key an event is
/// known under whatever transport carries it.
inline bool is_event_key(std::string_view key) noexcept { return key.starts_with('e'); }
/// An inbox key as people write it: "'m-17'", "'m-17' of transport 'orders.jsonl'", or the event id.
std::string describe_message_id(std::string_view key);

/// Returns s, cut to n bytes with "..." when longer (keys and subjects in messages).
std::string truncate(std::string_view s, std::size_t n = 64);

}  // namespace idem::layout
