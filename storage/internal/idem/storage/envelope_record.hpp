#pragma once

// The parsed attributes of an envelope as a binary log record carries them beside the body
// (docs/LOGS.md, "Event logs"): what envelope_parser::parse and fingerprint() make of the
// body, so a rebuild from the binary log takes them instead of parsing the JSON again.
//
//     u8 rules revision | u8 flags (1: sequence, 2: binary data) | u64 LE fingerprint
//     | [varint sequence, with flag 1] | id, source, type, subject, time, msgid,
//     datacontenttype, dataschema, data
//
// each string as varint (offset + 1) and varint length of the same bytes in the body, or,
// when the body does not hold them verbatim (escapes, data_base64), varint 0, varint length,
// the bytes. Varints are LEB128 (seven bits a byte, low first). ~40 bytes for a typical event.
//
// Only a body that parses as a valid envelope has attributes. They are a cache of the body:
// the body stays the record's content (lossless conversion) and a reader that cannot use
// them (another rules revision, bytes it does not understand) parses the body instead.

#include <idem/storage/envelope.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace idem {

/// The revision of the rules that turn a body into an envelope and a fingerprint
/// (envelope_parser::parse, fingerprint()). Bump it whenever either changes: attributes
/// stored under another revision are ignored and the body is parsed again.
inline constexpr std::uint8_t envelope_rules_revision = 1;

/// Appends to out the attributes of ev, the envelope parsed from body, with its fingerprint.
void encode_envelope_attributes(std::string& out, std::string_view body, const envelope& ev, std::uint64_t fingerprint);

/// Reads attributes that encode_envelope_attributes wrote for body into out and fingerprint;
/// false (out unspecified) if they are of another rules revision or do not decode: parse the body.
bool decode_envelope_attributes(std::string_view attributes, std::string_view body, envelope& out,
                                std::uint64_t& fingerprint);

}  // namespace idem
