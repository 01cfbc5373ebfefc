#include <idem/storage/canonical.hpp>

#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace idem {
namespace {

bool digits(std::string_view s, std::size_t at, std::size_t n, int& out) noexcept {
    if (at + n > s.size()) return false;
    int v = 0;
    for (std::size_t i = at; i < at + n; ++i) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    out = v;
    return true;
}

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
std::int64_t days_from_civil(int y, int m, int d) noexcept {
    y -= m <= 2 ? 1 : 0;
    const int era = (y >= 0 ? y : y - 399) / 400;
    const int yoe = y - era * 400;
    const int doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return static_cast<std::int64_t>(era) * 146097 + doe - 719468;
}

// FNV-1a over the canonical text, finished with a 64-bit mix.
struct hasher {
    std::uint64_t h = 14695981039346656037ull;
    void bytes(std::string_view s) noexcept {
        for (char c : s) {
            h ^= static_cast<unsigned char>(c);
            h *= 1099511628211ull;
        }
    }
    void tag(char t) noexcept { bytes(std::string_view(&t, 1)); }
    void u64(std::uint64_t v) noexcept {
        char b[8];
        std::memcpy(b, &v, 8);
        bytes(std::string_view(b, 8));
    }
    void str(std::string_view s) noexcept {  // length-prefixed: no two sequences of strings collide by concatenation
        u64(s.size());
        bytes(s);
    }
    std::uint64_t done() const noexcept {
        auto x = h;
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ull;
        x ^= x >> 33;
        return x == 0 ? 1 : x;
    }
};

void hash_number(hasher& h, double v) {
    if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 9.2e18) {
        h.tag('i');
        h.u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
    } else {
        h.tag('d');
        std::uint64_t bits;
        std::memcpy(&bits, &v, 8);
        h.u64(bits);
    }
}

void hash_value(hasher& h, simdjson::dom::element e) {
    using simdjson::dom::element_type;
    switch (e.type()) {
    case element_type::OBJECT: {
        std::vector<std::pair<std::string_view, simdjson::dom::element>> members;
        for (auto field : simdjson::dom::object(e)) members.emplace_back(field.key, field.value);
        std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        h.tag('{');
        h.u64(members.size());
        for (const auto& [k, v] : members) {
            h.str(k);
            hash_value(h, v);
        }
        return;
    }
    case element_type::ARRAY: {
        h.tag('[');
        auto array = simdjson::dom::array(e);
        h.u64(array.size());
        for (auto v : array) hash_value(h, v);
        return;
    }
    case element_type::STRING:
        h.tag('s');
        h.str(std::string_view(e));
        return;
    case element_type::INT64: {
        auto v = std::int64_t(e);
        if (v >= -(std::int64_t{1} << 53) && v <= (std::int64_t{1} << 53)) {
            hash_number(h, static_cast<double>(v));
        } else {
            h.tag('i');
            h.u64(static_cast<std::uint64_t>(v));
        }
        return;
    }
    case element_type::UINT64: {
        auto v = std::uint64_t(e);
        h.tag(v <= static_cast<std::uint64_t>(INT64_MAX) ? 'i' : 'u');
        h.u64(v);
        return;
    }
    case element_type::DOUBLE: hash_number(h, double(e)); return;
    case element_type::BOOL: h.tag(bool(e) ? 't' : 'f'); return;
    case element_type::NULL_VALUE: h.tag('n'); return;
    }
}

}  // namespace

std::optional<std::uint64_t> parse_event_time(std::string_view s) noexcept {
    // YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM), 't' accepted for 'T', 'z' for 'Z' (RFC 3339).
    int year, month, day, hour, minute, second;
    if (s.size() < 20 || !digits(s, 0, 4, year) || s[4] != '-' || !digits(s, 5, 2, month) || s[7] != '-' ||
        !digits(s, 8, 2, day) || (s[10] != 'T' && s[10] != 't') || !digits(s, 11, 2, hour) ||
        s[13] != ':' || !digits(s, 14, 2, minute) || s[16] != ':' || !digits(s, 17, 2, second)) {
        return std::nullopt;
    }
    static constexpr int month_days[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (month < 1 || month > 12 || day < 1 || day > month_days[month - 1] || hour > 23 || minute > 59 ||
        second > 60) {
        return std::nullopt;
    }
    if (month == 2 && day == 29 && !(year % 4 == 0 && (year % 100 != 0 || year % 400 == 0))) return std::nullopt;
    std::size_t i = 19;
    std::uint64_t fraction_ns = 0;
    if (i < s.size() && s[i] == '.') {
        ++i;
        std::size_t n = 0;
        std::uint64_t scale = 100000000;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
            if (n < 9) fraction_ns += static_cast<std::uint64_t>(s[i] - '0') * scale;
            scale /= 10;
            ++n;
            ++i;
        }
        if (n == 0) return std::nullopt;
    }
    std::int64_t offset_s = 0;
    if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
        ++i;
    } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
        int oh, om;
        if (!digits(s, i + 1, 2, oh) || i + 3 >= s.size() || s[i + 3] != ':' || !digits(s, i + 4, 2, om) || oh > 23 ||
            om > 59) {
            return std::nullopt;
        }
        offset_s = (s[i] == '+' ? 1 : -1) * (oh * 3600 + om * 60);
        i += 6;
    } else {
        return std::nullopt;
    }
    if (i != s.size()) return std::nullopt;
    auto seconds = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset_s;
    if (seconds < 0 || seconds > 18'000'000'000) return std::nullopt;  // before 1970 or past 2540
    return static_cast<std::uint64_t>(seconds) * 1'000'000'000 + fraction_ns;
}

std::uint64_t fingerprint(const envelope& ev) {
    hasher h;
    h.str(ev.id);
    h.str(ev.source);
    h.str(ev.type);
    h.str(ev.subject);
    h.u64(ev.sequence.value_or(0));
    if (auto t = parse_event_time(ev.time)) {
        h.tag('T');
        h.u64(*t);
    } else {
        h.tag('t');
        h.str(ev.time);
    }
    if (ev.data_binary) {
        h.tag('B');  // bytes of data_base64 that are not JSON; JSON ones were decoded into data
        h.str(ev.data);
        return h.done();
    }
    thread_local simdjson::dom::parser parser;
    auto doc = parser.parse(ev.data.data(), ev.data.size(), true);
    if (doc.error() != simdjson::SUCCESS) {
        h.tag('r');  // not JSON the parser takes: the bytes themselves
        h.str(ev.data);
    } else {
        hash_value(h, doc.value_unsafe());
    }
    return h.done();
}

std::uint64_t fingerprint_bytes(std::string_view body) noexcept {
    hasher h;
    h.tag('b');
    h.str(body);
    return h.done();
}

}  // namespace idem
