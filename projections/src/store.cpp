#include <idem/projections/store.hpp>

#include "event_ids.hpp"
#include "inbox_entry.hpp"
#include "operator_session.hpp"
#include "row_journal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/id_log.hpp>
#include <idem/storage/log_position.hpp>

#include <algorithm>
#include <utility>
#include <deque>
#include <iterator>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>

namespace idem {

std::string_view to_string(outcome_kind k) noexcept {
    switch (k) {
    case outcome_kind::applied: return "applied";
    case outcome_kind::duplicate_message: return "duplicate_message";
    case outcome_kind::duplicate_event: return "duplicate_event";
    case outcome_kind::parked: return "parked";
    case outcome_kind::dead_lettered: return "dead_lettered";
    case outcome_kind::ignored: return "ignored";
    }
    return "unknown";
}

std::string transport_message_id(std::string_view transport, std::string_view transport_id) {
    if (transport.empty()) return transport_message_id(transport_id);
    std::string out = "t";
    out.append(std::to_string(transport.size()));
    out.push_back(':');
    out.append(transport);
    out.append(transport_id);
    return out;
}

std::pair<std::string_view, std::string_view> split_message_id(std::string_view key) {
    if (key.starts_with("t")) {
        const auto colon = key.find(':');
        std::size_t n = 0;
        const auto digits = key.substr(1, colon == std::string_view::npos ? 0 : colon - 1);
        for (char c : digits) n = n * 10 + static_cast<std::size_t>(c - '0');
        if (colon != std::string_view::npos && colon + 1 + n <= key.size()) {
            return {key.substr(colon + 1, n), key.substr(colon + 1 + n)};
        }
    }
    return {{}, key.empty() ? key : key.substr(1)};
}

namespace {

// 2: inbox entries carry a fingerprint, commit and outcome; 3: changed rows go to a journal first;
// 4: inbox entries carry the event's identity too, and transport ids are keyed by their transport
constexpr std::uint32_t storage_format = 4;
constexpr std::string_view format_key = "format";
constexpr std::string_view commit_key = "commit";

std::string stats_key(std::string_view consumer) { return "stats/" + std::string(consumer); }
// A consumer's retention clock: [highest event time seen][inbox floor], ns, u64 LE each; then
// [pending jump: lowest time][n: events that agree on it][their n identities] (absent in stores written before).
std::string clock_key(std::string_view consumer) { return "clock/" + std::string(consumer); }
// The event time below which a projection's contributing sets were pruned, ns, u64 LE.
std::string contrib_floor_key(std::string_view projection) { return "contrib-floor/" + std::string(projection); }

struct clock_record {
    std::uint64_t event_time = 0;
    std::uint64_t inbox_floor = 0;
    std::uint64_t jump_time = 0;           // events far ahead of event_time that may be a real jump: their lowest time
    std::vector<std::uint64_t> jump_votes;  // the identities of the distinct events that agree on it (empty: none)
};

clock_record decode_clock(std::optional<std::string_view> v) {
    clock_record c;
    if (v && v->size() >= 16) {
        c.event_time = codec::get_u64_le(*v);
        c.inbox_floor = codec::get_u64_le(v->substr(8));
    }
    if (v && v->size() >= 32) {
        c.jump_time = codec::get_u64_le(v->substr(16));
        const auto n = codec::get_u64_le(v->substr(24));
        for (std::size_t i = 0; i < n && v->size() >= 40 + 8 * i; ++i) {
            c.jump_votes.push_back(codec::get_u64_le(v->substr(32 + 8 * i)));
        }
    }
    return c;
}

std::string encode_clock(const clock_record& c) {
    std::string out;
    codec::put_u64_le(out, c.event_time);
    codec::put_u64_le(out, c.inbox_floor);
    codec::put_u64_le(out, c.jump_time);
    codec::put_u64_le(out, c.jump_votes.size());
    for (auto id : c.jump_votes) codec::put_u64_le(out, id);
    return out;
}

std::uint64_t get_u64_or_zero(std::optional<std::string_view> v) {
    return v && v->size() >= 8 ? codec::get_u64_le(*v) : 0;
}

std::uint64_t count_ns(std::chrono::nanoseconds d) { return d.count() > 0 ? static_cast<std::uint64_t>(d.count()) : 0; }

// Inbox entries carry [fingerprint][commit << 8 | outcome].
std::uint64_t now_ns() {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
}

consumer_stats decode_stats(std::optional<std::string_view> v) {
    consumer_stats s;
    if (!v || v->size() < (outcome_kinds + 2) * 8) return s;
    for (std::size_t i = 0; i < outcome_kinds; ++i) s.outcomes[i] = codec::get_u64_le(v->substr(i * 8));
    s.released = codec::get_u64_le(v->substr(outcome_kinds * 8));
    s.batches = codec::get_u64_le(v->substr((outcome_kinds + 1) * 8));
    if (v->size() >= (outcome_kinds + 6) * 8) {
        s.late_events = codec::get_u64_le(v->substr((outcome_kinds + 2) * 8));
        s.id_conflicts = codec::get_u64_le(v->substr((outcome_kinds + 3) * 8));
        s.pruned_ids = codec::get_u64_le(v->substr((outcome_kinds + 4) * 8));
        s.pruned_contributors = codec::get_u64_le(v->substr((outcome_kinds + 5) * 8));
    }
    if (v->size() >= (outcome_kinds + 8) * 8) {
        s.transport_collisions = codec::get_u64_le(v->substr((outcome_kinds + 6) * 8));
        s.future_events = codec::get_u64_le(v->substr((outcome_kinds + 7) * 8));
    }
    return s;
}

std::string encode_stats(const consumer_stats& s) {
    std::string out;
    for (auto n : s.outcomes) codec::put_u64_le(out, n);
    codec::put_u64_le(out, s.released);
    codec::put_u64_le(out, s.batches);
    codec::put_u64_le(out, s.late_events);
    codec::put_u64_le(out, s.id_conflicts);
    codec::put_u64_le(out, s.pruned_ids);
    codec::put_u64_le(out, s.pruned_contributors);
    codec::put_u64_le(out, s.transport_collisions);
    codec::put_u64_le(out, s.future_events);
    return out;
}

void put_str(std::string& out, std::string_view s) {
    codec::put_u32_le(out, static_cast<std::uint32_t>(s.size()));
    out.append(s);
}

std::string_view take_str(std::string_view& in) {
    if (in.size() < 4) throw_error(errc::corrupt_record, "truncated record");
    auto n = codec::get_u32_le(in);
    if (in.size() - 4 < n) throw_error(errc::corrupt_record, "truncated record");
    auto s = in.substr(4, n);
    in.remove_prefix(4 + n);
    return s;
}

// A too_large body is kept as its first dead_letter_prefix bytes with its size and digest:
// the reason byte's top bit marks that form (reasons stay below 128).
std::string encode_dead_letter(reason why, std::string_view detail, std::string_view message_id,
                               std::string_view body, std::uint64_t time_ns) {
    const bool cut = why == reason::too_large && body.size() > dead_letter_prefix;
    std::string out;
    out.push_back(static_cast<char>(static_cast<unsigned>(why) | (cut ? 0x80u : 0u)));
    codec::put_u64_le(out, time_ns);
    put_str(out, message_id);
    put_str(out, detail);
    if (cut) {
        codec::put_u64_le(out, body.size());
        codec::put_u64_le(out, body_digest(body));
        body = body.substr(0, dead_letter_prefix);
    }
    out.append(body);
    return out;
}

dead_letter decode_dead_letter(std::uint64_t position, std::string_view v) {
    if (v.size() < 9) throw_error(errc::corrupt_record, "truncated dead letter");
    dead_letter d;
    d.position = position;
    const auto first = static_cast<unsigned char>(v[0]);
    d.why = static_cast<reason>(first & 0x7fu);
    d.time_ns = codec::get_u64_le(v.substr(1));
    v.remove_prefix(9);
    d.message_id = take_str(v);
    d.detail = take_str(v);
    d.body_size = v.size();
    if ((first & 0x80u) != 0) {
        if (v.size() < 16) throw_error(errc::corrupt_record, "truncated dead letter");
        d.truncated = true;
        d.body_size = codec::get_u64_le(v);
        d.body_digest = codec::get_u64_le(v.substr(8));
        v.remove_prefix(16);
    }
    d.body = v;
    return d;
}

std::string parked_key(std::string_view subject, std::uint64_t sequence) {
    return codec::contributor_key(subject, codec::u64_key(sequence));
}

std::string truncate(std::string_view s, std::size_t n = 64) {
    if (s.size() <= n) return std::string(s);
    return std::string(s.substr(0, n)) + "...";
}

// An inbox entry's identity word: the event id's hash, never 0 (0 marks a delivery without one).
std::uint64_t event_identity(std::string_view event_id) { return id_log::hash_of(event_id) | 1; }

// An inbox key as people write it: "m-17", "m-17 of transport 'orders.jsonl'", or the event id.
std::string describe_message_id(std::string_view key) {
    if (key.starts_with("t")) {
        const auto colon = key.find(':');
        std::size_t n = 0;
        for (char c : key.substr(1, colon - 1)) n = n * 10 + static_cast<std::size_t>(c - '0');
        if (colon != std::string_view::npos && colon + 1 + n <= key.size()) {
            return "'" + truncate(key.substr(colon + 1 + n)) + "' of transport '" + truncate(key.substr(colon + 1, n)) +
                   "'";
        }
    }
    return "'" + truncate(key.substr(std::min<std::size_t>(1, key.size()))) + "'";
}

}  // namespace

namespace {
class batch_run;
}  // namespace

struct store::impl {
    impl();
    ~impl();
    store_options options;
    std::shared_ptr<environment> env;
    MDB_dbi meta = 0;
    MDB_dbi streams = 0;
    MDB_dbi parked = 0;
    MDB_dbi dead = 0;
    MDB_dbi checkpoints = 0;
    MDB_dbi collisions = 0;
    std::unique_ptr<id_log> ids;  // the inbox
    std::unique_ptr<detail::event_id_log> event_ids;  // event ids of deliveries under transport ids
    std::vector<std::unique_ptr<projection_base>> projections;
    std::vector<MDB_dbi> tables;
    std::vector<std::unique_ptr<id_log>> contributors;  // per projection: row + effect key pairs
    std::vector<std::unique_ptr<detail::row_journal>> journals;  // per projection: rows not yet folded in
    envelope_parser parser;

