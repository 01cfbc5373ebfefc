#pragma once
// What this process's memory mappings say about themselves (/proc/self/smaps).

#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>

namespace idem::test {

/// Returns the bytes of this process's mappings advised to use transparent huge pages (VmFlags "hg").
inline std::size_t huge_advised_bytes() {
    std::ifstream smaps{"/proc/self/smaps"};
    std::size_t total = 0;
    std::size_t size_kb = 0;
    for (std::string line; std::getline(smaps, line);) {
        if (line.starts_with("Size:")) {
            std::istringstream{line.substr(5)} >> size_kb;
        } else if (line.starts_with("VmFlags:") && (line + " ").find(" hg ") != std::string::npos) {
            total += size_kb * 1024;
        }
    }
    return total;
}

}  // namespace idem::test
