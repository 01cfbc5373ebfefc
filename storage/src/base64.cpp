// RFC 4648 base64 (standard alphabet), both ways: to_json writes binary data with it, the
// parser reads data_base64.

#include "base64.hpp"

#include <array>
#include <cstdint>

namespace idem::detail {

namespace {

constexpr char base64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

void append_base64(std::string& out, std::string_view bytes) {
    std::size_t i = 0;
    auto at = [&](std::size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
    for (; i + 3 <= bytes.size(); i += 3) {
        const unsigned n = at(i) << 16 | at(i + 1) << 8 | at(i + 2);
        out.push_back(base64_alphabet[n >> 18]);
        out.push_back(base64_alphabet[(n >> 12) & 63]);
        out.push_back(base64_alphabet[(n >> 6) & 63]);
        out.push_back(base64_alphabet[n & 63]);
    }
    if (const auto rest = bytes.size() - i; rest != 0) {
        const unsigned n = at(i) << 16 | (rest == 2 ? at(i + 1) << 8 : 0u);
        out.push_back(base64_alphabet[n >> 18]);
        out.push_back(base64_alphabet[(n >> 12) & 63]);
        out.push_back(rest == 2 ? base64_alphabet[(n >> 6) & 63] : '=');
        out.push_back('=');
    }
}

// RFC 4648 base64 (standard alphabet). Padding may be left out (Java's decoder takes both);
// any other character, whitespace included, is an error.
bool decode_base64(std::string_view in, std::string& out) {
    static constexpr auto values = [] {
        std::array<signed char, 256> t{};
        t.fill(-1);
        for (int k = 0; k < 64; ++k) t[static_cast<unsigned char>(base64_alphabet[k])] = static_cast<signed char>(k);
        return t;
    }();
    std::size_t padding = 0;
    while (padding < 2 && padding < in.size() && in[in.size() - 1 - padding] == '=') ++padding;
    if (padding != 0 && in.size() % 4 != 0) return false;
    in.remove_suffix(padding);
    if (in.size() % 4 == 1) return false;
    out.clear();
    unsigned n = 0;
    int bits = 0;
    for (char c : in) {
        const auto v = values[static_cast<unsigned char>(c)];
        if (v < 0) return false;
        n = (n << 6) | static_cast<unsigned>(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(static_cast<char>((n >> bits) & 0xFF));
        }
    }
    return true;
}

}  // namespace idem::detail
