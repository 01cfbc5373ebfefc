#include <idem/examples/gen.hpp>

#include <idem/examples/game.hpp>
#include <idem/examples/orders.hpp>
#include <idem/examples/trading.hpp>

#include "totals.hpp"

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

namespace {

// xoshiro256** seeded through splitmix64: the same numbers for a seed on every platform
// (the standard distributions are not specified bit for bit).
class random_bits {
public:
    explicit random_bits(std::uint64_t seed) {
        for (auto& s : s_) {
            seed += 0x9E3779B97F4A7C15ull;
            std::uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            s = z ^ (z >> 31);
        }
    }
    std::uint64_t next() {
        const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const std::uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    // The modulo bias is below 2^-40 for the small ranges used here.
    std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
    std::int64_t between(std::int64_t lo, std::int64_t hi) {
        return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
    }
    // Always draws, so the stream does not depend on p.
    bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }

private:
    static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::array<std::uint64_t, 4> s_{};
};

enum class domain_kind : std::uint8_t { trading, game, orders };
enum class op : std::uint8_t { fill, line, score, grant, consume };
constexpr std::uint8_t no_flaw = 0xFF;

// One line as the generator decided it; the text is rendered from it, so a copy is
// re-rendered rather than kept.
struct line_spec {
    std::uint64_t event = 0;  // the id's number, unique in the log
    std::uint64_t msgid = 0;  // 0: no msgid attribute
    std::uint64_t exec = 0;   // trading: the exec_id's number
    std::uint64_t seq = 0;    // 0: no sequence attribute
    std::uint64_t time_us = 0;
    std::int64_t amount = 0;  // fill: signed qty; line: amount; score: points; items: count
    std::int64_t price = 0;   // fill: ticks
    std::uint32_t row = 0;    // position, order or player: the subject's stream
    std::uint32_t item = 0;   // items: index into the catalog
    op what = op::fill;
    std::uint8_t flaw = no_flaw;  // a defect, as its enum value
    bool reissued = false;
};

bool has_flaw(const line_spec& s, defect d) {
    return s.flaw == static_cast<std::uint8_t>(d);
}

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

constexpr std::size_t catalog_size = 8;
constexpr std::array<const char*, catalog_size> catalog{"sword", "shield", "potion", "arrow",
                                                        "gem",   "key",    "scroll", "coin"};
using item_counts = std::array<std::int64_t, catalog_size>;

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
    store_model(domain_kind d, std::size_t streams, std::size_t matches)
        : domain_(d), matches_(matches), highest_(streams), parked_in_(streams) {
        if (d == domain_kind::trading) {
            positions_.resize(streams);
            versions_.resize(streams);
        } else if (d == domain_kind::orders) {
            orders_.resize(streams);
            versions_.resize(streams);
        } else {
            match_total_.resize(matches);
            match_version_.resize(matches);
            held_.resize(streams);
            versions_.resize(streams);
        }
    }

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
        r.totals_json = totals();
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
        // Effect keys: a fill's exec_id; every other event's own id.
        auto& effects = s.what == op::fill ? effect_exec_ : effect_event_;
        const std::uint64_t effect = s.what == op::fill ? s.exec : s.event;
        if (is_set(effects, effect)) return result::duplicate_event;
        if (has_flaw(s, defect::rejected) && s.what == op::fill) return dead(why::handler_failed);
        try {
            switch (s.what) {
                case op::fill:
                    positions_[s.row].apply(s.amount, s.price);
                    break;
                case op::line:
                    orders_[s.row].add(line_added{{}, s.amount});
                    break;
                case op::score: {
                    const auto m = s.row % matches_;
                    match_total_[m] += s.amount;
                    ++match_version_[m];
                    break;
                }
                case op::grant:
                    held_[s.row][s.item] += s.amount;
                    break;
                case op::consume:
                    if (held_[s.row][s.item] < s.amount) return dead(why::handler_failed);
                    held_[s.row][s.item] -= s.amount;
                    break;
            }
        } catch (const std::exception&) {
            return dead(why::handler_failed);
        }
        if (s.what != op::score) ++versions_[s.row];
        test_and_set(effects, effect);
        return result::applied;
    }

    std::string totals() const {
        if (domain_ == domain_kind::trading) {
            std::int64_t rows = 0, fills = 0, qty = 0, cost = 0, pnl = 0;
            for (std::size_t i = 0; i < positions_.size(); ++i) {
                if (versions_[i] == 0) continue;
                ++rows;
                fills += static_cast<std::int64_t>(versions_[i]);
                qty += positions_[i].qty;
                cost += positions_[i].cost;
                pnl += positions_[i].realized_pnl;
            }
            return detail::format_totals(
                {{"positions", rows}, {"fills", fills}, {"qty", qty}, {"cost", cost}, {"realized_pnl", pnl}});
        }
        if (domain_ == domain_kind::orders) {
            std::int64_t rows = 0, lines = 0, total = 0;
            for (std::size_t i = 0; i < orders_.size(); ++i) {
                if (versions_[i] == 0) continue;
                ++rows;
                lines += orders_[i].lines;
                total += orders_[i].total;
            }
            return detail::format_totals({{"orders", rows}, {"lines", lines}, {"total", total}});
        }
        std::int64_t matches = 0, scores = 0, points = 0, players = 0, item_events = 0, items = 0;
        for (std::size_t m = 0; m < match_total_.size(); ++m) {
            if (match_version_[m] == 0) continue;
            ++matches;
            scores += static_cast<std::int64_t>(match_version_[m]);
            points += match_total_[m];
        }
        for (std::size_t p = 0; p < held_.size(); ++p) {
            if (versions_[p] == 0) continue;
            ++players;
            item_events += static_cast<std::int64_t>(versions_[p]);
            for (auto n : held_[p]) items += n;
        }
        return detail::format_totals({{"matches", matches},
                                      {"scores", scores},
                                      {"points", points},
                                      {"players", players},
                                      {"item_events", item_events},
                                      {"items", items}});
    }

    domain_kind domain_;
    std::size_t matches_;
    std::array<std::uint64_t, result_names.size()> outcomes_{};
    std::array<std::uint64_t, why_count> reasons_{};
    std::uint64_t released_ = 0;
    std::vector<std::uint8_t> inbox_msgid_, inbox_event_;
    std::vector<std::uint8_t> effect_exec_, effect_event_;
    std::vector<std::uint64_t> highest_;
    std::vector<std::uint32_t> parked_in_;
    std::unordered_map<std::uint64_t, line_spec> parked_;
    // Rows, indexed by stream (positions, orders, players' inventories) or by match.
    std::vector<position> positions_;
    std::vector<order_total> orders_;
    std::vector<std::int64_t> match_total_;
    std::vector<std::uint64_t> match_version_;
    std::vector<item_counts> held_;
    std::vector<std::uint64_t> versions_;
};

