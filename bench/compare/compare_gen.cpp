// compare_gen: writes the workload of the side-by-side comparison as an event log and
// prints the state every variant must end with.
//
//   compare_gen --out DIR [--messages N] [--aggregates A] [--duplicates F] [--seed S]
//               [--prefix K] [--jsonl]
//
// N envelopes of order.line_added over A orders (integer amounts), each with a UUID-like
// transport message id in `msgid`; a share F of them are redeliveries (same msgid, same
// bytes) of an earlier message, at a random later position. It streams: message i is a
// pure function of (seed, i), so a redelivery regenerates its original instead of keeping
// it, and any N fits in constant memory. Writes DIR/workload.bin (and DIR/workload.jsonl
// with --jsonl); prints one `reference` line for the whole log and one for its first K
// records (the prefix the one-commit-per-message variants run).

#include "../workload.hpp"

#include <idem/storage/envelope.hpp>
#include <idem/storage/event_log.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <unordered_map>

[[noreturn]] void idem_bench::usage(const char* why) {
    std::fprintf(stderr,
                 "compare_gen: %s\n"
                 "usage: compare_gen --out DIR [--messages N] [--aggregates A] [--duplicates F] [--seed S]\n"
                 "                   [--prefix K] [--jsonl]\n",
                 why);
    std::exit(2);
}

namespace {

using idem_bench::parse_number;

std::uint64_t splitmix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

struct gen_options {
    std::uint64_t messages = 1'000'000;
    std::uint64_t aggregates = 100'000;
    double duplicates = 0.10;
    std::uint64_t seed = 42;
    std::uint64_t prefix = 0;
    std::filesystem::path out{};
    bool jsonl = false;
};

// Message i: its order, amount and message id, derived from (seed, i) only.
class messages {
public:
    explicit messages(const gen_options& o) : o_(o) {}

    std::string body(std::uint64_t i, std::string& order, std::int64_t& amount) const {
        const std::uint64_t base = splitmix(o_.seed ^ splitmix(i));
        order = "order-" + std::to_string(splitmix(base + 1) % o_.aggregates);
        amount = static_cast<std::int64_t>(splitmix(base + 2) % 10'000) + 1;
        idem::envelope e;
        e.id = "line-" + std::to_string(i);
        e.source = "/orders";
        e.type = "order.line_added";
        e.msgid = uuid(splitmix(base + 3), splitmix(base + 4));
        e.data = R"({"order_id":")" + order + R"(","amount":)" + std::to_string(amount) + "}";
        return e.to_json();
    }

private:
    // 8-4-4-4-12 lowercase hex with the version-4 and variant bits of a random UUID.
    static std::string uuid(std::uint64_t hi, std::uint64_t lo) {
        static constexpr char hex[] = "0123456789abcdef";
        hi = (hi & ~std::uint64_t{0xf000}) | 0x4000;
        lo = (lo & ~(std::uint64_t{3} << 62)) | (std::uint64_t{2} << 62);
        std::string s;
        s.reserve(36);
        for (int n = 0; n < 32; ++n) {
            if (n == 8 || n == 12 || n == 16 || n == 20) s.push_back('-');
            const std::uint64_t word = n < 16 ? hi : lo;
            s.push_back(hex[(word >> (60 - 4 * (n % 16))) & 0xf]);
        }
        return s;
    }

    const gen_options& o_;
};

void print_reference(std::uint64_t limit, std::uint64_t written, std::uint64_t distinct,
                     const std::unordered_map<std::string, idem_bench::totals>& rows) {
    auto s = idem_bench::summarize({rows.begin(), rows.end()});
    std::printf("reference limit=%llu messages=%llu distinct=%llu rows=%zu sum_total=%lld sum_lines=%lld digest=%llu\n",
                static_cast<unsigned long long>(limit), static_cast<unsigned long long>(written),
                static_cast<unsigned long long>(distinct), s.rows, static_cast<long long>(s.sum_total),
                static_cast<long long>(s.sum_lines), static_cast<unsigned long long>(s.digest));
}

gen_options parse_args(int argc, char** argv) {
    gen_options o;
    for (int i = 1; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--jsonl") {
            o.jsonl = true;
            continue;
        }
        if (arg == "--help" || arg == "-h") idem_bench::usage("the workload of the side-by-side comparison");
        if (i + 1 >= argc) idem_bench::usage(("missing value for " + std::string(arg)).c_str());
        std::string_view value = argv[++i];
        if (arg == "--messages") {
            o.messages = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--aggregates") {
            o.aggregates = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--duplicates") {
            o.duplicates = parse_number<double>(arg, value);
        } else if (arg == "--seed") {
            o.seed = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--prefix") {
            o.prefix = parse_number<std::uint64_t>(arg, value);
        } else if (arg == "--out") {
            o.out = std::string(value);
        } else {
            idem_bench::usage(("unknown option " + std::string(arg)).c_str());
        }
    }
    if (o.out.empty()) idem_bench::usage("--out is required");
    if (o.messages == 0 || o.aggregates == 0) idem_bench::usage("sizes must be positive");
    if (!(o.duplicates >= 0.0 && o.duplicates < 1.0)) idem_bench::usage("--duplicates must be in [0, 1)");
    return o;
}

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse_args(argc, argv);
    try {
        std::filesystem::create_directories(o.out);
        const auto bin = o.out / "workload.bin";
        const messages gen{o};
        std::mt19937_64 rng{o.seed};
        std::uint64_t redeliveries =
            static_cast<std::uint64_t>(static_cast<double>(o.messages) * o.duplicates + 0.5);
        if (redeliveries >= o.messages) idem_bench::usage("--duplicates leaves no distinct message");
        std::unordered_map<std::string, idem_bench::totals> rows;
        std::uint64_t originals = 0;
        std::string order;
        std::int64_t amount = 0;
        {
            idem::log_writer out{bin, idem::log_format::binary};
            for (std::uint64_t k = 0; k < o.messages; ++k) {
                // Exactly `redeliveries` of them: at each position a redelivery with probability
                // (redeliveries left) / (positions left), of a uniformly chosen earlier message.
                const std::uint64_t left = o.messages - k;
                const bool again = originals > 0 && rng() % left < redeliveries;
                if (again) {
                    --redeliveries;
                    out.write(gen.body(rng() % originals, order, amount));
                } else {
                    out.write(gen.body(originals++, order, amount));
                    auto& t = rows[order];
                    t.total += amount;
                    t.lines += 1;
                }
                if (k + 1 == o.prefix && o.prefix < o.messages) print_reference(o.prefix, k + 1, originals, rows);
            }
            out.sync();
        }
        print_reference(0, o.messages, originals, rows);
        if (o.jsonl) idem::convert_log(bin, o.out / "workload.jsonl", idem::log_format::jsonl);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "compare_gen: %s\n", e.what());
        return 1;
    }
}
