#pragma once

// Canonical forms of an event, for retention: its time as a number, and a fingerprint of
// its content that formatting cannot change.

#include <idem/storage/envelope.hpp>

#include <cstdint>
#include <optional>
#include <string_view>

namespace idem {

/// Parses an RFC 3339 timestamp ("2026-12-02T09:30:00.123Z", "...+02:00") into ns since the
/// Unix epoch; nullopt if it is not one (or before 1970).
std::optional<std::uint64_t> parse_event_time(std::string_view text) noexcept;

/// Returns a 64-bit fingerprint of an event's decoded content: id, source, type, subject,
/// sequence, time (as an instant) and data as a JSON value (object members in key order,
/// numbers by value, strings unescaped), or as bytes when it is binary. Whitespace, member
/// order, escapes and number spelling do not change it, nor whether JSON data came as `data`
/// or as `data_base64`; any changed field or value does. Never 0.
std::uint64_t fingerprint(const envelope& ev);

/// Returns the fingerprint of bytes that are not an envelope (a malformed body). Never 0.
std::uint64_t fingerprint_bytes(std::string_view body) noexcept;

}  // namespace idem
