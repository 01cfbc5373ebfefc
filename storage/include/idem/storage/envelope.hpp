#pragma once

// The CloudEvents 1.0 JSON envelope: one event as delivered.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// Why an event was dead-lettered; the text form (to_string) is what users see.
enum class reason {
    none = 0,
    invalid_json,             ///< the body is not one JSON object
    missing_id,               ///< `id` absent or empty
    missing_source,           ///< `source` absent or empty
    missing_type,             ///< `type` absent or empty
    invalid_field,            ///< an attribute breaks a CloudEvents rule (type, value, name) or appears twice
    unsupported_specversion,  ///< `specversion` present and not "1.0"
    invalid_sequence,         ///< `sequence` not a positive integer, or without a `subject`
    missing_key,              ///< a projection found no aggregate key for the event
    key_too_long,             ///< an aggregate key or effect key exceeds LMDB's key limit
    decode_failed,            ///< `data` does not decode into the handler's event type
    handler_failed,           ///< a handler threw; the message is kept
    sequence_gap,             ///< a gap under the `reject` gap policy
    sequence_conflict,        ///< a different event already holds that stream position
    unknown_type,             ///< no projection handles the type (when the consumer rejects unknown types)
    too_large,                ///< the envelope exceeds the consumer's size limit
    invalid_utf8,             ///< the body is not valid UTF-8
    late_event,               ///< older than the event-time horizon with no sequence to prove it new
    id_conflict,              ///< a message id already processed, redelivered with different content
    missing_specversion,      ///< `specversion` absent or null (CloudEvents requires it)
    future_event,             ///< further ahead of the consumer's event time than its allowed skew
    transport_collision,      ///< a transport id already used by another event (recorded, not dead-lettered)
    released_dropped,         ///< a parked event an operator dropped (idem release --drop)
    upcast_failed,            ///< an upcaster threw while lifting the event's data to the version handled
};

/// Returns the reason whose text is name, or nullopt ("none" is not a reason a dead letter has).
std::optional<reason> reason_from_string(std::string_view name) noexcept;

/// Every reason a dead letter may have, in enum order.
std::vector<reason> dead_letter_reasons();

/// Returns the stable text of a reason ("missing_id", ...).
std::string_view to_string(reason r) noexcept;

/// One CloudEvents 1.0 event. Identity is (source, id); field order, whitespace and
/// unknown attributes never change it.
struct envelope {
    std::string id;                        ///< required, non-empty
    std::string source;                    ///< required, non-empty
    std::string type;                      ///< required, non-empty
    std::string subject;                   ///< default aggregate key; may be empty
    std::optional<std::uint64_t> sequence; ///< 1-based position in the subject's stream
    std::string time;                      ///< RFC 3339 event time, as given
    std::string msgid;                     ///< transport message id extension; empty if absent
    std::string datacontenttype;           ///< media type of the data, as given; empty if absent
    std::string dataschema;                ///< URI of the data's schema, as given; empty if absent (schema_version())
    std::string data = "null";             ///< the `data` member as raw JSON text, or the bytes of binary data
    bool data_binary = false;              ///< data holds bytes from `data_base64` that are not JSON


    /// Returns the event id: an unambiguous encoding of (source, id).
    std::string event_id() const;
    /// Returns the message id: `msgid` if present, else the event id (distinct namespaces).
    std::string message_id() const;
    /// Returns the version of the data's schema: the last segment of `dataschema` (after its last
    /// ':' or '/') when it is a number, optionally after a 'v' ("urn:idem:example:order.line_added:2",
    /// "https://example.com/schemas/order/v3"); 1 without a dataschema or without such a segment;
    /// nullopt when the segment is a number that is no version: 0, or past 2^64 - 1.
    std::optional<std::uint64_t> schema_version() const;
    /// Serializes as a CloudEvents JSON object (JSON data inserted verbatim, binary data as `data_base64`).
    std::string to_json() const;
};

/// Returns the message id key for a transport-supplied id (same namespace as envelope::message_id).
std::string transport_message_id(std::string_view msgid);

/// Returns a printable "source id" label for messages.
std::string describe(const envelope& e);

/// Why parsing failed.
struct parse_error {
    reason why = reason::none;
    std::string detail;  ///< names the field and the cause
};

/// Parses CloudEvents JSON envelopes; reuse one per thread (it keeps its buffers).
///
/// The body is checked against CloudEvents 1.0 and its JSON format: `specversion`, `id`,
/// `source` and `type` required, `null` read as unset, String values without control
/// characters, `time` in RFC 3339, extension names of [a-z0-9], extension values a string,
/// a boolean or a 32-bit integer, `data` xor `data_base64`, each name once (inside `data`
/// too). `data_base64` is decoded: when `datacontenttype` declares JSON and the bytes are
/// JSON, `data` holds that JSON text; otherwise `data` holds the bytes and `data_binary`
/// is set. A leading UTF-8 byte order mark is skipped.
class envelope_parser {
public:
    envelope_parser();
    ~envelope_parser();
    envelope_parser(envelope_parser&&) noexcept;
    envelope_parser& operator=(envelope_parser&&) noexcept;

    /// Parses text into out; on failure returns false and fills err with the reason and field.
    bool parse(std::string_view text, envelope& out, parse_error& err);

private:
    struct impl;
    std::unique_ptr<impl> impl_;
};

/// Appends s as a JSON string literal (quoted, escaped); a byte that is not part of a complete
/// UTF-8 sequence is written as \u00XX, so the output is valid JSON whatever s holds.
void append_json_string(std::string& out, std::string_view s);

/// Returns whether text is an RFC 3339 date-time ("2026-12-02T10:00:00.5+01:00"): a 'T' or
/// 't' between date and time, seconds, an optional fraction, and 'Z', 'z' or ±hh:mm.
bool is_rfc3339_timestamp(std::string_view text) noexcept;

/// Returns whether a media type declares JSON: `*/json` or `*/*+json`, parameters ignored.
bool is_json_media_type(std::string_view media_type) noexcept;

}  // namespace idem
