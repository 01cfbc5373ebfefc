#pragma once

// How `idem publish` names what it sends: the Nats-Msg-Id of an event, the concrete subject of a
// message under a wildcard stream subject, and whether a stream's subject captures another. The
// rules are documented in <idem/sources/jetstream_publish.hpp>; kept apart so they read (and are
// tested) without a broker.

#include <idem/storage/envelope.hpp>

#include <optional>
#include <string>
#include <string_view>

namespace idem::jetstream::detail {

/// Returns s with the bytes outside 0x21-0x7E, '%' and those in `also` percent-encoded (%XX,
/// upper-case hex): reversible, so two different inputs never give the same text.
std::string percent_encode(std::string_view s, std::string_view also);

/// Returns the Nats-Msg-Id of an event: its msgid, else "<byte length of source>:<source><id>",
/// with bytes outside 0x21-0x7E and '%' percent-encoded.
std::string publish_msg_id(const envelope& e);

/// Returns s as one NATS subject token: "events" if empty, else s with bytes outside 0x21-0x7E
/// and '.', '*', '>', '%' percent-encoded ("events" itself becomes "%65vents", so that every
/// token decodes back to one subject).
std::string subject_token(std::string_view s);

/// Returns the subject a token of subject_token() stands for; nothing when the token is not one
/// subject_token() makes (a '%' not followed by two upper-case hex digits, a byte it encodes).
std::optional<std::string> subject_of_token(std::string_view token);

/// A stream subject to publish under: literal, or with wildcards a message fills in.
class publish_subject {
public:
    /// Checks pattern (non-empty tokens, `*` and `>` only as whole tokens, `>` only last, no
    /// whitespace); throws errc::invalid_argument naming it and the cause.
    explicit publish_subject(std::string pattern);
    /// A pattern (the stream's subject) and a template of each message's subject: literal
    /// tokens and one or more whole `{subject}` tokens, captured by the pattern (e.g. pattern
    /// "orders.>", template "orders.{subject}"); throws errc::invalid_argument naming the cause.
    publish_subject(std::string pattern, std::string subject_template);

    /// Returns the subject as given.
    const std::string& pattern() const noexcept { return pattern_; }
    /// Returns whether it has wildcards (messages then need a concrete subject).
    bool wildcard() const noexcept { return wildcard_; }
    /// Returns what the messages' subjects look like, for the check that the stream captures
    /// them: the pattern, or the template with `*` for each `{subject}`.
    const std::string& sent() const noexcept { return sent_; }
    /// Returns the concrete subject of a message whose envelope subject is event_subject ("" if
    /// none or not an envelope): each wildcard token replaced by subject_token(event_subject).
    std::string for_event(std::string_view event_subject) const;

private:
    std::string pattern_;
    std::string template_;  // "" without a template
    std::string sent_;
    bool wildcard_ = false;
};

/// Returns whether every subject matching `subject` (maybe a wildcard) also matches `filter`
/// (a stream's subject): "orders.>" captures "orders.>", "orders.*" and "orders.o-1".
bool captures(std::string_view filter, std::string_view subject);

}  // namespace idem::jetstream::detail
