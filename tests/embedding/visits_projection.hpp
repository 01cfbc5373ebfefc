#pragma once

// A user's own domain: `page.visited {page, visitor}` counted per page.

#include <idem/projections/projection.hpp>

#include <cstdint>
#include <string>

struct page_visited {
    static constexpr const char* event_type = "page.visited";
    std::string page;
    std::string visitor;

    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(page), CEREAL_NVP(visitor));
    }
};

struct page_visits {
    std::int64_t count = 0;

    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(count));
    }
};

/// Returns the `visits` projection: one row per page, counting its visits.
idem::projection<page_visits> visits();
