#pragma once

// The simulation's reference: an in-memory consumer written from the contract (the shared
// design and docs/DESIGN.md), not from idem's code. It keeps what the contract says a consumer
// keeps — the inbox, per-row state, version, highest sequence and contributing set, per-stream
// sequences with parked events, dead letters with their reasons, the durable counters — and
// says what outcome each delivery must have.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace idem_sim {

/// Outcome kinds.
enum class kind : std::uint8_t { applied, duplicate_message, duplicate_event, parked, dead_lettered, ignored };
inline constexpr std::size_t kinds = 6;
/// Their names, as idem::to_string spells them (the driver compares names, not numbers).
inline constexpr const char* kind_names[kinds] = {"applied", "duplicate_message", "duplicate_event",
                                                  "parked",  "dead_lettered",     "ignored"};

/// Dead-letter reasons the simulation produces.
enum class why : std::uint8_t {
    none = 0,
    invalid_json,
    missing_id,
    missing_source,
    missing_type,
    invalid_field,
    unsupported_specversion,
    invalid_sequence,
    missing_key,
    key_too_long,
    decode_failed,
    handler_failed,
    sequence_gap,
    sequence_conflict,
    unknown_type,
    too_large,
    invalid_utf8,
};
inline constexpr std::size_t reasons = 17;
/// Their names, as idem::to_string spells them.
inline constexpr const char* reason_names[reasons] = {
    "none",          "invalid_json",     "missing_id",       "missing_source",          "missing_type",
    "invalid_field", "unsupported_specversion", "invalid_sequence", "missing_key",     "key_too_long",
    "decode_failed", "handler_failed",   "sequence_gap",     "sequence_conflict",       "unknown_type",
    "too_large",     "invalid_utf8"};

/// The event types of the simulation's domain.
enum class event_type : std::uint8_t {
    line,   ///< "sim.line" {order, amount}: projection totals, keyed by order (its own stream)
    note,   ///< "sim.note" {order}: handled by no projection, sequenced in the order's stream
    fill,   ///< "sim.fill" {account, exec, qty}: projection positions, effect key exec
    score,  ///< "sim.score" {match, player, points}: board (keys match and the partition's "all"), players (subject)
    ping,   ///< "sim.ping": handled by nobody, no sequence
};

/// One logical event as the producer made it (what the envelope says, before any transport).
struct event {
    event_type type = event_type::line;
    std::string source;
    std::string id;
    std::string subject;
    std::optional<std::uint64_t> sequence;
    std::string msgid;       ///< the msgid attribute ("" if absent)
    std::string key;         ///< order, account or match
    std::string exec;        ///< fills: the effect key
    std::int64_t value = 0;  ///< amount, qty or points
    bool bad_payload = false;  ///< data does not decode as the type's payload
};

/// One delivery: an event (or a malformed envelope) and the transport's message id.
struct delivery {
    std::shared_ptr<const event> ev;  ///< null: the envelope is malformed
    why malformed = why::none;        ///< the reason the envelope is rejected, when ev is null
    std::string transport;            ///< transport message id ("" if none)
    std::string body;                 ///< the envelope's JSON text
    std::uint8_t partition = 0;       ///< which share of the keyspace it touches (the engine phase splits by it)
};

/// What the model expects of one delivery.
struct expected {
    kind k = kind::applied;
    why r = why::none;
};

/// A projection row: what the simulation's state holds, its version and highest sequence.
struct row {
    std::int64_t sum = 0;
    std::int64_t count = 0;
    std::uint64_t digest = 0;
    std::uint64_t version = 0;
    std::uint64_t highest = 0;
};

/// The projections, in the order they are added to the store.
enum class proj : std::uint8_t { totals, positions, board, players };
inline constexpr std::size_t projections = 4;
inline constexpr const char* projection_names[projections] = {"totals", "positions", "board", "players"};

/// How a state absorbs an event (the handlers of the driver's projections do the same).
inline void absorb(row& r, std::int64_t value) {
    r.sum += value;
    r.count += 1;
    r.digest = r.digest * 1000003u + static_cast<std::uint64_t>(value) + static_cast<std::uint64_t>(r.count);
}

/// Whether the projection's handler throws for this value (deterministic, so the model knows).
inline bool handler_throws(proj p, std::int64_t value) {
    switch (p) {
    case proj::totals: return value % 101 == 13;
    case proj::positions: return value % 103 == 17;
    case proj::board: return false;
    case proj::players: return value % 89 == 7;
    }
    return false;
}

/// The partition's row of all its matches ("k3m17" -> "k3all").
inline std::string all_row(const std::string& match) { return match.substr(0, match.find('m')) + "all"; }

enum class gaps { park, apply, reject };

/// The consumer the contract describes, in memory.
class model {
public:
    model(gaps g, bool dead_letter_unknown) : gaps_(g), dead_letter_unknown_(dead_letter_unknown) {}

    /// Applies one delivery and returns what it must come out as.
    expected deliver(const delivery& d) {
        expected out = deliver_inner(d);
        ++stats_[static_cast<std::size_t>(out.k)];
        return out;
    }
    /// Counts a committed batch.
    void committed() {
        ++batches_;
        ++commit_;
    }

    std::uint64_t commit() const { return commit_; }
    void set_commit(std::uint64_t c) { commit_ = c; }
    void add_batches(std::uint64_t n) { batches_ += n; }
    std::uint64_t batches() const { return batches_; }
    std::uint64_t released() const { return released_; }
    const std::uint64_t* stats() const { return stats_; }
    std::size_t inbox_size() const { return inbox_.size(); }
    std::size_t parked() const { return parked_.size(); }
    std::size_t dead_letters() const { return dead_total_; }
    const std::uint64_t* dead_by_reason() const { return dead_; }
    const std::unordered_map<std::string, row>& rows(proj p) const { return rows_[static_cast<std::size_t>(p)]; }
    std::size_t contributors(proj p) const { return contrib_[static_cast<std::size_t>(p)].size(); }

private:
    struct parked_event {
        std::string message_id;
        std::shared_ptr<const event> ev;
    };
    struct staged {
        std::size_t p;
        std::string key;
        std::string contributor;
        bool own;
    };

