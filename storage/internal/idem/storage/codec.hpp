#pragma once

// Byte layouts of keys and records. Integers in keys are big-endian so keys sort
// numerically; integers in values are little-endian fixed width, so records are
// portable across machines regardless of the host's byte order.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::codec {

/// Appends v as 8 big-endian bytes (sorts numerically as a key).
void put_u64_be(std::string& out, std::uint64_t v);
/// Reads 8 big-endian bytes; the view must hold at least 8.
std::uint64_t get_u64_be(std::string_view in) noexcept;
/// Returns v as an 8-byte big-endian key.
std::string u64_key(std::uint64_t v);
/// Appends v as 8 little-endian bytes.
void put_u64_le(std::string& out, std::uint64_t v);
/// Appends v as 4 little-endian bytes.
void put_u32_le(std::string& out, std::uint32_t v);
/// Reads 8 little-endian bytes.
std::uint64_t get_u64_le(std::string_view in) noexcept;
/// Reads 4 little-endian bytes.
std::uint32_t get_u32_le(std::string_view in) noexcept;

// A projection's table holds its rows under   escaped(aggregate) 00 00.
// A row's contributing set lives in the projection's contributor log as ids
//                                              escaped(aggregate) 00 01 effect-key.
// escaped() doubles as 00 FF for every 00 byte, which keeps rows in key order and makes
// the encoding prefix-free, so no aggregate key can alias another's row or effects.

/// Returns the table key of an aggregate's row.
std::string row_key(std::string_view aggregate);
/// Returns the id recording that effect contributed to aggregate's row (also a (key, suffix) pair key).
std::string contributor_key(std::string_view aggregate, std::string_view effect);
/// Returns the first key past every contributor_key(aggregate, ...).
std::string after_contributors(std::string_view aggregate);

/// A decoded projection-table key.
struct table_key {
    std::string aggregate;     ///< the row's aggregate key, unescaped
    bool is_row = false;       ///< true for the row record, false for a contributor entry
    std::string_view effect;   ///< the effect key of a contributor entry (a view into the input)
};

/// Decodes a projection-table key; nullopt if it is not one.
std::optional<table_key> decode_table_key(std::string_view key);

/// Current layout version of row records. 1: [1][state version u32][applied u64][highest
/// sequence u64][state]; 2: [2][crc32c u32][the same], the CRC32C over every byte after it, so a
/// bit flipped anywhere in the row's header or state is found when the row is read. Rows of
/// layout 1 (written before checksums) still read, unchecked.
inline constexpr std::uint8_t record_format = 2;

/// The fixed part of a row record, before the cereal-encoded state.
struct row_header {
    std::uint32_t state_version = 0;    ///< the projection's state format version that wrote it
    std::uint64_t applied = 0;          ///< events applied to the row (its version)
    std::uint64_t highest_sequence = 0; ///< highest stream sequence applied to the row (0: none)
};

/// Appends header and state bytes as a row record.
void encode_row(std::string& out, const row_header& header, std::string_view state);

/// A decoded row record; state is a view into the input.
struct row_record {
    row_header header;
    std::string_view state;
    bool checked = false;  ///< its checksum matched (false: a layout-1 record, which has none)
};

/// Decodes a row record; throws std::system_error(corrupt_record) if it is not one or its
/// checksum does not match.
row_record decode_row(std::string_view record);

}  // namespace idem::codec
