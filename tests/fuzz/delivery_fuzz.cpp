// Fuzzes the apply path with the example domains' projections: each line of the input is
// one delivery (so sequences, gaps, parking and release happen within a batch), applied in
// one batch through store::prepare and store::apply. Bad input must come out as outcomes,
// never as a crash or an exception: every delivery gets one outcome, a dead letter has a
// reason and a detail, and the same batch delivered again under the same transport ids is
// all duplicate_message.

#include <idem/examples/domains.hpp>
#include <idem/projections/store.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace {

namespace fs = std::filesystem;

void require(bool ok, const char* what, std::string_view input) {
    if (ok) return;
    std::fprintf(stderr, "delivery_fuzz: invariant broken: %s\ninput (%zu bytes): %.*s\n", what, input.size(),
                 static_cast<int>(input.size()), input.data());
    std::abort();
}

// One store, replaced by a fresh one every few thousand inputs so the environment stays small.
class fixture {
public:
    fixture() {
        const char* shm = "/dev/shm";
        path_ = (fs::exists(shm) ? fs::path(shm) : fs::temp_directory_path()) /
                ("idem-delivery-fuzz-" + std::to_string(::getpid()));
        fresh();
    }
    ~fixture() {
        store_.reset();
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    idem::store& store() {
        if (++uses_ % 2000 == 0) fresh();
        return *store_;
    }
    std::uint64_t next_id() { return ++ids_; }

private:
    void fresh() {
        store_.reset();
        std::error_code ec;
        fs::remove_all(path_, ec);
        // The command line's consumer: unknown types are dead letters; a small size limit so too_large is reachable.
        store_ = std::make_unique<idem::store>(idem::store_options{
            .path = path_,
            .consumer = "fuzz",
            .sync = idem::durability::none,
            .unknown_types = idem::unknown_type_policy::dead_letter,
            .max_event_bytes = 1024,
        });
        idem::examples::add_all(*store_);
    }

    fs::path path_;
    std::unique_ptr<idem::store> store_;
    std::uint64_t uses_ = 0;
    std::uint64_t ids_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    static fixture f;
    const std::string_view input(reinterpret_cast<const char*>(data), size);
    auto& store = f.store();

    std::vector<idem::delivery> batch;
    std::size_t start = 0;
    while (start <= input.size() && batch.size() < 64) {
        auto end = input.find('\n', start);
        if (end == std::string_view::npos) end = input.size();
        batch.push_back({std::string(input.substr(start, end - start)), "t" + std::to_string(f.next_id())});
        start = end + 1;
    }

    const auto outcomes = store.apply(batch);
    require(outcomes.size() == batch.size(), "not one outcome per delivery", input);
    for (const auto& o : outcomes) {
        const bool dead = o.kind == idem::outcome_kind::dead_lettered;
        require(dead == (o.why != idem::reason::none), "a dead letter without a reason, or a reason without one",
                input);
        require(!dead || !o.detail.empty(), "a dead letter without a detail", input);
        require(idem::to_string(o.kind) != "unknown" && idem::to_string(o.why) != "unknown", "an unnamed outcome",
                input);
    }

    const auto again = store.apply(batch);
    require(again.size() == batch.size(), "not one outcome per redelivery", input);
    for (const auto& o : again) {
        require(o.kind == idem::outcome_kind::duplicate_message, "a redelivery that is not duplicate_message", input);
    }
    return 0;
}
