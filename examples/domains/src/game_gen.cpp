// The game domain's generator: scores in matches (a tenth of the aggregates) and items
// granted to and consumed by players (the rest), each player a stream. Players consume only
// what they hold; a rejected line consumes more than anyone holds, which the handler refuses.
// A replay re-sends some scores under a new event id at the same stream position.

#include "gen_domain.hpp"

#include <idem/examples/game.hpp>

#include "totals.hpp"

#include <algorithm>
#include <vector>

namespace idem::examples::detail {

namespace {

constexpr std::size_t catalog_size = 8;
constexpr std::array<const char*, catalog_size> catalog{"sword", "shield", "potion", "arrow",
                                                        "gem",   "key",    "scroll", "coin"};
using item_counts = std::array<std::int64_t, catalog_size>;
constexpr std::array<const char*, 2> match_servers{"/match-server/eu-1", "/match-server/us-1"};

class game final : public domain_gen {
public:
    game(const gen_options& o, random_bits& rng) {
        matches_ = std::max<std::size_t>(1, static_cast<std::size_t>(o.aggregates / 10));
        const auto n = static_cast<std::size_t>(std::max<std::uint64_t>(1, o.aggregates));
        streams_ = std::max<std::size_t>(1, n > matches_ ? n - matches_ : 1);
        // The trading domain draws a price per instrument here; every domain draws as many, so
        // a seed gives the same stream of numbers whatever the domain.
        for (std::size_t i = 0; i < std::min<std::size_t>(streams_, 32); ++i) rng.between(1'000, 90'000);
        gen_held_.resize(streams_);
        match_total_.resize(matches_);
        match_version_.resize(matches_);
        held_.resize(streams_);
        versions_.resize(streams_);
    }

    std::size_t streams() const override { return streams_; }
    bool makes(defect) const override { return true; }

    void make_event(line_spec& s, random_bits& rng) override {
        const auto roll = rng.below(100);
        auto& held = gen_held_[s.row];
        const bool holds_any = std::any_of(held.begin(), held.end(), [](std::int64_t n) { return n > 0; });
        if (roll < 60) {
            make_score(s, rng);
        } else if (roll < 85 || !holds_any) {
            s.what = op::grant;
            s.item = static_cast<std::uint32_t>(rng.below(catalog_size));
            s.amount = rng.between(1, 5);
            held[s.item] += s.amount;
        } else {
            s.what = op::consume;
            auto start = rng.below(catalog_size);
            for (std::size_t k = 0; k < catalog_size; ++k) {
                const auto item = (start + k) % catalog_size;
                if (held[item] > 0) {
                    s.item = static_cast<std::uint32_t>(item);
                    break;
                }
            }
            s.amount = rng.between(1, held[s.item]);
            held[s.item] -= s.amount;
        }
    }
    void make_defect(line_spec& s, random_bits& rng) override {
        if (has_flaw(s, defect::rejected)) {
            // More than any player can hold: the handler refuses it whatever the row holds.
            s.what = op::consume;
            s.item = static_cast<std::uint32_t>(rng.below(catalog_size));
            s.amount = 1'000'000'000'000;
        } else {
            make_score(s, rng);
        }
    }
    bool reissuable(const line_spec& s) const override { return s.what == op::score; }
    void reissue(line_spec&) const override {}

    std::string_view id_prefix(const line_spec&) const override { return "ev-"; }
    std::string_view source(const line_spec& s, std::string&) const override {
        if (s.what == op::score) return s.reissued ? "/match-server/replay" : match_servers[(s.row % matches_) % 2];
        return "/inventory";
    }
    std::string_view type(const line_spec& s) const override {
        if (has_flaw(s, defect::unknown_type)) return "player.joined";
        switch (s.what) {
            case op::score:
                return scored::event_type;
            case op::grant:
                return item_granted::event_type;
            default:
                return item_consumed::event_type;
        }
    }
    // Player streams: a score's row is its match, but its stream is its player.
    void append_subject(line_text& t, const line_spec& s) const override { append_player(t, s.row); }
    void append_data(line_text& t, const line_spec& s) const override {
        if (s.what == op::score) {
            t.text.append("\"match\":\"");
            t.text.append(t.key_prefix);
            t.text.append("match-");
            append_uint(t.text, s.row % matches_);
            t.key_flaws(s);
            t.text.append("\",\"player\":\"");
            append_player(t, s.row);
            t.text.push_back('"');
            t.number_field("points", s.amount, s);
            return;
        }
        t.text.append("\"player\":\"");
        append_player(t, s.row);
        t.key_flaws(s);
        t.text.append("\",\"item\":\"");
        t.text.append(catalog[s.item]);
        t.text.push_back('"');
        t.number_field("count", s.amount, s);
    }

    effect_key effect(const line_spec& s) const override { return {false, s.event}; }
    bool apply(const line_spec& s) override {
        switch (s.what) {
            case op::score: {
                const auto m = s.row % matches_;
                match_total_[m] += s.amount;
                ++match_version_[m];
                return true;  // the leaderboard's row is the match, not the player
            }
            case op::grant:
                held_[s.row][s.item] += s.amount;
                break;
            default:
                if (held_[s.row][s.item] < s.amount) return false;
                held_[s.row][s.item] -= s.amount;
                break;
        }
        ++versions_[s.row];
        return true;
    }
    std::string totals() const override {
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
        return format_totals({{"matches", matches},
                              {"scores", scores},
                              {"points", points},
                              {"players", players},
                              {"item_events", item_events},
                              {"items", items}});
    }

private:
    static void make_score(line_spec& s, random_bits& rng) {
        s.what = op::score;
        s.amount = rng.chance(0.05) ? -rng.between(1, 20) : rng.between(1, 100);
    }
    static void append_player(line_text& t, std::uint32_t row) {
        t.text.append(t.key_prefix);
        t.text.append("player-");
        append_uint(t.text, row);
    }

    std::size_t streams_ = 1;
    std::size_t matches_ = 1;
    std::vector<item_counts> gen_held_;  // what each player holds in stream order, to consume only that
    // The model's rows: leaderboards by match, inventories by player.
    std::vector<std::int64_t> match_total_;
    std::vector<std::uint64_t> match_version_;
    std::vector<item_counts> held_;
    std::vector<std::uint64_t> versions_;
};

}  // namespace

std::unique_ptr<domain_gen> game_gen(const gen_options& o, random_bits& rng) {
    return std::make_unique<game>(o, rng);
}

}  // namespace idem::examples::detail
