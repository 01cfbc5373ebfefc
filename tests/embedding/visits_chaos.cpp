// The user's test of their projection through the chaos kit (<idem/testing.hpp>), as a
// plain program: exit 1 with the kit's report if a schedule leaves a row different.

#include "visits_projection.hpp"

#include <idem/testing.hpp>

#include <cstdio>
#include <string>
#include <vector>

int main() {
    std::vector<std::string> events;
    for (int i = 1; i <= 4; ++i) {
        events.push_back(R"({"specversion":"1.0","id":")" + std::to_string(i) +
                         R"(","source":"/site","type":"page.visited","data":{"page":"/home","visitor":"v)" +
                         std::to_string(i) + R"("}})");
    }
    idem::testing::chaos_options o;
    o.schedules = 20;
    o.resends = false;  // the site never re-sends a visit under a new id, and a visit has no business key
    idem::testing::chaos kit{o};
    kit.add(visits());
    const auto report = kit.run(events);
    std::fputs(report.explain().c_str(), report.ok() ? stdout : stderr);
    return report.ok() ? 0 : 1;
}
