// The chaos kit against the mistakes users make in projections: each buggy projection must be
// reported within the default number of schedules, with a short shrunk schedule that fails
// again, and its corrected version must pass.

#include <idem/testing.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <cstdlib>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

// --- events -------------------------------------------------------------------------------

// An order line on its own stream (subject = the order, sequenced).
struct line {
    std::string order_id;
    std::int64_t amount = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order_id), CEREAL_NVP(amount));
    }
};

// A fill of an order (stream: the order, unsequenced) on an account row that several orders feed.
struct fill {
    std::string account;
    std::string exec_id;
    std::int64_t qty = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(account), CEREAL_NVP(exec_id), CEREAL_NVP(qty));
    }
};

// A player's points (stream: the player, unsequenced) on a match row that several players feed.
// Sequenced streams would be guarded by their sequences even without effect keys.
struct score {
    std::string match;
    std::string score_id;
    std::int64_t points = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(match), CEREAL_NVP(score_id), CEREAL_NVP(points));
    }
};

// sequence 0: none (a source that does not number its streams, such as a webhook).
std::string envelope(const std::string& id, const std::string& type, const std::string& subject, int sequence,
                     const std::string& data) {
    return R"({"specversion":"1.0","id":")" + id + R"(","source":"/test","type":")" + type + R"(","subject":")" +
           subject + (sequence > 0 ? R"(","sequence":")" + std::to_string(sequence) : "") + R"(","data":)" + data + "}";
}

std::vector<std::string> lines() {
    std::vector<std::string> out;
    for (int o = 1; o <= 2; ++o) {
        for (int l = 1; l <= 3; ++l) {
            const auto order = "order-" + std::to_string(o);
            out.push_back(envelope("l" + std::to_string(o) + std::to_string(l), "line", order, l,
                                   R"({"order_id":")" + order + R"(","amount":)" + std::to_string(10 * l + o) + "}"));
        }
    }
    return out;
}

std::vector<std::string> fills() {
    std::vector<std::string> out;
    for (int o = 1; o <= 3; ++o) {
        for (int f = 1; f <= 2; ++f) {
            const auto exec = "x" + std::to_string(o) + std::to_string(f);
            out.push_back(
                envelope("f" + std::to_string(o) + std::to_string(f), "fill", "ord-" + std::to_string(o), 0,
                         R"({"account":"acct-1","exec_id":")" + exec + R"(","qty":)" + std::to_string(o * f) + "}"));
        }
    }
    return out;
}

std::vector<std::string> scores() {
    std::vector<std::string> out;
    for (int p = 1; p <= 3; ++p) {
        for (int s = 1; s <= 2; ++s) {
            const auto id = "s" + std::to_string(p) + std::to_string(s);
            out.push_back(
                envelope(id, "score", "player-" + std::to_string(p), 0,
                         R"({"match":"m1","score_id":"pts-)" + id + R"(","points":)" + std::to_string(p + s) + "}"));
        }
    }
    return out;
}

// --- states -------------------------------------------------------------------------------

struct total {
    std::int64_t sum = 0;
    std::int64_t count = 0;
    std::int64_t extra = 0;  // what the buggy handlers write beside the sum
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(sum), CEREAL_NVP(count), CEREAL_NVP(extra));
    }
};

// --- projections: correct ones and the mistakes -------------------------------------------

idem::projection<total> line_totals() {
    return idem::projection<total>("totals")
        .on<line>("line",
                  [](total& t, const line& l) {
                      t.sum += l.amount;
                      ++t.count;
                  })
        .key([](const line& l) { return l.order_id; });
}

idem::projection<total> stamped_line_totals() {
    return idem::projection<total>("totals")
        .on<line>("line",
                  [](total& t, const line& l) {
                      t.sum += l.amount;
                      t.extra =
                          std::chrono::system_clock::now().time_since_epoch().count();  // the mistake: the wall clock
                  })
        .key([](const line& l) { return l.order_id; });
}

idem::projection<total> random_line_totals() {
    return idem::projection<total>("totals")
        .on<line>("line",
                  [](total& t, const line& l) {
                      t.sum += l.amount;
                      t.extra = std::random_device{}();  // the mistake: a random number
                  })
        .key([](const line& l) { return l.order_id; });
}

