// The trading domain's generator: fills of accounts' positions in 32 instruments on four
// venues, each position a stream; a drop copy re-sends some fills under a new event id with
// the same exec_id (their effect key) and no sequence. A rejected fill has side "hold" or
// qty 0, which the handler refuses.

#include "gen_domain.hpp"

#include <idem/examples/trading.hpp>

#include "totals.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace idem::examples::detail {

namespace {

constexpr std::array<const char*, 32> tickers{"AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "AVGO",
                                              "JPM",  "V",    "MA",   "UNH",  "XOM",  "JNJ",  "PG",   "HD",
                                              "COST", "ABBV", "MRK",  "CVX",  "KO",   "PEP",  "ADBE", "CRM",
                                              "NFLX", "AMD",  "INTC", "CSCO", "ORCL", "QCOM", "TXN",  "IBM"};
constexpr std::array<const char*, 4> venues{"xnas", "xnys", "arcx", "bats"};
constexpr std::array<const char*, 4> exec_prefixes{"XNAS-", "XNYS-", "ARCX-", "BATS-"};

class trading final : public domain_gen {
public:
    trading(const gen_options& o, random_bits& rng) {
        const auto n = static_cast<std::size_t>(std::max<std::uint64_t>(1, o.aggregates));
        if (n >= (std::size_t{1} << 32)) throw std::invalid_argument("at most 2^32 - 1 aggregates");
        streams_ = n;
        instruments_ = std::min<std::size_t>(streams_, tickers.size());
        for (std::size_t i = 0; i < instruments_; ++i) base_price_.push_back(rng.between(1'000, 90'000));
        positions_.resize(streams_);
        versions_.resize(streams_);
    }

    std::size_t streams() const override { return streams_; }
    bool makes(defect) const override { return true; }

    void make_event(line_spec& s, random_bits& rng) override { make_fill(s, rng); }
    void make_defect(line_spec& s, random_bits& rng) override { make_fill(s, rng); }
    bool reissuable(const line_spec&) const override { return true; }
    void reissue(line_spec& copy) const override { copy.seq = 0; }

    std::string_view id_prefix(const line_spec& s) const override { return s.reissued ? "dc-" : "fill-"; }
    std::string_view source(const line_spec& s, std::string& scratch) const override {
        scratch.assign(s.reissued ? "/dropcopy/" : "/venue/");
        scratch.append(venues[(s.row % instruments_) % venues.size()]);
        return scratch;
    }
    std::string_view type(const line_spec& s) const override {
        return has_flaw(s, defect::unknown_type) ? "order.cancelled" : fill::event_type;
    }
    void append_subject(line_text& t, const line_spec& s) const override {
        append_account(t, s);
        t.text.push_back('/');
        t.text.append(tickers[s.row % instruments_]);
    }
    void append_data(line_text& t, const line_spec& s) const override {
        t.text.append("\"account\":\"");
        append_account(t, s);
        t.text.append("\",\"instrument\":\"");
        t.text.append(tickers[s.row % instruments_]);
        t.text.push_back('"');
        const bool rejected = has_flaw(s, defect::rejected);
        const bool bad_side = rejected && s.event % 2 == 1;
        t.attribute("side", bad_side ? "hold" : s.amount > 0 ? "buy" : "sell");
        // A rejected fill with a good side has a quantity of 0.
        t.number_field("qty", rejected && !bad_side ? 0 : (s.amount > 0 ? s.amount : -s.amount), s);
        t.text.append(",\"price\":");
        append_int(t.text, s.price);
        t.text.append(",\"exec_id\":\"");
        t.text.append(exec_prefixes[(s.row % instruments_) % venues.size()]);
        append_uint(t.text, s.exec);
        t.text.push_back('"');
    }

    effect_key effect(const line_spec& s) const override { return {true, s.exec}; }
    bool apply(const line_spec& s) override {
        positions_[s.row].apply(s.amount, s.price);
        ++versions_[s.row];
        return true;
    }
    std::string totals() const override {
        std::int64_t rows = 0, fills = 0, qty = 0, cost = 0, pnl = 0;
        for (std::size_t i = 0; i < positions_.size(); ++i) {
            if (versions_[i] == 0) continue;
            ++rows;
            fills += static_cast<std::int64_t>(versions_[i]);
            qty += positions_[i].qty;
            cost += positions_[i].cost;
            pnl += positions_[i].realized_pnl;
        }
        return format_totals({{"positions", rows}, {"fills", fills}, {"qty", qty}, {"cost", cost}, {"realized_pnl", pnl}});
    }

private:
    void make_fill(line_spec& s, random_bits& rng) {
        s.what = op::fill;
        const auto instrument = s.row % instruments_;
        const std::int64_t base = base_price_[instrument];
        s.price = base + rng.between(-base / 100, base / 100);
        const std::int64_t qty = rng.between(1, 500);
        s.amount = rng.chance(0.5) ? qty : -qty;
        s.exec = next_exec_++;
    }
    // The account's name as it appears in data and subject; a key_too_long defect makes it long.
    void append_account(line_text& t, const line_spec& s) const {
        t.text.append(t.key_prefix);
        t.text.append("acct-");
        append_uint(t.text, s.row / instruments_);
        t.key_flaws(s);
    }

    std::size_t streams_ = 1;
    std::size_t instruments_ = 1;
    std::vector<std::int64_t> base_price_;
    std::uint64_t next_exec_ = 1;
    std::vector<position> positions_;     // the model's rows, by stream
    std::vector<std::uint64_t> versions_;  // fills applied to each
};

}  // namespace

std::unique_ptr<domain_gen> trading_gen(const gen_options& o, random_bits& rng) {
    return std::make_unique<trading>(o, rng);
}

}  // namespace idem::examples::detail