    static std::string event_id(const event& e) { return e.source + '\x1f' + e.id; }

    expected dead(why r) {
        ++dead_[static_cast<std::size_t>(r)];
        ++dead_total_;
        return {kind::dead_lettered, r};
    }

    expected deliver_inner(const delivery& d) {
        if (!d.ev) {
            // Only a transport id identifies a redelivery of a body that does not parse.
            if (!d.transport.empty() && !inbox_.insert("m" + d.transport).second) return {kind::duplicate_message, why::none};
            return dead(d.malformed);
        }
        const auto& e = *d.ev;
        const std::string message_id = !d.transport.empty() ? "m" + d.transport
                                       : !e.msgid.empty()   ? "m" + e.msgid
                                                            : "e" + event_id(e);
        if (!inbox_.insert(message_id).second) return {kind::duplicate_message, why::none};
        if (!e.sequence) return apply(e);
        const auto seq = *e.sequence;
        auto& highest = streams_[e.subject];
        const auto h = highest;
        if (seq <= h) return {kind::duplicate_event, why::none};
        if (seq > h + 1) {
            if (gaps_ == gaps::reject) return dead(why::sequence_gap);
            if (gaps_ == gaps::park) {
                const auto key = parked_key(e.subject, seq);
                if (auto it = parked_.find(key); it != parked_.end()) {
                    if (event_id(*it->second.ev) == event_id(e)) return {kind::duplicate_event, why::none};
                    return dead(why::sequence_conflict);
                }
                parked_.emplace(key, parked_event{message_id, d.ev});
                return {kind::parked, why::none};
            }
        }
        auto result = apply(e);
        streams_[e.subject] = std::max(h, seq);
        release(e.subject);
        return result;
    }

    static std::string parked_key(const std::string& subject, std::uint64_t seq) {
        return subject + '\x1f' + std::to_string(seq);
    }

    void release(const std::string& subject) {
        if (gaps_ != gaps::park) return;
        for (;;) {
            auto& highest = streams_[subject];
            auto it = parked_.find(parked_key(subject, highest + 1));
            if (it == parked_.end()) return;
            auto ev = it->second.ev;
            parked_.erase(it);
            auto result = apply(*ev);
            ++released_;
            streams_[subject] = highest + 1;
            if (result.k == kind::dead_lettered) ++stats_[static_cast<std::size_t>(kind::dead_lettered)];
        }
    }

    // The projections handling e's type, in the order they were added, and e's keys in each.
    void parts(const event& e, std::vector<std::pair<proj, std::vector<std::string>>>& out) const {
        out.clear();
        switch (e.type) {
        case event_type::line: out.push_back({proj::totals, {e.key}}); break;
        case event_type::fill: out.push_back({proj::positions, {e.key}}); break;
        case event_type::score: {
            std::vector<std::string> keys{e.key, all_row(e.key)};
            std::sort(keys.begin(), keys.end());
            out.push_back({proj::board, keys});
            out.push_back({proj::players, {e.subject}});
            break;
        }
        case event_type::note:
        case event_type::ping: break;
        }
    }

    expected apply(const event& e) {
        parts(e, parts_);
        if (parts_.empty()) {
            if (dead_letter_unknown_) return dead(why::unknown_type);
            return {kind::ignored, why::none};
        }
        staged_.clear();
        for (const auto& [p, keys] : parts_) {
            if (e.bad_payload) return dead(why::decode_failed);
            const std::string effect = p == proj::positions ? e.exec : "e" + event_id(e);
            if (effect.empty()) return dead(why::missing_key);
            if (keys.empty() || keys.front().empty()) return dead(why::missing_key);
            const auto pi = static_cast<std::size_t>(p);
            for (const auto& key : keys) {
                const bool own = e.sequence && key == e.subject;
                auto it = rows_[pi].find(key);
                if (own && it != rows_[pi].end() && *e.sequence <= it->second.highest) continue;
                auto contributor = key + '\x1f' + effect;
                if (contrib_[pi].contains(contributor)) continue;
                if (handler_throws(p, e.value)) return dead(why::handler_failed);
                staged_.push_back({pi, key, std::move(contributor), own});
            }
        }
        if (staged_.empty()) return {kind::duplicate_event, why::none};
        for (auto& s : staged_) {
            auto& r = rows_[s.p][s.key];
            absorb(r, e.value);
            r.version += 1;
            if (s.own) r.highest = std::max(r.highest, *e.sequence);
            contrib_[s.p].insert(std::move(s.contributor));
        }
        return {kind::applied, why::none};
    }

    gaps gaps_;
    bool dead_letter_unknown_;
    std::unordered_set<std::string> inbox_;
    std::unordered_map<std::string, std::uint64_t> streams_;
    std::unordered_map<std::string, parked_event> parked_;
    std::unordered_map<std::string, row> rows_[projections];
    std::unordered_set<std::string> contrib_[projections];
    std::uint64_t stats_[kinds]{};
    std::uint64_t dead_[reasons]{};
    std::size_t dead_total_ = 0;
    std::uint64_t released_ = 0;
    std::uint64_t batches_ = 0;
    std::uint64_t commit_ = 0;
    std::vector<std::pair<proj, std::vector<std::string>>> parts_;
    std::vector<staged> staged_;
};

}  // namespace idem_sim
