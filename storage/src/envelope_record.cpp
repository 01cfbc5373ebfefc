// The parsed attributes a binary log record carries beside its body (envelope_record.hpp).

#include <idem/storage/envelope_record.hpp>

namespace idem {
namespace {

enum attribute_flag : std::uint8_t {
    has_sequence = 1,
    binary_data = 2,
};

void put_u64(std::string& out, std::uint64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(static_cast<unsigned char>(v >> (8 * i)));
    out.append(b, 8);
}

// LEB128: seven bits a byte, low first, the high bit set on all but the last.
void put_varint(std::string& out, std::uint64_t v) {
    while (v >= 0x80) {
        out.push_back(static_cast<char>(static_cast<unsigned char>(v | 0x80)));
        v >>= 7;
    }
    out.push_back(static_cast<char>(static_cast<unsigned char>(v)));
}

// A string the body holds verbatim (most attributes: their JSON has no escapes) is its range
// of the body, as any occurrence of the same bytes serves: offset + 1, length. Another is
// stored: 0, length, bytes.
void put_string(std::string& out, std::string_view body, std::string_view s) {
    const auto at = s.empty() ? 0 : body.find(s);
    if (at != std::string_view::npos) {
        put_varint(out, at + 1);
        put_varint(out, s.size());
    } else {
        put_varint(out, 0);
        put_varint(out, s.size());
        out.append(s);
    }
}

// Reads the fields in order; any read past the end, or out of the body, leaves ok false.
struct fields {
    std::string_view rest;
    std::string_view body;
    bool ok = true;

    std::uint8_t byte() {
        if (rest.empty()) {
            ok = false;
            return 0;
        }
        const auto b = static_cast<std::uint8_t>(rest.front());
        rest.remove_prefix(1);
        return b;
    }
    std::uint64_t u64() {
        if (rest.size() < 8) {
            ok = false;
            return 0;
        }
        std::uint64_t v = 0;
        for (std::size_t i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(rest[i])} << (8 * i);
        rest.remove_prefix(8);
        return v;
    }
    std::uint64_t varint() {
        std::uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            const auto b = byte();
            if (!ok) return 0;
            v |= std::uint64_t{b & 0x7Fu} << shift;
            if ((b & 0x80) == 0) return v;
        }
        ok = false;  // longer than a u64
        return 0;
    }
    std::string_view string() {
        const auto at = varint();
        const auto n = varint();
        if (!ok) return {};
        if (at != 0) {
            if (at - 1 > body.size() || n > body.size() - (at - 1)) {
                ok = false;
                return {};
            }
            return body.substr(at - 1, n);
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
    if (ev.sequence) put_varint(out, *ev.sequence);
    for (const std::string* s : {&ev.id, &ev.source, &ev.type, &ev.subject, &ev.time, &ev.msgid, &ev.datacontenttype,
                                 &ev.dataschema, &ev.data}) {
        put_string(out, body, *s);
    }
}

bool decode_envelope_attributes(std::string_view attributes, std::string_view body, envelope& out,
                                std::uint64_t& fingerprint) {
    fields in{attributes, body};
    if (in.byte() != envelope_rules_revision || !in.ok) return false;
    const auto flags = in.byte();
    if ((flags & ~(has_sequence | binary_data)) != 0) return false;
    fingerprint = in.u64();
    if ((flags & has_sequence) != 0) {
        out.sequence = in.varint();
    } else {
        out.sequence.reset();
    }
    for (std::string* s : {&out.id, &out.source, &out.type, &out.subject, &out.time, &out.msgid, &out.datacontenttype,
                           &out.dataschema, &out.data}) {
        s->assign(in.string());
    }
    out.data_binary = (flags & binary_data) != 0;
    return in.ok && in.rest.empty();
}

}  // namespace idem
