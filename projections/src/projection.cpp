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
