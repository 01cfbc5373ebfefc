// What a user adds to their own suite: the orders projection through the chaos kit
// (docs/TESTING.md, "The chaos test kit"). The envelopes are the orders a test of theirs would feed it.

#include <idem/testing.hpp>

#include <idem/examples/orders.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace {

std::vector<std::string> order_lines() {
    std::vector<std::string> out;
    for (int order = 1; order <= 3; ++order) {
        for (int line = 1; line <= 3; ++line) {
            const auto id = "order-" + std::to_string(order);
            out.push_back(R"({"specversion":"1.0","id":"line-)" + std::to_string(order) + "-" + std::to_string(line) +
                          R"(","source":"/orders","type":"order.line_added","subject":")" + id + R"(","sequence":")" +
                          std::to_string(line) + R"(","data":{"order_id":")" + id + R"(","amount":)" +
                          std::to_string(100 * line + order) + "}}");
        }
    }
    return out;
}

}  // namespace

TEST_CASE("order totals survive duplicates, reordering, crashes and pruning") {
    idem::testing::chaos kit;
    kit.add(idem::examples::order_totals());
    kit.upcast(idem::examples::order_line_upcaster());  // the lines below are version 1
    auto report = kit.run(order_lines());
    CHECK_MESSAGE(report.ok(), report.explain());
}
