#include "visits_projection.hpp"

idem::projection<page_visits> visits() {
    return idem::projection<page_visits>("visits")
        .on<page_visited>([](page_visits& v, const page_visited&) { ++v.count; })
        .key([](const page_visited& e) { return e.page; });
}
