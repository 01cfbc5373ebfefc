#include <idem/sources/partition_layout.hpp>

#include <algorithm>
#include <fstream>

namespace idem::jetstream {

namespace {

constexpr const char* owned_name = "owned";

}  // namespace

std::string partition_directory(std::uint32_t k) { return "p" + std::to_string(k); }

std::filesystem::path replay_marker(const std::filesystem::path& dir, std::uint32_t k) {
    return dir / (partition_directory(k) + ".replay");
}

std::optional<std::vector<std::uint32_t>> read_owned(const std::filesystem::path& dir) {
    std::ifstream f(dir / owned_name);
    if (!f) return std::nullopt;
    std::vector<std::uint32_t> ks;
    for (std::uint32_t k = 0; f >> k;) ks.push_back(k);
    return ks;
}

void write_owned(const std::filesystem::path& dir, std::vector<std::uint32_t> ks) {
    std::sort(ks.begin(), ks.end());
    const auto file = dir / owned_name;
    auto tmp = file;
    tmp += ".tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        for (auto k : ks) f << k << "\n";
    }
    std::filesystem::rename(tmp, file);
}

}  // namespace idem::jetstream
