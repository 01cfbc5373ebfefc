#include "report.hpp"

namespace idem::testing {

namespace detail {

std::optional<chaos_difference> first_difference(const rows_image& expected, const rows_image& actual,
                                                 const std::string& where) {
    auto e = expected.begin();
    auto a = actual.begin();
    while (e != expected.end() || a != actual.end()) {
        chaos_difference d;
        d.where = where;
        if (a == actual.end() || (e != expected.end() && e->first < a->first)) {
            d.projection = e->first.first;
            d.key = e->first.second;
            d.expected_version = e->second.version;
            d.expected_state = e->second.state;
            return d;
        }
        if (e == expected.end() || a->first < e->first) {
            d.projection = a->first.first;
            d.key = a->first.second;
            d.actual_version = a->second.version;
            d.actual_state = a->second.state;
            return d;
        }
        if (!(e->second == a->second)) {
            d.projection = e->first.first;
            d.key = e->first.second;
            d.expected_version = e->second.version;
            d.expected_state = e->second.state;
            d.actual_version = a->second.version;
            d.actual_state = a->second.state;
            return d;
        }
        ++e;
        ++a;
    }
    return std::nullopt;
}

}  // namespace detail

namespace {

std::string row_text(const std::optional<std::uint64_t>& version, const std::string& state) {
    if (!version) return "no row";
    return "version " + std::to_string(*version) + ", state " + state;
}

std::string malformed_note(const chaos_report& r) {
    if (r.malformed == 0) return {};
    return "chaos: " + std::to_string(r.malformed) + " envelope(s) do not parse, the first is " + r.first_malformed +
           ": dead letters wherever delivered, they change no row and were left out of the schedules\n";
}

}  // namespace

std::string chaos_report::explain() const {
    if (ok()) {
        return "chaos: " + std::to_string(schedules) + " schedule(s) over " + std::to_string(events) +
               " event(s) matched the reference (each event once, in order): every row's state and version" +
               (kills > 0 ? " (" + std::to_string(kills) + " forked children killed at crash points)" : std::string()) +
               "\n" + malformed_note(*this);
    }
    const auto& d = *difference;
    std::string out = "chaos: the schedule of seed " + std::to_string(seed) + " (schedule " +
                      std::to_string(schedules) +
                      ") left a row different from the reference (each event once, in order).\n";
    out += "Shrunk from " + std::to_string(steps_before) + " steps (" + std::to_string(deliveries_before) +
           " deliveries) to " + std::to_string(steps.size()) + " step(s) (" + std::to_string(deliveries) +
           " deliveries) that still fail:\n";
    for (std::size_t i = 0; i < steps.size(); ++i) out += "  " + std::to_string(i + 1) + ". " + steps[i] + "\n";
    out += "First differing row, in the " + d.where + ": projection '" + d.projection + "', key '" + d.key + "'\n";
    out += "  expected: " + row_text(d.expected_version, d.expected_state) + "\n";
    out += "  got:      " + row_text(d.actual_version, d.actual_state) + "\n";
    if (!confirmed) out += "The shrunk schedule did not fail when run again: the projection is not deterministic.\n";
    out += malformed_note(*this);
    out += "Rerun this schedule with seed " + std::to_string(seed) + " and 1 schedule.\n";
    return out;
}

}  // namespace idem::testing
