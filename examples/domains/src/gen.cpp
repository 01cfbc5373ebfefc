// generate(): the domain-neutral half of the example-log generator. It draws the ids, times,
// streams and sequences, mixes in the defects (redeliveries, republished and reissued copies,
// late events, defect lines), wraps each event in its envelope, and models what the store does
// with each line. What the events of a domain are, how they read and what they do to its rows
// is that domain's generator (trading_gen.cpp, orders_gen.cpp, game_gen.cpp; gen_domain.hpp).

#include <idem/examples/gen.hpp>

#include "gen_domain.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <exception>
#include <map>
#include <optional>
#include <queue>
#include <stdexcept>
#include <unordered_map>

namespace idem::examples {

std::string_view to_string(defect d) noexcept {
    switch (d) {
        case defect::truncated:
            return "truncated";
        case defect::invalid_json:
            return "invalid_json";
        case defect::missing_id:
            return "missing_id";
        case defect::missing_source:
            return "missing_source";
        case defect::missing_type:
            return "missing_type";
        case defect::wrong_field_type:
            return "wrong_field_type";
        case defect::unknown_type:
            return "unknown_type";
        case defect::oversized:
            return "oversized";
        case defect::invalid_utf8:
            return "invalid_utf8";
        case defect::key_too_long:
            return "key_too_long";
        case defect::undecodable:
            return "undecodable";
        case defect::rejected:
            return "rejected";
    }
    return "unknown";
}

std::vector<defect> every_defect() {
    return {defect::truncated,    defect::invalid_json,     defect::missing_id,   defect::missing_source,
            defect::missing_type, defect::wrong_field_type, defect::unknown_type, defect::oversized,
            defect::invalid_utf8, defect::key_too_long,     defect::undecodable,  defect::rejected};
}

namespace detail {

void line_text::key_flaws(const line_spec& s) {
    // Appended to a key to take it past LMDB's 511-byte key limit.
    static const std::string long_suffix(600, 'x');
    // The byte sequence C3 28: a two-byte UTF-8 lead followed by a non-continuation byte.
    constexpr std::string_view bad_utf8 = "\xC3\x28";
    if (has_flaw(s, defect::key_too_long)) text.append(long_suffix);
    if (has_flaw(s, defect::invalid_utf8)) text.append(bad_utf8);
}

std::unique_ptr<domain_gen> make_domain_gen(const gen_options& o, random_bits& rng) {
    if (o.domain == "trading") return trading_gen(o, rng);
    if (o.domain == "game") return game_gen(o, rng);
    if (o.domain == "orders") return orders_gen(o, rng);
    throw std::invalid_argument("unknown domain '" + o.domain + "' (trading, game or orders)");
}

}  // namespace detail

namespace {

using namespace detail;

// The outcomes and reasons the store reports, as the model counts them.
enum class result : std::uint8_t { applied, duplicate_message, duplicate_event, parked, dead_lettered, ignored };
constexpr std::array<const char*, 6> result_names{"applied", "duplicate_message", "duplicate_event",
                                                  "parked",  "dead_lettered",     "ignored"};
enum class why : std::uint8_t {
    invalid_json,
    missing_id,
    missing_source,
    missing_type,
    invalid_field,
    key_too_long,
    decode_failed,
    handler_failed,
    sequence_conflict,
    unknown_type,
    too_large,
    invalid_utf8,
};
constexpr std::size_t why_count = 12;
const char* name_of(why w) {
    switch (w) {
        case why::invalid_json:
            return "invalid_json";
        case why::missing_id:
            return "missing_id";
        case why::missing_source:
            return "missing_source";
        case why::missing_type:
            return "missing_type";
        case why::invalid_field:
            return "invalid_field";
        case why::key_too_long:
            return "key_too_long";
        case why::decode_failed:
            return "decode_failed";
        case why::handler_failed:
            return "handler_failed";
        case why::sequence_conflict:
            return "sequence_conflict";
        case why::unknown_type:
            return "unknown_type";
        case why::too_large:
            return "too_large";
        case why::invalid_utf8:
            return "invalid_utf8";
    }
    return "unknown";
}

// Sets flag i, growing the vector; returns whether it was already set.
bool test_and_set(std::vector<std::uint8_t>& flags, std::uint64_t i) {
    if (i >= flags.size()) flags.resize(std::max<std::size_t>(static_cast<std::size_t>(i) + 1, flags.size() * 2));
    const bool was = flags[i] != 0;
    flags[i] = 1;
    return was;
}

bool is_set(const std::vector<std::uint8_t>& flags, std::uint64_t i) {
    return i < flags.size() && flags[i] != 0;
}

// The store's semantics (projections/src/batch_run.cpp) over line_specs, in delivery order:
// inbox first, then stream sequence (duplicate below the stream's highest, park past a
// gap, release when it fills), then the contributing set, then the handler, all or nothing.
class store_model {
public:
    store_model(domain_gen& domain, std::size_t streams)
        : domain_(domain), highest_(streams), parked_in_(streams) {}

