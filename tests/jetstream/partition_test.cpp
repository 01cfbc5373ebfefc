// Which partition a key belongs to: the server's FNV-1a hash of the subject token, and the
// reversible encoding of keys that are not one NATS token. The values are FNV-1a's published
// test vectors, not idem's own output; the scale-out test checks the mapping against a server.
// Then a group of two instances in this process against a real nats-server: partitions given up
// for balance, an instance stopped while its partitions run, its partitions taken over (the
// paths the sanitizer builds run here, in one process, with every thread visible).

#include <idem/sources/jetstream_partitions.hpp>
#include <idem/sources/jetstream_publish.hpp>

#include "../projections/fixtures.hpp"
#include "nats_fixture.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

TEST_SUITE("partitions") {

TEST_CASE("a token's partition is FNV-1a of its bytes modulo N") {
    constexpr std::uint32_t all = 0xFFFFFFFFu;  // modulo 2^32-1 leaves these hashes unchanged
    CHECK(idem::jetstream::partition_of_token("a", all) == 0xe40c292cu);
    CHECK(idem::jetstream::partition_of_token("foobar", all) == 0xbf9cf968u);
    CHECK(idem::jetstream::partition_of_token("foobar", 7) == 0xbf9cf968u % 7);
    CHECK(idem::jetstream::partition_of_token("anything", 1) == 0);
}

TEST_CASE("a key that is not one NATS token is encoded before it is hashed") {
    SUBCASE("dots, wildcards, spaces and percent") {
        CHECK(idem::jetstream::partition_of("a.b", 1000) == idem::jetstream::partition_of_token("a%2Eb", 1000));
        CHECK(idem::jetstream::partition_of("x *>", 1000) == idem::jetstream::partition_of_token("x%20%2A%3E", 1000));
        CHECK(idem::jetstream::partition_of("5%", 1000) == idem::jetstream::partition_of_token("5%25", 1000));
    }
    SUBCASE("an empty key is the token 'events', and the key 'events' is '%65vents'") {
        CHECK(idem::jetstream::partition_of("", 1000) == idem::jetstream::partition_of_token("events", 1000));
        CHECK(idem::jetstream::partition_of("events", 1000) == idem::jetstream::partition_of_token("%65vents", 1000));
    }
    SUBCASE("a plain key is hashed as it is") {
        CHECK(idem::jetstream::partition_of("order-42", 16) == idem::jetstream::partition_of_token("order-42", 16));
    }
}

TEST_CASE("every key's token decodes back to the key, and only tokens the encoding makes decode") {
    using idem::jetstream::subject_of_token;
    using idem::jetstream::subject_token;
    const std::vector<std::string> keys = {"",       "events", "Events",   "a.b",  "a..b", ".",     "*",
                                           ">",      "x *>",   "%",        "%41",  "5%",    "%65vents",
                                           " ",      "tab\t", "caf\xc3\xa9", "\x7f", "order-42", "{subject}"};
    for (const auto& k : keys) {
        CAPTURE(k);
        const auto t = subject_token(k);
        CHECK(!t.empty());
        CHECK(t.find_first_of(".*> \t") == std::string::npos);  // one NATS token
        for (char c : t) CHECK((static_cast<unsigned char>(c) >= 0x21 && static_cast<unsigned char>(c) <= 0x7E));
        CHECK(subject_of_token(t) == k);
    }
    std::set<std::string> tokens;
    for (const auto& k : keys) tokens.insert(subject_token(k));
    CHECK(tokens.size() == keys.size());  // no two keys share a token
    for (const char* bad : {"a.b", "%4", "%zz", "%41", "%2e", "a b", "*", ">", "%"}) {
        CAPTURE(bad);
        CHECK(!subject_of_token(bad));
    }
}

TEST_CASE("keys spread over every partition") {
    std::set<std::uint32_t> seen;
    for (int i = 0; i < 200; ++i) seen.insert(idem::jetstream::partition_of("order-" + std::to_string(i), 8));
    CHECK(seen.size() == 8);
}

}  // TEST_SUITE

using namespace idem_test;
using namespace std::chrono_literals;
namespace js = idem::jetstream;

