#pragma once

// Publishing event logs into a NATS JetStream stream (`idem publish`): every record of the logs
// becomes one message whose body is the record's text, unchanged (CloudEvents structured JSON).
//
//   idem::jetstream::publish_options po;
//   po.servers = {"nats://127.0.0.1:4222"};
//   po.stream = "ORDERS";
//   po.subject = "orders.>";              // created with this subject if the stream is missing
//   po.logs = {"orders.jsonl"};
//   auto r = idem::jetstream::publish(po); // r.stored, r.duplicates, r.malformed, ...
//
// The stream: created when missing (file storage, `replicas` replicas, subjects = {subject},
// Duplicates = duplicates_window or the server's default of 2 minutes). An existing stream must
// capture the subject (else errc::invalid_argument naming its subjects) and is never changed.
//
// Message subjects: a literal subject is used as it is. A wildcard one (a `*` token, or `>` as the
// last token) needs a concrete subject per message: each wildcard token is replaced by the
// envelope's `subject` attribute encoded as one NATS token (bytes outside 0x21-0x7E and `.`,
// `*`, `>`, `%` percent-encoded: "%2E" for a dot), or by "events" when the envelope has no
// subject or the record is not an envelope. So `orders.>` puts order o-1's events on
// `orders.o-1`, and a consumer may filter one aggregate's subject. A subject equal to "events"
// itself is encoded "%65vents", so that every token decodes back to one subject
// (subject_of_token).
//
// A subject template (`subject_template`, e.g. "orders.{subject}") names each message's subject
// instead: its literal tokens as they are, each whole `{subject}` token replaced by the encoded
// envelope subject as above; the stream's subject (`subject`, e.g. "orders.>") must capture it.
// This is how producers feed a partitioned stream: the servers' mapping then hashes that token.
//
// Message ids (Nats-Msg-Id), with msg_id_policy::envelope: the envelope's `msgid` extension if it
// has one, else "<byte length of source>:<source><id>", the CloudEvents identity (source + id:
// two sources may use the same id, so the id alone would make the stream drop the second as a
// duplicate). Bytes outside 0x21-0x7E (spaces, controls, non-ASCII) and `%` are percent-encoded
// (%XX), so the header is printable and decodes back unambiguously. A record that is not a valid
// envelope is published unchanged without a message id (the consumer dead-letters it) and
// counted as malformed; having no id, it is stored again when the log is published again.
// msg_id_policy::none sends no header: every record is stored, duplicates included. A record
// larger than the server's max payload cannot be carried: it is not published, but counted
// (too_large) and named (too_large_records), as torn log tails are.
//
// Publisher-side dedup is the stream's Duplicates window (default 2 min): a republish under the
// same Nats-Msg-Id within the window stores nothing (the ack says duplicate, counted in
// `duplicates`); after the window, or under a new id, the stream stores it again and idem's inbox
// and effect keys catch it at the consumer.
//
// Publishes are asynchronous, with at most max_pending acks outstanding. A publish that fails in
// transit or whose ack does not come within ack_timeout (a broker restart, a cluster failover) is
// sent again under the same message id, so the retry of a publish that was in fact stored is
// dropped by the window; one still failing after retry_for, or refused by the stream itself (a
// JetStream error code), is an error naming the log and line. Needs the meson feature `jetstream`
// (cnats).

#include <idem/storage/event_log.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::jetstream {

/// Which Nats-Msg-Id the messages carry.
enum class msg_id_policy {
    envelope,  ///< the envelope's msgid, else its encoded source + id (none for a malformed record)
    none,      ///< no header: the stream's window drops nothing
};

/// How messages are published to a stream (publish and relay alike): the stream made if
/// missing, and the window of publishes awaiting their acks.
struct stream_publishing {
    int replicas = 1;                                             ///< a new stream's replicas
    std::optional<std::chrono::nanoseconds> duplicates_window{};  ///< a new stream's window; unset: the server's 2 min
    std::size_t max_pending = 1024;                               ///< publishes awaiting their ack at most
    std::chrono::milliseconds ack_timeout{5000};  ///< an ack not received within is a failed publish (retried)
    std::chrono::milliseconds retry_for{60000};   ///< how long a failing message is retried before giving up
};

/// What to publish, where.
struct publish_options : stream_publishing {
    /// nats://host:port, one or more of a cluster; an entry may hold several, comma-separated.
    std::vector<std::string> servers;
    std::string stream;                       ///< the stream (created if missing)
    std::string subject;                      ///< the subject it captures, maybe with wildcards (see above)
    std::string subject_template;             ///< each message's subject, "{subject}" filled in ("": from subject)
    std::vector<std::filesystem::path> logs;  ///< read in order, records in file order
    std::optional<log_format> format{};       ///< the logs' format; unset: detected from each file
    bool skip_bad = false;                    ///< binary logs: skip and count corrupt records
    msg_id_policy msg_id = msg_id_policy::envelope;
};

/// What a publish did.
struct publish_result {
    std::uint64_t records = 0;         ///< records read from the logs
    std::uint64_t published = 0;       ///< messages acknowledged by the stream (stored + duplicates)
    std::uint64_t stored = 0;          ///< of them, stored as new messages
    std::uint64_t duplicates = 0;      ///< of them, dropped by the stream's Duplicates window (stored nothing)
    std::uint64_t malformed = 0;       ///< records that are not valid envelopes (published without a message id)
    std::uint64_t too_large = 0;       ///< records over the server's max payload: not published (see too_large_records)
    std::uint64_t retries = 0;         ///< publishes sent again after a failure or a missing ack
    std::uint64_t skipped = 0;         ///< corrupt binary records skipped (skip_bad)
    std::uint64_t first_sequence = 0;  ///< the lowest stream sequence stored by this run (0: none stored)
    std::uint64_t last_sequence = 0;   ///< the highest stream sequence stored by this run (0: none stored)
    bool stream_created = false;       ///< the stream did not exist and was created
    std::vector<std::string> stream_subjects;       ///< the stream's subjects
    std::chrono::nanoseconds duplicates_window{0};  ///< the stream's Duplicates window
    int replicas = 0;                               ///< the stream's replicas
    std::vector<std::string> too_large_records;     ///< "FILE:LINE (N bytes)" of each record not published
    std::vector<std::string> torn_tails;  ///< "FILE: incomplete last record at offset N (detail)", not published
    std::chrono::nanoseconds elapsed{0};
};

/// Publishes every record of options.logs to options.stream, creating the stream if missing.
///
/// Throws std::system_error: errc::invalid_argument for a subject or stream that cannot be used
/// (naming them), errc::broker_failed when no server answers (naming the URLs) or a publish still
/// fails after retry_for (naming the log and line), and the log reader's errors naming the file.
publish_result publish(const publish_options& options);

/// Returns an envelope subject (an aggregate key) as the one NATS subject token `publish` puts
/// in place of a wildcard or of `{subject}` (see above).
std::string subject_token(std::string_view subject);

/// Returns the envelope subject a token of subject_token() stands for; nothing when the token is
/// not one subject_token() makes.
std::optional<std::string> subject_of_token(std::string_view token);

}  // namespace idem::jetstream
