#include <idem/storage/codec.hpp>

#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>  // crc32c

#include <cstdio>

namespace idem::codec {

void put_u64_be(std::string& out, std::uint64_t v) {
    char bytes[8];  // one append, not 8 push_backs with a capacity check each
    for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((v >> (8 * (7 - i))) & 0xFFu);
    out.append(bytes, 8);
}

std::uint64_t get_u64_be(std::string_view in) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < 8; ++i) {
        v = (v << 8) | static_cast<unsigned char>(in[i]);
    }
    return v;
}

std::string u64_key(std::uint64_t v) {
    std::string out;
    out.reserve(8);
    put_u64_be(out, v);
    return out;
}

void put_u64_le(std::string& out, std::uint64_t v) {
    char bytes[8];  // one append, not 8 push_backs with a capacity check each
    for (std::size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
    out.append(bytes, 8);
}

void put_u32_le(std::string& out, std::uint32_t v) {
    char bytes[4];  // one append, not 4 push_backs with a capacity check each
    for (std::size_t i = 0; i < 4; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xFFu);
    out.append(bytes, 4);
}

std::uint64_t get_u64_le(std::string_view in) noexcept {
    std::uint64_t v = 0;
    for (std::size_t i = 8; i-- > 0;) {
        v = (v << 8) | static_cast<unsigned char>(in[i]);
    }
    return v;
}

std::uint32_t get_u32_le(std::string_view in) noexcept {
    std::uint32_t v = 0;
    for (std::size_t i = 4; i-- > 0;) {
        v = (v << 8) | static_cast<unsigned char>(in[i]);
    }
    return v;
}

namespace {

void append_escaped(std::string& out, std::string_view key) {
    for (char c : key) {
        out.push_back(c);
        if (c == '\0') {
            out.push_back('\xFF');
        }
    }
}

}  // namespace

std::string row_key(std::string_view aggregate) {
    std::string out;
    out.reserve(aggregate.size() + 2);
    append_escaped(out, aggregate);
    out.push_back('\0');
    out.push_back('\0');
    return out;
}

std::string contributor_key(std::string_view aggregate, std::string_view effect) {
    std::string out;
    out.reserve(aggregate.size() + 2 + effect.size());
    append_escaped(out, aggregate);
    out.push_back('\0');
    out.push_back('\x01');
    out.append(effect);
    return out;
}

std::string after_contributors(std::string_view aggregate) {
    std::string out;
    append_escaped(out, aggregate);
    out.push_back('\0');
    out.push_back('\x02');
    return out;
}

std::optional<table_key> decode_table_key(std::string_view key) {
    table_key out;
    for (std::size_t i = 0; i < key.size(); ++i) {
        if (key[i] != '\0') {
            out.aggregate.push_back(key[i]);
            continue;
        }
        if (i + 1 >= key.size()) {
            return std::nullopt;
        }
        char marker = key[i + 1];
        if (marker == '\xFF') {
            out.aggregate.push_back('\0');
            ++i;
            continue;
        }
        if (marker == '\0' && i + 2 == key.size()) {
            out.is_row = true;
            return out;
        }
        if (marker == '\x01') {
            out.effect = key.substr(i + 2);
            return out;
        }
        return std::nullopt;
    }
    return std::nullopt;
}

namespace {
constexpr std::size_t header_size_v1 = 1 + 4 + 8 + 8;
constexpr std::size_t header_size = 1 + 4 + 4 + 8 + 8;
constexpr std::size_t checksummed = 1 + 4;  // the bytes the checksum covers start here

std::string hex(std::uint32_t v) {
    char out[16];
    std::snprintf(out, sizeof out, "%08x", v);
    return out;
}
}  // namespace

void encode_row(std::string& out, const row_header& header, std::string_view state) {
    const auto start = out.size();
    out.reserve(start + header_size + state.size());
    out.push_back(static_cast<char>(record_format));
    put_u32_le(out, 0);  // the checksum, once the rest is written
    put_u32_le(out, header.state_version);
    put_u64_le(out, header.applied);
    put_u64_le(out, header.highest_sequence);
    out.append(state);
    const auto crc = crc32c(std::string_view(out).substr(start + checksummed));
    for (std::size_t i = 0; i < 4; ++i) out[start + 1 + i] = static_cast<char>(crc >> (8 * i));
}

row_record decode_row(std::string_view record) {
    const auto format = record.empty() ? 0 : static_cast<std::uint8_t>(record[0]);
    row_record out;
    if (format == 1 && record.size() >= header_size_v1) {
        record.remove_prefix(1);
    } else if (format == 2 && record.size() >= header_size) {
        const auto stored = get_u32_le(record.substr(1));
        const auto computed = crc32c(record.substr(checksummed));
        if (stored != computed) {
            throw_error(errc::corrupt_record, "row record of " + std::to_string(record.size()) +
                                                  " bytes does not match its checksum (stored " + hex(stored) +
                                                  ", computed " + hex(computed) + "): it was damaged after it was written");
        }
        out.checked = true;
        record.remove_prefix(checksummed);
    } else {
        throw_error(errc::corrupt_record, "row record of " + std::to_string(record.size()) +
                                              " bytes has an unknown layout");
    }
    out.header.state_version = get_u32_le(record);
    out.header.applied = get_u64_le(record.substr(4));
    out.header.highest_sequence = get_u64_le(record.substr(12));
    out.state = record.substr(20);
    return out;
}

}  // namespace idem::codec
