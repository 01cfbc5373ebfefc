// Event payload decoding, side by side: cereal's JSONInputArchive over an istream (the
// decoder idem used before) against idem::json_input_archive over simdjson (what
// detail::decode_event uses now), both into the trading example's `fill`.
//
//   decode_bench [--payloads N] [--runs R] [--seed S]
//
// Workload: N realistic `order.filled` payloads, generated up front, such as
// {"account":"acct-17","instrument":"ES","side":"buy","qty":3,"price":501250,"exec_id":"x-123456"}.
// Each run decodes all of them once per decoder (the runs alternate the two); both must
// decode every payload to the same fill. Prints the median ns per payload and the ratio.
// Then the step before it: idem::envelope_parser over the whole CloudEvent around each
// payload (attributes checked, `data` validated and kept), median ns per event.

#include <idem/examples/trading.hpp>
#include <idem/projections/projection.hpp>
#include <idem/storage/envelope.hpp>

#include <cereal/archives/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <istream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using idem::examples::fill;

struct bench_options {
    std::size_t payloads = 1'000'000;
    std::size_t runs = 3;
    std::uint64_t seed = 7;
};

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr, "decode_bench: %s\nusage: decode_bench [--payloads N] [--runs R] [--seed S]\n", why);
    std::exit(2);
}

bench_options parse_args(int argc, char** argv) {
    bench_options o;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (i + 1 >= argc) usage("missing value");
        const auto value = std::strtoull(argv[++i], nullptr, 10);
        if (arg == "--payloads") {
            o.payloads = value;
        } else if (arg == "--runs") {
            o.runs = value;
        } else if (arg == "--seed") {
            o.seed = value;
        } else {
            usage("unknown option");
        }
    }
    if (o.payloads == 0 || o.runs == 0) usage("--payloads and --runs must be positive");
    return o;
}

std::vector<std::string> make_payloads(const bench_options& o) {
    static constexpr std::array<const char*, 8> instruments{"ES", "NQ", "CL", "GC", "ZN", "6E", "AAPL", "MSFT"};
    std::mt19937_64 rng{o.seed};
    std::vector<std::string> out;
    out.reserve(o.payloads);
    for (std::size_t i = 0; i < o.payloads; ++i) {
        std::string p = "{\"account\":\"acct-" + std::to_string(rng() % 1000) + "\",\"instrument\":\"" +
                        instruments[rng() % instruments.size()] + "\",\"side\":\"" + (rng() % 2 ? "buy" : "sell") +
                        "\",\"qty\":" + std::to_string(1 + rng() % 100) +
                        ",\"price\":" + std::to_string(490'000 + rng() % 20'000) + ",\"exec_id\":\"x-" +
                        std::to_string(100'000 + i) + "\"}";
        out.push_back(std::move(p));
    }
    return out;
}

// The decoder detail::decode_event used before json_input_archive: cereal's JSON archive
// over a streambuf viewing the payload.
std::shared_ptr<const void> decode_cereal(std::string_view data) {
    auto event = std::make_shared<fill>();
    idem::detail::view_buf buf{data};
    std::istream in{&buf};
    cereal::JSONInputArchive archive{in};
    event->serialize(archive);
    return event;
}

std::shared_ptr<const void> decode_simdjson(std::string_view data) {
    return idem::detail::decode_event<fill>(data);
}

using decoder = std::shared_ptr<const void> (*)(std::string_view);

// Decodes every payload once; returns ns per payload. The checksum keeps the work observable.
double run(decoder decode, const std::vector<std::string>& payloads, std::uint64_t& checksum) {
    const auto start = std::chrono::steady_clock::now();
    for (const auto& p : payloads) {
        const auto event = decode(p);
        const auto& f = *static_cast<const fill*>(event.get());
        checksum += static_cast<std::uint64_t>(f.qty + f.price) + f.exec_id.size() + f.account.size();
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    return took.count() / static_cast<double>(payloads.size());
}

bool same(const fill& a, const fill& b) {
    return a.account == b.account && a.instrument == b.instrument && a.side == b.side && a.qty == b.qty &&
           a.price == b.price && a.exec_id == b.exec_id;
}

// The CloudEvent a venue would publish around payload i.
std::string make_envelope(const std::string& payload, std::size_t i) {
    return R"({"specversion":"1.0","id":"fill-)" + std::to_string(i) +
           R"(","source":"/venue/x","type":"order.filled","subject":"acct-)" + std::to_string(i % 1000) +
           R"(","sequence":")" + std::to_string(1 + i / 1000) +
           R"(","time":"2026-12-02T09:30:00.000000Z","datacontenttype":"application/json","data":)" + payload + "}";
}

