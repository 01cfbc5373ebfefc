// Checking and applying a store's upcasting steps.

#include "upcast_chain.hpp"

#include <idem/storage/error.hpp>

#include <algorithm>
#include <exception>

namespace idem::detail {

namespace {

std::string name_of(std::string_view type, std::uint64_t version) {
    return "'" + std::string(type) + "' version " + std::to_string(version);
}

}  // namespace

void upcast_chain::add(upcaster step) {
    if (step.type.empty() || step.from == 0 || !step.lift) {
        throw_error(errc::invalid_argument, "upcaster of " + name_of(step.type, step.from) +
                                                ": needs a type, a version from 1 and a function");
    }
    if (step.to_type.empty()) step.to_type = step.type;
    if (step.from == UINT32_MAX) {
        throw_error(errc::invalid_argument, "upcaster of " + name_of(step.type, step.from) + ": no version follows it");
    }
    step_key key{step.type, step.from};
    if (steps_.contains(key)) {
        throw_error(errc::invalid_argument,
                    "two upcasters from " + name_of(step.type, step.from) + ": a version is lifted one way only");
    }
    auto bump = [&](const std::string& type, std::uint32_t v) {
        auto& k = known_[type];
        k.oldest = std::min(k.oldest, v);
        k.newest = std::max(k.newest, v);
    };
    bump(step.type, step.from);
    bump(step.to_type, step.from + 1);
    const auto type = step.type;
    const auto to_type = step.to_type;
    steps_.emplace(std::move(key), std::move(step));
    check_no_gap(type);
    if (to_type != type) check_no_gap(to_type);
}

// Every version of a type between its lowest step and its newest version must lift: a
// version with no step below the newest would reach the handlers as it is.
void upcast_chain::check_no_gap(std::string_view type) const {
    auto first = steps_.lower_bound(step_view(type, 0));
    if (first == steps_.end() || first->first.first != type) return;  // only a step's target so far
    const auto newest = known_.find(type)->second.newest;
    for (auto v = first->first.second; v < newest; ++v) {
        if (steps_.find(step_view(type, v)) == steps_.end()) {
            throw_error(errc::invalid_argument, "upcasters of '" + std::string(type) + "' have a gap: version " +
                                                    std::to_string(v) + " has none, while version " +
                                                    std::to_string(newest) + " is the newest");
        }
    }
}

std::string_view upcast_chain::lifted::json(std::string_view own) {
    if (!changed) return own;
    if (object) {
        data = made_by->encode(object.get());
        object.reset();
        made_by = nullptr;
    }
    return data;
}

std::shared_ptr<const void> upcast_chain::lifted::decode_for(const projection_base::handler& h, std::string_view own) {
    if (object && made_by->to == h.event) return object;
    return h.decode(json(own));
}

upcast_chain::lifted upcast_chain::lift(const envelope& ev) const {
    const auto version = ev.schema_version();
    if (!version) {
        // Refused whatever the steps: taken for another version, the data would be misread.
        lifted out;
        out.type = final_type(ev.type);
        const auto digits = ev.dataschema.substr(ev.dataschema.find_last_not_of("0123456789") + 1);
        out.failure = "dataschema '" + ev.dataschema + "' names " +
                      (digits.find_first_not_of('0') == std::string::npos
                           ? std::string("version 0, and versions start at 1")
                           : "a version past 2^64 - 1 (" + std::to_string(digits.size()) + " digits)") +
                      ": no version of '" + ev.type + "' this code can read";
        return out;
    }
    if (steps_.empty() || ev.data_binary) return {};
    auto out = lift(ev.type, *version, ev.data);
    if (!out.failure.empty() && !ev.dataschema.empty()) out.failure += " (dataschema '" + ev.dataschema + "')";
    return out;
}

upcast_chain::lifted upcast_chain::lift(std::string_view type, std::uint64_t version, std::string_view data) const {
    lifted out;
    out.type = type;
    // Steps are numbered in 32 bits: a version past them has none, and is newer than any the chain knows.
    if (version > UINT32_MAX) {
        out.type = final_type(type);
        if (known_.contains(type)) {
            out.failure = "'" + std::string(type) + "' version " + std::to_string(version) +
                          " is newer than this code, which knows up to version " +
                          std::to_string(known_.find(type)->second.newest);
        }
        return out;
    }
    if (auto k = known_.find(type); k != known_.end() && version < k->second.oldest) {
        out.failure = name_of(type, version) + " has no upcaster (the oldest version known is " +
                      std::to_string(k->second.oldest) + ")";
        return out;
    }
    // Versions only go up, one at a time, so the walk ends (a chain cannot come back to a version).
    for (;;) {
        auto it = steps_.find(step_view(out.type, static_cast<std::uint32_t>(version)));  // at most UINT32_MAX here
        if (it == steps_.end()) break;
        const auto& step = it->second;
        if (out.failure.empty()) {
            try {
                const auto& typed = step.objects;
                if (typed.lift && out.object && out.made_by->to == typed.from) {
                    out.object = typed.lift(out.object.get());  // decoded once, handed on
                    out.made_by = &typed;
                } else if (typed.lift) {
                    std::shared_ptr<const void> decoded;
                    try {
                        decoded = typed.decode(out.json(data));
                    } catch (const std::exception& e) {
                        out.undecodable = true;
                        throw;
                    }
                    out.object = typed.lift(decoded.get());
                    out.made_by = &typed;
                } else {
                    out.data = step.lift(out.json(data));
                    out.object.reset();
                    out.made_by = nullptr;
                }
                out.changed = true;
            } catch (const std::exception& e) {
                out.failure = out.undecodable ? "data does not decode as " + std::string(out.type) + " (version " +
                                                    std::to_string(version) + "): " + e.what()
                                              : "upcaster from " + name_of(out.type, version) + " threw: " + e.what();
            } catch (...) {
                out.failure = "upcaster from " + name_of(out.type, version) + " threw";
            }
        }
        out.type = step.to_type;  // followed on a failure too: the handlers of the type it was meant to reach fail
        ++version;
    }
    if (out.failure.empty()) {
        if (auto k = known_.find(out.type); k != known_.end() && version > k->second.newest) {
            out.failure = name_of(out.type, version) + " is newer than this code, which knows up to version " +
                          std::to_string(k->second.newest);
            out.type = final_type(out.type);
        }
    }
    return out;
}

// A version the chain cannot lift still fails where its handlers are: those of the type the
// chain leads to from its oldest version (a renamed type's), not ignored for want of any.
std::string_view upcast_chain::final_type(std::string_view type) const {
    auto k = known_.find(type);
    if (k == known_.end()) return type;
    auto version = k->second.oldest;
    for (;;) {
        auto it = steps_.find(step_view(type, version));
        if (it == steps_.end()) return type;
        type = it->second.to_type;
        ++version;
    }
}

}  // namespace idem::detail