    // A bulk build (begin_bulk .. end_bulk): one transaction and one batch_run across apply() calls.
    std::unique_ptr<write_txn> bulk_txn;
    std::unique_ptr<batch_run> bulk;
    std::size_t bulk_budget = 0;

    std::uint64_t wall_now() const { return options.retention.now ? options.retention.now() : now_ns(); }
    prune_result prune_step(write_txn& txn, const prune_limits& limits, clock_record clock, consumer_stats& stats,
                            std::vector<std::pair<std::size_t, id_log::prune_step>>& steps);
    prune_result prune_run(write_txn& txn, const prune_limits& limits, batch_run& run,
                           std::vector<std::pair<std::size_t, id_log::prune_step>>& steps);
    void prune_in_batch(write_txn& txn, batch_run& run, std::vector<std::pair<std::size_t, id_log::prune_step>>& steps);
    void forget_pruned(const std::vector<std::pair<std::size_t, id_log::prune_step>>& steps) {
        // The removed entries are gone for good: the indexes drop them (after the commit).
        for (const auto& [p, step] : steps) (p == SIZE_MAX ? *ids : *contributors[p]).pruned(step);
    }
    bool retaining() const noexcept {
        return options.retention.inbox_retention.has_value() || options.retention.allowed_lateness.has_value();
    }
    std::vector<outcome> run(const prepared_batch& batch, const std::optional<checkpoint>& at);
    void run_operator(const std::function<bool(detail::operator_session&)>& fn);
    std::vector<outcome> run_bulk(const prepared_batch& batch, const std::optional<checkpoint>& at);
    void abandon_bulk();
    void open_tables() {
        // Everything is opened first and swapped in at the end: a failure half way leaves the
        // previous handles and indexes in place, never a partial set.
        auto new_streams = env->table("streams/" + options.consumer);
        auto new_parked = env->table("parked/" + options.consumer);
        auto new_dead = env->table("deadletter/" + options.consumer);
        auto new_checkpoints = env->table("checkpoint/" + options.consumer);
        auto new_collisions = env->table("collision/" + options.consumer);
        auto new_ids = std::make_unique<id_log>(*env, "inbox/" + options.consumer, detail::inbox_extra_words);
        auto new_event_ids = std::make_unique<detail::event_id_log>(*env, options.consumer, new_ids->table());
        std::vector<MDB_dbi> new_tables;
        std::vector<std::unique_ptr<id_log>> new_contributors;
        std::vector<std::unique_ptr<detail::row_journal>> new_journals;
        for (const auto& p : projections) {
            new_tables.push_back(env->table("proj/" + p->name()));
            new_contributors.push_back(std::make_unique<id_log>(*env, "contrib/" + p->name()));
            new_journals.push_back(std::make_unique<detail::row_journal>(*env, p->name(), meta));
        }
        streams = new_streams;
        parked = new_parked;
        dead = new_dead;
        checkpoints = new_checkpoints;
        collisions = new_collisions;
        ids = std::move(new_ids);
        event_ids = std::move(new_event_ids);
        tables = std::move(new_tables);
        contributors = std::move(new_contributors);
        journals = std::move(new_journals);
    }
    void open_projection(const projection_base& p) {
        tables.push_back(env->table("proj/" + p.name()));
        contributors.push_back(std::make_unique<id_log>(*env, "contrib/" + p.name()));
        journals.push_back(std::make_unique<detail::row_journal>(*env, p.name(), meta));
    }
    void rolled_back() {
        ids->rolled_back();
        for (auto& c : contributors) c->rolled_back();
        for (auto& j : journals) j->rolled_back();
    }
};

struct prepared_batch::item {
    /// What one projection makes of the event: its decoded payload and rows, or why not.
    struct part {
        std::size_t projection = 0;
        const projection_base::handler* handler = nullptr;
        std::shared_ptr<const void> decoded;
        std::vector<std::string> keys;          // sorted, unique, non-empty
        std::vector<std::string> contributors;  // per key: the contributing-set entry (row + effect key)
        std::vector<std::uint64_t> contributor_hashes;  // per key: id_log::hash_of(contributor)
        std::vector<std::uint64_t> key_hashes;          // per key: its hash in the batch's row table
        std::optional<std::string> effect;
        reason failed = reason::none;  // decode_failed, handler_failed (a key function), missing_key
        std::string detail;
    };
    std::string body;
    std::string transport_id;
    std::string transport;   // the transport the id belongs to
    std::uint64_t line = 0;  // where it was read from a log (0: not from a log)
    std::uint64_t offset = 0;
    std::string message_id;  // the inbox key (set when the envelope parsed)
    std::uint64_t message_hash = 0;  // id_log::hash_of(message_id)
    std::uint64_t subject_hash = 0;  // the subject's hash in the batch's stream table
    std::optional<std::uint64_t> time_ns;  // the event time, if it has one that parses
    std::uint64_t fingerprint = 0;         // of the decoded content (or of the bytes, when malformed)
    std::uint64_t identity = 0;            // of the event id (0: malformed, no event id)
    parse_error err;  // err.why != none: the envelope is rejected as a whole
    envelope ev;
    std::vector<part> parts;  // per projection handling ev.type, in the order projections were added
};

prepared_batch::prepared_batch() = default;
prepared_batch::~prepared_batch() = default;
prepared_batch::prepared_batch(prepared_batch&&) noexcept = default;
prepared_batch& prepared_batch::operator=(prepared_batch&&) noexcept = default;
std::size_t prepared_batch::size() const noexcept { return items_.size(); }
void prepared_batch::append(prepared_batch&& other) {
    if (items_.empty()) {
        items_.swap(other.items_);
        return;
    }
    std::move(other.items_.begin(), other.items_.end(), std::back_inserter(items_));
    other.items_.clear();
}
void prepared_batch::take(prepared_batch& other, std::size_t i) { items_.push_back(std::move(other.items_.at(i))); }
void prepared_batch::clear() noexcept { items_.clear(); }

namespace {

using part = prepared_batch::item::part;

/// Decodes the event for every projection handling its type and runs the key functions.
void prepare_parts(const store::impl& s, const envelope& ev, std::vector<part>& parts) {
    meta m{ev.id, ev.source, ev.type, ev.subject, ev.sequence, ev.time, {}};
    std::string event_id;  // the default effect key, built when a projection needs it
    std::size_t used = 0;  // parts are reused (with their strings' capacity) when a batch is recycled
    for (std::size_t p = 0; p < s.projections.size(); ++p) {
        const auto& proj = *s.projections[p];
        const auto* h = proj.find(ev.type);
        if (h == nullptr) continue;
        if (used == parts.size()) parts.emplace_back();
        auto& out = parts[used++];
        out.projection = p;
        out.handler = h;
        out.decoded.reset();
        out.keys.clear();
        out.effect.reset();
        out.failed = reason::none;
        out.detail.clear();
        auto fail = [&](reason why, const std::string& what) {
            out.failed = why;
            out.detail = describe(ev) + ", projection '" + proj.name() + "'" + what;
        };
        if (ev.data_binary) {
            // A typed handler reads JSON; data_base64 that is not JSON has no decoding into its type.
            fail(reason::decode_failed,
                 ": data does not decode as " + ev.type + ": it is binary (data_base64 of " +
                     std::to_string(ev.data.size()) + " bytes, " +
                     (ev.datacontenttype.empty() ? "no datacontenttype" : "datacontenttype '" + ev.datacontenttype + "'") +
                     "), and a typed handler takes JSON data only");
            continue;
        }
        try {
            out.decoded = h->decode(ev.data);
        } catch (const std::exception& e) {
            fail(reason::decode_failed, ": data does not decode as " + ev.type + ": " + e.what());
            continue;
        }
        try {
            proj.keys(*h, out.decoded.get(), m, out.keys);
            out.effect = proj.effect_key(*h, out.decoded.get(), m);
        } catch (const std::exception& e) {
            fail(reason::handler_failed, std::string(": key function threw: ") + e.what());
            continue;
        }
        if (out.keys.empty()) {
            fail(reason::missing_key, ": no aggregate key (the event has no subject)");
            continue;
        }
        if (out.effect && out.effect->empty()) {
            fail(reason::missing_key, ": the effect key is empty");
            continue;
        }
        std::sort(out.keys.begin(), out.keys.end());
        out.keys.erase(std::unique(out.keys.begin(), out.keys.end()), out.keys.end());
        if (out.keys.front().empty()) {
            fail(reason::missing_key, ": an aggregate key is empty");
            continue;
        }
        if (!out.effect && event_id.empty()) event_id = ev.event_id();
        out.contributors.resize(out.keys.size());
        out.contributor_hashes.resize(out.keys.size());
        out.key_hashes.resize(out.keys.size());
        for (std::size_t k = 0; k < out.keys.size(); ++k) {
            out.key_hashes[k] = std::hash<std::string_view>{}(out.keys[k]);
            out.contributors[k] = codec::contributor_key(out.keys[k], out.effect ? *out.effect : event_id);
            out.contributor_hashes[k] = id_log::hash_of(out.contributors[k]);
        }
    }
    parts.resize(used);
}

void prepare_item(const store::impl& s, const delivery& d, prepared_batch::item& out, envelope_parser& parser) {
    out.body.assign(d.body);
    out.transport_id.assign(d.message_id);
    out.transport.assign(d.transport);
    out.line = d.line;
    out.offset = d.offset;
    const auto limit = s.options.max_event_bytes;
    if (limit != 0 && d.body.size() > limit) {
        out.err = {reason::too_large, "the envelope has " + std::to_string(d.body.size()) +
                                          " bytes, over the limit of " + std::to_string(limit)};
        out.identity = 0;
        out.time_ns.reset();
        out.fingerprint = fingerprint_bytes(out.body);
        out.parts.clear();
        return;
    }
    if (parser.parse(out.body, out.ev, out.err)) {
        // A transport id (the delivery's, else the envelope's msgid) counts within its transport.
        const auto& transport_id = out.transport_id.empty() ? out.ev.msgid : out.transport_id;
        out.message_id =
            transport_id.empty() ? out.ev.message_id() : transport_message_id(out.transport, transport_id);
        out.message_hash = id_log::hash_of(out.message_id);
        out.identity = event_identity(out.ev.event_id());
        out.subject_hash = std::hash<std::string_view>{}(out.ev.subject);
        out.time_ns = parse_event_time(out.ev.time);
        out.fingerprint = fingerprint(out.ev);
        prepare_parts(s, out.ev, out.parts);
    } else {
        out.identity = 0;
        out.time_ns.reset();
        out.fingerprint = fingerprint_bytes(out.body);
        out.parts.clear();
    }
}

}  // namespace

namespace {

/// Strings to V with one hash per lookup and references that stay valid as it grows: the
/// entries live in a deque, an open-addressing array of their indices finds them.
template <class V>
class string_table {
public:
    struct entry {
        std::string key;
        std::uint64_t hash = 0;
        V value{};
    };