    void observe(const line_spec& s) {
        if (auto w = parse_failure(s)) {
            count(dead(*w));
            return;
        }
        // Without a transport id beside the line, the message id is the msgid, else the event id.
        const bool duplicate = s.msgid != 0 ? test_and_set(inbox_msgid_, s.msgid) : test_and_set(inbox_event_, s.event);
        count(duplicate ? result::duplicate_message : process(s));
    }

    gen_result results() const {
        gen_result r;
        for (std::size_t i = 0; i < result_names.size(); ++i) r.outcomes[result_names[i]] = outcomes_[i];
        r.outcomes["released"] = released_;
        for (std::size_t i = 0; i < reasons_.size(); ++i) {
            if (reasons_[i] != 0) r.dead_letter_reasons[name_of(static_cast<why>(i))] = reasons_[i];
        }
        r.parked_left = parked_.size();
        r.totals_json = domain_.totals();
        return r;
    }

private:
    static std::optional<why> parse_failure(const line_spec& s) {
        if (s.flaw == no_flaw) return std::nullopt;
        switch (static_cast<defect>(s.flaw)) {
            case defect::truncated:
                return why::invalid_json;
            case defect::invalid_json:
                return why::invalid_json;
            case defect::missing_id:
                return why::missing_id;
            case defect::missing_source:
                return why::missing_source;
            case defect::missing_type:
                return why::missing_type;
            case defect::wrong_field_type:
                return why::invalid_field;
            case defect::oversized:
                return why::too_large;
            case defect::invalid_utf8:
                return why::invalid_utf8;
            default:
                return std::nullopt;
        }
    }

    void count(result r) { ++outcomes_[static_cast<std::size_t>(r)]; }
    result dead(why w) {
        ++reasons_[static_cast<std::size_t>(w)];
        return result::dead_lettered;
    }
    static std::uint64_t parked_key(std::uint32_t stream, std::uint64_t seq) {
        return (std::uint64_t{stream} << 32) | seq;  // generate() bounds seq below 2^32
    }

    result process(const line_spec& s) {
        if (s.seq == 0) return apply(s);
        auto& highest = highest_[s.row];
        if (s.seq <= highest) return result::duplicate_event;
        if (s.seq > highest + 1) {
            auto [it, inserted] = parked_.try_emplace(parked_key(s.row, s.seq), s);
            if (!inserted) return it->second.event == s.event ? result::duplicate_event : dead(why::sequence_conflict);
            ++parked_in_[s.row];
            return result::parked;
        }
        // A dead-lettered event moves its stream on too.
        const result r = apply(s);
        highest = s.seq;
        release(s.row);
        return r;
    }

    void release(std::uint32_t stream) {
        while (parked_in_[stream] != 0) {
            auto it = parked_.find(parked_key(stream, highest_[stream] + 1));
            if (it == parked_.end()) return;
            const line_spec s = it->second;
            parked_.erase(it);
            --parked_in_[stream];
            const result r = apply(s);
            ++released_;
            highest_[stream] += 1;
            if (r == result::dead_lettered) count(result::dead_lettered);
        }
    }

    result apply(const line_spec& s) {
        if (has_flaw(s, defect::unknown_type)) return dead(why::unknown_type);
        if (has_flaw(s, defect::undecodable)) return dead(why::decode_failed);
        if (has_flaw(s, defect::key_too_long)) return dead(why::key_too_long);
        const auto effect = domain_.effect(s);
        auto& effects = effect.from_payload ? effect_payload_ : effect_event_;
        if (is_set(effects, effect.id)) return result::duplicate_event;
        if (has_flaw(s, defect::rejected)) return dead(why::handler_failed);
        try {
            if (!domain_.apply(s)) return dead(why::handler_failed);
        } catch (const std::exception&) {
            return dead(why::handler_failed);
        }
        test_and_set(effects, effect.id);
        return result::applied;
    }