constexpr std::array<const char*, 32> tickers{"AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "AVGO",
                                              "JPM",  "V",    "MA",   "UNH",  "XOM",  "JNJ",  "PG",   "HD",
                                              "COST", "ABBV", "MRK",  "CVX",  "KO",   "PEP",  "ADBE", "CRM",
                                              "NFLX", "AMD",  "INTC", "CSCO", "ORCL", "QCOM", "TXN",  "IBM"};
constexpr std::array<const char*, 4> venues{"xnas", "xnys", "arcx", "bats"};
constexpr std::array<const char*, 4> exec_prefixes{"XNAS-", "XNYS-", "ARCX-", "BATS-"};
constexpr std::array<const char*, 3> shops{"/shop/web", "/shop/mobile", "/shop/pos"};
constexpr std::array<const char*, 2> match_servers{"/match-server/eu-1", "/match-server/us-1"};

// 2026-12-02T09:30:00Z, the log's first event time.
constexpr std::uint64_t start_us = 1'796'203'800ull * 1'000'000ull;
// Appended to a key to take it past LMDB's 511-byte key limit.
const std::string long_suffix(600, 'x');
// The byte sequence C3 28: a two-byte UTF-8 lead followed by a non-continuation byte.
constexpr std::string_view bad_utf8 = "\xC3\x28";

void append_uint(std::string& out, std::uint64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
}

