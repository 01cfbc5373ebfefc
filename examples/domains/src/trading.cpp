#include <idem/examples/trading.hpp>

#include <idem/examples/detail/fields.hpp>

#include <algorithm>
#include <stdexcept>

namespace idem::examples {

namespace {

std::int64_t magnitude(std::int64_t v, const char* what) {
    return v < 0 ? detail::checked_sub(0, v, what) : v;
}

// a / b rounded to the nearest integer, halves away from zero (b != 0).
std::int64_t rounded_div(std::int64_t a, std::int64_t b) {
    const std::int64_t q = a / b;
    const std::int64_t r = a % b;
    if (r == 0) return q;
    const std::int64_t ar = r < 0 ? -r : r;  // |r| < |b|, so neither negation overflows
    const std::int64_t ab = b < 0 ? -b : b;
    if (ar < ab - ar) return q;
    return (a < 0) == (b < 0) ? q + 1 : q - 1;
}

}  // namespace

std::string fill::key() const {
    return position_key(account, instrument);
}

std::int64_t fill::signed_qty() const {
    if (qty <= 0) {
        throw std::invalid_argument("fill '" + exec_id + "': qty must be > 0, got " + std::to_string(qty));
    }
    if (side == "buy") return qty;
    if (side == "sell") return -qty;
    throw std::invalid_argument("fill '" + exec_id + "': side must be \"buy\" or \"sell\", got \"" + side + "\"");
}

void position::apply(const fill& f) {
    apply(f.signed_qty(), f.price);
}

void position::apply(std::int64_t signed_qty, std::int64_t price) {
    if (signed_qty == 0) throw std::invalid_argument("a fill of 0 units");
    position next = *this;
    if (qty == 0 || (qty > 0) == (signed_qty > 0)) {
        // Opening or adding: the cost grows by exactly what was paid (or received, short).
        next.qty = detail::checked_add(qty, signed_qty, "position qty");
        next.cost = detail::checked_add(cost, detail::checked_mul(signed_qty, price, "fill value"), "position cost");
    } else {
        const std::int64_t open = magnitude(qty, "position qty");
        const std::int64_t size = magnitude(signed_qty, "fill qty");
        const std::int64_t closed = std::min(open, size);
        const std::int64_t sign = qty > 0 ? 1 : -1;
        // The closed units take their share of the exact cost; closing everything takes all
        // of it, so truncation never leaves cost behind on a flat position.
        const std::int64_t released = closed == open ? cost : detail::checked_mul(cost, closed, "released cost") / open;
        const std::int64_t value = detail::checked_mul(sign * closed, price, "fill value");
        next.realized_pnl =
            detail::checked_add(realized_pnl, detail::checked_sub(value, released, "realized PnL"), "realized PnL");
        next.qty = qty - sign * closed;
        next.cost = cost - released;
        if (size > closed) {
            // A flip: the rest opens a position on the fill's side at the fill's price.
            next.qty = signed_qty > 0 ? size - closed : closed - size;
            next.cost = detail::checked_mul(next.qty, price, "position cost");
        }
    }
    next.avg_price = next.qty == 0 ? 0 : rounded_div(next.cost, next.qty);
    *this = next;
}

std::string position_key(std::string_view account, std::string_view instrument) {
    std::string key;
    key.reserve(account.size() + 1 + instrument.size());
    key.append(account).append("/").append(instrument);
    return key;
}

idem::projection<position> positions() {
    return idem::projection<position>(positions_projection)
        .on<fill>([](position& p, const fill& f) { p.apply(f); }, idem::strong_guarantee)
        .key([](const fill& f) { return f.key(); })
        .effect_key([](const fill& f) { return f.exec_id; });
}

}  // namespace idem::examples
