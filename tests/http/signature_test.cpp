#include <idem/sources/webhook_signature.hpp>

#include <doctest/doctest.h>

#include <system_error>

using namespace idem::http;
using namespace std::chrono_literals;

namespace {

// The Standard Webhooks specification's own test vector (its reference libraries test it).
constexpr std::string_view sw_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr std::string_view sw_id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
constexpr std::string_view sw_timestamp = "1614265330";
constexpr std::string_view sw_body = R"({"test": 2432232314})";
constexpr std::string_view sw_signature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
constexpr std::chrono::seconds sw_now{1614265330};

signature_check standard(std::string_view signature, std::string_view body = sw_body,
                         std::chrono::seconds now = sw_now, std::vector<std::string> keys = {}) {
    if (keys.empty()) keys.push_back(key_from_secret(signature_scheme::standard_webhooks, sw_secret));
    signature_headers h;
    h.webhook_id = sw_id;
    h.webhook_timestamp = sw_timestamp;
    h.webhook_signature = signature;
    return verify_signature(signature_scheme::standard_webhooks, keys, h, body, now, 300s);
}

}  // namespace

TEST_SUITE("webhook signatures") {
    TEST_CASE("the Standard Webhooks test vector is accepted and every alteration rejected") {
        CHECK(standard(sw_signature) == signature_check::valid);
        SUBCASE("one byte of the body changed") {
            CHECK(standard(sw_signature, R"({"test": 2432232315})") == signature_check::mismatch);
        }
        SUBCASE("a wrong signature") {
            CHECK(standard("v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=") == signature_check::mismatch);
        }
        SUBCASE("several signatures, one of them valid (rotation on the sender's side)") {
            CHECK(standard("v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= " + std::string(sw_signature)) ==
                  signature_check::valid);
        }
        SUBCASE("several keys, the second one signing (rotation on ours)") {
            std::vector<std::string> keys{"another key", key_from_secret(signature_scheme::standard_webhooks, sw_secret)};
            CHECK(standard(sw_signature, sw_body, sw_now, keys) == signature_check::valid);
        }
        SUBCASE("a timestamp outside the tolerance, either way") {
            CHECK(standard(sw_signature, sw_body, sw_now + 301s) == signature_check::expired);
            CHECK(standard(sw_signature, sw_body, sw_now - 301s) == signature_check::expired);
            CHECK(standard(sw_signature, sw_body, sw_now + 299s) == signature_check::valid);
        }
        SUBCASE("no v1 signature, or none at all") {
            CHECK(standard("v1a,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=") == signature_check::malformed);
            CHECK(standard("") == signature_check::missing);
        }
    }

    TEST_CASE("a Standard Webhooks secret must be whsec_ and base64") {
        CHECK_THROWS_AS(key_from_secret(signature_scheme::standard_webhooks, "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                        std::system_error);
        CHECK_THROWS_AS(key_from_secret(signature_scheme::standard_webhooks, "whsec_not*base64"), std::system_error);
    }

    TEST_CASE("GitHub's documented example is accepted") {
        // From GitHub's "Validating webhook deliveries".
        std::vector<std::string> keys{"It's a Secret to Everybody"};
        signature_headers h;
        h.hub_signature_256 = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        CHECK(verify_signature(signature_scheme::github, keys, h, "Hello, World!", 0s, 300s) == signature_check::valid);
        CHECK(verify_signature(signature_scheme::github, keys, h, "Hello, World?", 0s, 300s) ==
              signature_check::mismatch);
        h.hub_signature_256 = "sha1=757107ea";
        CHECK(verify_signature(signature_scheme::github, keys, h, "Hello, World!", 0s, 300s) ==
              signature_check::malformed);
    }

    TEST_CASE("a Stripe signature is checked over t.body and its timestamp") {
        const std::vector<std::string> keys{"whsec_test_secret"};
        const std::string body = R"({"id":"evt_1","type":"order.line_added"})";
        const std::string v1 = hex_encode(hmac_sha256(keys[0], "1700000000." + body));
        const std::string header = "t=1700000000,v1=" + v1 + ",v0=ignored";
        signature_headers h;
        h.stripe_signature = header;
        CHECK(verify_signature(signature_scheme::stripe, keys, h, body, 1700000100s, 300s) == signature_check::valid);
        CHECK(verify_signature(signature_scheme::stripe, keys, h, body, 1700000400s, 300s) == signature_check::expired);
        CHECK(verify_signature(signature_scheme::stripe, keys, h, body + " ", 1700000100s, 300s) ==
              signature_check::mismatch);
        const std::string without_timestamp = "v1=" + v1;  // signature_headers holds views
        h.stripe_signature = without_timestamp;
        CHECK(verify_signature(signature_scheme::stripe, keys, h, body, 1700000100s, 300s) == signature_check::malformed);
    }

    TEST_CASE("base64 and hex round-trip against known texts") {
        CHECK(base64_encode("") == "");
        CHECK(base64_encode("f") == "Zg==");
        CHECK(base64_encode("fo") == "Zm8=");
        CHECK(base64_encode("foobar") == "Zm9vYmFy");
        std::string out;
        CHECK(base64_decode("Zm9vYg==", out));
        CHECK(out == "foob");
        CHECK_FALSE(base64_decode("Zm9v!", out));
        CHECK(hex_encode("\x01\xab") == "01ab");
        CHECK(equal_constant_time("abc", "abc"));
        CHECK_FALSE(equal_constant_time("abc", "abd"));
        CHECK_FALSE(equal_constant_time("abc", "ab"));
    }
}
