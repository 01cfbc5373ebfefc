// The orders domain's generator: lines added to orders from three shops, each order a stream.
// Order lines have no amount a handler refuses, so it makes no `rejected` lines.

#include "gen_domain.hpp"

#include <idem/examples/orders.hpp>

#include "totals.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace idem::examples::detail {

namespace {

constexpr std::array<const char*, 3> shops{"/shop/web", "/shop/mobile", "/shop/pos"};

class orders final : public domain_gen {
public:
    orders(const gen_options& o, random_bits& rng) {
        const auto n = static_cast<std::size_t>(std::max<std::uint64_t>(1, o.aggregates));
        if (n >= (std::size_t{1} << 32)) throw std::invalid_argument("at most 2^32 - 1 aggregates");
        streams_ = n;
        // The trading domain draws a price per instrument here; every domain draws as many, so
        // a seed gives the same stream of numbers whatever the domain.
        for (std::size_t i = 0; i < std::min<std::size_t>(streams_, 32); ++i) rng.between(1'000, 90'000);
        orders_.resize(streams_);
        versions_.resize(streams_);
    }

    std::size_t streams() const override { return streams_; }
    bool makes(defect d) const override { return d != defect::rejected; }

    void make_event(line_spec& s, random_bits& rng) override { make_line(s, rng); }
    void make_defect(line_spec& s, random_bits& rng) override { make_line(s, rng); }
    bool reissuable(const line_spec&) const override { return false; }
    void reissue(line_spec&) const override {}

    std::string_view id_prefix(const line_spec&) const override { return "line-"; }
    std::string_view source(const line_spec& s, std::string&) const override { return shops[s.row % shops.size()]; }
    std::string_view type(const line_spec& s) const override {
        return has_flaw(s, defect::unknown_type) ? "order.shipped" : line_added::event_type;
    }
    void append_subject(line_text& t, const line_spec& s) const override { append_order(t, s); }
    void append_data(line_text& t, const line_spec& s) const override {
        t.text.append("\"order_id\":\"");
        append_order(t, s);
        t.text.push_back('"');
        t.number_field("amount", s.amount, s);
    }

    effect_key effect(const line_spec& s) const override { return {false, s.event}; }
    bool apply(const line_spec& s) override {
        orders_[s.row].add(line_added{{}, money{s.amount, "EUR"}});
        ++versions_[s.row];
        return true;
    }
    std::string totals() const override {
        std::int64_t rows = 0, lines = 0, total = 0;
        for (std::size_t i = 0; i < orders_.size(); ++i) {
            if (versions_[i] == 0) continue;
            ++rows;
            lines += orders_[i].lines;
            total += orders_[i].total;
        }
        return format_totals({{"orders", rows}, {"lines", lines}, {"total", total}});
    }

private:
    static void make_line(line_spec& s, random_bits& rng) {
        s.what = op::line;
        s.amount = rng.chance(0.03) ? -rng.between(100, 5'000) : rng.between(100, 99'999);
    }
    static void append_order(line_text& t, const line_spec& s) {
        t.text.append(t.key_prefix);
        t.text.append("order-");
        append_uint(t.text, s.row);
        t.key_flaws(s);
    }

    std::size_t streams_ = 1;
    std::vector<order_total> orders_;      // the model's rows, by stream
    std::vector<std::uint64_t> versions_;  // lines applied to each
};

}  // namespace

std::unique_ptr<domain_gen> orders_gen(const gen_options& o, random_bits& rng) {
    return std::make_unique<orders>(o, rng);
}

}  // namespace idem::examples::detail