    /// Returns the hash try_emplace uses for key.
    static std::uint64_t hash_of(std::string_view key) noexcept { return std::hash<std::string_view>{}(key); }
    /// Returns the entry for key, inserting a default value if absent; and whether it was inserted.
    std::pair<entry*, bool> try_emplace(std::string_view key) { return try_emplace(key, hash_of(key)); }
    /// The same with key's hash computed ahead.
    std::pair<entry*, bool> try_emplace(std::string_view key, std::uint64_t hash) {
        if (!slots_.empty()) {
            const std::size_t mask = slots_.size() - 1;
            for (auto i = static_cast<std::size_t>(hash) & mask; slots_[i] != 0; i = (i + 1) & mask) {
                auto& e = entries_[slots_[i] - 1];
                if (e.hash == hash && e.key == key) return {&e, false};
            }
        }
        if ((entries_.size() + 1) * 10 > slots_.size() * 7) grow();
        const std::size_t mask = slots_.size() - 1;
        auto i = static_cast<std::size_t>(hash) & mask;
        while (slots_[i] != 0) i = (i + 1) & mask;
        auto& e = entries_.emplace_back();
        e.key.assign(key);
        e.hash = hash;
        slots_[i] = static_cast<std::uint32_t>(entries_.size());
        return {&e, true};
    }
    void clear() {
        entries_.clear();
        slots_.clear();
    }
    /// Asks the CPU to bring hash's slot, and the entry it holds now, into cache.
    void prefetch(std::uint64_t hash) const noexcept {
        if (slots_.empty()) return;
        const auto slot = slots_[static_cast<std::size_t>(hash) & (slots_.size() - 1)];
        if (slot != 0) __builtin_prefetch(&entries_[slot - 1]);
    }
    std::deque<entry>& entries() noexcept { return entries_; }

private:
    void grow() {
        slots_.assign(std::max<std::size_t>(64, slots_.size() * 2), 0);
        const std::size_t mask = slots_.size() - 1;
        for (std::size_t k = 0; k < entries_.size(); ++k) {
            auto i = static_cast<std::size_t>(entries_[k].hash) & mask;
            while (slots_[i] != 0) i = (i + 1) & mask;
            slots_[i] = static_cast<std::uint32_t>(k + 1);
        }
    }

    std::deque<entry> entries_;
    std::vector<std::uint32_t> slots_;  // entry index + 1; 0 marks an empty slot
};

// The state of one batch while it is being applied; written out at the end, in key order.
class batch_run {
    friend class operator_run;

public:
    /// Starts on a fresh write transaction: catches the id indexes up with other writers and
    /// reads the consumer's counters and the number this batch will commit as.
    /// A bulk build writes rows straight into the row tables (it folds the journals in first).
    batch_run(store::impl& s, write_txn& txn, bool bulk = false) : s_(s), txn_(txn), bulk_(bulk) {
        s_.ids->catch_up(txn_);
        s_.event_ids->clear();
        for (auto& c : s_.contributors) c->catch_up(txn_);
        for (std::size_t p = 0; p < s_.journals.size(); ++p) {
            s_.journals[p]->catch_up(txn_);
            if (bulk_) s_.journals[p]->fold_all(txn_, s_.tables[p]);
        }
        if (auto v = txn_.get(s_.meta, commit_key); v && v->size() >= 8) commit_ = codec::get_u64_le(*v) + 1;
        stats = decode_stats(txn_.get(s_.meta, stats_key(s_.options.consumer)));
        clock_ = decode_clock(txn_.get(s_.meta, clock_key(s_.options.consumer)));
        for (const auto& p : s_.projections) {
            contrib_floors_.push_back(get_u64_or_zero(txn_.get(s_.meta, contrib_floor_key(p->name()))));
        }
        cursor c{txn_, s_.parked};
        parked_possible_ = c.first().has_value();
    }

    /// Applies deliveries in order and returns their outcomes; at, if given, is where they were
    /// read from (dead letters name it) and becomes the source's checkpoint at finish().
    std::vector<outcome> deliver_all(const std::vector<prepared_batch::item>& batch,
                                     const std::optional<checkpoint>& at);
    /// Returns the commit number the batch's outcomes carry.
    std::uint64_t commit() const noexcept { return commit_; }
    /// Brings the index slots a later deliver(d) will probe into cache (hashes are prepared).
    void prefetch(const prepared_batch::item& d) const noexcept {
        if (d.err.why != reason::none) return;
        s_.ids->prefetch(d.message_hash);
        if (d.ev.sequence) streams_.prefetch(d.subject_hash);
        for (const auto& pt : d.parts) {
            for (auto h : pt.contributor_hashes) s_.contributors[pt.projection]->prefetch(h);
            if (pt.projection < rows_.size()) {
                for (auto h : pt.key_hashes) rows_[pt.projection].prefetch(h);
            }
        }
    }
    /// Writes everything the batch holds into the transaction (the caller commits).
    void finish();
    /// Bulk builds: writes what the batch holds so far (ids, effect keys, dead letters) into the
    /// transaction, and the rows too when they exceed budget bytes (then forgets them).
    void spill(std::size_t budget);

    consumer_stats stats;
    /// The consumer's retention clock as this batch has moved it (prune steps in a bulk build read it).
    const clock_record& clock() const noexcept { return clock_; }
    void set_inbox_floor(std::uint64_t floor) noexcept { clock_.inbox_floor = std::max(clock_.inbox_floor, floor); }
    void set_contrib_floor(std::size_t p, std::uint64_t floor) {
        if (p < contrib_floors_.size()) contrib_floors_[p] = std::max(contrib_floors_[p], floor);
    }

private:
    struct row_slot {
        codec::row_header header;
        std::unique_ptr<detail::state_box> state;
        bool dirty = false;
    };
    struct staged_change {
        std::size_t projection;
        row_slot* slot;
        std::unique_ptr<detail::state_box> state;
        const std::string* contributor;
        std::uint64_t contributor_hash;
        bool own_stream;
    };

    outcome deliver(const prepared_batch::item& d);
    bool ahead(std::uint64_t time, std::uint64_t identity);
    bool holds(std::size_t p, const std::string& contributor, std::uint64_t hash) const;
    bool future_guarded() const;
    outcome future_event(const envelope& ev, std::uint64_t time, std::string_view message_id, std::string_view body);
    outcome process(const envelope& ev, std::optional<std::uint64_t> time, std::string_view message_id,
                    std::string_view body, const std::vector<part>& parts);
    std::optional<outcome> late(const envelope& ev, std::optional<std::uint64_t> time, std::string_view message_id,
                                std::string_view body, const std::vector<part>& parts);
    outcome apply_projections(const envelope& ev, std::string_view message_id, std::string_view body,
                              const std::vector<part>* parts);
    void release_parked(const std::string& subject);
    outcome dead(reason why, std::string detail, std::string_view message_id, std::string_view body);
    row_slot& load_row(std::size_t p, const std::string& key, std::uint64_t hash);
    struct stream_state {
        std::uint64_t highest = 0;
        bool dirty = false;
    };
    stream_state& stream(const std::string& subject);
    std::optional<std::string> parked_value(const std::string& key) const;
    void write_rows();
    void write_dead_letters();
    void write_collisions();


