#pragma once

// What generate() (gen.cpp) needs of a domain, and what it shares with each domain's
// generator (trading_gen.cpp, orders_gen.cpp, game_gen.cpp).
//
// gen.cpp owns everything domain-neutral: the random stream, the ids, sequences and times,
// the defect mixing (redeliveries, republished and reissued copies, late events, defect
// lines), the envelope around each event, and the model of the store's inbox, streams and
// effect keys. A domain says what its events are, how they read, and what its rows become
// when one is applied.

#include <idem/examples/gen.hpp>

#include <array>
#include <charconv>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace idem::examples::detail {

// xoshiro256** seeded through splitmix64: the same numbers for a seed on every platform
// (the standard distributions are not specified bit for bit).
class random_bits {
public:
    explicit random_bits(std::uint64_t seed) {
        for (auto& s : s_) {
            seed += 0x9E3779B97F4A7C15ull;
            std::uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            s = z ^ (z >> 31);
        }
    }
    std::uint64_t next() {
        const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const std::uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }
    // The modulo bias is below 2^-40 for the small ranges used here.
    std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
    std::int64_t between(std::int64_t lo, std::int64_t hi) {
        return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
    }
    // Always draws, so the stream does not depend on p.
    bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }

private:
    static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    std::array<std::uint64_t, 4> s_{};
};

enum class op : std::uint8_t { fill, line, score, grant, consume };
constexpr std::uint8_t no_flaw = 0xFF;

// One line as the generator decided it; the text is rendered from it, so a copy is
// re-rendered rather than kept.
struct line_spec {
    std::uint64_t event = 0;  // the id's number, unique in the log
    std::uint64_t msgid = 0;  // 0: no msgid attribute
    std::uint64_t exec = 0;   // trading: the exec_id's number
    std::uint64_t seq = 0;    // 0: no sequence attribute
    std::uint64_t time_us = 0;
    std::int64_t amount = 0;  // fill: signed qty; line: amount; score: points; items: count
    std::int64_t price = 0;   // fill: ticks
    std::uint32_t row = 0;    // position, order or player: the subject's stream
    std::uint32_t item = 0;   // items: index into the catalog
    op what = op::fill;
    std::uint8_t flaw = no_flaw;  // a defect, as its enum value
    bool reissued = false;
};

inline bool has_flaw(const line_spec& s, defect d) { return s.flaw == static_cast<std::uint8_t>(d); }

inline void append_uint(std::string& out, std::uint64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
}

inline void append_int(std::string& out, std::int64_t v) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, end);
}

/// The text of a line being rendered, with the pieces every domain's data is made of.
struct line_text {
    std::string& text;
    const std::string& key_prefix;

    /// Appends ,"name":"value".
    void attribute(const char* name, std::string_view value) {
        text.append(",\"").append(name).append("\":\"").append(value).push_back('"');
    }
    /// Appends ,"name":v, or "x" in place of the number for an undecodable line.
    void number_field(const char* name, std::int64_t v, const line_spec& s) {
        text.append(",\"").append(name).append("\":");
        if (has_flaw(s, defect::undecodable)) {
            text.append("\"x\"");
        } else {
            append_int(text, v);
        }
    }
    /// Appends what makes an aggregate key bad (key_too_long, invalid_utf8), if s has it.
    void key_flaws(const line_spec& s);
};

/// The effect key a store checks for an event: from the payload (trading's exec_id) or the
/// event's own id; the model keeps one set of each.
struct effect_key {
    bool from_payload = false;
    std::uint64_t id = 0;
};

/// One example domain as generate() sees it.
class domain_gen {
public:
    virtual ~domain_gen() = default;

    /// Returns the rows (streams) events are spread over: positions, orders or players.
    virtual std::size_t streams() const = 0;
    /// Returns whether lines of defect kind d can be made for this domain.
    virtual bool makes(defect d) const = 0;

    // --- generating --------------------------------------------------------

    /// Decides a fresh event of stream s.row (its op and payload).
    virtual void make_event(line_spec& s, random_bits& rng) = 0;
    /// Decides a defect line's op and payload (s.flaw is set).
    virtual void make_defect(line_spec& s, random_bits& rng) = 0;
    /// Returns whether s may be re-sent under a new event id with the same effect.
    virtual bool reissuable(const line_spec& s) const = 0;
    /// Adjusts such a copy (a drop copy reports a fill outside the venue's stream).
    virtual void reissue(line_spec& copy) const = 0;

    // --- rendering ---------------------------------------------------------

    /// Returns what an event id starts with ("fill-").
    virtual std::string_view id_prefix(const line_spec& s) const = 0;
    /// Returns the event's source (may be built in scratch).
    virtual std::string_view source(const line_spec& s, std::string& scratch) const = 0;
    /// Returns the event's type (one no projection handles for an unknown_type line).
    virtual std::string_view type(const line_spec& s) const = 0;
    /// Appends the subject's text (without quotes).
    virtual void append_subject(line_text& t, const line_spec& s) const = 0;
    /// Appends the data object's members (without braces).
    virtual void append_data(line_text& t, const line_spec& s) const = 0;

    // --- the store's rows --------------------------------------------------

    /// Returns the effect key of s.
    virtual effect_key effect(const line_spec& s) const = 0;
    /// Applies s to its rows as the projection's handler would; returns false or throws if the
    /// handler refuses it (the rows are then unchanged).
    virtual bool apply(const line_spec& s) = 0;
    /// Returns the domain totals, as domain_totals() reads them from the rows.
    virtual std::string totals() const = 0;
};

/// Returns the domain o.domain names; throws std::invalid_argument for another.
/// rng is the generator's stream: a domain may draw from it while it sets up.
std::unique_ptr<domain_gen> make_domain_gen(const gen_options& o, random_bits& rng);

std::unique_ptr<domain_gen> trading_gen(const gen_options& o, random_bits& rng);
std::unique_ptr<domain_gen> orders_gen(const gen_options& o, random_bits& rng);
std::unique_ptr<domain_gen> game_gen(const gen_options& o, random_bits& rng);

}  // namespace idem::examples::detail
