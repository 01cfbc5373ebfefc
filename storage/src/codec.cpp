#include <idem/storage/codec.hpp>

#include <idem/storage/error.hpp>

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
constexpr std::size_t header_size = 1 + 4 + 8 + 8;
}

void encode_row(std::string& out, const row_header& header, std::string_view state) {
    out.reserve(out.size() + header_size + state.size());
    out.push_back(static_cast<char>(record_format));
    put_u32_le(out, header.state_version);
    put_u64_le(out, header.applied);
    put_u64_le(out, header.highest_sequence);
    out.append(state);
}

row_record decode_row(std::string_view record) {
    if (record.size() < header_size || static_cast<std::uint8_t>(record[0]) != record_format) {
        throw_error(errc::corrupt_record, "row record of " + std::to_string(record.size()) +
                                              " bytes has an unknown layout");
    }
    row_record out;
    out.header.state_version = get_u32_le(record.substr(1));
    out.header.applied = get_u64_le(record.substr(5));
    out.header.highest_sequence = get_u64_le(record.substr(13));
    out.state = record.substr(header_size);
    return out;
}

}  // namespace idem::codec