void append_int(std::string& out, std::int64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
}

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
        : o_(o), sink_(sink), rng_(o.seed), model_(kind_of(o.domain), streams_of(o), matches_of(o)) {
        domain_ = kind_of(o.domain);
        for (double share : {o.redeliver, o.republish, o.reissue, o.reorder, o.malformed}) {
            if (!(share >= 0.0 && share <= 1.0)) throw std::invalid_argument("a share must be within [0, 1]");
        }
        if (o.events >= (std::uint64_t{1} << 32)) throw std::invalid_argument("at most 2^32 - 1 events");
        streams_ = streams_of(o);
        matches_ = matches_of(o);
        instruments_ = std::min<std::size_t>(streams_, tickers.size());
        for (auto d : o.defects) {
            if (d == defect::rejected && domain_ == domain_kind::orders)
                continue;  // order lines have no invalid amount
            kinds_.push_back(d);
        }
        next_seq_.resize(streams_);
        if (domain_ == domain_kind::game) gen_held_.resize(streams_);
        for (std::size_t i = 0; i < instruments_; ++i) base_price_.push_back(rng_.between(1'000, 90'000));
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

    static domain_kind kind_of(std::string_view d) {
        if (d == "trading") return domain_kind::trading;
        if (d == "game") return domain_kind::game;
        if (d == "orders") return domain_kind::orders;
        throw std::invalid_argument("unknown domain '" + std::string(d) + "' (trading, game or orders)");
    }
    static std::size_t matches_of(const gen_options& o) {
        return std::max<std::size_t>(1, static_cast<std::size_t>(o.aggregates / 10));
    }
    // Streams: positions, orders, or players (the aggregates left after the matches).
    static std::size_t streams_of(const gen_options& o) {
        const auto n = static_cast<std::size_t>(std::max<std::uint64_t>(1, o.aggregates));
        if (o.domain == "game") return std::max<std::size_t>(1, n > matches_of(o) ? n - matches_of(o) : 1);
        if (n >= (std::size_t{1} << 32)) throw std::invalid_argument("at most 2^32 - 1 aggregates");
        return n;
    }

    std::uint32_t pick_row() { return static_cast<std::uint32_t>(rng_.below(streams_)); }

    line_spec next_event() {
        line_spec s;
        s.event = next_event_++;
        s.time_us = clock_;
        if (rng_.chance(0.5)) s.msgid = next_msgid_++;
        s.row = pick_row();
        switch (domain_) {
            case domain_kind::trading:
                make_fill(s);
                break;
            case domain_kind::orders:
                make_line(s);
                break;
            case domain_kind::game: {
                const auto roll = rng_.below(100);
                auto& held = gen_held_[s.row];
                const bool holds_any = std::any_of(held.begin(), held.end(), [](std::int64_t n) { return n > 0; });
                if (roll < 60) {
                    make_score(s);
                } else if (roll < 85 || !holds_any) {
                    s.what = op::grant;
                    s.item = static_cast<std::uint32_t>(rng_.below(catalog_size));
                    s.amount = rng_.between(1, 5);
                    held[s.item] += s.amount;
                } else {
                    s.what = op::consume;
                    auto start = rng_.below(catalog_size);
                    for (std::size_t k = 0; k < catalog_size; ++k) {
                        const auto item = (start + k) % catalog_size;
                        if (held[item] > 0) {
                            s.item = static_cast<std::uint32_t>(item);
                            break;
                        }
                    }
                    s.amount = rng_.between(1, held[s.item]);
                    held[s.item] -= s.amount;
                }
                break;
            }
        }
        s.seq = ++next_seq_[s.row];
        return s;
    }

    void make_fill(line_spec& s) {
        s.what = op::fill;
        const auto instrument = s.row % instruments_;
        const std::int64_t base = base_price_[instrument];
        s.price = base + rng_.between(-base / 100, base / 100);
        const std::int64_t qty = rng_.between(1, 500);
        s.amount = rng_.chance(0.5) ? qty : -qty;
        s.exec = next_exec_++;
    }
    void make_line(line_spec& s) {
        s.what = op::line;
        s.amount = rng_.chance(0.03) ? -rng_.between(100, 5'000) : rng_.between(100, 99'999);
    }
    void make_score(line_spec& s) {
        s.what = op::score;
        s.amount = rng_.chance(0.05) ? -rng_.between(1, 20) : rng_.between(1, 100);
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
        switch (domain_) {
            case domain_kind::trading:
                make_fill(s);
                break;
            case domain_kind::orders:
                make_line(s);
                break;
            case domain_kind::game:
                if (kind == defect::rejected) {
                    // More than any player can hold: the handler refuses it whatever the row holds.
                    s.what = op::consume;
                    s.item = static_cast<std::uint32_t>(rng_.below(catalog_size));
                    s.amount = 1'000'000'000'000;
                } else {
                    make_score(s);
                }
                break;
        }
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
    bool reissuable(const line_spec& s) const {
        return s.flaw == no_flaw && !s.reissued && (s.what == op::fill || s.what == op::score);
    }

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
            // A drop copy reports the fill again outside the venue's stream; a replayed score
            // claims the same position of the player's stream.
            line_spec copy = s;
            copy.event = next_event_++;
            copy.reissued = true;
            copy.msgid = rng_.chance(0.5) ? next_msgid_++ : 0;
            if (copy.what == op::fill) copy.seq = 0;
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

    // --- rendering ----------------------------------------------------------

    void append_string(std::string_view s) {
        text_.push_back('"');
        text_.append(s);
        text_.push_back('"');
    }
    void append_attribute(const char* name, std::string_view value) {
        text_.append(",\"").append(name).append("\":");
        append_string(value);
    }

    // The aggregate's name as it appears in data and subject; a key_too_long defect makes it long.
    void append_key_name(const line_spec& s) {
        if (s.what != op::grant && s.what != op::consume) text_.append(o_.key_prefix);
        switch (s.what) {
            case op::fill:
                text_.append("acct-");
                append_uint(text_, s.row / instruments_);
                break;
            case op::line:
                text_.append("order-");
                append_uint(text_, s.row);
                break;
            case op::score:
                text_.append("match-");
                append_uint(text_, s.row % matches_);
                break;
            case op::grant:
            case op::consume:
                append_player(s.row);
                break;
        }
        if (has_flaw(s, defect::key_too_long)) text_.append(long_suffix);
        if (has_flaw(s, defect::invalid_utf8)) text_.append(bad_utf8);
    }
    void append_player(std::uint32_t row) {
        text_.append(o_.key_prefix);
        text_.append("player-");
        append_uint(text_, row);
    }
    void append_instrument(const line_spec& s) {
        const auto i = s.row % instruments_;
        text_.append(tickers[i]);
    }

    void append_subject(const line_spec& s) {
        text_.append(",\"subject\":\"");
        switch (s.what) {
            case op::fill:
                append_key_name(s);
                text_.push_back('/');
                append_instrument(s);
                break;
            case op::line:
                append_key_name(s);
                break;
            case op::score:
            case op::grant:
            case op::consume:
                // Player streams: a score's row is its match, but its stream is its player.
                append_player(s.row);
                break;
        }
        text_.push_back('"');
    }

    void append_number_field(const char* name, std::int64_t v, const line_spec& s) {
        text_.append(",\"").append(name).append("\":");
        if (has_flaw(s, defect::undecodable)) {
            text_.append("\"x\"");
        } else {
            append_int(text_, v);
        }
    }

    void append_data(const line_spec& s) {
        text_.append(",\"data\":{");
        switch (s.what) {
            case op::fill: {
                text_.append("\"account\":\"");
                append_key_name(s);
                text_.append("\",\"instrument\":\"");
                append_instrument(s);
                text_.push_back('"');
                const bool rejected = has_flaw(s, defect::rejected);
                const bool bad_side = rejected && s.event % 2 == 1;
                append_attribute("side", bad_side ? "hold" : s.amount > 0 ? "buy" : "sell");
                // A rejected fill with a good side has a quantity of 0.
                append_number_field("qty", rejected && !bad_side ? 0 : (s.amount > 0 ? s.amount : -s.amount), s);
                text_.append(",\"price\":");
                append_int(text_, s.price);
                text_.append(",\"exec_id\":\"");
                text_.append(exec_prefixes[(s.row % instruments_) % venues.size()]);
                append_uint(text_, s.exec);
                text_.push_back('"');
                break;
            }
            case op::line:
                text_.append("\"order_id\":\"");
                append_key_name(s);
                text_.push_back('"');
                append_number_field("amount", s.amount, s);
                break;
            case op::score:
                text_.append("\"match\":\"");
                append_key_name(s);
                text_.append("\",\"player\":\"");
                append_player(s.row);
                text_.push_back('"');
                append_number_field("points", s.amount, s);
                break;
            case op::grant:
            case op::consume:
                text_.append("\"player\":\"");
                append_key_name(s);
                text_.append("\",\"item\":\"");
                text_.append(catalog[s.item]);
                text_.push_back('"');
                append_number_field("count", s.amount, s);
                break;
        }
        if (has_flaw(s, defect::oversized)) {
            text_.append(",\"note\":\"");
            text_.append((std::size_t{1} << 20) + 1, 'x');
            text_.push_back('"');
        }
        text_.push_back('}');
    }

    std::string_view source_of(const line_spec& s) {
        switch (s.what) {
            case op::fill:
                scratch_.assign(s.reissued ? "/dropcopy/" : "/venue/");
                scratch_.append(venues[(s.row % instruments_) % venues.size()]);
                return scratch_;
            case op::line:
                return shops[s.row % shops.size()];
            case op::score:
                return s.reissued ? "/match-server/replay" : match_servers[(s.row % matches_) % 2];
            case op::grant:
            case op::consume:
                return "/inventory";
        }
        return "/";
    }

    std::string_view type_of(const line_spec& s) const {
        if (has_flaw(s, defect::unknown_type)) {
            switch (domain_) {
                case domain_kind::trading:
                    return "order.cancelled";
                case domain_kind::orders:
                    return "order.shipped";
                case domain_kind::game:
                    return "player.joined";
            }
        }
        switch (s.what) {
            case op::fill:
                return fill::event_type;
            case op::line:
                return line_added::event_type;
            case op::score:
                return scored::event_type;
            case op::grant:
                return item_granted::event_type;
            case op::consume:
                return item_consumed::event_type;
        }
        return "";
    }

    std::string_view id_prefix(const line_spec& s) const {
        switch (s.what) {
            case op::fill:
                return s.reissued ? "dc-" : "fill-";
            case op::line:
                return "line-";
            default:
                return "ev-";
        }
    }

    void render(const line_spec& s) {
        text_.clear();
        text_.append("{\"specversion\":\"1.0\"");
        if (has_flaw(s, defect::wrong_field_type)) {
            text_.append(",\"id\":");
            append_uint(text_, s.event);
        } else if (!has_flaw(s, defect::missing_id)) {
            // The seed is part of the id: two runs with different seeds are two sources whose events differ.
            text_.append(",\"id\":\"").append(id_prefix(s));
            append_uint(text_, o_.seed);
            text_.push_back('-');
            append_uint(text_, s.event);
            text_.push_back('"');
        }
        if (has_flaw(s, defect::invalid_json)) {
            text_.append(",source:");
            append_string(source_of(s));
        } else if (!has_flaw(s, defect::missing_source)) {
            append_attribute("source", source_of(s));
        }
        if (!has_flaw(s, defect::missing_type)) append_attribute("type", type_of(s));
        append_subject(s);
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
        append_data(s);
        text_.push_back('}');
        if (has_flaw(s, defect::truncated)) text_.resize(text_.size() * 3 / 5);
    }

    const gen_options& o_;
    const std::function<void(std::string_view)>& sink_;
    random_bits rng_;
    store_model model_;
    domain_kind domain_ = domain_kind::trading;
    std::size_t streams_ = 1;
    std::size_t matches_ = 1;
    std::size_t instruments_ = 1;
    std::vector<defect> kinds_;
    std::size_t defect_turn_ = 0;
    std::vector<std::int64_t> base_price_;
    std::vector<std::uint64_t> next_seq_;
    std::vector<item_counts> gen_held_;  // what each player holds in stream order, to consume only that
    std::map<std::uint32_t, std::vector<held_event>> held_;
    std::vector<line_spec> ready_;
    std::priority_queue<pending_copy, std::vector<pending_copy>, later> pending_;
    std::uint64_t scheduled_ = 0;
    std::uint64_t next_event_ = 1;
    std::uint64_t next_msgid_ = 1;
    std::uint64_t next_exec_ = 1;
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
