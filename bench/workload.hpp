#pragma once

// What the benchmarks share: the order.line_added workload (the read model of
// examples/orders, UUID-like transport message ids, redeliveries placed at random later
// positions), the in-memory reference it must end with, the write counters of
// /proc/self/io, and the formatting of the reports.
//
// Each benchmark defines idem_bench::usage(), which prints its own usage and exits 2;
// the helpers here call it on bad input.

#include <idem/idem.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace idem_bench {

/// Prints why, then the benchmark's usage, and exits 2 (each benchmark defines it).
[[noreturn]] void usage(const char* why);

template <class T>
T parse_number(std::string_view name, std::string_view text) {
    T value{};
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size()) {
        usage(("bad value '" + std::string(text) + "' for " + std::string(name)).c_str());
    }
    return value;
}

// The event payload and read model of examples/orders, so idem runs its documented path.
struct line_added {
    static constexpr const char* event_type = "order.line_added";
    std::string order_id;
    std::int64_t amount = 0;
    template <class Archive>
    void serialize(Archive& ar) { ar(CEREAL_NVP(order_id), CEREAL_NVP(amount)); }
};

struct order_total {
    std::int64_t total = 0;
    std::int64_t lines = 0;
    template <class Archive>
    void serialize(Archive& ar) { ar(total, lines); }
};

/// The projection of examples/orders: one row per order, summing its lines.
inline idem::projection<order_total> order_totals_projection() {
    return idem::projection<order_total>("order-totals")
        .on<line_added>([](order_total& t, const line_added& e) {
            t.total += e.amount;
            t.lines += 1;
        })
        .key([](const line_added& e) { return e.order_id; });
}

// --- workload ----------------------------------------------------------------

struct totals {
    std::int64_t total = 0;
    std::int64_t lines = 0;
};

struct workload {
    std::vector<idem::delivery> deliveries;  // in delivery order, redeliveries included
    std::size_t distinct = 0;                // distinct messages (each one event)
    std::map<std::string, totals> expected;  // order_id -> totals of the distinct events
};

inline std::string uuid_text(std::mt19937_64& rng) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    out.reserve(36);
    std::uint64_t bits = rng();
    for (int i = 0; i < 32; ++i) {
        if (i == 16) bits = rng();
        if (i == 8 || i == 12 || i == 16 || i == 20) out.push_back('-');
        out.push_back(hex[bits & 0xFu]);
        bits >>= 4;
    }
    return out;
}

