// Webhook sender files and the senders' retry horizon. A secret file holds key bytes, so the
// messages name the file and the line, never the secret.

#include <idem/sources/http.hpp>

#include <idem/storage/duration.hpp>
#include <idem/storage/error.hpp>

#include <filesystem>
#include <fstream>

namespace idem::http {

namespace {

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

}  // namespace

webhook_secret read_webhook_secret(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw_error(errc::invalid_argument, "webhook secret file '" + path + "' cannot be read");
    webhook_secret out;
    out.name = std::filesystem::path(path).stem().string();
    std::vector<std::string> secrets;
    webhook_mapping m;
    bool mapped = false;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        auto where = [&] { return "webhook secret file '" + path + "' line " + std::to_string(n) + ": "; };
        auto text = trim(line);
        if (text.empty() || text.front() == '#') continue;
        auto eq = text.find('=');
        if (eq == std::string_view::npos) throw_error(errc::invalid_argument, where() + "expected 'key = value'");
        auto key = trim(text.substr(0, eq));
        auto value = std::string(trim(text.substr(eq + 1)));
        if (key == "scheme") {
            try {
                out.scheme = scheme_from_string(value);
            } catch (const std::system_error& e) {
                throw_error(errc::invalid_argument, where() + e.what());
            }
        } else if (key == "secret") {
            secrets.push_back(value);
        } else if (key == "tolerance") {
            auto d = parse_duration(value);
            if (!d || *d < std::chrono::seconds(1)) {
                throw_error(errc::invalid_argument, where() + "tolerance '" + value + "' is not a duration (5m, 300s)");
            }
            out.tolerance = std::chrono::duration_cast<std::chrono::seconds>(*d);
        } else if (key == "name") {
            out.name = value;
        } else if (key == "source" || key == "type" || key == "subject" || key == "id") {
            mapped = true;
            (key == "source" ? m.source : key == "type" ? m.type : key == "subject" ? m.subject : m.id) = value;
        } else {
            throw_error(errc::invalid_argument, where() + "unknown key '" + std::string(key) +
                                                    "' (scheme, secret, tolerance, name, source, type, subject, id)");
        }
    }
    if (secrets.empty()) throw_error(errc::invalid_argument, "webhook secret file '" + path + "' has no 'secret ='");
    for (const auto& s : secrets) {
        try {
            out.keys.push_back(key_from_secret(out.scheme, s));
        } catch (const std::system_error& e) {
            throw_error(errc::invalid_argument, "webhook secret file '" + path + "': " + e.what());
        }
    }
    if (mapped) {
        if (m.source.empty()) m.source = "/webhooks/" + out.name;
        if (m.type.empty()) {
            throw_error(errc::invalid_argument, "webhook secret file '" + path + "': a mapping needs 'type ='");
        }
        // A GitHub signature covers the body only and has no timestamp: a captured request can be
        // replayed after the inbox has forgotten it, with any headers. The event's id and row key
        // must then come from the body; the type has no other place than X-GitHub-Event.
        if (out.scheme == signature_scheme::github) {
            for (const auto& [key, value] : {std::pair{"id", &m.id}, std::pair{"subject", &m.subject}}) {
                if (value->starts_with("header:")) {
                    throw_error(errc::invalid_argument,
                                "webhook secret file '" + path + "': '" + key + " = " + *value +
                                    "': a github signature does not cover headers, so the event's " + key +
                                    " must come from the body (a JSON pointer such as /id)");
                }
            }
        }
        out.mapping = std::move(m);
    }
    return out;
}

redelivery_bound webhook_redelivery_bound() {
    // Standard Webhooks' retry schedule spans about 3.2 days, Stripe's 3 days; GitHub does not
    // retry by itself. The longest of them, rounded up to the hour.
    return {std::chrono::hours(77), "webhook senders retry for up to ~3.2 days (Standard Webhooks; Stripe 3 days)"};
}

}  // namespace idem::http
