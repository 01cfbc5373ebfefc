// HMAC-SHA256 through OpenSSL 3's one-shot HMAC(); the comparisons go through
// CRYPTO_memcmp, so a forger learns nothing from how long a wrong signature took.

#include <idem/sources/webhook_signature.hpp>

#include <idem/storage/error.hpp>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <array>
#include <charconv>
#include <cstdint>

namespace idem::http {

namespace {

constexpr std::string_view base64_alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool parse_seconds(std::string_view text, std::int64_t& out) {
    text = trim(text);
    if (text.empty()) return false;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
    return ec == std::errc{} && end == text.data() + text.size();
}

bool within(std::int64_t ts, std::chrono::seconds now, std::chrono::seconds tolerance) {
    // Compared without subtracting: a timestamp near the int64 limits must not overflow into
    // "within" (the tolerance is never negative).
    const auto t = tolerance.count();
    return ts >= now.count() - t && ts <= now.count() + t;
}

// Calls fn(part) for each part of s split at sep.
template <class F>
void split(std::string_view s, char sep, F&& fn) {
    while (true) {
        auto at = s.find(sep);
        fn(s.substr(0, at));
        if (at == std::string_view::npos) return;
        s.remove_prefix(at + 1);
    }
}

signature_check standard_webhooks(const std::vector<std::string>& keys, const signature_headers& h,
                                  std::string_view body, std::chrono::seconds now, std::chrono::seconds tolerance) {
    if (h.webhook_id.empty() || h.webhook_timestamp.empty() || h.webhook_signature.empty()) {
        return signature_check::missing;
    }
    std::int64_t ts = 0;
    if (!parse_seconds(h.webhook_timestamp, ts)) return signature_check::malformed;
    std::string content;
    content.reserve(h.webhook_id.size() + h.webhook_timestamp.size() + body.size() + 2);
    content.append(h.webhook_id).append(".").append(h.webhook_timestamp).append(".").append(body);
    std::vector<std::string> expected;
    for (const auto& k : keys) expected.push_back(base64_encode(hmac_sha256(k, content)));
    bool any_v1 = false;
    bool matched = false;
    split(h.webhook_signature, ' ', [&](std::string_view sig) {
        if (!sig.starts_with("v1,")) return;  // other versions (v1a: asymmetric) are not ours to check
        any_v1 = true;
        sig.remove_prefix(3);
        for (const auto& e : expected) matched |= equal_constant_time(sig, e);
    });
    if (!any_v1) return signature_check::malformed;
    if (!matched) return signature_check::mismatch;
    return within(ts, now, tolerance) ? signature_check::valid : signature_check::expired;
}

signature_check github(const std::vector<std::string>& keys, const signature_headers& h, std::string_view body) {
    auto sig = trim(h.hub_signature_256);
    if (sig.empty()) return signature_check::missing;
    if (!sig.starts_with("sha256=")) return signature_check::malformed;
    sig.remove_prefix(7);
    bool matched = false;
    for (const auto& k : keys) matched |= equal_constant_time(sig, hex_encode(hmac_sha256(k, body)));
    return matched ? signature_check::valid : signature_check::mismatch;
}

signature_check stripe(const std::vector<std::string>& keys, const signature_headers& h, std::string_view body,
                       std::chrono::seconds now, std::chrono::seconds tolerance) {
    if (trim(h.stripe_signature).empty()) return signature_check::missing;
    std::string_view t;
    std::vector<std::string_view> v1;
    split(h.stripe_signature, ',', [&](std::string_view item) {
        item = trim(item);
        if (item.starts_with("t=")) t = item.substr(2);
        if (item.starts_with("v1=")) v1.push_back(item.substr(3));
    });
    std::int64_t ts = 0;
    if (t.empty() || v1.empty() || !parse_seconds(t, ts)) return signature_check::malformed;
    std::string content;
    content.append(t).append(".").append(body);
    bool matched = false;
    for (const auto& k : keys) {
        auto expected = hex_encode(hmac_sha256(k, content));
        for (auto s : v1) matched |= equal_constant_time(s, expected);
    }
    if (!matched) return signature_check::mismatch;
    return within(ts, now, tolerance) ? signature_check::valid : signature_check::expired;
}

}  // namespace

signature_scheme scheme_from_string(std::string_view name) {
    if (name == "standard-webhooks") return signature_scheme::standard_webhooks;
    if (name == "github") return signature_scheme::github;
    if (name == "stripe") return signature_scheme::stripe;
    throw_error(errc::invalid_argument,
                "signature scheme '" + std::string(name) + "' is not one of standard-webhooks, github, stripe");
}

std::string_view to_string(signature_scheme s) noexcept {
    switch (s) {
    case signature_scheme::standard_webhooks: return "standard-webhooks";
    case signature_scheme::github: return "github";
    case signature_scheme::stripe: return "stripe";
    }
    return "unknown";
}

std::string_view to_string(signature_check c) noexcept {
    switch (c) {
    case signature_check::valid: return "valid";
    case signature_check::missing: return "missing";
    case signature_check::malformed: return "malformed";
    case signature_check::mismatch: return "mismatch";
    case signature_check::expired: return "expired";
    }
    return "unknown";
}

signature_check verify_signature(signature_scheme scheme, const std::vector<std::string>& keys,
                                 const signature_headers& headers, std::string_view body,
                                 std::chrono::seconds now, std::chrono::seconds tolerance) {
    switch (scheme) {
    case signature_scheme::standard_webhooks: return standard_webhooks(keys, headers, body, now, tolerance);
    case signature_scheme::github: return github(keys, headers, body);
    case signature_scheme::stripe: return stripe(keys, headers, body, now, tolerance);
    }
    return signature_check::mismatch;
}

std::string key_from_secret(signature_scheme scheme, std::string_view secret) {
    secret = trim(secret);
    if (secret.empty()) throw_error(errc::invalid_argument, "an empty webhook secret");
    if (scheme != signature_scheme::standard_webhooks) return std::string(secret);
    if (!secret.starts_with("whsec_")) {
        throw_error(errc::invalid_argument, "a Standard Webhooks secret starts with 'whsec_'");
    }
    std::string key;
    if (!base64_decode(secret.substr(6), key) || key.empty()) {
        throw_error(errc::invalid_argument, "the Standard Webhooks secret after 'whsec_' is not base64");
    }
    return key;
}

std::string sha256(std::string_view bytes) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int n = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), md.data(), &n, EVP_sha256(), nullptr) != 1) {
        throw_error(errc::invalid_argument, "SHA-256 is not available");
    }
    return std::string(reinterpret_cast<const char*>(md.data()), n);
}

