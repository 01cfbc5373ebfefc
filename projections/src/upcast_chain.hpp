#pragma once

// The upcasting steps of a store, checked as they are added (no two steps from one version,
// no gap inside a type's versions) and applied to an event's data before it is decoded.

#include <idem/projections/upcast.hpp>
#include <idem/storage/envelope.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace idem::detail {

class upcast_chain {
public:
    /// Adds a step; throws errc::invalid_argument naming it if it repeats a step or leaves a gap.
    void add(upcaster step);
    bool empty() const noexcept { return steps_.empty(); }

    /// An event after its steps: the type its handlers are chosen by, and its data: the event's
    /// own (no step ran), lifted JSON text, or the object the last typed step returned.
    struct lifted {
        std::string_view type;
        std::string data;      ///< the lifted JSON text (when the last step was a JSON one)
        bool changed = false;  ///< false: the event's own data stands
        std::shared_ptr<const void> object;   ///< the last typed step's result
        const upcaster::typed* made_by = nullptr;  ///< the step that returned object (its type, its encoder)
        std::string failure;   ///< why it could not be lifted ("" = it was)
        bool undecodable = false;  ///< the failure is the data not decoding as a typed step's event

        /// The JSON text of the lifted event (the object's encoded once when a handler needs it).
        std::string_view json(std::string_view own);
        /// The event as handler h takes it: the last typed step's object when it is h's type,
        /// else h's decoding of the lifted JSON (own: the event's data). Throws what h throws.
        std::shared_ptr<const void> decode_for(const projection_base::handler& h, std::string_view own);
    };
    /// Lifts (type, version, data) through the steps from it; version is the event's schema version.
    lifted lift(std::string_view type, std::uint64_t version, std::string_view data) const;
    /// Lifts ev as every path does: binary data is not JSON, so no step reads it; a dataschema
    /// naming no version (0, past 64 bits) fails whatever the steps.
    lifted lift(const envelope& ev) const;

private:
    using step_key = std::pair<std::string, std::uint32_t>;
    using step_view = std::pair<std::string_view, std::uint32_t>;
    struct by_type_and_version {  // transparent: looked up by a type's view
        using is_transparent = void;
        static step_view view(const step_key& k) { return {k.first, k.second}; }
        static step_view view(const step_view& k) { return k; }
        bool operator()(const auto& a, const auto& b) const { return view(a) < view(b); }
    };
    std::map<step_key, upcaster, by_type_and_version> steps_;
    struct span {
        std::uint32_t oldest = UINT32_MAX;
        std::uint32_t newest = 0;
    };
    std::map<std::string, span, std::less<>> known_;  // per type: the versions its steps read or write
    void check_no_gap(std::string_view type) const;
    std::string_view final_type(std::string_view type) const;
};

}  // namespace idem::detail