namespace {

constexpr std::uint32_t group_partitions = 4;

// One instance of the group "grp" of stream ORD, run on its own thread from construction to
// stop(); its callbacks record the partitions it holds.
class instance {
public:
    instance(const nats_server& server, const std::filesystem::path& dir, const std::string& name) {
        js::partitioned_options po;
        po.source.servers = {server.url()};
        po.source.stream = "ORD";
        po.source.consumer = "grp";
        po.source.fetch_wait = 100ms;
        po.partitions = group_partitions;
        po.instance = name;
        po.db = dir / name;
        po.lease_ttl = 1s;
        po.engine.store = options(po.db);
        po.add_projections = [](idem::store& s) { s.add(totals_by_order()); };
        po.on_lease = [this](std::uint32_t k, bool owned, std::uint64_t, std::string_view) {
            std::scoped_lock lock{m_};
            if (owned) {
                held_.insert(k);
            } else {
                held_.erase(k);
            }
        };
        consumer_ = std::make_unique<js::partitioned_consumer>(po);
        thread_ = std::thread([this] {
            try {
                result_ = consumer_->run();
            } catch (...) {
                error_ = std::current_exception();
            }
        });
    }
    ~instance() {
        consumer_->stop();
        if (thread_.joinable()) thread_.join();
    }
    instance(const instance&) = delete;
    instance& operator=(const instance&) = delete;

    std::set<std::uint32_t> held() const {
        std::scoped_lock lock{m_};
        return held_;
    }
    // Stops the instance and returns what its run did (rethrows its failure).
    js::partitioned_result stop() {
        consumer_->stop();
        thread_.join();
        if (error_) std::rethrow_exception(error_);
        return result_;
    }

private:
    mutable std::mutex m_;
    std::set<std::uint32_t> held_;
    std::unique_ptr<js::partitioned_consumer> consumer_;
    std::thread thread_;
    js::partitioned_result result_;
    std::exception_ptr error_;
};

template <class Done>
void wait_until(Done done, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!done()) {
        if (std::chrono::steady_clock::now() > deadline) FAIL("still waiting for " << what);
        std::this_thread::sleep_for(50ms);
    }
}

// Publishes lines over a dozen orders to ORD.<partition>.<order>, as the servers' mapping would.
struct group_stream {
    publisher pub;
    reference ref;
    std::map<std::uint32_t, std::uint64_t> last;  // partition -> its last stream sequence
    int published = 0;

    explicit group_stream(const nats_server& server) : pub(server.url(), "ORD") {}
    void publish(int n) {
        for (int end = published + n; published < end; ++published) {
            const auto order = "o" + std::to_string(published % 12);
            const auto k = js::partition_of(order, group_partitions);
            const auto subject = std::to_string(k) + "." + js::subject_token(order);
            last[k] = pub.publish(line("ev-" + std::to_string(published), order, published).to_json(),
                                  "m-" + std::to_string(published), subject);
            ref.add(order, published);
        }
    }
    // Whether instance `name` holds every partition with a published checkpoint at its last sequence.
    bool caught_up_by(const nats_server& server, const std::string& name) const {
        auto owners = js::read_owners({server.url()}, "grp");
        if (owners.size() != group_partitions) return false;
        for (const auto& o : owners) {
            const auto end = last.find(o.partition);
            if (o.instance != name || o.checkpoint < (end == last.end() ? 0 : end->second)) return false;
        }
        return true;
    }
};

std::map<std::string, row_summary> dump_partitions(const std::filesystem::path& db, const std::vector<std::uint32_t>& ks) {
    std::map<std::string, row_summary> rows;
    for (auto k : ks) rows.merge(dump(idem::snapshot::open(db / js::partition_directory(k)), "order-totals"));
    return rows;
}

}  // namespace

TEST_SUITE("partitioned group") {

TEST_CASE("partitions given up for balance and by a stopping instance are taken over, and the rows are whole") {
    temp_dir dir;
    nats_server server{dir.path() / "nats"};
    group_stream stream{server};
    stream.publish(120);

    instance a{server, dir.path(), "a"};
    wait_until([&] { return a.held().size() == group_partitions; }, "a to hold every partition");
    std::optional<instance> b;
    b.emplace(server, dir.path(), "b");
    // a gives partitions up for balance while they run; b takes them.
    wait_until([&] { return !b->held().empty(); }, "b to take a partition a gave up");
    // b stops while its partitions run: each is stopped, acked and given up.
    auto rb = b->stop();
    b.reset();
    CHECK(rb.taken >= 1);
    CHECK(!rb.owned_at_stop.empty());
    wait_until([&] { return a.held().size() == group_partitions; }, "a to take b's partitions over");
    stream.publish(60);
    wait_until([&] { return stream.caught_up_by(server, "a"); }, "a to apply every partition to its end");

    auto ra = a.stop();
    CHECK(ra.given_up >= 1);
    CHECK(ra.owned_at_stop == std::vector<std::uint32_t>{0, 1, 2, 3});
    CHECK(dump_partitions(dir.path() / "a", ra.owned_at_stop) == stream.ref.rows);
    for (const auto& o : js::read_owners({server.url()}, "grp")) CHECK(o.instance.empty());  // every lease given up
}

}  // TEST_SUITE
