#pragma once

// Webhook signatures: HMAC-SHA256 over the raw request bytes, compared in constant time, in the
// three schemes the HTTP source accepts.
//
//   Standard Webhooks  webhook-id, webhook-timestamp, webhook-signature: "v1,<base64>" (several,
//                      space-separated); signed content "<id>.<timestamp>.<body>"; secrets
//                      "whsec_<base64>"; the timestamp within a tolerance of now (both ways).
//   GitHub             X-Hub-Signature-256: "sha256=<hex>" over the body; the secret as given.
//   Stripe             Stripe-Signature: "t=<ts>,v1=<hex>[,v1=<hex>...]" over "<ts>.<body>";
//                      the secret as given (whsec_... used as is); the timestamp within the tolerance.
//
// Several keys may be configured for one sender (rotation): a request is valid when any
// signature matches any key. Needs the meson feature `http` (OpenSSL).

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace idem::http {

/// How a sender signs its requests.
enum class signature_scheme { standard_webhooks, github, stripe };

/// Returns the scheme named "standard-webhooks", "github" or "stripe"; throws errc::invalid_argument naming it otherwise.
signature_scheme scheme_from_string(std::string_view name);
/// Returns the name of a scheme ("standard-webhooks", ...).
std::string_view to_string(signature_scheme s) noexcept;

/// The result of checking a request's signature.
enum class signature_check {
    valid,
    missing,    ///< the scheme's headers are absent or empty
    malformed,  ///< a header does not parse (no v1 signature, a timestamp that is not a number)
    mismatch,   ///< no signature matches any key
    expired,    ///< the signature matches, but its timestamp is outside the tolerance
};

/// Returns the stable text of a check ("valid", "missing", ...).
std::string_view to_string(signature_check c) noexcept;

/// The signature headers of one request (empty: absent).
struct signature_headers {
    std::string_view webhook_id;          ///< Standard Webhooks: webhook-id
    std::string_view webhook_timestamp;   ///< Standard Webhooks: webhook-timestamp
    std::string_view webhook_signature;   ///< Standard Webhooks: webhook-signature
    std::string_view hub_signature_256;   ///< GitHub: X-Hub-Signature-256
    std::string_view stripe_signature;    ///< Stripe: Stripe-Signature
};

/// Checks body against headers under scheme with any of keys (raw key bytes). now and tolerance
/// bound the Standard Webhooks and Stripe timestamps (seconds since the epoch).
signature_check verify_signature(signature_scheme scheme, const std::vector<std::string>& keys,
                                 const signature_headers& headers, std::string_view body,
                                 std::chrono::seconds now, std::chrono::seconds tolerance);

/// Returns the key bytes of a secret as the scheme's senders write it: a Standard Webhooks
/// "whsec_<base64>" decoded; others as given. Throws errc::invalid_argument naming the cause.
std::string key_from_secret(signature_scheme scheme, std::string_view secret);

/// Returns HMAC-SHA256(key, message).
std::string hmac_sha256(std::string_view key, std::string_view message);
/// Returns SHA-256(bytes).
std::string sha256(std::string_view bytes);
/// Returns the standard base64 text of bytes.
std::string base64_encode(std::string_view bytes);
/// Returns the bytes of standard base64 text; false if text is not base64.
bool base64_decode(std::string_view text, std::string& out);
/// Returns the lower-case hex text of bytes.
std::string hex_encode(std::string_view bytes);
/// Returns whether a equals b, taking a time that depends on their lengths only.
bool equal_constant_time(std::string_view a, std::string_view b) noexcept;

}  // namespace idem::http
