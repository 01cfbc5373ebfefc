// The CloudEvents HTTP binding (structured, binary, batched) and the webhook wrapping. A body
// that does not parse is handed to the engine as it is, so that it is dead-lettered and
// counted like any malformed event, and a retry of the same bytes gets the same answer.

#include "ingest.hpp"

#include <rapidjson/document.h>
#include <rapidjson/pointer.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>

namespace idem::http::detail {

namespace {

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// The media type of a Content-Type value, lower case, without its parameters.
std::string media_type(std::string_view content_type) {
    auto semi = content_type.find(';');
    auto t = content_type.substr(0, semi);
    while (!t.empty() && t.back() == ' ') t.remove_suffix(1);
    while (!t.empty() && t.front() == ' ') t.remove_prefix(1);
    return lower(t);
}

bool is_json_media(std::string_view type) {
    return type == "application/json" || type == "text/json" || type.ends_with("+json");
}

using writer = rapidjson::Writer<rapidjson::StringBuffer>;

void string_field(writer& w, std::string_view name, std::string_view value) {
    w.Key(name.data(), static_cast<rapidjson::SizeType>(name.size()));
    w.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
}

delivery raw(std::string_view body) {
    delivery d;
    d.body = std::string(body);
    return d;
}

std::string text_of(const rapidjson::StringBuffer& b) { return std::string(b.GetString(), b.GetSize()); }

// The elements of a JSON array, each as the exact bytes it has in text (offset, length), none of
// them decoded: events go to the engine as they were sent, which checks each in full (its
// numbers, strings and depth) and answers each on its own. nullopt when text is not one
// well-formed array: brackets or quotes unbalanced, or content after it. Nothing here
// recurses, however deep the nesting.
std::optional<std::vector<std::pair<std::size_t, std::size_t>>> array_elements(std::string_view text) {
    using simdjson::ondemand::json_type;
    thread_local simdjson::ondemand::parser parser;
    const simdjson::padded_string padded(text);
    simdjson::ondemand::document doc;
    simdjson::ondemand::array array;
    if (parser.iterate(padded).get(doc) != simdjson::SUCCESS || doc.get_array().get(array) != simdjson::SUCCESS) {
        return std::nullopt;
    }
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (auto element : array) {
        simdjson::ondemand::value v;
        json_type type{};
        if (element.get(v) != simdjson::SUCCESS || v.type().get(type) != simdjson::SUCCESS) return std::nullopt;
        std::string_view raw;
        if (type == json_type::object) {
            simdjson::ondemand::object o;
            if (v.get_object().get(o) != simdjson::SUCCESS || o.raw_json().get(raw) != simdjson::SUCCESS) {
                return std::nullopt;
            }
        } else if (type == json_type::array) {
            simdjson::ondemand::array a;
            if (v.get_array().get(a) != simdjson::SUCCESS || a.raw_json().get(raw) != simdjson::SUCCESS) {
                return std::nullopt;
            }
        } else {
            raw = v.raw_json_token();
        }
        while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\n' || raw.back() == '\r' || raw.back() == '\t')) {
            raw.remove_suffix(1);
        }
        out.emplace_back(static_cast<std::size_t>(raw.data() - padded.data()), raw.size());
    }
    if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS) return std::nullopt;  // content after it
    return out;
}

// Binary mode: the ce-* headers are the attributes, the body is the data.
delivery binary_event(const header_list& h, std::string_view body) {
    rapidjson::StringBuffer buf;
    writer w{buf};
    w.StartObject();
    for (auto [name, value] : h.fields) {
        if (name.size() > 3 && iequals(name.substr(0, 3), "ce-")) {
            string_field(w, lower(name.substr(3)), percent_decode(value));
        }
    }
    const auto content_type = h.get("content-type");
    if (content_type) string_field(w, "datacontenttype", *content_type);
    if (!body.empty()) {
        if (!content_type || is_json_media(media_type(*content_type))) {
            // Embedded as it is when it is one JSON value (the engine checks the rest of it);
            // anything else could close the object and add attributes of its own.
            const auto one = array_elements("[" + std::string(body) + "]");
            if (!one || one->size() != 1) return raw(body);  // dead-lettered as invalid_json
            w.Key("data");
            w.RawValue(body.data(), body.size(), rapidjson::kObjectType);
        } else {
            string_field(w, "data_base64", base64_encode(body));
        }
    }
    w.EndObject();
    return raw(text_of(buf));
}

// An attribute of a wrapped webhook: a JSON pointer into the body or a header.
std::optional<std::string> mapped(std::string_view how, const rapidjson::Document& body, const header_list& h) {
    if (how.empty()) return std::nullopt;
    if (how.starts_with("header:")) {
        auto v = h.get(how.substr(7));
        return v ? std::optional<std::string>(std::string(*v)) : std::nullopt;
    }
    rapidjson::Pointer p(how.data(), how.size());
    if (!p.IsValid()) return std::nullopt;
    const auto* v = p.Get(body);
    if (v == nullptr) return std::nullopt;
    if (v->IsString()) return std::string(v->GetString(), v->GetStringLength());
    if (v->IsInt64()) return std::to_string(v->GetInt64());
    if (v->IsUint64()) return std::to_string(v->GetUint64());
    return std::nullopt;
}