std::string hmac_sha256(std::string_view key, std::string_view message) {
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int len = 0;
    if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), md.data(), &len) == nullptr) {
        throw_error(errc::invalid_argument, "HMAC-SHA256 failed in OpenSSL");
    }
    return std::string(reinterpret_cast<const char*>(md.data()), len);
}

std::string base64_encode(std::string_view bytes) {
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    std::size_t i = 0;
    auto byte = [&](std::size_t k) { return static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[k])); };
    for (; i + 3 <= bytes.size(); i += 3) {
        const auto v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
        for (int s = 18; s >= 0; s -= 6) out += base64_alphabet[(v >> s) & 63];
    }
    if (const auto rest = bytes.size() - i; rest > 0) {
        auto v = byte(i) << 16;
        if (rest == 2) v |= byte(i + 1) << 8;
        out += base64_alphabet[(v >> 18) & 63];
        out += base64_alphabet[(v >> 12) & 63];
        out += rest == 2 ? base64_alphabet[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

bool base64_decode(std::string_view text, std::string& out) {
    out.clear();
    std::uint32_t acc = 0;
    int bits = 0;
    std::size_t pad = 0;
    for (char c : text) {
        if (c == '=') {
            ++pad;
            continue;
        }
        if (pad > 0) return false;  // data after padding
        auto at = base64_alphabet.find(c);
        if (at == std::string_view::npos) return false;
        acc = (acc << 6) | static_cast<std::uint32_t>(at);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out += static_cast<char>((acc >> bits) & 0xFF);
        }
    }
    return pad <= 2 && (text.size() % 4 == 0 || pad == 0);
}

std::string hex_encode(std::string_view bytes) {
    constexpr std::string_view digits = "0123456789abcdef";
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) {
        const auto b = static_cast<unsigned char>(c);
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

bool equal_constant_time(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace idem::http