    store::impl& s_;
    write_txn& txn_;
    bool bulk_ = false;
    std::uint64_t time_ns_ = s_.wall_now();
    clock_record clock_;                         // the consumer's event time and inbox floor
    std::uint64_t clock_before_ = 0;             // the event time before the delivery being applied
    bool future_ = false;                        // the delivery being applied is too far ahead of it
    std::vector<std::uint64_t> contrib_floors_;  // per projection: its contributing sets were pruned below this
    std::deque<string_table<row_slot>> rows_;  // per projection: the rows this batch touched
    string_table<stream_state> streams_;
    bool parked_possible_ = false;  // the parked table or this batch holds an event: release_parked must look
    std::map<std::string, std::optional<std::string>> parked_;  // nullopt: deleted in this batch
    std::vector<std::string> dead_letters_;
    std::vector<std::string> collisions_;  // transport collisions seen, encoded as dead letters are
    std::size_t row_bytes_ = 0;  // an estimate of the memory rows_ holds
    const prepared_batch::item* current_ = nullptr;  // the delivery being applied (null: a released parked event)
    std::string source_;                              // where the batch was read from, if from a log
    std::map<std::string, std::string> checkpoints_;  // source -> stored value, written at finish()
    std::uint64_t commit_ = 1;
};

outcome batch_run::dead(reason why, std::string detail, std::string_view message_id, std::string_view body) {
    const auto log_path = log_source_path(source_);
    if (current_ != nullptr && log_path) {
        // Read from a log: say where (path:line, or the byte offset once resumed mid-file).
        const auto path = *log_path;
        detail = current_->line != 0 ? std::string(path) + ":" + std::to_string(current_->line) + " (byte offset " +
                                           std::to_string(current_->offset) + "): " + detail
                                     : std::string(path) + " at byte offset " + std::to_string(current_->offset) +
                                           ": " + detail;
    }
    dead_letters_.push_back(encode_dead_letter(why, detail, message_id, body, time_ns_));
    return outcome{outcome_kind::dead_lettered, why, std::move(detail), 0};
}

outcome batch_run::deliver(const prepared_batch::item& d) {
    current_ = &d;
    const bool malformed = d.err.why != reason::none;
    // Without a valid envelope only a transport id can identify a redelivery.
    std::string transport;
    if (malformed && !d.transport_id.empty()) transport = transport_message_id(d.transport, d.transport_id);
    const std::string& message_id = malformed ? transport : d.message_id;
    const auto hash = malformed ? id_log::hash_of(message_id) : d.message_hash;
    auto label = [&] { return malformed ? std::string("message") : describe(d.ev) + ": message"; };
    std::optional<std::string> collision;  // the transport id was first used by another event
    if (!message_id.empty()) {
        if (auto first = s_.ids->find(txn_, message_id, hash)) {
            const auto first_commit = first->position == 0 ? commit_ : first->extra[1] >> 8;
            if (first->extra[2] != d.identity && !message_id.starts_with("e")) {
                // A transport id is unique within its transport only as far as the transport keeps
                // it so: another event under it is reported, and judged on its own as a new message.
                ++stats.transport_collisions;
                collision = label() + " " + describe_message_id(message_id) + " was first used in commit " +
                            std::to_string(first_commit) +
                            " by another event: a transport id collision, judged as a new message";
            } else if (first->extra[0] != 0 && first->extra[0] != d.fingerprint) {
                // Same id, other content: the first effect stands; this one is kept for the operator.
                ++stats.id_conflicts;
                return dead(reason::id_conflict,
                            label() + " " + describe_message_id(message_id) + " was first processed in commit " +
                                std::to_string(first_commit) + " with other content (fingerprint " +
                                std::to_string(first->extra[0]) + ", this delivery " + std::to_string(d.fingerprint) +
                                "); the first effect stands",
                            message_id, d.body);
            } else {
                return outcome{outcome_kind::duplicate_message, reason::none,
                               label() + " " + describe_message_id(message_id) + " already processed in commit " +
                                   std::to_string(first_commit),
                               0};
            }
        }
    }
    clock_before_ = clock_.event_time;
    future_ = d.time_ns && ahead(*d.time_ns, d.identity);
    if (d.time_ns && !future_) clock_.event_time = std::max(clock_.event_time, *d.time_ns);
    const auto stamp = s_.options.retention.clock == retention_clock::event ? clock_.event_time : time_ns_;
    // A collision's id is in the inbox already (the first event's); this event is not recorded under it.
    const bool record = !message_id.empty() && !collision;
    if (record) s_.ids->stage(message_id, stamp, hash);
    // Transport ids ('m' unnamed transport, 't' named) are what `why --event` must map back to the event.
    if (record && !malformed && (message_id.starts_with('m') || message_id.starts_with('t'))) {
        s_.event_ids->stage(message_id, d.ev.event_id(), stamp);
    }
    auto result = malformed ? dead(d.err.why, "malformed event: " + d.err.detail, message_id, d.body)
                            : process(d.ev, d.time_ns, message_id, d.body, d.parts);
    if (record) s_.ids->annotate_last({d.fingerprint, detail::inbox_word(commit_, result.kind), d.identity});
    if (collision) {
        *collision += ": " + std::string(to_string(result.kind)) +
                      (result.why != reason::none ? " (" + std::string(to_string(result.why)) + ")" : std::string());
        collisions_.push_back(encode_dead_letter(reason::transport_collision, *collision, message_id, d.body, time_ns_));
        result.detail = result.detail.empty() ? *collision : *collision + "; " + result.detail;
    }
    return result;
}

bool batch_run::holds(std::size_t p, const std::string& contributor, std::uint64_t hash) const {
    // An entry counts until the horizon (as of the delivery being judged) passes its stamp, whether
    // or not a prune step has removed it yet: outcomes never depend on when pruning ran, so batch
    // sizes and a rebuild give the same ones. An expired entry may have been recorded again since.
    auto e = s_.contributors[p]->find(txn_, contributor, hash);
    if (!e) return false;
    const auto& lateness = s_.options.retention.allowed_lateness;
    if (!lateness || clock_before_ <= count_ns(*lateness)) return true;
    const auto horizon = clock_before_ - count_ns(*lateness);
    if (e->stamp >= horizon) return true;
    e = s_.contributors[p]->find_newest(txn_, contributor, hash);
    return e && e->stamp >= horizon;
}

bool batch_run::future_guarded() const {
    const auto& r = s_.options.retention;
    return r.max_future_skew && (r.allowed_lateness || (r.inbox_retention && r.clock == retention_clock::event));
}

outcome batch_run::future_event(const envelope& ev, std::uint64_t time, std::string_view message_id,
                                std::string_view body) {
    ++stats.future_events;
    return dead(reason::future_event,
                describe(ev) + ": event time " + ev.time + " is " + std::to_string((time - clock_.event_time) / 1'000'000) +
                    " ms ahead of the consumer's event time, more than the allowed skew of " +
                    format_duration(*s_.options.retention.max_future_skew) +
                    "; it did not move the event-time horizon",
                message_id, body);
}

bool batch_run::ahead(std::uint64_t time, std::uint64_t identity) {
    // An event far ahead of the consumer's event time is held against it (one bad clock must not
    // move the horizon for everyone) until enough such events agree that the source jumped forward.
    const auto& r = s_.options.retention;
    if (!future_guarded() || clock_.event_time == 0) return false;
    const auto skew = count_ns(*r.max_future_skew);
    if (time <= clock_.event_time || time - clock_.event_time <= skew) return false;
    // Votes are distinct events: the same outlier re-sent under new message ids votes once.
    auto& votes = clock_.jump_votes;
    const auto lo = std::min(time, clock_.jump_time);
    const auto hi = std::max(time, clock_.jump_time);
    if (!votes.empty() && hi - lo <= skew) {
        clock_.jump_time = lo;
        if (std::find(votes.begin(), votes.end(), identity) == votes.end()) votes.push_back(identity);
    } else {
        clock_.jump_time = time;
        votes.assign(1, identity);
    }
    if (votes.size() < std::max<std::uint32_t>(1, r.future_confirmations)) return true;
    clock_.jump_time = 0;
    votes.clear();
    return false;
}

std::optional<outcome> batch_run::late(const envelope& ev, std::optional<std::uint64_t> time,
                                       std::string_view message_id, std::string_view body,
                                       const std::vector<part>& parts) {
    // The contributing sets of these rows prove an unsequenced event new only above their floor
    // (where they may have been pruned) and, by policy, the horizon.
    const auto& lateness = s_.options.retention.allowed_lateness;
    std::uint64_t floor = 0;
    if (lateness && clock_before_ > count_ns(*lateness)) floor = clock_before_ - count_ns(*lateness);
    for (const auto& pt : parts) floor = std::max(floor, contrib_floors_[pt.projection]);
    if (!lateness && floor == 0) return std::nullopt;
    if (!time) {
        ++stats.late_events;
        return dead(reason::late_event,
                    describe(ev) + ": no usable time ('" + truncate(ev.time) +
                        "'): with an event-time horizon an unsequenced event needs one to be proven new",
                    message_id, body);
    }
    if (*time >= floor) return std::nullopt;
    ++stats.late_events;
    return dead(reason::late_event,
                describe(ev) + ": event time " + ev.time + " is older than the horizon (" +
                    std::to_string((floor - *time) / 1'000'000) +
                    " ms before it) and no sequence proves it new; its contributing sets may be pruned",
                message_id, body);
}

outcome batch_run::process(const envelope& ev, std::optional<std::uint64_t> time, std::string_view message_id,
                           std::string_view body, const std::vector<part>& parts) {
    if (!ev.sequence) {
        if (future_) return future_event(ev, *time, message_id, body);
        if (!parts.empty()) {
            if (auto rejected = late(ev, time, message_id, body, parts)) return std::move(*rejected);
        }
        return apply_projections(ev, message_id, body, &parts);
    }
    auto seq = *ev.sequence;
    // The parked key escapes the subject (at most doubling it) and appends 10 bytes: measure only when it may not fit.
    if (2 * ev.subject.size() + 10 > txn_.env().max_key_size() &&
        parked_key(ev.subject, seq).size() > txn_.env().max_key_size()) {
        return dead(reason::key_too_long,
                    describe(ev) + ": subject of " + std::to_string(ev.subject.size()) +
                        " bytes is too long to track its stream (limit ~500 bytes)",
                    message_id, body);
    }
    auto& st = stream(ev.subject);  // a reference into a node-based map: stable while the batch runs
    const auto highest = st.highest;
    if (seq <= highest) {
        return outcome{outcome_kind::duplicate_event, reason::none,
                       describe(ev) + ": sequence " + std::to_string(seq) + " of '" + truncate(ev.subject) +
                           "' already applied (stream at " + std::to_string(highest) + ")",
                       0};
    }
    if (seq > highest + 1) {
        if (s_.options.gaps == gap_policy::reject) {
            return dead(reason::sequence_gap,
                        describe(ev) + ": sequence " + std::to_string(seq) + " of '" + truncate(ev.subject) +
                            "' skips ahead of " + std::to_string(highest + 1),
                        message_id, body);
        }
        if (s_.options.gaps == gap_policy::park) {
            auto key = parked_key(ev.subject, seq);
            if (auto existing = parked_value(key)) {
                std::string_view rest = *existing;
                take_str(rest);
                envelope other;
                parse_error err;
                if (s_.parser.parse(rest, other, err) && other.event_id() == ev.event_id()) {
                    return outcome{outcome_kind::duplicate_event, reason::none,
                                   describe(ev) + ": already parked at sequence " + std::to_string(seq), 0};
                }
                return dead(reason::sequence_conflict,
                            describe(ev) + ": sequence " + std::to_string(seq) + " of '" + truncate(ev.subject) +
                                "' is already held by another event",
                            message_id, body);
            }
            std::string value;
            put_str(value, message_id);
            value.append(body);
            parked_[key] = std::move(value);
            parked_possible_ = true;
            return outcome{outcome_kind::parked, reason::none,
                           describe(ev) + ": sequence " + std::to_string(seq) + " of '" + truncate(ev.subject) +
                               "' waits for " + std::to_string(highest + 1),
                           0};
        }
    }
    // A dead-lettered event still moves its stream on: it is kept for the operator, and
    // holding every later event of the stream behind it would stall the aggregate.
    auto result = future_ ? future_event(ev, *time, message_id, body) : apply_projections(ev, message_id, body, &parts);
    st = stream_state{std::max(highest, seq), true};
    release_parked(ev.subject);
    return result;
}

void batch_run::release_parked(const std::string& subject) {
    if (s_.options.gaps != gap_policy::park || !parked_possible_) return;
    for (;;) {
        auto& st = stream(subject);
        const auto highest = st.highest;
        auto key = parked_key(subject, highest + 1);
        auto value = parked_value(key);
        if (!value) return;
        parked_[key] = std::nullopt;
        std::string_view rest = *value;
        std::string message_id(take_str(rest));
        envelope ev;
        parse_error err;
        if (!s_.parser.parse(rest, ev, err)) {
            throw_error(errc::corrupt_record, "parked event of '" + subject + "' no longer parses: " + err.detail);
        }
        const auto* delivering = std::exchange(current_, nullptr);  // a released event was read elsewhere
        // Judged against the event time as it is now: parked, it did not move it.
        const auto time = parse_event_time(ev.time);
        const auto& skew = s_.options.retention.max_future_skew;
        const bool far_ahead = time && skew && future_guarded() && clock_.event_time != 0 &&
                               *time > clock_.event_time && *time - clock_.event_time > count_ns(*skew);
        auto result = far_ahead ? future_event(ev, *time, message_id, rest) : apply_projections(ev, message_id, rest, nullptr);
        current_ = delivering;
        ++stats.released;
        st = stream_state{highest + 1, true};
        if (result.kind == outcome_kind::dead_lettered) {
            ++stats.outcomes[static_cast<std::size_t>(outcome_kind::dead_lettered)];
        }
    }
}

outcome batch_run::apply_projections(const envelope& ev, std::string_view message_id, std::string_view body,
                                     const std::vector<part>* parts) {
    std::vector<part> local;
    if (parts == nullptr) {  // a released parked event: prepared here, on the writer
        prepare_parts(s_, ev, local);
        parts = &local;
    }
    meta m{ev.id, ev.source, ev.type, ev.subject, ev.sequence, ev.time, {}};
    std::vector<staged_change> staged;
    const bool handled = !parts->empty();
    const auto limit = txn_.env().max_key_size();

    for (const auto& pt : *parts) {
        if (pt.failed != reason::none) return dead(pt.failed, pt.detail, message_id, body);
        const auto p = pt.projection;
        const auto& proj = *s_.projections[p];
        const auto& effect = pt.effect;
        for (std::size_t k = 0; k < pt.keys.size(); ++k) {
            const auto& key = pt.keys[k];
            const auto& contributor = pt.contributors[k];
            if (contributor.size() > limit) {
                return dead(reason::key_too_long,
                            describe(ev) + ", projection '" + proj.name() + "': row key '" + truncate(key) + "' (" +
                                std::to_string(key.size()) + " bytes) with its effect key (" +
                                std::to_string(effect ? effect->size() : ev.event_id().size()) +
                                " bytes) exceeds LMDB's " + std::to_string(limit) + "-byte key limit",
                            message_id, body);
            }
            auto& slot = load_row(p, key, pt.key_hashes[k]);
            const bool own_stream = ev.sequence && key == ev.subject;
            if (own_stream && *ev.sequence <= slot.header.highest_sequence) continue;
            if (holds(p, contributor, pt.contributor_hashes[k])) continue;
            auto copy = slot.state->clone();
            m.key = key;
            try {
                pt.handler->apply(*copy, pt.decoded.get(), m);
            } catch (const std::exception& e) {
                return dead(reason::handler_failed,
                            describe(ev) + ", projection '" + proj.name() + "', row '" + truncate(key) +
                                "': handler threw: " + e.what(),
                            message_id, body);
            }
            staged.push_back(staged_change{p, &slot, std::move(copy), &contributor, pt.contributor_hashes[k], own_stream});
        }
    }
    if (!handled) {
        if (s_.options.unknown_types == unknown_type_policy::dead_letter) {
            return dead(reason::unknown_type, describe(ev) + ": no projection handles type '" + truncate(ev.type) + "'",
                        message_id, body);
        }
        return outcome{outcome_kind::ignored, reason::none, describe(ev) + ": no projection handles " + ev.type, 0};
    }
    if (staged.empty()) {
        return outcome{outcome_kind::duplicate_event, reason::none,
                       describe(ev) + ": every row it maps to already holds its effect", 0};
    }
    // All handlers succeeded: only now does the event touch the batch's rows. Contributing-set
    // entries carry the event time (the horizon prunes by it), or the consumer's without one.
    const auto stamp = parse_event_time(ev.time).value_or(clock_.event_time);
    for (auto& c : staged) {
        c.slot->state = std::move(c.state);
        c.slot->header.applied += 1;
        if (c.own_stream) c.slot->header.highest_sequence = std::max(c.slot->header.highest_sequence, *ev.sequence);
        c.slot->dirty = true;
        s_.contributors[c.projection]->stage(*c.contributor, stamp, c.contributor_hash);
    }
    return outcome{outcome_kind::applied, reason::none, {}, 0};
}

batch_run::row_slot& batch_run::load_row(std::size_t p, const std::string& key, std::uint64_t hash) {
    if (rows_.size() <= p) rows_.resize(s_.projections.size());
    auto [entry, inserted] = rows_[p].try_emplace(key, hash);
    auto& slot = entry->value;
    if (!inserted) return slot;
    row_bytes_ += 2 * key.size() + 192;
    const auto& proj = *s_.projections[p];
    const auto row_key = codec::row_key(key);
    auto record = s_.journals[p]->find(txn_, row_key);
    if (!record) record = txn_.get(s_.tables[p], row_key);
    if (record) {
        auto decoded = codec::decode_row(*record);
        slot.header = decoded.header;
        slot.state = proj.load(decoded.state, decoded.header.state_version);
    } else {
        slot.header.state_version = proj.state_version();
        slot.state = proj.make_state();
    }
    return slot;
}

batch_run::stream_state& batch_run::stream(const std::string& subject) {
    auto [entry, inserted] = streams_.try_emplace(subject);
    if (inserted) {
        if (auto v = txn_.get(s_.streams, subject); v && v->size() >= 8) entry->value.highest = codec::get_u64_le(*v);
    }
    return entry->value;
}

std::optional<std::string> batch_run::parked_value(const std::string& key) const {
    if (auto it = parked_.find(key); it != parked_.end()) return it->second;
    if (auto v = txn_.get(s_.parked, key)) return std::string(*v);
    return std::nullopt;
}

void batch_run::write_rows() {
    std::string value;
    std::vector<std::pair<std::pair<std::size_t, std::string>, row_slot*>> dirty;
    for (std::size_t p = 0; p < rows_.size(); ++p) {
        for (auto& e : rows_[p].entries()) {
            if (e.value.dirty) dirty.emplace_back(std::pair{p, codec::row_key(e.key)}, &e.value);
        }
    }
    std::sort(dirty.begin(), dirty.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string state;
    std::size_t table = SIZE_MAX;
    std::string last;  // the table's last key before this write: keys after it are appended
    std::optional<cursor> appender;
    std::vector<std::size_t> journaled(s_.journals.size());
    for (auto& [id, slot] : dirty) {
        const auto& proj = *s_.projections[id.first];
        slot->header.state_version = proj.state_version();
        state.clear();
        proj.save(*slot->state, state);
        value.clear();
        codec::encode_row(value, slot->header, state);
        slot->dirty = false;
        if (!bulk_) {
            s_.journals[id.first]->append(txn_, id.second, value);
            ++journaled[id.first];
            continue;
        }
        // A bulk build writes each table's keys in order: its B-tree is walked left to right once.
        if (id.first != table) {
            table = id.first;
            appender.emplace(txn_, s_.tables[table]);
            auto e = appender->last();
            last = e ? std::string(e->first) : std::string();
        }
        if (last.empty() || id.second > last) {
            appender->put(id.second, value, MDB_APPEND);  // through one cursor: no search from the root
        } else {
            txn_.put(s_.tables[id.first], id.second, value);
        }
    }
    // Each batch folds twice what it journaled: the frozen journal is empty before the active
    // one is due to take its place.
    for (std::size_t p = 0; p < journaled.size(); ++p) {
        s_.journals[p]->fold(txn_, s_.tables[p], 2 * journaled[p], s_.options.journal_rows);
    }
}

void batch_run::write_dead_letters() {
    if (dead_letters_.empty()) return;
    cursor c{txn_, s_.dead};
    auto last = c.last();
    std::uint64_t position = last ? codec::get_u64_be(last->first) + 1 : 1;
    for (const auto& d : dead_letters_) txn_.put(s_.dead, codec::u64_key(position++), d, MDB_APPEND);
    dead_letters_.clear();
}

void batch_run::write_collisions() {
    if (collisions_.empty()) return;
    cursor c{txn_, s_.collisions};
    auto last = c.last();
    std::uint64_t position = last ? codec::get_u64_be(last->first) + 1 : 1;
    for (const auto& d : collisions_) txn_.put(s_.collisions, codec::u64_key(position++), d, MDB_APPEND);
    collisions_.clear();
}

void batch_run::spill(std::size_t budget) {
    // The index learns the written ids before the commit; abandon_bulk() rebuilds it from disk.
    for (auto& c : s_.contributors) {
        c->write(txn_);
        c->committed();
    }
    s_.ids->write(txn_);
    s_.ids->committed();
    s_.event_ids->write(txn_);
    write_dead_letters();
    write_collisions();
    if (row_bytes_ > budget) {
        write_rows();
        for (auto& t : rows_) t.clear();
        row_bytes_ = 0;
    }
}

std::vector<outcome> batch_run::deliver_all(const std::vector<prepared_batch::item>& batch,
                                            const std::optional<checkpoint>& at) {
    source_ = at ? at->source : std::string();
    std::vector<outcome> outcomes;
    outcomes.reserve(batch.size());
    constexpr std::size_t ahead = 8;  // deliveries whose index slots are fetched while earlier ones apply
    for (std::size_t i = 0; i < batch.size(); ++i) {
        if (i + ahead < batch.size()) prefetch(batch[i + ahead]);
        if (i == batch.size() / 2 && i != 0) crash_point("mid_batch");
        outcomes.push_back(deliver(batch[i]));
        outcomes.back().commit = commit_;
        ++stats.outcomes[static_cast<std::size_t>(outcomes.back().kind)];
    }
    current_ = nullptr;  // the caller may reuse the batch's items once this returns
    if (at) {
        auto& value = checkpoints_[at->source];
        value.clear();
        codec::put_u64_le(value, at->position);
        value += at->detail;
    }
    return outcomes;
}

void batch_run::finish() {
    std::string value;
    write_rows();
    for (auto& c : s_.contributors) c->write(txn_);
    s_.ids->write(txn_);
    s_.event_ids->write(txn_);
    write_dead_letters();
    write_collisions();
    std::vector<std::pair<std::string_view, std::uint64_t>> dirty_streams;
    for (const auto& e : streams_.entries()) {
        if (e.value.dirty) dirty_streams.emplace_back(e.key, e.value.highest);
    }
    std::sort(dirty_streams.begin(), dirty_streams.end());
    for (const auto& [subject, highest] : dirty_streams) {
        value.clear();
        codec::put_u64_le(value, highest);
        txn_.put(s_.streams, subject, value);
    }
    for (const auto& [key, v] : parked_) {
        if (v) {
            txn_.put(s_.parked, key, *v);
        } else {
            txn_.del(s_.parked, key);
        }
    }
    for (const auto& [source, stored] : checkpoints_) txn_.put(s_.checkpoints, source, stored);
    stats.batches += 1;
    txn_.put(s_.meta, stats_key(s_.options.consumer), encode_stats(stats));
    txn_.put(s_.meta, clock_key(s_.options.consumer), encode_clock(clock_));
    value.clear();
    codec::put_u64_le(value, commit_);
    txn_.put(s_.meta, commit_key, value);
}

// An operator action's view of a batch run (detail::operator_session).
class operator_run final : public detail::operator_session {
public:
    explicit operator_run(batch_run& run) : run_(run) {}
    write_txn& txn() override { return run_.txn_; }
    std::uint64_t commit() const override { return run_.commit_; }
    std::uint64_t now() const override { return run_.time_ns_; }
    MDB_dbi parked_table() const override { return run_.s_.parked; }
    MDB_dbi dead_table() const override { return run_.s_.dead; }
    outcome reapply(const envelope& ev, std::string_view message_id, std::string_view body) override {
        return run_.apply_projections(ev, message_id, body, nullptr);
    }
    void dead_letter(reason why, std::string detail, std::string_view message_id, std::string_view body) override {
        run_.dead(why, std::move(detail), message_id, body);
    }
    void write_dead_letters() override { run_.write_dead_letters(); }
    std::uint64_t stream_highest(const std::string& subject) override { return run_.stream(subject).highest; }
    void release_after(const std::string& subject, std::uint64_t highest) override {
        set_stream(subject, highest);
        run_.release_parked(subject);
    }
    void set_stream(const std::string& subject, std::uint64_t highest) override {
        run_.stream(subject) = batch_run::stream_state{highest, true};
    }
    void unpark(const std::string& key) override { run_.parked_[key] = std::nullopt; }
    bool is_parked(const std::string& key) const override { return run_.parked_value(key).has_value(); }

private:
    batch_run& run_;
};

}  // namespace

void store::impl::run_operator(const std::function<bool(detail::operator_session&)>& fn) {
    write_txn txn{*env};
    batch_run run{*this, txn};
    operator_run op{run};
    if (!fn(op)) {
        rolled_back();  // aborted by txn's destructor
        return;
    }
    run.finish();
    if (options.before_commit) options.before_commit(run.commit());
    txn.commit();
    ids->committed();
    for (auto& c : contributors) c->committed();
}

void store::operate(const std::function<bool(detail::operator_session&)>& fn) {
    if (impl_->bulk) throw_error(errc::invalid_argument, "an operator action cannot run during a bulk build");
    for (;;) {
        try {
            impl_->run_operator(fn);
            return;
        } catch (const std::system_error& e) {
            impl_->rolled_back();
            if (e.code() != errc::map_full) throw;
        } catch (...) {
            impl_->rolled_back();
            throw;
        }
        impl_->env->grow();
    }
}

prune_result store::impl::prune_step(write_txn& txn, const prune_limits& limits, clock_record clock,
                                     consumer_stats& stats, std::vector<std::pair<std::size_t, id_log::prune_step>>& steps) {
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
            const auto key = contrib_floor_key(projections[p]->name());
            const auto floor = std::max(get_u64_or_zero(txn.get(meta, key)), step.newest_removed + 1);
            std::string value;
            codec::put_u64_le(value, floor);
            txn.put(meta, key, value);
        }
        if (budget == 0) result.more = true;
    }
    if (result.ids + result.contributors > 0) crash_point("during_prune");
    return result;
}