delivery wrapped_event(const webhook_mapping& m, const header_list& h, std::string_view body,
                       const std::string& default_id) {
    rapidjson::Document d;
    d.Parse<rapidjson::kParseIterativeFlag>(body.data(), body.size());  // no recursion per level
    if (d.HasParseError()) return raw(body);
    rapidjson::StringBuffer buf;
    writer w{buf};
    w.StartObject();
    string_field(w, "specversion", "1.0");
    auto id = mapped(m.id, d, h);
    if (!id && m.id.empty() && !default_id.empty()) id = default_id;
    if (id) string_field(w, "id", *id);
    if (!m.source.empty()) string_field(w, "source", m.source);
    if (auto t = mapped(m.type, d, h)) string_field(w, "type", *t);
    if (auto s = mapped(m.subject, d, h)) string_field(w, "subject", *s);
    string_field(w, "datacontenttype", "application/json");
    w.Key("data");
    w.RawValue(body.data(), body.size(), d.GetType());
    w.EndObject();
    return raw(text_of(buf));
}

// The sender whose signature the request carries, or the refusal.
struct signed_by {
    const webhook_secret* sender = nullptr;
    std::string error;
};

signed_by check_signature(const header_list& h, std::string_view body, const std::vector<webhook_secret>& senders,
                          std::chrono::seconds now) {
    signature_headers sh;
    sh.webhook_id = h.get("webhook-id").value_or("");
    sh.webhook_timestamp = h.get("webhook-timestamp").value_or("");
    sh.webhook_signature = h.get("webhook-signature").value_or("");
    sh.hub_signature_256 = h.get("x-hub-signature-256").value_or("");
    sh.stripe_signature = h.get("stripe-signature").value_or("");
    signed_by out;
    std::string seen;
    for (const auto& s : senders) {
        auto c = verify_signature(s.scheme, s.keys, sh, body, now, s.tolerance);
        if (c == signature_check::valid) {
            out.sender = &s;
            return out;
        }
        if (c != signature_check::missing) {
            seen += (seen.empty() ? "" : ", ") + s.name + " (" + std::string(to_string(s.scheme)) + "): " +
                    std::string(to_string(c));
        }
    }
    out.error = seen.empty() ? "the request carries no webhook signature of a configured sender"
                             : "the webhook signature is not valid: " + seen;
    return out;
}

}  // namespace

std::optional<std::string_view> header_list::get(std::string_view name) const {
    for (auto [n, v] : fields) {
        if (iequals(n, name)) return v;
    }
    return std::nullopt;
}

std::string percent_decode(std::string_view text) {
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
            out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
            i += 2;
        } else {
            out += text[i];
        }
    }
    return out;
}

ingest read_events(const header_list& headers, std::string_view body, const std::vector<webhook_secret>& senders,
                   std::chrono::seconds now) {
    ingest out;
    std::string message_id;
    std::string default_id;  // a wrapped event's id when its mapping names none: something the signature covers
    std::string transport;
    const webhook_mapping* mapping = nullptr;
    const auto type = media_type(headers.get("content-type").value_or(""));
    const bool structured = type == "application/cloudevents+json" || type == "application/cloudevents-batch+json";
    const bool binary = !structured && headers.get("ce-specversion");
    if (!senders.empty()) {
        auto s = check_signature(headers, body, senders, now);
        if (s.sender == nullptr) {
            out.status = 401;
            out.error = std::move(s.error);
            return out;
        }
        out.sender = s.sender->name;
        transport = "webhook:" + s.sender->name;
        // The message is named by what its signature covers, so that no header outside it (ce-*,
        // X-GitHub-Delivery, X-GitHub-Event) can make a captured request a new message: Standard
        // Webhooks sign webhook-id with the body; GitHub and Stripe sign the body only (Stripe
        // with a timestamp that changes on every retry), so their message is the body's hash.
        if (s.sender->scheme == signature_scheme::standard_webhooks) {
            message_id = std::string(headers.get("webhook-id").value_or(""));
        } else {
            message_id = "sha256:" + hex_encode(sha256(body));
        }
        default_id = message_id;
        if (s.sender->mapping) {
            mapping = &*s.sender->mapping;
        } else if (s.sender->scheme == signature_scheme::github && binary) {
            // Without a timestamp a GitHub signature can be replayed for ever, past the inbox's
            // memory of the message, and it covers none of the ce-* headers that would be the
            // event's identity.
            out.status = 400;
            out.error = "sender '" + s.sender->name +
                        "' signs with the github scheme, which covers the body only and has no timestamp: a "
                        "binary-mode CloudEvent's ce-* headers are outside the signature; send the event "
                        "structured (application/cloudevents+json) or configure a mapping";
            return out;
        }
    }
    auto single = [&](delivery d) {
        d.message_id = message_id;
        d.transport = transport;
        d.signed_message_id = !message_id.empty();
        out.deliveries.push_back(std::move(d));
    };
    if (mapping != nullptr) {
        single(wrapped_event(*mapping, headers, body, default_id));
        return out;
    }
    if (type == "application/cloudevents+json") {
        single(raw(body));
    } else if (type == "application/cloudevents-batch+json") {
        out.batch = true;
        auto first = body.find_first_not_of(" \t\r\n");
        if (first != std::string_view::npos && body[first] != '[') {
            out.status = 400;
            out.error = "a CloudEvents batch (application/cloudevents-batch+json) is a JSON array of events";
            return out;
        }
        const auto elements = array_elements(body);
        if (!elements) {
            out.batch = false;  // no events to answer one by one: a malformed body, 400 like any
            single(raw(body));  // one dead letter: invalid_json
            return out;
        }
        for (auto [at, size] : *elements) {
            delivery one = raw(body.substr(at, size));  // the event's own bytes, not re-encoded
            one.transport = transport;  // each event is identified by its own id, not the request's
            out.deliveries.push_back(std::move(one));
        }
    } else if (binary) {
        single(binary_event(headers, body));
    } else {
        out.status = 415;
        out.error = "content type '" + type +
                    "' is not a CloudEvent: send application/cloudevents+json, application/cloudevents-batch+json, "
                    "or ce-* headers (binary mode)";
    }
    return out;
}

}  // namespace idem::http::detail
