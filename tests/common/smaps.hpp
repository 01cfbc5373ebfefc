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

/// Whether the kernel has transparent huge pages at all (one built without them refuses the
/// advice, and tables keep small pages).
inline bool kernel_has_huge_pages() {
    return static_cast<bool>(std::ifstream{"/sys/kernel/mm/transparent_hugepage/enabled"});
}

}  // namespace idem::test