void store::impl::prune_in_batch(write_txn& txn, batch_run& run,
                                 std::vector<std::pair<std::size_t, id_log::prune_step>>& steps) {
    steps.clear();
    if (!retaining() || options.retention.prune_per_batch == 0) return;
    // On the event clock a batch removes everything that expired: then what a commit holds
    // depends only on the log and the batch boundaries, never on timing (a resumed or
    // repeated run gives the same inbox and the same outcomes).
    const bool event_clock = options.retention.clock == retention_clock::event;
    const auto limits = event_clock ? prune_limits{SIZE_MAX, std::chrono::hours(24), {}}
                                    : prune_limits{options.retention.prune_per_batch, std::chrono::milliseconds(1), {}};
    prune_run(txn, limits, run, steps);
}

prune_result store::impl::prune_run(write_txn& txn, const prune_limits& limits, batch_run& run,
                                    std::vector<std::pair<std::size_t, id_log::prune_step>>& steps) {
    // A prune inside a batch's transaction: the batch writes the floors with its clock record.
    auto result = prune_step(txn, limits, run.clock(), run.stats, steps);
    for (const auto& [p, step] : steps) {
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
    std::vector<std::pair<std::size_t, id_log::prune_step>> steps;
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
        auto clock = decode_clock(txn.get(s.meta, clock_key(s.options.consumer)));
        auto stats = decode_stats(txn.get(s.meta, stats_key(s.options.consumer)));
        result = s.prune_step(txn, limits, clock, stats, steps);
        if (result.ids + result.contributors == 0) return;
        for (const auto& [p, step] : steps) {
            if (p == SIZE_MAX) clock.inbox_floor = std::max(clock.inbox_floor, step.newest_removed + 1);
        }
        txn.put(s.meta, clock_key(s.options.consumer), encode_clock(clock));
        txn.put(s.meta, stats_key(s.options.consumer), encode_stats(stats));
    });
    forget();
    return result;
}

