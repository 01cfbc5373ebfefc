#include <idem/sources/log_source.hpp>

#include <algorithm>
#include <string_view>

namespace idem {

std::string log_transport(const std::filesystem::path& log) {
    // The file name without rotation suffixes ("events.jsonl.3", "events.jsonl-20261203"): the
    // rotations of one log are one origin, whichever directory the files are read from.
    std::string name = log.filename().string();
    for (;;) {
        const auto cut = name.find_last_of(".-");
        if (cut == std::string::npos || cut == 0 || cut + 1 == name.size()) break;
        const auto tail = std::string_view(name).substr(cut + 1);
        if (!std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; })) break;
        name.resize(cut);
    }
    return name;
}

}  // namespace idem