// Parses every envelope once; returns ns per envelope.
double run_envelopes(const std::vector<std::string>& envelopes, std::uint64_t& checksum) {
    idem::envelope_parser parser;
    idem::envelope ev;
    idem::parse_error err;
    const auto start = std::chrono::steady_clock::now();
    for (const auto& e : envelopes) {
        if (!parser.parse(e, ev, err)) {
            std::fprintf(stderr, "decode_bench: envelope refused: %s\n", err.detail.c_str());
            std::exit(1);
        }
        checksum += ev.id.size() + ev.data.size() + ev.sequence.value_or(0);
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    return took.count() / static_cast<double>(envelopes.size());
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const auto o = parse_args(argc, argv);
    const auto payloads = make_payloads(o);
    std::size_t bytes = 0;
    for (const auto& p : payloads) bytes += p.size();

    for (const auto& p : payloads) {
        const auto a = decode_cereal(p);
        const auto b = decode_simdjson(p);
        if (!same(*static_cast<const fill*>(a.get()), *static_cast<const fill*>(b.get()))) {
            std::fprintf(stderr, "decode_bench: the decoders disagree on %s\n", p.c_str());
            return 1;
        }
    }

    std::vector<double> cereal_ns;
    std::vector<double> simdjson_ns;
    std::uint64_t sum_cereal = 0;
    std::uint64_t sum_simdjson = 0;
    for (std::size_t r = 0; r < o.runs; ++r) {
        cereal_ns.push_back(run(&decode_cereal, payloads, sum_cereal));
        simdjson_ns.push_back(run(&decode_simdjson, payloads, sum_simdjson));
        std::fprintf(stderr, "run %zu: cereal %.1f ns/payload, simdjson %.1f ns/payload\n", r + 1, cereal_ns.back(),
                     simdjson_ns.back());
    }
    if (sum_cereal != sum_simdjson) {
        std::fprintf(stderr, "decode_bench: checksums differ\n");
        return 1;
    }

    const double before = median(cereal_ns);
    const double after = median(simdjson_ns);
    std::printf("%zu fill payloads, %.1f bytes each, median of %zu runs\n", payloads.size(),
                static_cast<double>(bytes) / static_cast<double>(payloads.size()), o.runs);
    std::printf("%-34s %10s\n", "decoder", "ns/payload");
    std::printf("%-34s %10.1f\n", "cereal::JSONInputArchive (istream)", before);
    std::printf("%-34s %10.1f\n", "idem::json_input_archive (simdjson)", after);
    std::printf("speed-up: %.2fx\n", before / after);

    std::vector<std::string> envelopes;
    envelopes.reserve(payloads.size());
    std::size_t envelope_bytes = 0;
    for (std::size_t i = 0; i < payloads.size(); ++i) {
        envelopes.push_back(make_envelope(payloads[i], i));
        envelope_bytes += envelopes.back().size();
    }
    std::vector<double> envelope_ns;
    std::uint64_t sum_envelopes = 0;
    for (std::size_t r = 0; r < o.runs; ++r) {
        envelope_ns.push_back(run_envelopes(envelopes, sum_envelopes));
        std::fprintf(stderr, "run %zu: envelope_parser %.1f ns/event\n", r + 1, envelope_ns.back());
    }
    std::printf("%zu envelopes, %.1f bytes each\n", envelopes.size(),
                static_cast<double>(envelope_bytes) / static_cast<double>(envelopes.size()));
    std::printf("%-34s %10.1f ns/event\n", "idem::envelope_parser", median(envelope_ns));
    return 0;
}