std::vector<outcome> store::impl::run(const prepared_batch& prepared, const std::optional<checkpoint>& at) {
    crash_point("after_decode");
    write_txn txn{*env};
    batch_run run{*this, txn};
    auto outcomes = run.deliver_all(prepared.items_, at);
    std::vector<std::pair<std::size_t, id_log::prune_step>> pruned;
    prune_in_batch(txn, run, pruned);  // expired entries leave with the batch's own commit
    run.finish();
    if (options.before_commit) options.before_commit(run.commit());
    crash_point("before_commit");
    txn.commit();
    crash_point("after_commit");
    forget_pruned(pruned);
    ids->committed();
    for (auto& c : contributors) c->committed();
    return outcomes;
}

std::vector<outcome> store::impl::run_bulk(const prepared_batch& prepared, const std::optional<checkpoint>& at) {
    auto outcomes = bulk->deliver_all(prepared.items_, at);
    std::vector<std::pair<std::size_t, id_log::prune_step>> pruned;
    prune_in_batch(*bulk_txn, *bulk, pruned);
    forget_pruned(pruned);  // as spill() does: abandon_bulk() rebuilds the indexes from disk
    bulk->spill(bulk_budget);
    return outcomes;
}

void store::impl::abandon_bulk() {
    bulk.reset();
    bulk_txn.reset();  // aborts
    rolled_back();
    open_tables();  // the id indexes learned uncommitted ids: rebuild them from disk
}