idem::projection<total> counted_line_totals() {
    return idem::projection<total>("totals")
        .on<line>("line",
                  [](total& t, const line& l) {
                      static std::int64_t lines_seen = 0;  // the mistake: state outside the row
                      t.sum += l.amount;
                      t.extra = ++lines_seen;
                  })
        .key([](const line& l) { return l.order_id; });
}

idem::projection<total> paged_line_totals() {
    return idem::projection<total>("totals")
        .on<line>("line", [](total& t, const line& l) { t.sum += l.amount; })
        .key([](const line& l) {
            static int calls = 0;  // the mistake: the key depends on how often it was asked
            return l.order_id + "/page-" + std::to_string(calls++ / 4);
        });
}

idem::projection<total> positions(bool stable_effect_key) {
    auto p = idem::projection<total>("positions")
                 .on<fill>("fill",
                           [](total& t, const fill& f) {
                               t.sum += f.qty;
                               ++t.count;
                           })
                 .key([](const fill& f) { return f.account; });
    if (stable_effect_key) {
        p.effect_key([](const fill& f) { return f.exec_id; });
    } else {
        // The mistake: an id of the delivery, not of the business effect.
        p.effect_key([](const fill&, const idem::meta& m) { return std::string(m.id); });
    }
    return p;
}

idem::projection<total> match_points(bool with_effect_key) {
    auto p = idem::projection<total>("match-points")
                 .on<score>("score",
                            [](total& t, const score& s) {
                                t.sum += s.points;
                                ++t.count;
                            })
                 .key([](const score& s) { return s.match; });
    if (with_effect_key) p.effect_key([](const score& s) { return s.score_id; });
    return p;  // without: the mistake, an increment on a row many streams feed with no effect key
}

template <class State>
idem::testing::chaos_report run(idem::projection<State> p, const std::vector<std::string>& events,
                                idem::testing::chaos_options o = {}) {
    idem::testing::chaos kit{o};
    kit.add(std::move(p));
    return kit.run(events);
}

// A buggy projection: caught within the default schedules, shrunk to at most max_deliveries
// deliveries, confirmed by a second run of the shrunk schedule.
void check_caught(const idem::testing::chaos_report& r, std::size_t max_deliveries) {
    MESSAGE(r.explain());
    REQUIRE_FALSE(r.ok());
    CHECK(r.schedules <= idem::testing::chaos_options{}.schedules);
    CHECK(r.confirmed);
    CHECK(r.deliveries >= 1);
    CHECK(r.deliveries <= max_deliveries);
    CHECK(r.deliveries <= r.deliveries_before);
    CHECK(r.steps.size() <= r.steps_before);
    CHECK(r.explain().find("seed " + std::to_string(r.seed)) != std::string::npos);
}

}  // namespace

