#include <idem/examples/orders.hpp>

#include <idem/examples/detail/fields.hpp>

#include <stdexcept>

namespace idem::examples {

void order_total::add(const line_added& line) {
    // Everything that can throw comes before the first change: a throw leaves the row as it was.
    if (!currency.empty() && line.amount.currency != currency) {
        throw std::invalid_argument("the order is in " + currency + ", the line in " + line.amount.currency);
    }
    const auto new_total = detail::checked_add(total, line.amount.minor, "order total");
    if (currency.empty()) currency = line.amount.currency;
    total = new_total;
    lines += 1;
}

idem::projection<order_total> order_totals() {
    return idem::projection<order_total>(order_totals_projection)
        .on<line_added>([](order_total& t, const line_added& e) { t.add(e); }, idem::strong_guarantee)
        .key([](const line_added& e) { return e.order_id; })
        .state_version(order_total::state_version)
        .migrate<order_total_v1>(1, [](const order_total_v1& old) {
            return order_total{old.total, old.lines, old.lines == 0 ? "" : "EUR"};
        });
}

idem::projection<order_total> order_totals_copy() {
    return idem::projection<order_total>(order_totals_copy_projection)
        .on<order_total_changed>([](order_total& t, const order_total_changed& e) {
            t = order_total{e.total, e.lines, e.currency};
        })
        .state_version(order_total::state_version);
}

idem::upcaster order_line_upcaster() {
    return idem::upcast_step<line_added_v1, line_added>(line_added::event_type, 1, [](const line_added_v1& v1) {
        return line_added{v1.order_id, money{v1.amount, "EUR"}};
    });
}

}  // namespace idem::examples