store::impl::impl() = default;
store::impl::~impl() = default;

void store::begin_bulk(std::size_t memory_budget) {
    auto& s = *impl_;
    if (s.bulk) throw_error(errc::invalid_argument, "begin_bulk: a bulk build is already running");
    s.bulk_txn = std::make_unique<write_txn>(*s.env);
    try {
        s.bulk = std::make_unique<batch_run>(s, *s.bulk_txn, true);
        s.bulk_budget = memory_budget;
    } catch (...) {
        s.abandon_bulk();
        throw;
    }
}

void store::end_bulk() {
    auto& s = *impl_;
    if (!s.bulk) throw_error(errc::invalid_argument, "end_bulk: no bulk build is running");
    try {
        s.bulk->finish();
        if (s.options.before_commit) s.options.before_commit(s.bulk->commit());
        crash_point("before_commit");
        s.bulk_txn->commit();
        crash_point("after_commit");
    } catch (...) {
        s.abandon_bulk();
        throw;
    }
    s.ids->committed();
    for (auto& c : s.contributors) c->committed();
    s.bulk.reset();
    s.bulk_txn.reset();
}

store::store(store_options options) : impl_(std::make_unique<impl>()) {
    if (options.consumer.empty() || options.consumer.find('/') != std::string::npos) {
        throw_error(errc::invalid_argument, "consumer name '" + options.consumer + "' must be non-empty without '/'");
    }
    impl_->options = std::move(options);
    auto& o = impl_->options;
    const auto& r = o.retention;
    if (r.source && r.inbox_retention && *r.inbox_retention < r.source->bound) {
        throw_error(errc::invalid_argument,
                    "'" + o.path.string() + "': inbox_retention of " + format_duration(*r.inbox_retention) +
                        " is shorter than the source's redelivery bound of " + format_duration(r.source->bound) +
                        (r.source->what.empty() ? std::string() : " (" + r.source->what + ")") +
                        ": ids would be pruned while the source may still redeliver them");
    }
    if (r.resend_within && r.allowed_lateness && *r.allowed_lateness < *r.resend_within) {
        throw_error(errc::invalid_argument,
                    "'" + o.path.string() + "': allowed_lateness of " + format_duration(*r.allowed_lateness) +
                        " is shorter than the source's re-send delay of " + format_duration(*r.resend_within) +
                        ": a re-sent event's effect key could be forgotten before the copy arrives, and be applied twice");
    }
    environment_options eo;
    eo.map_size = std::min(o.map_size, o.max_map_size);
    eo.max_map_size = o.max_map_size;
    eo.sync = o.sync;
    eo.wait_for_writer = o.wait_for_writer;
    impl_->env = environment::open(o.path, eo);
    auto& env = *impl_->env;
    impl_->meta = env.table("meta");
    env.write([&](write_txn& txn) {
        auto v = txn.get(impl_->meta, format_key);
        if (!v) {
            std::string value;
            codec::put_u32_le(value, storage_format);
            txn.put(impl_->meta, format_key, value);
        } else if (v->size() != 4 || codec::get_u32_le(*v) != storage_format) {
            throw_error(errc::format_mismatch, "'" + o.path.string() + "' holds storage format " +
                                                   (v->size() == 4 ? std::to_string(codec::get_u32_le(*v)) : "?") +
                                                   ", this build reads format " + std::to_string(storage_format));
        }
    });
    impl_->open_tables();
}

void store::reopen() {
    impl_->rolled_back();
    impl_->env->reopen();
    impl_->meta = impl_->env->table("meta");
    impl_->open_tables();
}

store::~store() = default;

store& store::add_projection(std::unique_ptr<projection_base> p) {
    for (const auto& existing : impl_->projections) {
        if (existing->name() == p->name()) {
            throw_error(errc::invalid_argument, "projection '" + p->name() + "' added twice");
        }
    }
    if (p->name().empty() || p->name().find('/') != std::string::npos) {
        throw_error(errc::invalid_argument, "projection name '" + p->name() + "' must be non-empty without '/'");
    }
    impl_->open_projection(*p);
    impl_->projections.push_back(std::move(p));
    return *this;
}

prepared_batch store::prepare(std::span<const delivery> batch) const {
    prepared_batch out;
    prepare(batch, out);
    return out;
}

void store::prepare(std::span<const delivery> batch, prepared_batch& into) const {
    thread_local envelope_parser parser;
    into.items_.resize(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) prepare_item(*impl_, batch[i], into.items_[i], parser);
}

std::vector<outcome> store::apply(std::span<const delivery> batch, const std::optional<checkpoint>& at) {
    return apply(prepare(batch), at);
}

std::vector<outcome> store::apply(const prepared_batch& batch, const std::optional<checkpoint>& at) {
    if (impl_->bulk) {
        try {
            return impl_->run_bulk(batch, at);
        } catch (...) {
            impl_->abandon_bulk();
            throw;
        }
    }
    for (;;) {
        try {
            return impl_->run(batch, at);
        } catch (const std::system_error& e) {
            impl_->rolled_back();
            if (e.code() != errc::map_full) throw;
        } catch (...) {
            impl_->rolled_back();
            throw;
        }
        // The transaction is gone (aborted by unwinding): grow with none of ours live (throws
        // map_full at the limit), then redo the whole batch.
        impl_->env->grow();
    }
}

outcome store::apply(const delivery& d) { return apply(std::span<const delivery>(&d, 1)).front(); }

snapshot store::read() const { return snapshot{impl_->env}; }

std::uint64_t store::last_commit() const { return read().commit(); }

std::size_t store::inbox_size() const { return impl_->ids->size(); }

const std::shared_ptr<environment>& store::env() const noexcept { return impl_->env; }

const store_options& store::options() const noexcept { return impl_->options; }

// --- snapshot ---------------------------------------------------------------

snapshot snapshot::open(const std::filesystem::path& path) {
    environment_options eo;
    eo.read_only = true;
    return snapshot{environment::open(path, eo)};
}

namespace {

// A snapshot may only use handles opened before its transaction began, on the same handle
// generation: refresh, begin, and start over if the environment was reopened in between.
read_txn begin_snapshot(environment& env) {
    for (;;) {
        auto generation = env.generation();
        env.refresh_tables();
        read_txn txn{env};
        if (env.generation() == generation) return txn;
    }
}

}  // namespace

namespace detail {
/// The journals of each projection as one snapshot sees them.
struct snapshot_journals_entry {
    journal_state state;
    std::shared_ptr<journal_index> index;  // shared by the environment's snapshots in this process
    std::optional<journal_view> view;      // read on first need: scans, and point reads the index cannot answer
};
struct snapshot_journals {
    std::mutex mutex;
    std::map<std::string, snapshot_journals_entry, std::less<>> projections;
};
}  // namespace detail

snapshot::snapshot(std::shared_ptr<environment> env)
    : env_(std::move(env)), txn_(begin_snapshot(*env_)), journals_(std::make_shared<detail::snapshot_journals>()) {}

std::optional<MDB_dbi> snapshot::table(const std::string& name) const {
    auto dbi = env_->try_table(name);
    unsigned flags = 0;
    // A table created after this snapshot began has a handle this transaction cannot use.
    if (dbi && mdb_dbi_flags(txn_.handle(), *dbi, &flags) != 0) return std::nullopt;
    return dbi;
}

MDB_dbi snapshot::row_table(std::string_view projection) const {
    auto t = table("proj/" + std::string(projection));
    if (!t) throw_error(errc::unknown_projection, "no projection '" + std::string(projection) + "' in '" +
                                                       env_->path().string() + "'");
    return *t;
}

detail::journal_view& snapshot::journal(std::string_view projection) const {
    std::scoped_lock lock{journals_->mutex};
    auto& j = journals(projection);
    if (!j.view) j.view = detail::journal_view::read(txn_, j.state);
    return *j.view;
}

