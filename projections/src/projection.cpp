#include <idem/projections/projection.hpp>

#include <simdjson.h>

namespace idem::detail {

void append_compact_json(std::string_view json, std::string& out) {
    auto start = out.size();
    out.resize(start + json.size());
    std::size_t written = 0;
    if (simdjson::minify(json.data(), json.size(), out.data() + start, written) != simdjson::SUCCESS) {
        throw_error(errc::invalid_argument, "state did not serialize to valid JSON");
    }
    out.resize(start + written);
}

}  // namespace idem::detail

namespace idem::detail {

std::shared_ptr<void> migrate(const migrations& steps, const std::string& projection, std::string_view bytes,
                              std::uint32_t version, std::uint32_t current) {
    auto first = steps.find(version);
    if (first == steps.end()) {
        throw_error(errc::state_version_mismatch,
                    "projection '" + projection + "': row has state version " + std::to_string(version) +
                        ", and no migration reads that version (the current one is " + std::to_string(current) + ")");
    }
    std::shared_ptr<void> state;
    std::uint32_t at = version;
    try {
        state = first->second.load(bytes);
        for (; at < current; ++at) state = steps.at(at).lift(state.get());  // check_migrations: no gap
    } catch (const std::exception& e) {
        throw migration_failed("projection '" + projection + "': migrating a row from state version " +
                               std::to_string(at) + " failed: " + e.what());
    }
    return state;
}

void check_migrations(const migrations& steps, const std::string& projection, std::uint32_t current,
                      std::type_index current_type) {
    if (steps.empty()) return;
    auto fail = [&](std::uint32_t at, const std::string& what) {
        throw_error(errc::invalid_argument,
                    "projection '" + projection + "': the migration from state version " + std::to_string(at) + " " + what);
    };
    for (const auto& [from, step] : steps) {
        if (from == 0 || from >= current) {
            fail(from, "is not below the current state version " + std::to_string(current));
        }
        auto next = steps.find(from + 1);
        if (from + 1 < current && next == steps.end()) {
            fail(from, "leads to version " + std::to_string(from + 1) + ", which has no migration (a gap)");
        }
        const auto expected = from + 1 == current ? current_type : next->second.from;
        if (step.to != expected) {
            fail(from, "returns another type than version " + std::to_string(from + 1) + "'s state" +
                           (from + 1 == current ? " (the projection's State)" : ""));
        }
    }
}

}  // namespace idem::detail
