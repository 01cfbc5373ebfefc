// The on-disk layout (layout.hpp): table names, meta keys, record codecs.

#include <idem/projections/layout.hpp>

#include <idem/storage/error.hpp>
#include <idem/storage/id_log.hpp>

#include <algorithm>

namespace idem {

std::uint64_t body_digest(std::string_view bytes) noexcept {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (char ch : bytes) {
        h ^= static_cast<unsigned char>(ch);
        h *= 0x100000001b3ULL;
    }
    return h;
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

namespace layout {

namespace {
std::string named(std::string_view prefix, std::string_view name) {
    std::string out;
    out.reserve(prefix.size() + name.size());
    out.append(prefix);
    out.append(name);
    return out;
}
}  // namespace

std::string stats_key(std::string_view consumer) { return named("stats/", consumer); }
std::string copied_checkpoint_key(std::string_view consumer, std::string_view source) {
    std::string out = named("copied-checkpoint/", consumer);
    out.push_back('\0');
    out.append(source);
    return out;
}
std::string clock_key(std::string_view consumer) { return named("clock/", consumer); }
std::string contrib_floor_key(std::string_view projection) { return named("contrib-floor/", projection); }
std::string journal_key(std::string_view projection) { return named("journal/", projection); }

std::string inbox_table(std::string_view consumer) { return named("inbox/", consumer); }
std::string rows_table(std::string_view projection) { return named("proj/", projection); }
std::string journal_table(std::string_view projection, std::uint64_t parity) {
    return named(parity % 2 == 0 ? "journal0/" : "journal1/", projection);
}
std::string contrib_table(std::string_view projection) { return named("contrib/", projection); }
std::string streams_table(std::string_view consumer) { return named("streams/", consumer); }
std::string parked_table(std::string_view consumer) { return named("parked/", consumer); }
std::string dead_letter_table(std::string_view consumer) { return named("deadletter/", consumer); }
std::string collision_table(std::string_view consumer) { return named("collision/", consumer); }
std::string event_ids_table(std::string_view consumer) { return named("eventids/", consumer); }
std::string event_contents_table(std::string_view consumer) { return named("eventcontent/", consumer); }
std::string audit_table(std::string_view consumer) { return named("audit/", consumer); }
std::string checkpoint_table(std::string_view consumer) { return named("checkpoint/", consumer); }

std::uint64_t u64_or_zero(std::optional<std::string_view> v) { return v && v->size() >= 8 ? codec::get_u64_le(*v) : 0; }

std::string u64_value(std::uint64_t v) {
    std::string out;
    codec::put_u64_le(out, v);
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

std::uint64_t take_u64(std::string_view& in) {
    if (in.size() < 8) throw_error(errc::corrupt_record, "truncated record");
    auto v = codec::get_u64_le(in);
    in.remove_prefix(8);
    return v;
}

std::uint32_t take_u32(std::string_view& in) {
    if (in.size() < 4) throw_error(errc::corrupt_record, "truncated record");
    auto v = codec::get_u32_le(in);
    in.remove_prefix(4);
    return v;
}

std::string change_key(change_position at) {
    std::string out;
    codec::put_u64_be(out, at.commit);
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((at.index >> shift) & 0xff));
    return out;
}

change_position decode_change_key(std::string_view key) {
    if (key.size() != 12) throw_error(errc::corrupt_record, "change feed: a key of " + std::to_string(key.size()) + " bytes");
    change_position at{codec::get_u64_be(key), 0};
    for (std::size_t i = 8; i < 12; ++i) at.index = (at.index << 8) | static_cast<unsigned char>(key[i]);
    return at;
}

void encode_change(std::string& out, change_kind kind, std::uint64_t version, std::uint32_t state_version,
                   std::string_view projection, std::string_view key, std::string_view state) {
    out.push_back(static_cast<char>(kind));
    codec::put_u64_le(out, version);
    codec::put_u32_le(out, state_version);
    put_str(out, projection);
    put_str(out, key);
    out.append(state);
}

change decode_change(std::string_view key, std::string_view value) {
    change c;
    c.position = decode_change_key(key);
    try {
        if (value.empty()) throw_error(errc::corrupt_record, "empty record");
        const auto kind = static_cast<unsigned char>(value.front());
        if (kind != static_cast<unsigned>(change_kind::row) && kind != static_cast<unsigned>(change_kind::reset)) {
            throw_error(errc::corrupt_record, "unknown kind " + std::to_string(kind));
        }
        c.kind = static_cast<change_kind>(kind);
        value.remove_prefix(1);
        c.version = take_u64(value);
        c.state_version = take_u32(value);
        c.projection = take_str(value);
        c.key = take_str(value);
        c.state = value;
    } catch (const std::system_error& e) {
        throw_error(errc::corrupt_record, "change feed entry " + c.position.to_string() + " does not decode: " + e.what());
    }
    return c;
}

std::string encode_position(change_position at) {
    std::string out;
    codec::put_u64_le(out, at.commit);
    codec::put_u32_le(out, at.index);
    return out;
}

change_position decode_position(std::optional<std::string_view> v) {
    if (!v || v->size() < 12) return {};
    return {codec::get_u64_le(*v), codec::get_u32_le(v->substr(8))};
}

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
        const auto at = 32 + 8 * c.jump_votes.size();
        if (c.jump_votes.size() == n && v->size() >= at + 8) {
            const auto m = codec::get_u64_le(v->substr(at));
            for (std::size_t i = 0; i < m && v->size() >= at + 16 + 8 * i; ++i) {
                c.jump_sources.push_back(codec::get_u64_le(v->substr(at + 8 + 8 * i)));
            }
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
    codec::put_u64_le(out, c.jump_sources.size());
    for (auto id : c.jump_sources) codec::put_u64_le(out, id);
    return out;
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

namespace {
// Flags in a dead letter's reason byte (reasons stay below 64).
constexpr unsigned dead_letter_truncated = 0x80u;
constexpr unsigned dead_letter_has_origin = 0x40u;
constexpr unsigned dead_letter_reason_mask = 0x3fu;
}  // namespace

std::string encode_dead_letter(reason why, std::string_view detail, std::string_view message_id,
                               std::string_view body, std::uint64_t time_ns, const dead_letter_origin& at,
                               std::optional<std::uint64_t> digest) {
    const bool cut = why == reason::too_large && body.size() > dead_letter_prefix;
    const bool origin = !at.source.empty();
    std::string out;
    out.push_back(static_cast<char>(static_cast<unsigned>(why) | (cut ? dead_letter_truncated : 0u) |
                                    (origin ? dead_letter_has_origin : 0u)));
    codec::put_u64_le(out, time_ns);
    put_str(out, message_id);
    put_str(out, detail);
    if (origin) {
        put_str(out, at.source);
        codec::put_u64_le(out, at.line);
        codec::put_u64_le(out, at.offset);
    }
    if (cut) {
        codec::put_u64_le(out, body.size());
        codec::put_u64_le(out, digest ? *digest : body_digest(body));
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
    d.why = static_cast<reason>(first & dead_letter_reason_mask);
    d.time_ns = codec::get_u64_le(v.substr(1));
    v.remove_prefix(9);
    d.message_id = take_str(v);
    d.detail = take_str(v);
    if ((first & dead_letter_has_origin) != 0) {
        d.source = take_str(v);
        if (v.size() < 16) throw_error(errc::corrupt_record, "truncated dead letter");
        d.line = codec::get_u64_le(v);
        d.offset = codec::get_u64_le(v.substr(8));
        v.remove_prefix(16);
    }
    d.body_size = v.size();
    if ((first & dead_letter_truncated) != 0) {
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

std::optional<std::pair<std::string, std::uint64_t>> decode_parked_key(std::string_view key) {
    auto k = codec::decode_table_key(key);
    if (!k || k->effect.size() != 8) return std::nullopt;
    return std::pair{std::move(k->aggregate), codec::get_u64_be(k->effect)};
}

namespace {

// A parked value's first word in the versioned layout: no older value's message id has this length.
constexpr std::uint32_t parked_versioned = 0xFFFFFFFFu;
constexpr std::uint8_t parked_version = 1;

}  // namespace

std::string encode_parked(std::string_view message_id, std::string_view event_id, std::string_view body) {
    std::string out;
    out.reserve(4 + 1 + 4 + message_id.size() + 4 + event_id.size() + body.size());
    codec::put_u32_le(out, parked_versioned);
    out.push_back(static_cast<char>(parked_version));
    put_str(out, message_id);
    put_str(out, event_id);
    out.append(body);
    return out;
}

parked_value decode_parked_value(std::string_view v) {
    parked_value p;
    if (v.size() >= 5 && codec::get_u32_le(v) == parked_versioned) {
        const auto version = static_cast<std::uint8_t>(v[4]);
        if (version != parked_version) {
            throw_error(errc::corrupt_record, "parked value of version " + std::to_string(version) + ", this build reads " +
                                                  std::to_string(parked_version));
        }
        v.remove_prefix(5);
        p.message_id = take_str(v);
        p.event_id = take_str(v);
    } else {
        p.message_id = take_str(v);
    }
    p.body = v;
    return p;
}

std::pair<std::string_view, std::string_view> decode_parked(std::string_view v) {
    const auto p = decode_parked_value(v);
    return {p.message_id, p.body};
}

std::string encode_checkpoint(std::uint64_t position, std::string_view detail) {
    std::string out;
    codec::put_u64_le(out, position);
    out.append(detail);
    return out;
}

std::string encode_action(const operator_action& a) {
    std::string out;
    codec::put_u64_le(out, a.time_ns);
    codec::put_u64_le(out, a.commit);
    put_str(out, a.action);
    put_str(out, a.stream);
    put_str(out, a.note);
    put_str(out, a.summary);
    codec::put_u32_le(out, static_cast<std::uint32_t>(a.skipped.size()));
    for (const auto& r : a.skipped) {
        codec::put_u64_le(out, r.from);
        codec::put_u64_le(out, r.to);
    }
    codec::put_u32_le(out, static_cast<std::uint32_t>(a.sequences.size()));
    for (auto s : a.sequences) codec::put_u64_le(out, s);
    return out;
}

operator_action decode_action(std::uint64_t position, std::string_view v) {
    operator_action a;
    a.position = position;
    a.time_ns = take_u64(v);
    a.commit = take_u64(v);
    a.action = take_str(v);
    a.stream = take_str(v);
    a.note = take_str(v);
    a.summary = take_str(v);
    for (auto n = take_u32(v); n != 0; --n) {
        sequence_range r;
        r.from = take_u64(v);
        r.to = take_u64(v);
        a.skipped.push_back(r);
    }
    for (auto n = take_u32(v); n != 0; --n) a.sequences.push_back(take_u64(v));
    return a;
}

std::optional<inbox_entry> decode_inbox_entry(std::string_view v) {
    if (v.size() < inbox_header) return std::nullopt;
    inbox_entry e;
    e.record.stamp = codec::get_u64_le(v);
    inbox_words words{};
    for (std::size_t w = 0; w < words.size(); ++w) words[w] = codec::get_u64_le(v.substr(8 * (w + 1)));
    const auto first = decode_inbox_first(words);
    e.record.fingerprint = first.fingerprint;
    e.record.commit = first.commit;
    e.record.outcome = first.outcome;
    e.record.why = first.why;
    e.message_id = v.substr(inbox_header);
    return e;
}

std::uint64_t event_identity(std::string_view event_id) { return id_log::hash_of(event_id) | 1; }

std::uint64_t source_identity(std::string_view source) { return id_log::hash_of(source) | 1; }

std::string truncate(std::string_view s, std::size_t n) {
    if (s.size() <= n) return std::string(s);
    return std::string(s.substr(0, n)) + "...";
}

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

}  // namespace layout
}  // namespace idem