    domain_gen& domain_;
    std::array<std::uint64_t, result_names.size()> outcomes_{};
    std::array<std::uint64_t, why_count> reasons_{};
    std::uint64_t released_ = 0;
    std::vector<std::uint8_t> inbox_msgid_, inbox_event_;
    std::vector<std::uint8_t> effect_payload_, effect_event_;
    std::vector<std::uint64_t> highest_;
    std::vector<std::uint32_t> parked_in_;
    std::unordered_map<std::uint64_t, line_spec> parked_;
};

// 2026-12-02T09:30:00Z, the log's first event time.
constexpr std::uint64_t start_us = 1'796'203'800ull * 1'000'000ull;
void append_padded(std::string& out, std::uint64_t v, int width) {
    char buf[8];
    for (int i = width - 1; i >= 0; --i) {
        buf[i] = static_cast<char>('0' + v % 10);
        v /= 10;
    }
    out.append(buf, static_cast<std::size_t>(width));
}

// RFC 3339 UTC with microseconds; civil date from days (H. Hinnant's algorithm).
void append_time(std::string& out, std::uint64_t us) {
    const std::uint64_t secs = us / 1'000'000;
    const std::uint64_t days = secs / 86'400;
    const std::uint64_t sod = secs % 86'400;
    const std::uint64_t z = days + 719'468;
    const std::uint64_t era = z / 146'097;
    const std::uint64_t doe = z - era * 146'097;
    const std::uint64_t yoe = (doe - doe / 1460 + doe / 36'524 - doe / 146'096) / 365;
    const std::uint64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const std::uint64_t mp = (5 * doy + 2) / 153;
    const std::uint64_t day = doy - (153 * mp + 2) / 5 + 1;
    const std::uint64_t month = mp < 10 ? mp + 3 : mp - 9;
    const std::uint64_t year = yoe + era * 400 + (month <= 2 ? 1 : 0);
    append_padded(out, year, 4);
    out.push_back('-');
    append_padded(out, month, 2);
    out.push_back('-');
    append_padded(out, day, 2);
    out.push_back('T');
    append_padded(out, sod / 3600, 2);
    out.push_back(':');
    append_padded(out, sod / 60 % 60, 2);
    out.push_back(':');
    append_padded(out, sod % 60, 2);
    out.push_back('.');
    append_padded(out, us % 1'000'000, 6);
    out.push_back('Z');
}

class generator {
public:
    generator(const gen_options& o, const std::function<void(std::string_view)>& sink)
        : o_(o), sink_(sink), rng_(o.seed), domain_(make_domain_gen(o, rng_)), model_(*domain_, domain_->streams()) {
        for (double share : {o.redeliver, o.republish, o.reissue, o.reorder, o.malformed}) {
            if (!(share >= 0.0 && share <= 1.0)) throw std::invalid_argument("a share must be within [0, 1]");
        }
        if (o.events >= (std::uint64_t{1} << 32)) throw std::invalid_argument("at most 2^32 - 1 events");
        streams_ = domain_->streams();
        for (auto d : o.defects) {
            if (domain_->makes(d)) kinds_.push_back(d);
        }
        next_seq_.resize(streams_);
        text_.reserve(1024);
    }