/// messages deliveries of order lines over aggregates orders, a fraction duplicates of
/// them redeliveries (same transport message id) of an earlier message.
inline workload generate(std::size_t messages, std::size_t aggregates, double duplicates, std::uint64_t seed) {
    workload w;
    std::mt19937_64 rng{seed};
    const auto redeliveries = static_cast<std::size_t>(static_cast<double>(messages) * duplicates + 0.5);
    if (redeliveries >= messages) usage("--duplicates leaves no distinct message");
    w.distinct = messages - redeliveries;

    std::vector<idem::delivery> originals;
    originals.reserve(w.distinct);
    for (std::size_t i = 0; i < w.distinct; ++i) {
        idem::envelope e;
        e.id = "line-" + std::to_string(i);
        e.source = "/orders";
        e.type = "order.line_added";
        std::string order = "order-" + std::to_string(rng() % aggregates);
        auto amount = static_cast<std::int64_t>(rng() % 10'000) + 1;
        e.data = R"({"order_id":")" + order + R"(","amount":)" + std::to_string(amount) + "}";
        auto& t = w.expected[order];
        t.total += amount;
        t.lines += 1;
        originals.push_back({e.to_json(), uuid_text(rng)});
    }

    // Each redelivery copies an earlier message and lands uniformly after it: sorting by
    // (slot, tie) puts original i at slot i and a copy of i at a random slot in (i, distinct].
    struct placed {
        std::uint64_t slot;
        std::uint64_t tie;
        std::size_t original;
    };
    std::vector<placed> order;
    order.reserve(messages);
    for (std::size_t i = 0; i < w.distinct; ++i) order.push_back({i, rng(), i});
    for (std::size_t d = 0; d < redeliveries; ++d) {
        std::size_t j = rng() % w.distinct;
        std::uint64_t slot = j + 1 + rng() % (w.distinct - j);
        order.push_back({slot, rng(), j});
    }
    std::sort(order.begin(), order.end(),
              [](const placed& a, const placed& b) { return std::pair{a.slot, a.tie} < std::pair{b.slot, b.tie}; });
    w.deliveries.reserve(messages);
    for (const auto& p : order) w.deliveries.push_back(originals[p.original]);
    return w;
}

// --- measurement ---------------------------------------------------------------

// The write counters of /proc/self/io. write_bytes is what the kernel charges this process
// for page-cache pages it dirtied (LMDB's pwrite + fdatasync per commit turns them into
// device writes); kernels with large page-cache folios charge a whole folio for a 4 KiB
// write, so wchar, the bytes handed to write syscalls, is kept as an exact cross-check.
// Both count every thread of the process (the engine's writer thread included).
struct io_counters {
    std::uint64_t write_bytes = 0;
    std::uint64_t wchar = 0;
};

inline io_counters read_io() {
    std::ifstream in{"/proc/self/io"};
    std::string line;
    io_counters c;
    bool found = false;
    auto value = [&](std::size_t skip) {
        std::string_view v = line;
        v.remove_prefix(std::min(v.size(), v.find_first_not_of(' ', skip)));
        return parse_number<std::uint64_t>("/proc/self/io", v);
    };
    while (std::getline(in, line)) {
        if (line.starts_with("write_bytes:")) {
            c.write_bytes = value(12);
            found = true;
        } else if (line.starts_with("wchar:")) {
            c.wchar = value(6);
        }
    }
    if (!found) throw std::runtime_error("/proc/self/io has no write_bytes line");
    return c;
}

// Bytes the block device holding path has written, from /sys/dev/block/<major>:<minor>/stat
// (sectors written, 512 bytes each): what reached the disk, the file system's journal
// included, from every process on the machine. nullopt where path is on no block device
// (tmpfs) or the counter cannot be read.
inline std::optional<std::uint64_t> device_bytes_written(const std::filesystem::path& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    std::ifstream in{"/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) +
                     "/stat"};
    std::uint64_t field = 0;
    for (int i = 0; i < 7 && (in >> field); ++i) {
    }
    if (!in) return std::nullopt;
    return field * 512;  // the 7th field: sectors written
}

// What a variant ended with, in a form both variants and the reference can produce.
struct summary {
    std::size_t rows = 0;
    std::int64_t sum_total = 0;
    std::int64_t sum_lines = 0;
    std::uint64_t digest = 0xcbf29ce484222325u;  // FNV-1a 64 over "key=total,lines;" in key order

    bool operator==(const summary&) const = default;
};

inline summary summarize(std::vector<std::pair<std::string, totals>> rows) {
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    summary s;
    auto mix = [&](std::string_view text) {
        for (char c : text) {
            s.digest ^= static_cast<unsigned char>(c);
            s.digest *= 0x100000001b3u;
        }
    };
    for (const auto& [key, t] : rows) {
        ++s.rows;
        s.sum_total += t.total;
        s.sum_lines += t.lines;
        mix(key);
        mix("=" + std::to_string(t.total) + "," + std::to_string(t.lines) + ";");
    }
    return s;
}

/// The summary the distinct events of w add up to.
inline summary reference(const workload& w) {
    return summarize(std::vector<std::pair<std::string, totals>>(w.expected.begin(), w.expected.end()));
}

/// The summary of the order-totals rows a snapshot holds.
inline summary read_summary(const idem::snapshot& snap) {
    std::vector<std::pair<std::string, totals>> rows;
    snap.scan<order_total>("order-totals", [&](const idem::row<order_total>& row) {
        rows.emplace_back(row.key, totals{row.state.total, row.state.lines});
    });
    return summarize(std::move(rows));
}

using clock_type = std::chrono::steady_clock;

// --- report ----------------------------------------------------------------------

inline std::string with_commas(std::uint64_t v) {
    std::string digits = std::to_string(v);
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i != 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
        out.push_back(digits[i]);
    }
    return out;
}

inline std::string fixed(double v, int decimals) {
    std::array<char, 64> buf{};
    std::snprintf(buf.data(), buf.size(), "%.*f", decimals, v);
    return buf.data();
}

/// The sample at q * (n - 1) in sorted order (the engine's rule for its distributions).
inline double percentile(std::vector<double>& v, double q) {
    if (v.empty()) return 0;
    auto i = static_cast<std::size_t>(q * static_cast<double>(v.size() - 1));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
    return v[i];
}

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    auto mid = v.size() / 2;
    return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

inline std::string describe(const summary& s) {
    return std::to_string(s.rows) + " rows, total " + std::to_string(s.sum_total) + ", lines " +
           std::to_string(s.sum_lines) + ", digest " + std::to_string(s.digest);
}

}  // namespace idem_bench