TEST_SUITE("chaos kit") {
    TEST_CASE("a handler that reads the wall clock is reported") {
        auto r = run(stamped_line_totals(), lines());
        check_caught(r, 1);
        CHECK(r.difference->expected_state != r.difference->actual_state);
    }

    TEST_CASE("a handler that draws a random number is reported") {
        check_caught(run(random_line_totals(), lines()), 1);
    }

    TEST_CASE("a handler with a side effect outside the row (a static counter) is reported") {
        check_caught(run(counted_line_totals(), lines()), 1);
    }

    TEST_CASE("a key function that depends on mutable state is reported") {
        check_caught(run(paged_line_totals(), lines()), 1);
    }

    TEST_CASE("an effect key that changes between deliveries of one effect is reported") {
        auto r = run(positions(false), fills());
        check_caught(r, 2);
        bool resent = false;
        for (const auto& s : r.steps) resent = resent || s.find("re-sent as new event id") != std::string::npos;
        CHECK(resent);
        CHECK(r.difference->projection == "positions");
        CHECK(r.difference->key == "acct-1");
    }

    TEST_CASE("a shrunk schedule names each delivery by its event id, source and envelope number") {
        // Envelopes that do not parse come first, so an event's position among the events that
        // parse is not its envelope's number: only the id, the source and that number find it.
        auto input = fills();
        input.insert(input.begin(), {"{not json", "[]"});
        auto r = run(positions(false), input);
        check_caught(r, 2);
        const std::regex named{R"(id (\S+) source (\S+) \(envelope (\d+): fill ord-\d\))"};
        std::size_t found = 0;
        for (const auto& s : r.steps) {
            for (std::sregex_iterator m{s.begin(), s.end(), named}, end; m != end; ++m) {
                ++found;
                const auto number = std::stoul((*m)[3].str());
                REQUIRE(number >= 1);
                REQUIRE(number <= input.size());
                const auto& text = input[number - 1];
                CHECK_MESSAGE(text.find(R"("id":")" + (*m)[1].str() + R"(")") != std::string::npos, s);
                CHECK_MESSAGE(text.find(R"("source":")" + (*m)[2].str() + R"(")") != std::string::npos, s);
                CHECK(r.explain().find((*m)[0].str()) != std::string::npos);
            }
        }
        CHECK(found == r.deliveries);
    }

    TEST_CASE("an increment without an effect key on a row several streams feed is reported") {
        auto r = run(match_points(false), scores());
        check_caught(r, 2);
        CHECK(r.difference->key == "m1");
        REQUIRE(r.difference->expected_version);
        REQUIRE(r.difference->actual_version);
        CHECK(*r.difference->actual_version > *r.difference->expected_version);
    }

    TEST_CASE("the corrected projections pass") {
        // IDEM_SOAK=1 runs the 1,000 schedules; the default keeps the CI run short.
        idem::testing::chaos_options o;
        o.schedules = std::getenv("IDEM_SOAK") != nullptr && std::string(std::getenv("IDEM_SOAK")) == "1" ? 1000 : 100;
        SUBCASE("pure handlers and a stable key") {
            auto r = run(line_totals(), lines(), o);
            CHECK_MESSAGE(r.ok(), r.explain());
            CHECK(r.schedules == o.schedules);
        }
        SUBCASE("an effect key from the payload") {
            auto r = run(positions(true), fills(), o);
            CHECK_MESSAGE(r.ok(), r.explain());
        }
        SUBCASE("a row fed by several streams, with an effect key") {
            auto r = run(match_points(true), scores(), o);
            CHECK_MESSAGE(r.ok(), r.explain());
        }
    }

    TEST_CASE("forked children killed with SIGKILL at the crash points leave the same rows") {
        idem::testing::chaos_options o;
        o.forked_crashes = true;
        o.schedules = 30;
        auto r = run(line_totals(), lines(), o);
        CHECK_MESSAGE(r.ok(), r.explain());
        // The schedules name kills at every point, and each of those children died by SIGKILL
        // at its point (a child whose point is not reached would finish instead).
        idem::testing::chaos kit{o};
        kit.add(line_totals());
        std::size_t planned = 0;
        std::set<std::string> points;
        for (std::uint64_t seed = 1; seed <= 30; ++seed) {
            for (const auto& s : kit.schedule(lines(), seed)) {
                const auto at = s.find("killed (SIGKILL) at ");
                if (at == std::string::npos) continue;
                ++planned;
                points.insert(s.substr(at + 20, s.find(';', at) - at - 20));
            }
        }
        MESSAGE(planned << " kills planned, " << r.kills << " children killed");
        CHECK(planned >= 10);
        CHECK(r.kills == planned);
        CHECK(points ==
              std::set<std::string>{"after_decode", "mid_batch", "before_commit", "after_commit", "during_prune"});
    }

    TEST_CASE("the same seed gives the same schedule") {
        idem::testing::chaos kit;
        kit.add(line_totals());
        const auto a = kit.schedule(lines(), 42);
        CHECK(a == kit.schedule(lines(), 42));
        CHECK(a != kit.schedule(lines(), 43));
        CHECK(a.size() >= 2);
    }

    TEST_CASE("the schedules exercise duplicates, re-sends, reordering, crashes and pruning") {
        idem::testing::chaos kit;
        kit.add(line_totals());
        std::string all;
        for (std::uint64_t seed = 1; seed <= 20; ++seed) {
            for (const auto& s : kit.schedule(lines(), seed)) all += s + "\n";
        }
        for (const char* what :
             {"(again, same message id)", "(again, new message id", "(re-sent as new event id",
              "crash before the commit", "crash after the commit", "prune the inbox", "close and reopen"}) {
            CHECK_MESSAGE(all.find(what) != std::string::npos, what);
        }
        // Reordering within a stream: some schedule delivers order-1#2 before order-1#1.
        bool reordered = false;
        for (std::uint64_t seed = 1; seed <= 20 && !reordered; ++seed) {
            std::string s;
            for (const auto& step : kit.schedule(lines(), seed)) s += step;
            reordered = s.find("order-1#2") < s.find("order-1#1");
        }
        CHECK(reordered);
    }

    TEST_CASE("schedules on several workers report the first failure in seed order, as one worker does") {
        // A seed whose schedule passes (no re-send of a fill) and a later one that fails: the
        // workers finish them in any order, the report must name the later seed all the same.
        auto one = [](std::uint64_t seed, std::size_t schedules, std::size_t workers) {
            idem::testing::chaos_options o;
            o.seed = seed;
            o.schedules = schedules;
            o.workers = workers;
            return run(positions(false), fills(), o);
        };
        std::uint64_t start = 1;
        while (!one(start, 1, 1).ok()) ++start;
        const auto alone = one(start, 8, 1);
        REQUIRE_FALSE(alone.ok());
        CHECK(alone.schedules >= 2);
        for (std::size_t workers : {std::size_t{2}, std::size_t{3}}) {
            const auto together = one(start, 8, workers);
            CHECK(together.seed == alone.seed);
            CHECK(together.schedules == alone.schedules);
            CHECK(together.explain() == alone.explain());
        }
        // And a correct projection passes every schedule on several workers.
        idem::testing::chaos_options o;
        o.schedules = 20;
        o.workers = 2;
        const auto r = run(positions(true), fills(), o);
        CHECK_MESSAGE(r.ok(), r.explain());
        CHECK(r.schedules == 20);
    }

    TEST_CASE("progress is told after each schedule, and a stop ends the run leaving no store behind") {
        const auto parent = std::filesystem::temp_directory_path() /
                            ("idem-chaos-stop-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
        std::filesystem::create_directories(parent);
        std::atomic<bool> stop{false};
        std::vector<std::size_t> told;
        idem::testing::chaos_options o;
        o.schedules = 50;
        o.directory = parent;
        o.stop = &stop;
        o.progress = [&](std::size_t done, std::size_t total) {
            told.push_back(done);
            CHECK(total == 50);
            if (done == 3) stop = true;
        };
        idem::testing::chaos kit{o};
        kit.add(line_totals());
        try {
            kit.run(lines());
            FAIL("the run did not stop");
        } catch (const std::system_error& e) {
            CHECK(e.code() == std::errc::operation_canceled);
        }
        CHECK(told == std::vector<std::size_t>{1, 2, 3});
        CHECK(std::filesystem::is_empty(parent));
        std::filesystem::remove_all(parent);
    }

    TEST_CASE("envelopes that do not parse are dead letters, counted and left out; no envelope at all is bad input") {
        idem::testing::chaos_options o;
        o.schedules = 5;
        idem::testing::chaos kit{o};
        kit.add(line_totals());
        auto events = lines();
        events.insert(events.begin() + 1, R"({"specversion":"1.0","source":"/test","type":"line"})");
        events.insert(events.begin() + 3, R"({"specversion":"1.0","id":)");
        const auto report = kit.run(events);
        CHECK_MESSAGE(report.ok(), report.explain());
        CHECK(report.events == lines().size());
        CHECK(report.malformed == 2);
        CHECK(report.first_malformed.starts_with("envelope 2 (missing_id"));
        CHECK(report.explain().find("2 envelope(s) do not parse") != std::string::npos);
        CHECK_THROWS_WITH_AS(kit.run(std::vector<std::string>{}), doctest::Contains("no envelopes"),
                             std::invalid_argument);
        CHECK_THROWS_WITH_AS(kit.run(std::vector<std::string>{"{"}), doctest::Contains("envelope 1 (invalid_json"),
                             std::invalid_argument);
        idem::testing::chaos empty;
        CHECK_THROWS_WITH_AS(empty.run(lines()), doctest::Contains("no projections"), std::invalid_argument);
    }

}  // TEST_SUITE