    gen_result run() {
        for (std::uint64_t i = 0; i < o_.events; ++i) {
            flush_due();
            clock_ += static_cast<std::uint64_t>(rng_.between(0, 1999));
            const line_spec s = next_event();
            // Events of this stream held back earlier count this one as one position later.
            if (auto it = held_.find(s.row); it != held_.end()) {
                auto& list = it->second;
                for (auto& h : list) {
                    if (--h.wait == 0) ready_.push_back(h.spec);
                }
                std::erase_if(list, [](const held_event& h) { return h.wait == 0; });
                if (list.empty()) held_.erase(it);
            }
            if (rng_.chance(o_.reorder)) {
                held_[s.row].push_back({s, static_cast<std::uint32_t>(rng_.between(1, 3))});
            } else {
                emit(s, true);
            }
            for (const auto& r : ready_) emit(r, true);
            ready_.clear();
            if (!kinds_.empty() && rng_.chance(o_.malformed)) emit(next_defect(), true);
        }
        for (const auto& [row, list] : held_) {
            for (const auto& h : list) emit(h.spec, true);
        }
        held_.clear();
        while (!pending_.empty()) {
            auto c = pending_.top();
            pending_.pop();
            emit_copy(c);
        }
        auto r = model_.results();
        r.lines = lines_;
        r.events = o_.events;
        return r;
    }

private:
    struct held_event {
        line_spec spec;
        std::uint32_t wait;  // later events of its stream still to go before it
    };
    struct pending_copy {
        std::uint64_t due;    // emit once this many lines are out
        std::uint64_t order;  // ties keep scheduling order
        line_spec spec;
        bool restamp;  // a new event: stamped with the time it goes out
    };
    struct later {
        bool operator()(const pending_copy& a, const pending_copy& b) const {
            return a.due != b.due ? a.due > b.due : a.order > b.order;
        }
    };

    std::uint32_t pick_row() { return static_cast<std::uint32_t>(rng_.below(streams_)); }

    // A fresh event: the next id and time, a msgid half of the time, a stream, and what the
    // domain makes of it; then its stream's next sequence.
    line_spec next_event() {
        line_spec s;
        s.event = next_event_++;
        s.time_us = clock_;
        if (rng_.chance(0.5)) s.msgid = next_msgid_++;
        s.row = pick_row();
        domain_->make_event(s, rng_);
        s.seq = ++next_seq_[s.row];
        return s;
    }

    // A defect line: a fresh event outside every stream (no sequence), broken one way.
    line_spec next_defect() {
        const defect kind = kinds_[defect_turn_++ % kinds_.size()];
        line_spec s;
        s.event = next_event_++;
        s.time_us = clock_;
        if (rng_.chance(0.5)) s.msgid = next_msgid_++;
        s.row = pick_row();
        s.flaw = static_cast<std::uint8_t>(kind);
        domain_->make_defect(s, rng_);
        return s;
    }

    // Copies: republishing needs an identity (an envelope that parses); reissue is per domain.
    static bool parses(const line_spec& s) {
        if (s.flaw == no_flaw) return true;
        switch (static_cast<defect>(s.flaw)) {
            case defect::unknown_type:
            case defect::key_too_long:
            case defect::undecodable:
            case defect::rejected:
                return true;
            default:
                return false;
        }
    }
    bool reissuable(const line_spec& s) const { return s.flaw == no_flaw && !s.reissued && domain_->reissuable(s); }

