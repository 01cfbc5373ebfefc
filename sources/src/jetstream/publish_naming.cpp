#include "publish_naming.hpp"

#include <idem/storage/error.hpp>

#include <vector>

namespace idem::jetstream::detail {

std::string percent_encode(std::string_view s, std::string_view also) {
    static constexpr char hex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        auto b = static_cast<unsigned char>(c);
        if (b < 0x21 || b > 0x7E || c == '%' || also.find(c) != std::string_view::npos) {
            out += '%';
            out += hex[b >> 4];
            out += hex[b & 0xF];
        } else {
            out += c;
        }
    }
    return out;
}

namespace {

std::vector<std::string_view> tokens(std::string_view subject) {
    std::vector<std::string_view> out;
    std::size_t start = 0;
    for (;;) {
        auto dot = subject.find('.', start);
        if (dot == std::string_view::npos) {
            out.push_back(subject.substr(start));
            return out;
        }
        out.push_back(subject.substr(start, dot - start));
        start = dot + 1;
    }
}

}  // namespace

std::string publish_msg_id(const envelope& e) {
    if (!e.msgid.empty()) return percent_encode(e.msgid, "");
    // The length prefix makes the split between source and id unambiguous ("a" + "bc" and
    // "ab" + "c" differ), without reserving a separator character in either.
    return percent_encode(std::to_string(e.source.size()) + ":" + e.source + e.id, "%");
}

std::string subject_token(std::string_view s) {
    if (s.empty()) return "events";
    if (s == "events") return "%65vents";  // "events" stands for no subject
    return percent_encode(s, ".*>%");
}

std::optional<std::string> subject_of_token(std::string_view token) {
    if (token == "events") return std::string{};
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    std::string out;
    for (std::size_t i = 0; i < token.size(); ++i) {
        const char c = token[i];
        auto b = static_cast<unsigned char>(c);
        if (c == '%') {
            if (i + 2 >= token.size()) return std::nullopt;
            const int hi = hex(token[i + 1]);
            const int lo = hex(token[i + 2]);
            if (hi < 0 || lo < 0) return std::nullopt;
            out += static_cast<char>(hi * 16 + lo);
            i += 2;
        } else if (b < 0x21 || b > 0x7E || c == '.' || c == '*' || c == '>') {
            return std::nullopt;
        } else {
            out += c;
        }
    }
    if (subject_token(out) != token) return std::nullopt;  // not the one encoding of out
    return out;
}

publish_subject::publish_subject(std::string pattern) : pattern_(std::move(pattern)) {
    auto refuse = [&](const std::string& why) {
        throw_error(errc::invalid_argument, "subject '" + pattern_ + "' " + why);
    };
    if (pattern_.empty()) refuse("is empty");
    auto ts = tokens(pattern_);
    for (std::size_t i = 0; i < ts.size(); ++i) {
        auto t = ts[i];
        if (t.empty()) refuse("has an empty token (a leading, trailing or double dot)");
        for (char c : t) {
            if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7F)
                refuse("contains whitespace or a control character");
        }
        if (t.size() > 1 && (t.find('*') != std::string_view::npos || t.find('>') != std::string_view::npos)) {
            refuse("has '*' or '>' inside a token (a wildcard is a whole token)");
        }
        if (t == ">" && i + 1 != ts.size()) refuse("has '>' before its last token");
        if (t == "*" || t == ">") wildcard_ = true;
    }
    sent_ = pattern_;
}

publish_subject::publish_subject(std::string pattern, std::string subject_template)
    : publish_subject(std::move(pattern)) {
    template_ = std::move(subject_template);
    auto refuse = [&](const std::string& why) {
        throw_error(errc::invalid_argument, "subject template '" + template_ + "' " + why);
    };
    if (template_.empty()) refuse("is empty");
    bool placed = false;
    sent_.clear();
    for (auto t : tokens(template_)) {
        if (t.empty()) refuse("has an empty token (a leading, trailing or double dot)");
        for (char c : t) {
            if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7F)
                refuse("contains whitespace or a control character");
        }
        if (t == "{subject}") {
            placed = true;
        } else if (t.find_first_of("{}") != std::string_view::npos) {
            refuse("has '{' or '}' outside a whole '{subject}' token");
        } else if (t.find_first_of("*>") != std::string_view::npos) {
            refuse("has a wildcard: a template names one subject per message");
        }
        if (!sent_.empty()) sent_ += '.';
        sent_ += t == "{subject}" ? std::string_view("*") : t;
    }
    if (!placed) refuse("has no '{subject}' token");
    if (!captures(pattern_, sent_)) refuse("makes subjects that '" + pattern_ + "' does not capture");
}

std::string publish_subject::for_event(std::string_view event_subject) const {
    if (!template_.empty()) {
        const auto token = subject_token(event_subject);
        std::string out;
        for (auto t : tokens(template_)) {
            if (!out.empty()) out += '.';
            out += t == "{subject}" ? std::string_view(token) : t;
        }
        return out;
    }
    if (!wildcard_) return pattern_;
    const auto token = subject_token(event_subject);
    std::string out;
    for (auto t : tokens(pattern_)) {
        if (!out.empty()) out += '.';
        out += (t == "*" || t == ">") ? std::string_view(token) : t;
    }
    return out;
}

bool captures(std::string_view filter, std::string_view subject) {
    auto f = tokens(filter);
    auto s = tokens(subject);
    for (std::size_t i = 0; i < f.size(); ++i) {
        if (f[i] == ">") return s.size() > i;  // '>' takes one token or more, wildcards included
        if (i >= s.size()) return false;
        if (f[i] == "*") {
            if (s[i] == ">") return false;  // '>' spans tokens a '*' cannot
            continue;
        }
        if (f[i] != s[i]) return false;  // a literal captures only itself, not a wildcard
    }
    return f.size() == s.size();
}

}  // namespace idem::jetstream::detail
