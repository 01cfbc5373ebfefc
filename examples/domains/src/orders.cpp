#include <idem/examples/orders.hpp>

#include <idem/examples/detail/fields.hpp>

namespace idem::examples {

void order_total::add(const line_added& line) {
    total = detail::checked_add(total, line.amount, "order total");
    lines += 1;
}

idem::projection<order_total> order_totals() {
    return idem::projection<order_total>(order_totals_projection)
        .on<line_added>([](order_total& t, const line_added& e) { t.add(e); })
        .key([](const line_added& e) { return e.order_id; });
}

}  // namespace idem::examples
