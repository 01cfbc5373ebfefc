// The parsed attributes a binary log record carries beside its body (envelope_record.hpp).

#include <idem/storage/envelope_record.hpp>

#include <cstring>

namespace idem {
namespace {

enum attribute_flag : std::uint8_t {
    has_sequence = 1,
    binary_data = 2,
};

constexpr std::uint32_t inline_bytes = 0xFFFFFFFFu;  // a string's offset when its bytes follow

void put_u32(std::string& out, std::uint32_t v) {
    char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(static_cast<unsigned char>(v >> (8 * i)));
    out.append(b, 4);
}

void put_u64(std::string& out, std::uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(static_cast<unsigned char>(v >> (8 * i)));
    out.append(b, 8);
}

// A string the body holds verbatim (most attributes: their JSON has no escapes) is its range
// of the body, as any occurrence of the same bytes serves; another is stored.
void put_string(std::string& out, std::string_view body, std::string_view s) {
    const auto at = s.empty() ? 0 : body.find(s);
    if (at != std::string_view::npos && at < inline_bytes) {
        put_u32(out, static_cast<std::uint32_t>(at));
        put_u32(out, static_cast<std::uint32_t>(s.size()));
    } else {
        put_u32(out, inline_bytes);
        put_u32(out, static_cast<std::uint32_t>(s.size()));
        out.append(s);
    }
}

// Reads the fields in order; any read past the end leaves ok false.
struct fields {
    std::string_view rest;
    bool ok = true;

    std::uint64_t number(std::size_t bytes) {
        if (rest.size() < bytes) {
            ok = false;
            return 0;
        }
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < bytes; ++i) v |= std::uint64_t{static_cast<unsigned char>(rest[i])} << (8 * i);
        rest.remove_prefix(bytes);
        return v;
    }
    std::string_view string(std::string_view body) {
        const auto at = number(4);
        const auto n = number(4);
        if (!ok) return {};
        if (at != inline_bytes) {
            if (at > body.size() || n > body.size() - at) {
                ok = false;
                return {};
            }
            return body.substr(at, n);
        }
        if (rest.size() < n) {
            ok = false;
            return {};
        }
        auto s = rest.substr(0, n);
        rest.remove_prefix(n);
        return s;
    }
};

}  // namespace

void encode_envelope_attributes(std::string& out, std::string_view body, const envelope& ev, std::uint64_t fingerprint) {
    std::uint8_t flags = 0;
    if (ev.sequence) flags |= has_sequence;
    if (ev.data_binary) flags |= binary_data;
    out.push_back(static_cast<char>(envelope_rules_revision));
    out.push_back(static_cast<char>(flags));
    put_u64(out, fingerprint);
    put_u64(out, ev.sequence.value_or(0));
    for (const std::string* s : {&ev.id, &ev.source, &ev.type, &ev.subject, &ev.time, &ev.msgid, &ev.datacontenttype,
                                 &ev.dataschema, &ev.data}) {
        put_string(out, body, *s);
    }
}

bool decode_envelope_attributes(std::string_view attributes, std::string_view body, envelope& out,
                                std::uint64_t& fingerprint) {
    fields in{attributes};
    if (in.number(1) != envelope_rules_revision) return false;
    const auto flags = static_cast<std::uint8_t>(in.number(1));
    fingerprint = in.number(8);
    const auto sequence = in.number(8);
    for (std::string* s : {&out.id, &out.source, &out.type, &out.subject, &out.time, &out.msgid, &out.datacontenttype,
                           &out.dataschema, &out.data}) {
        s->assign(in.string(body));
    }
    if (!in.ok || !in.rest.empty() || (flags & ~(has_sequence | binary_data)) != 0) return false;
    if ((flags & has_sequence) != 0) {
        out.sequence = sequence;
    } else {
        out.sequence.reset();
    }
    out.data_binary = (flags & binary_data) != 0;
    return true;
}

}  // namespace idem