    void emit(const line_spec& s, bool original) {
        render(s);
        sink_(text_);
        model_.observe(s);
        ++lines_;
        if (!original) return;
        if (rng_.chance(o_.redeliver)) schedule(rng_.between(1, 1'000), s, false);
        if (parses(s) && rng_.chance(o_.republish)) {
            line_spec copy = s;
            copy.msgid = next_msgid_++;
            schedule(rng_.between(1, 5'000), copy, false);
        }
        if (reissuable(s) && rng_.chance(o_.reissue)) {
            // A new event with the same effect (a drop copy of a fill, a replayed score).
            line_spec copy = s;
            copy.event = next_event_++;
            copy.reissued = true;
            copy.msgid = rng_.chance(0.5) ? next_msgid_++ : 0;
            domain_->reissue(copy);
            schedule(rng_.between(1, 2'000), copy, true);
        }
    }
    void schedule(std::int64_t delay, const line_spec& s, bool restamp) {
        pending_.push(pending_copy{lines_ + static_cast<std::uint64_t>(delay), scheduled_++, s, restamp});
    }
    void emit_copy(pending_copy& c) {
        if (c.restamp) c.spec.time_us = std::max(c.spec.time_us, clock_);
        emit(c.spec, false);
    }
    void flush_due() {
        while (!pending_.empty() && pending_.top().due <= lines_) {
            auto c = pending_.top();
            pending_.pop();
            emit_copy(c);
        }
    }

    // --- rendering: the envelope around the domain's subject and data -------

    void append_string(std::string_view s) {
        text_.push_back('"');
        text_.append(s);
        text_.push_back('"');
    }

    void render(const line_spec& s) {
        text_.clear();
        line_text t{text_, o_.key_prefix};
        text_.append("{\"specversion\":\"1.0\"");
        if (has_flaw(s, defect::wrong_field_type)) {
            text_.append(",\"id\":");
            append_uint(text_, s.event);
        } else if (!has_flaw(s, defect::missing_id)) {
            // The seed is part of the id: two runs with different seeds are two sources whose events differ.
            text_.append(",\"id\":\"").append(domain_->id_prefix(s));
            append_uint(text_, o_.seed);
            text_.push_back('-');
            append_uint(text_, s.event);
            text_.push_back('"');
        }
        if (has_flaw(s, defect::invalid_json)) {
            text_.append(",source:");
            append_string(domain_->source(s, scratch_));
        } else if (!has_flaw(s, defect::missing_source)) {
            t.attribute("source", domain_->source(s, scratch_));
        }
        if (!has_flaw(s, defect::missing_type)) t.attribute("type", domain_->type(s));
        text_.append(",\"subject\":\"");
        domain_->append_subject(t, s);
        text_.push_back('"');
        if (s.seq != 0) {
            text_.append(",\"sequence\":\"");
            append_uint(text_, s.seq);
            text_.push_back('"');
        }
        text_.append(",\"time\":\"");
        append_time(text_, start_us + s.time_us);
        text_.push_back('"');
        if (s.msgid != 0) {
            // Transport ids are unique per domain: "orders-m-17". (Logs of the same domain still
            // number alike; the inbox scopes each log's ids to its transport.)
            text_.append(",\"msgid\":\"").append(o_.domain).append("-m-");
            append_uint(text_, s.msgid);
            text_.push_back('"');
        }
        text_.append(",\"datacontenttype\":\"application/json\"");
        text_.append(",\"data\":{");
        domain_->append_data(t, s);
        if (has_flaw(s, defect::oversized)) {
            text_.append(",\"note\":\"");
            text_.append((std::size_t{1} << 20) + 1, 'x');
            text_.push_back('"');
        }
        text_.push_back('}');
        text_.push_back('}');
        if (has_flaw(s, defect::truncated)) text_.resize(text_.size() * 3 / 5);
    }

    const gen_options& o_;
    const std::function<void(std::string_view)>& sink_;
    random_bits rng_;
    std::unique_ptr<domain_gen> domain_;
    store_model model_;
    std::size_t streams_ = 1;
    std::vector<defect> kinds_;
    std::size_t defect_turn_ = 0;
    std::vector<std::uint64_t> next_seq_;
    std::map<std::uint32_t, std::vector<held_event>> held_;
    std::vector<line_spec> ready_;
    std::priority_queue<pending_copy, std::vector<pending_copy>, later> pending_;
    std::uint64_t scheduled_ = 0;
    std::uint64_t next_event_ = 1;
    std::uint64_t next_msgid_ = 1;
    std::uint64_t clock_ = 0;
    std::uint64_t lines_ = 0;
    std::string text_;
    std::string scratch_;
};

void append_counts(std::string& out, const char* name, const std::map<std::string, std::uint64_t>& counts) {
    out.append("\"").append(name).append("\":{");
    bool first = true;
    for (const auto& [key, n] : counts) {
        if (!first) out.push_back(',');
        first = false;
        out.append("\"").append(key).append("\":");
        append_uint(out, n);
    }
    out.push_back('}');
}

}  // namespace

gen_result generate(const gen_options& o, const std::function<void(std::string_view line)>& sink) {
    generator g{o, sink};
    return g.run();
}

std::string to_json(const gen_result& r) {
    std::string out = "{\"lines\":";
    append_uint(out, r.lines);
    out.append(",\"events\":");
    append_uint(out, r.events);
    out.push_back(',');
    append_counts(out, "outcomes", r.outcomes);
    out.push_back(',');
    append_counts(out, "dead_letter_reasons", r.dead_letter_reasons);
    out.append(",\"parked_left\":");
    append_uint(out, r.parked_left);
    out.append(",\"totals\":");
    out.append(r.totals_json.empty() ? "{}" : r.totals_json);
    out.push_back('}');
    return out;
}

}  // namespace idem::examples