detail::snapshot_journals_entry& snapshot::journals(std::string_view projection) const {
    auto it = journals_->projections.find(projection);
    if (it == journals_->projections.end()) {
        const auto name = std::string(projection);
        detail::snapshot_journals_entry j;
        j.state = detail::journal_state::read(txn_, table("meta"), table(detail::row_journal::table_name(name, 0)),
                                              table(detail::row_journal::table_name(name, 1)), name);
        j.index = std::static_pointer_cast<detail::journal_index>(env_->attachment(
            "journal-index/" + name, [] { return std::static_pointer_cast<void>(std::make_shared<detail::journal_index>()); }));
        it = journals_->projections.emplace(name, std::move(j)).first;
    }
    return it->second;
}

std::optional<snapshot::raw_row_view> snapshot::raw_row(std::string_view projection, std::string_view key) const {
    const auto t = row_table(projection);
    const auto row_key = codec::row_key(key);
    std::optional<std::string_view> v;
    bool answered = false;
    {
        std::scoped_lock lock{journals_->mutex};
        auto& j = journals(projection);
        answered = j.index->find(txn_, j.state, row_key, v);
    }
    if (!answered) {
        const auto& journaled = journal(projection).latest;
        if (auto it = journaled.find(row_key); it != journaled.end()) v = it->second;
    }
    if (!v) v = txn_.get(t, row_key);
    if (!v) return std::nullopt;
    auto r = codec::decode_row(*v);
    return raw_row_view{key, r.header.applied, r.header.highest_sequence, r.header.state_version, r.state};
}

snapshot::row_reader snapshot::read_rows(std::string_view projection) const {
    const auto t = row_table(projection);
    return row_reader{cursor{txn_, t}, std::string(projection), journal(projection).sorted()};
}

std::optional<snapshot::raw_row_view> snapshot::row_reader::next() {
    if (!started_) {
        table_row_ = cursor_.first();
        started_ = true;
    }
    // The table's rows and the journals' in one key order; a journaled row replaces the table's.
    std::string_view row_key;
    std::string_view record;
    const bool journal_left = at_ < journaled_->size();
    if (!table_row_ && !journal_left) return std::nullopt;
    if (journal_left && (!table_row_ || (*journaled_)[at_].first <= table_row_->first)) {
        std::tie(row_key, record) = (*journaled_)[at_++];
        if (table_row_ && table_row_->first == row_key) table_row_ = cursor_.next();
    } else {
        std::tie(row_key, record) = *table_row_;
        table_row_ = cursor_.next();
    }
    auto k = codec::decode_table_key(row_key);
    if (!k || !k->is_row) throw_error(errc::corrupt_record, "unreadable key in projection '" + projection_ + "'");
    key_.assign(k->aggregate);
    auto r = codec::decode_row(record);
    return raw_row_view{key_, r.header.applied, r.header.highest_sequence, r.header.state_version, r.state};
}

void snapshot::scan_raw(std::string_view projection, const std::function<void(const raw_row_view&)>& fn) const {
    auto rows = read_rows(projection);
    while (auto r = rows.next()) fn(*r);
}

void snapshot::scan_contributors(std::string_view projection, std::string_view key,
                                 const std::function<void(std::string_view effect)>& fn) const {
    auto t = table("contrib/" + std::string(projection));
    if (!t) return;
    // The log is in commit order, not by row: a query walks all of it (diagnostics only;
    // the writer answers membership from its in-memory index).
    const auto prefix = codec::contributor_key(key, {});
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto id = e->second.substr(8);
        if (id.starts_with(prefix)) fn(id.substr(prefix.size()));
    }
}

std::size_t snapshot::contributors(std::string_view projection, std::string_view key) const {
    std::size_t n = 0;
    scan_contributors(projection, key, [&](std::string_view) { ++n; });
    return n;
}

bool snapshot::contributed(std::string_view projection, std::string_view key, std::string_view effect) const {
    bool found = false;
    scan_contributors(projection, key, [&](std::string_view e) { found = found || e == effect; });
    return found;
}

std::uint64_t snapshot::commit() const {
    auto t = table("meta");
    if (!t) return 0;
    auto v = txn_.get(*t, commit_key);
    return v && v->size() >= 8 ? codec::get_u64_le(*v) : 0;
}

std::optional<std::uint64_t> snapshot::checkpoint(std::string_view consumer, std::string_view source) const {
    auto t = table("checkpoint/" + std::string(consumer));
    if (!t) return std::nullopt;
    auto v = txn_.get(*t, source);
    if (!v || v->size() < 8) return std::nullopt;
    return codec::get_u64_le(*v);
}

std::optional<std::string> snapshot::checkpoint_value(std::string_view consumer, std::string_view source) const {
    auto t = table("checkpoint/" + std::string(consumer));
    if (!t) return std::nullopt;
    auto v = txn_.get(*t, source);
    if (!v || v->size() < 8) return std::nullopt;
    return std::string(*v);
}

std::vector<std::pair<std::string, std::uint64_t>> snapshot::checkpoints(std::string_view consumer) const {
    std::vector<std::pair<std::string, std::uint64_t>> out;
    auto t = table("checkpoint/" + std::string(consumer));
    if (!t) return out;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        if (e->second.size() >= 8) out.emplace_back(std::string(e->first), codec::get_u64_le(e->second));
    }
    return out;
}

consumer_stats snapshot::stats(std::string_view consumer) const {
    auto t = table("meta");
    if (!t) return {};
    return decode_stats(txn_.get(*t, stats_key(consumer)));
}

std::size_t snapshot::inbox_size(std::string_view consumer) const {
    auto t = table("inbox/" + std::string(consumer));
    return t ? txn_.entries(*t) : 0;
}

std::size_t snapshot::parked(std::string_view consumer) const {
    auto t = table("parked/" + std::string(consumer));
    return t ? txn_.entries(*t) : 0;
}

std::size_t snapshot::dead_letter_count(std::string_view consumer) const {
    auto t = table("deadletter/" + std::string(consumer));
    return t ? txn_.entries(*t) : 0;
}

std::optional<snapshot::inbox_record> snapshot::inbox_lookup(std::string_view consumer,
                                                             std::string_view message_id) const {
    auto t = table("inbox/" + std::string(consumer));
    if (!t) return std::nullopt;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto entry = detail::decode_inbox_entry(e->second);
        if (entry && entry->message_id == message_id) return entry->record;
    }
    return std::nullopt;
}

std::optional<std::pair<std::string, snapshot::inbox_record>> snapshot::inbox_lookup_transport_id(
    std::string_view consumer, std::string_view transport_id) const {
    auto t = table("inbox/" + std::string(consumer));
    if (!t) return std::nullopt;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto entry = detail::decode_inbox_entry(e->second);
        if (!entry || !entry->message_id.ends_with(transport_id)) continue;
        // A transport id ("m..." or "t<n>:<transport>..."), not an event id that ends alike.
        const auto key = entry->message_id;
        if (!key.starts_with('m') && !key.starts_with('t')) continue;
        if (split_message_id(key).second != transport_id) continue;
        return std::pair{std::string(key), entry->record};
    }
    return std::nullopt;
}

snapshot::retention_state snapshot::retention(std::string_view consumer) const {
    retention_state r;
    if (auto m = table("meta")) {
        auto clock = decode_clock(txn_.get(*m, clock_key(consumer)));
        r.event_time = clock.event_time;
        r.inbox_floor = clock.inbox_floor;
    }
    if (auto t = table("inbox/" + std::string(consumer))) {
        cursor c{txn_, *t};
        if (auto first = c.first(); first && first->second.size() >= 8) r.oldest = codec::get_u64_le(first->second);
    }
    return r;
}

std::optional<snapshot::parked_record> snapshot::parked_lookup(std::string_view consumer,
                                                               std::string_view message_id) const {
    auto t = table("parked/" + std::string(consumer));
    if (!t) return std::nullopt;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        std::string_view v = e->second;
        if (take_str(v) != message_id) continue;
        auto key = codec::decode_table_key(e->first);
        if (!key || key->effect.size() != 8) continue;
        parked_record r;
        r.subject = key->aggregate;
        r.sequence = codec::get_u64_be(key->effect);
        std::uint64_t highest = 0;
        if (auto streams = table("streams/" + std::string(consumer))) {
            if (auto h = txn_.get(*streams, r.subject); h && h->size() >= 8) highest = codec::get_u64_le(*h);
        }
        r.waiting_for = highest + 1;
        return r;
    }
    return std::nullopt;
}

std::size_t snapshot::contributor_entries(std::string_view projection) const {
    auto t = table("contrib/" + std::string(projection));
    return t ? txn_.entries(*t) : 0;
}

std::uint64_t snapshot::contributor_floor(std::string_view projection) const {
    auto m = table("meta");
    return m ? get_u64_or_zero(txn_.get(*m, contrib_floor_key(projection))) : 0;
}

std::vector<dead_letter> snapshot::collisions(std::string_view consumer) const {
    std::vector<dead_letter> out;
    auto t = table("collision/" + std::string(consumer));
    if (!t) return out;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) out.push_back(decode_dead_letter(codec::get_u64_be(e->first), e->second));
    return out;
}

std::vector<dead_letter> snapshot::dead_letters(std::string_view consumer) const {
    std::vector<dead_letter> out;
    auto t = table("deadletter/" + std::string(consumer));
    if (!t) return out;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) out.push_back(decode_dead_letter(codec::get_u64_be(e->first), e->second));
    return out;
}

}  // namespace idem
