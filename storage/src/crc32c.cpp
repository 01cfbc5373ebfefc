#include <idem/storage/event_log.hpp>

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define IDEM_CRC32C_X86 1
#endif

namespace idem {
namespace {

constexpr std::uint32_t castagnoli = 0x82F63B78u;  // reflected polynomial

// tables[k][b]: the CRC of byte b followed by k zero bytes, so eight bytes fold in one step.
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_tables() {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t c = b;
        for (int i = 0; i < 8; ++i) c = (c & 1u) != 0 ? (c >> 1) ^ castagnoli : c >> 1;
        t[0][b] = c;
    }
    for (std::size_t k = 1; k < 8; ++k) {
        for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFFu];
    }
    return t;
}

constexpr auto tables = make_tables();

std::uint32_t load_u32_le(const unsigned char* p) noexcept {
    return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
           static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

std::uint32_t update_portable(std::uint32_t state, const unsigned char* p, std::size_t n) noexcept {
    while (n >= 8) {
        std::uint32_t lo = load_u32_le(p) ^ state;
        std::uint32_t hi = load_u32_le(p + 4);
        state = tables[7][lo & 0xFFu] ^ tables[6][(lo >> 8) & 0xFFu] ^ tables[5][(lo >> 16) & 0xFFu] ^
                tables[4][lo >> 24] ^ tables[3][hi & 0xFFu] ^ tables[2][(hi >> 8) & 0xFFu] ^
                tables[1][(hi >> 16) & 0xFFu] ^ tables[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) state = (state >> 8) ^ tables[0][(state ^ *p++) & 0xFFu];
    return state;
}

#ifdef IDEM_CRC32C_X86
__attribute__((target("sse4.2"))) std::uint32_t update_sse42(std::uint32_t state, const unsigned char* p,
                                                             std::size_t n) noexcept {
    std::uint64_t s = state;
    while (n >= 8) {
        std::uint64_t word;
        std::memcpy(&word, p, 8);
        s = _mm_crc32_u64(s, word);
        p += 8;
        n -= 8;
    }
    auto s32 = static_cast<std::uint32_t>(s);
    while (n-- > 0) s32 = _mm_crc32_u8(s32, *p++);
    return s32;
}

bool has_sse42() noexcept {
#ifdef __SSE4_2__
    return true;
#else
    static const bool has = __builtin_cpu_supports("sse4.2");
    return has;
#endif
}
#endif

}  // namespace

std::uint32_t crc32c(std::string_view data, std::uint32_t crc) noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
#ifdef IDEM_CRC32C_X86
    if (has_sse42()) return ~update_sse42(~crc, p, data.size());
#endif
    return ~update_portable(~crc, p, data.size());
}

namespace detail {

std::uint32_t crc32c_portable(std::string_view data, std::uint32_t crc) noexcept {
    return ~update_portable(~crc, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

}  // namespace detail
}  // namespace idem
