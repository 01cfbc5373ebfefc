// The seeded simulation: random delivery schedules fed to idem and, delivery by delivery, to an
// independent in-memory model of the contract (model.hpp); every outcome and, periodically,
// the whole state must agree.
//
// A run is a sequence of worlds (each its own LMDB environment, projections, gap policy, map
// size and schedule shape), all derived from one seed. Most deliveries go through
// store::apply in batches (durability none); some phases go through idem::engine from several
// threads at once (group commit). Faults: storage errors injected at commit through
// store_options.before_commit (EIO, MAP_FULL once — the store grows and retries —, MAP_FULL at
// every try until the map limit, MDB_PANIC), a tiny initial map (real MAP_FULL and growth),
// restarts (the store closed and reopened from disk), and a whole replay from the start.
// A failed batch must be reported failed with nothing of it stored, then it is redelivered.
//
//   sim [--seed N] [--deliveries N] [--world N] [--long] [--seconds N] [--jobs N] [--verbose]
//
// On divergence it prints the seed, world and step and exits 1; `sim --seed S --world W` reruns
// that world alone, identically up to its first engine phase (engine phases batch as threads
// race, so they are checked against whatever order the engine committed in, and the state
// after one may differ between runs).

#include <idem/engine/engine.hpp>
#include <idem/projections/store_hooks.hpp>
#include <idem/projections/store.hpp>

#include "../common/temp_dir.hpp"
#include "model.hpp"
#include "schedule.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using namespace idem_sim;
using clock_type = std::chrono::steady_clock;

constexpr const char* consumer = "sim";

// --- the projections under test ----------------------------------------------

struct sim_state {
    std::int64_t sum = 0;
    std::int64_t count = 0;
    std::uint64_t digest = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(sum, count, digest);
    }
};

struct line_data {
    std::string order;
    std::int64_t amount = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(order), CEREAL_NVP(amount));
    }
};

struct fill_data {
    std::string account;
    std::string exec;
    std::int64_t qty = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(account), CEREAL_NVP(exec), CEREAL_NVP(qty));
    }
};

struct score_data {
    std::string match;
    std::string player;
    std::int64_t points = 0;
    template <class Archive>
    void serialize(Archive& ar) {
        ar(CEREAL_NVP(match), CEREAL_NVP(player), CEREAL_NVP(points));
    }
};

void add_value(sim_state& s, proj p, std::int64_t value) {
    if (handler_throws(p, value)) throw std::runtime_error("handler refuses value " + std::to_string(value));
    s.sum += value;
    s.count += 1;
    s.digest = s.digest * 1000003u + static_cast<std::uint64_t>(value) + static_cast<std::uint64_t>(s.count);
}

template <class Target>
void add_projections(Target& t) {
    t.add(idem::projection<sim_state>("totals")
              .on<line_data>("sim.line", [](sim_state& s, const line_data& e) { add_value(s, proj::totals, e.amount); })
              .key([](const line_data& e) { return e.order; }));
    t.add(idem::projection<sim_state>("positions")
              .on<fill_data>("sim.fill", [](sim_state& s, const fill_data& e) { add_value(s, proj::positions, e.qty); })
              .key([](const fill_data& e) { return e.account; })
              .effect_key([](const fill_data& e) { return e.exec; }));
    t.add(idem::projection<sim_state>("board")
              .on<score_data>("sim.score", [](sim_state& s, const score_data& e) { add_value(s, proj::board, e.points); })
              .key([](const score_data& e) { return std::vector<std::string>{e.match, all_row(e.match)}; }));
    t.add(idem::projection<sim_state>("players")
              .on<score_data>("sim.score",
                              [](sim_state& s, const score_data& e) { add_value(s, proj::players, e.points); }));
}

// --- run-wide settings and totals ----------------------------------------------

struct settings {
    std::uint64_t seed = 0;
    std::uint64_t deliveries = 10'000'000;
    std::optional<std::uint64_t> only_world;
    double seconds = 0;  // 0: no time limit
    unsigned jobs = 1;   // worlds run at once
    bool verbose = false;
};

struct totals {
    std::uint64_t deliveries = 0;
    std::uint64_t engine_deliveries = 0;
    std::uint64_t batches = 0;
    std::uint64_t failed_batches = 0;
    std::uint64_t injected[4]{};  // eio, map_full once, map_full always, panic
    std::uint64_t engine_failures = 0;
    std::uint64_t restarts = 0;
    std::uint64_t replays = 0;
    std::uint64_t engine_phases = 0;
    std::uint64_t full_checks = 0;
    std::uint64_t outcomes[kinds]{};
    std::uint64_t dead[reasons]{};
    std::uint64_t worlds = 0;

    void add(const totals& o) {
        deliveries += o.deliveries;
        engine_deliveries += o.engine_deliveries;
        batches += o.batches;
        failed_batches += o.failed_batches;
        for (std::size_t i = 0; i < 4; ++i) injected[i] += o.injected[i];
        engine_failures += o.engine_failures;
        restarts += o.restarts;
        replays += o.replays;
        engine_phases += o.engine_phases;
        full_checks += o.full_checks;
        for (std::size_t k = 0; k < kinds; ++k) outcomes[k] += o.outcomes[k];
        for (std::size_t r = 0; r < reasons; ++r) dead[r] += o.dead[r];
        worlds += o.worlds;
    }
};

std::uint64_t mix(std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

const char* kind_name(kind k) { return kind_names[static_cast<std::size_t>(k)]; }
std::string reason_name(why r) { return reason_names[static_cast<std::size_t>(r)]; }

/// idem's index of an outcome kind in consumer_stats::outcomes, found by name.
std::size_t stats_index(kind k) {
    for (std::size_t i = 0; i < idem::outcome_kinds; ++i) {
        if (idem::to_string(static_cast<idem::outcome_kind>(i)) == kind_name(k)) return i;
    }
    throw std::runtime_error(std::string("idem has no outcome kind '") + kind_name(k) + "'");
}

/// The model's name for an idem outcome kind or reason (the text idem gives it).
std::string name_of(idem::outcome_kind k) { return std::string(idem::to_string(k)); }
std::string name_of(idem::reason r) { return std::string(idem::to_string(r)); }

/// The divergence that stops the run, with where it happened.
struct divergence : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class fault { none, eio, map_full_once, map_full_always, panic };

// --- one world -------------------------------------------------------------------

class world {
public:
    world(const settings& s, std::uint64_t index, std::uint64_t size, totals& t, const std::atomic<bool>& stop)
        : settings_(s), stop_(stop), index_(index), seed_(mix(s.seed ^ mix(index + 1))), size_(size), totals_(t), rng_(seed_ ^ 0x5eed) {
        std::mt19937_64 shape_rng{seed_};
        auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
            return std::uniform_int_distribution<std::uint64_t>{lo, hi}(shape_rng);
        };
        const std::size_t scales[] = {4, 40, 400, 4000};
        shape_.orders = scales[pick(0, 3)];
        shape_.accounts = scales[pick(0, 3)];
        shape_.players = scales[pick(0, 3)];
        shape_.matches = std::max<std::size_t>(1, scales[pick(0, 3)] / 8);
        const auto g = pick(0, 9);
        gaps_ = g < 6 ? gaps::park : g < 8 ? gaps::apply : gaps::reject;
        // Rejecting gaps under heavy reordering dead-letters most sequenced events: reorder less there.
        const std::size_t windows[] = {1, 8, 64, 256};
        shape_.window = windows[pick(0, gaps_ == gaps::reject ? 1 : 3)];
        dead_letter_unknown_ = pick(0, 3) == 0;
        const std::size_t maps[] = {std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{64} << 20};
        map_size_ = maps[pick(0, 2)];
        engine_share_ = pick(0, 2) == 0 ? 0.0 : 0.15;
        replay_at_ = pick(0, 1) == 0 ? std::optional<std::uint64_t>{pick(size_ / 4, size_ * 3 / 4)} : std::nullopt;
        // Small row journals swap and fold many times per world (0: the automatic size).
        const std::size_t journals[] = {0, 8, 100, 1000};
        journal_rows_ = journals[pick(0, 3)];
        options_.path = dir_.env();
        options_.consumer = consumer;
        options_.sync = idem::durability::none;
        options_.gaps = gaps_ == gaps::park ? idem::gap_policy::park
                        : gaps_ == gaps::apply ? idem::gap_policy::apply
                                               : idem::gap_policy::reject;
        options_.unknown_types =
            dead_letter_unknown_ ? idem::unknown_type_policy::dead_letter : idem::unknown_type_policy::ignore;
        options_.tuning.map_size = map_size_;
        options_.tuning.max_map_size = std::size_t{8} << 30;
        options_.tuning.journal_rows = journal_rows_;
        model_ = std::make_unique<model>(gaps_, dead_letter_unknown_);
        main_ = std::make_unique<schedule>(seed_ ^ 0xabcdef, shape_);
    }

    void run() {
        if (settings_.verbose) {
            std::printf("world %llu: %llu deliveries, gaps %s, unknown types %s, map %zu KiB, journal %zu, window %zu, shape %zu/%zu/%zu/%zu, "
                        "engine share %.2f%s\n",
                        ull(index_), ull(size_), gaps_ == gaps::park ? "park" : gaps_ == gaps::apply ? "apply" : "reject",
                        dead_letter_unknown_ ? "dead-lettered" : "ignored", map_size_ >> 10, journal_rows_, shape_.window, shape_.orders,
                        shape_.accounts, shape_.players, shape_.matches, engine_share_,
                        replay_at_ ? ", one whole replay" : "");
        }
        open_store();
        full_check("after opening");
        std::uint64_t next_check = 100'000;
        while (delivered_ < size_) {
            if (stop_) return;
            if (replay_at_ && delivered_ >= *replay_at_ && !replay_) {
                // A whole replay from the start: the same deliveries again, in the same order.
                replay_ = std::make_unique<schedule>(seed_ ^ 0xabcdef, shape_);
                replay_left_ = main_->handed();
                replay_at_.reset();
                ++totals_.replays;
            }
            const auto action = pick(0, 999);
            if (action < 4) {
                restart();
            } else if (action < 10 && engine_share_ > 0) {
                engine_phase(std::min<std::uint64_t>(size_ - delivered_, pick(2000, 40000)));
            } else {
                store_batch();
            }
            if (delivered_ >= next_check) {
                full_check("periodic");
                next_check = delivered_ + 100'000;
            }
        }
        full_check("at the end");
        check_dead_letter_reasons();
        for (std::size_t k = 0; k < kinds; ++k) totals_.outcomes[k] += model_->stats()[k];
        for (std::size_t r = 0; r < reasons; ++r) totals_.dead[r] += model_->dead_by_reason()[r];
        store_.reset();
    }

    std::uint64_t delivered() const { return delivered_; }
    std::uint64_t step() const { return delivered_; }

private:
    static unsigned long long ull(std::uint64_t v) { return static_cast<unsigned long long>(v); }
    std::uint64_t pick(std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>{lo, hi}(rng_); }

    [[noreturn]] void diverge(const std::string& what) const {
        std::ostringstream out;
        out << "DIVERGENCE in world " << index_ << " at step " << delivered_ << " (deliveries applied in this world): "
            << what << "\nrerun: sim --seed " << settings_.seed << " --world " << index_;
        throw divergence(out.str());
    }

    delivery next_delivery() {
        if (replay_ && replay_left_ > 0) {
            --replay_left_;
            auto d = replay_->next();
            if (replay_left_ == 0) replay_.reset();
            return d;
        }
        return main_->next();
    }

    void open_store() {
        auto o = options_;
        idem::detail::set_before_commit(o, [this](std::uint64_t) { inject(); });
        store_ = std::make_unique<idem::store>(o);
        add_projections(*store_);
    }

    void inject() {
        if (fault_remaining_ == 0) return;
        if (fault_remaining_ > 0) --fault_remaining_;
        switch (fault_) {
        case fault::eio: throw std::system_error(std::make_error_code(std::errc::io_error), "injected EIO at commit");
        case fault::map_full_once:
        case fault::map_full_always:
            throw std::system_error(idem::make_error_code(idem::errc::map_full), "injected MDB_MAP_FULL at commit");
        case fault::panic: throw std::system_error(idem::make_error_code(idem::errc::panic), "injected MDB_PANIC at commit");
        case fault::none: break;
        }
    }

    void restart() {
        store_.reset();
        open_store();
        ++totals_.restarts;
        full_check("after a restart");
    }

    std::vector<delivery> take(std::uint64_t n) {
        std::vector<delivery> out;
        out.reserve(n);
        for (std::uint64_t i = 0; i < n; ++i) out.push_back(next_delivery());
        return out;
    }

    static std::string describe(const delivery& d) {
        return "body " + d.body + (d.transport.empty() ? std::string() : ", transport id " + d.transport);
    }

    void compare(const delivery& d, const idem::outcome& got, std::size_t position, std::uint64_t commit) {
        const auto want = model_->deliver(d);
        const auto got_kind = name_of(got.kind);
        const auto got_why = name_of(got.why);
        if (got_kind != kind_name(want.k) || (want.k == kind::dead_lettered && got_why != reason_name(want.r))) {
            diverge("delivery " + std::to_string(position) + " of its batch: expected " + kind_name(want.k) +
                    (want.k == kind::dead_lettered ? " (" + reason_name(want.r) + ")" : "") + ", got " + got_kind +
                    (got.kind == idem::outcome_kind::dead_lettered ? " (" + got_why + ")" : "") + " [" + got.detail +
                    "]\n" + describe(d));
        }
        if (got.commit != commit) {
            diverge("delivery " + std::to_string(position) + " carries commit " + std::to_string(got.commit) +
                    ", expected " + std::to_string(commit));
        }
    }

    void store_batch() {
        const auto n = pick(0, 9) < 7 ? pick(200, 2000) : pick(1, 50);
        auto batch = take(std::min<std::uint64_t>(n, size_ - delivered_));
        std::vector<idem::delivery> bodies;
        bodies.reserve(batch.size());
        for (const auto& d : batch) bodies.push_back(idem::delivery{d.body, d.transport});

        // A storage fault at this batch's commit, or none.
        const auto roll = pick(0, 999);
        fault_ = roll < 20 ? fault::eio : roll < 30 ? fault::map_full_once : roll < 32 ? fault::map_full_always
                 : roll < 37 ? fault::panic : fault::none;
        fault_remaining_ = fault_ == fault::map_full_always ? -1 : fault_ == fault::none ? 0 : 1;
        if (fault_ != fault::none) ++totals_.injected[static_cast<int>(fault_) - 1];
        for (int attempt = 0;; ++attempt) {
            // Every MAP_FULL doubles the map, injected ones included: once it reached its limit
            // (until the store is opened afresh), an injected MAP_FULL cannot be absorbed.
            const bool at_limit = idem::detail::store_env(*store_)->map_size() >= options_.tuning.max_map_size;
            std::vector<idem::outcome> outcomes;
            std::error_code failed;
            std::string message;
            try {
                outcomes = store_->apply(bodies);
            } catch (const std::system_error& e) {
                failed = e.code();
                message = e.what();
            } catch (const std::exception& e) {
                diverge(std::string("apply threw something other than std::system_error: ") + e.what());
            }
            // MAP_FULL once is absorbed by growing the map, unless earlier faults grew it to its limit.
            const bool must_fail = attempt == 0 && (fault_ == fault::eio || fault_ == fault::map_full_always ||
                                                    fault_ == fault::panic || (fault_ == fault::map_full_once && at_limit));
            if (!failed && must_fail) diverge("a batch whose commit failed was reported committed");
            if (failed) {
                if (!must_fail) diverge("a batch of " + std::to_string(batch.size()) + " failed: " + message);
                const auto want = fault_ == fault::eio ? std::make_error_code(std::errc::io_error)
                                  : fault_ == fault::panic ? idem::make_error_code(idem::errc::panic)
                                                           : idem::make_error_code(idem::errc::map_full);
                if (failed != want) {
                    diverge("a failed batch reported '" + message + "', expected the error " + want.message());
                }
                ++totals_.failed_batches;
                if (fault_ == fault::panic) store_->reopen();
                quick_check("after a failed batch");
                fault_ = fault::none;
                fault_remaining_ = 0;
                continue;  // the broker redelivers the batch
            }
            if (outcomes.size() != batch.size()) diverge("apply returned the wrong number of outcomes");
            const auto commit = model_->commit() + 1;
            for (std::size_t i = 0; i < batch.size(); ++i) compare(batch[i], outcomes[i], i, commit);
            model_->committed();
            break;
        }
        fault_ = fault::none;
        fault_remaining_ = 0;
        delivered_ += batch.size();
        totals_.deliveries += batch.size();
        ++totals_.batches;
    }

    // The engine: one thread per partition submits its share in order, concurrently; failed
    // deliveries are resubmitted once their round completed. The model then takes each
    // partition's deliveries in the order the engine committed them (commit number, then
    // submission order), which is the order any interleaving gave them.
    void engine_phase(std::uint64_t n) {
        store_.reset();
        ++totals_.engine_phases;
        auto all = take(n);
        std::vector<std::vector<delivery>> parts(shape_.partitions);
        for (auto& d : all) parts[d.partition].push_back(std::move(d));

        struct record {
            std::size_t index;
            std::uint64_t seq;
            idem::outcome out;
        };
        std::mutex m;
        std::condition_variable cv;
        std::vector<std::vector<record>> records(parts.size());
        std::vector<std::string> problems;
        std::mt19937_64 fault_rng{pick(0, UINT64_MAX)};
        std::atomic<std::uint64_t> failures{0};

        idem::engine_options eo;
        eo.store = options_;
        idem::detail::set_before_commit(eo.store, [&](std::uint64_t) {
            // Only the writer thread calls this.
            const auto roll = std::uniform_int_distribution<int>{0, 999}(fault_rng);
            if (roll < 20) throw std::system_error(std::make_error_code(std::errc::io_error), "injected EIO at commit");
            if (roll < 23) throw std::system_error(idem::make_error_code(idem::errc::panic), "injected MDB_PANIC");
        });
        eo.max_batch = pick(16, 4096);
        eo.max_in_flight = pick(0, 1) == 0 ? pick(64, 1024) : 65536;
        boost::asio::io_context io;
        auto guard = boost::asio::make_work_guard(io);
        std::vector<std::thread> io_threads;
        for (int i = 0; i < 2; ++i) io_threads.emplace_back([&io] { io.run(); });
        std::uint64_t engine_batches = 0;
        {
            idem::engine e{io.get_executor(), eo};
            add_projections(e);
            std::vector<std::thread> submitters;
            for (std::size_t p = 0; p < parts.size(); ++p) {
                submitters.emplace_back([&, p] {
                    std::vector<std::size_t> pending(parts[p].size());
                    for (std::size_t i = 0; i < pending.size(); ++i) pending[i] = i;
                    std::uint64_t seq = 0;
                    for (int round = 0; !pending.empty(); ++round) {
                        if (round == 100) {
                            std::scoped_lock lock{m};
                            problems.push_back("partition " + std::to_string(p) + ": deliveries still failing after 100 rounds");
                            return;
                        }
                        std::size_t remaining = pending.size();
                        std::vector<std::pair<std::uint64_t, std::size_t>> failed;  // (seq, index)
                        for (auto index : pending) {
                            const auto s = seq++;
                            e.async_apply(idem::delivery{parts[p][index].body, parts[p][index].transport},
                                          [&, p, index, s](std::error_code ec, idem::outcome out) {
                                              std::scoped_lock lock{m};
                                              if (ec) {
                                                  ++failures;
                                                  if (ec != std::make_error_code(std::errc::io_error) &&
                                                      ec != idem::make_error_code(idem::errc::panic)) {
                                                      problems.push_back("a delivery failed with " + ec.message());
                                                  }
                                                  failed.emplace_back(s, index);
                                              } else {
                                                  records[p].push_back(record{index, s, std::move(out)});
                                              }
                                              --remaining;
                                              cv.notify_all();
                                          });
                        }
                        std::unique_lock lock{m};
                        cv.wait(lock, [&] { return remaining == 0; });
                        std::sort(failed.begin(), failed.end());
                        pending.clear();
                        for (auto [s, index] : failed) pending.push_back(index);
                    }
                });
            }
            for (auto& t : submitters) t.join();
            engine_batches = e.stats().batches;
        }
        guard.reset();
        for (auto& t : io_threads) t.join();
        totals_.engine_failures += failures;
        if (!problems.empty()) diverge("engine phase: " + problems.front());

        std::set<std::uint64_t> commits;
        for (std::size_t p = 0; p < parts.size(); ++p) {
            auto& recs = records[p];
            if (recs.size() != parts[p].size()) diverge("engine phase: a delivery completed more or less than once");
            std::sort(recs.begin(), recs.end(), [](const record& a, const record& b) {
                return std::tie(a.out.commit, a.seq) < std::tie(b.out.commit, b.seq);
            });
            for (const auto& r : recs) {
                if (r.out.commit <= model_->commit()) diverge("engine phase: an outcome carries an old commit number");
                commits.insert(r.out.commit);
                compare(parts[p][r.index], r.out, r.index, r.out.commit);
            }
        }
        if (commits.size() != engine_batches) {
            diverge("engine phase: outcomes carry " + std::to_string(commits.size()) + " commit numbers, the engine counted " +
                    std::to_string(engine_batches) + " batches");
        }
        if (!commits.empty()) model_->set_commit(*commits.rbegin());
        model_->add_batches(engine_batches);
        delivered_ += n;
        totals_.deliveries += n;
        totals_.engine_deliveries += n;
        open_store();
        full_check("after an engine phase");
    }

    // Counters that any batch changes: a failed one must have changed none of them.
    void quick_check(const char* when) {
        auto snap = store_->read();
        check_counters(snap, when);
    }

    void check_counters(const idem::snapshot& snap, const char* when) {
        auto fail = [&](const std::string& what, std::uint64_t got, std::uint64_t want) {
            diverge(std::string(when) + ": " + what + " is " + std::to_string(got) + ", the model has " + std::to_string(want));
        };
        if (snap.commit() != model_->commit()) fail("the commit number", snap.commit(), model_->commit());
        const auto stats = snap.consumer(consumer).stats();
        for (std::size_t k = 0; k < kinds; ++k) {
            const auto got = stats.outcomes[stats_index(static_cast<kind>(k))];
            if (got != model_->stats()[k]) {
                fail(std::string("the count of ") + kind_name(static_cast<kind>(k)), got, model_->stats()[k]);
            }
        }
        if (stats.released != model_->released()) fail("the count of released events", stats.released, model_->released());
        if (stats.batches != model_->batches()) fail("the count of batches", stats.batches, model_->batches());
        if (snap.consumer(consumer).inbox_size() != model_->inbox_size()) fail("the inbox size", snap.consumer(consumer).inbox_size(), model_->inbox_size());
        if (store_->inbox_size() != model_->inbox_size()) fail("the inbox index size", store_->inbox_size(), model_->inbox_size());
        if (snap.consumer(consumer).parked() != model_->parked()) fail("the parked count", snap.consumer(consumer).parked(), model_->parked());
        if (snap.consumer(consumer).dead_letter_count() != model_->dead_letters()) {
            fail("the dead-letter count", snap.consumer(consumer).dead_letter_count(), model_->dead_letters());
        }
    }

    void full_check(const char* when) {
        ++totals_.full_checks;
        auto snap = store_->read();
        check_counters(snap, when);
        for (std::size_t p = 0; p < projections; ++p) {
            const auto& rows = model_->rows(static_cast<proj>(p));
            std::size_t seen = 0;
            snap.scan<sim_state>(projection_names[p], [&](const idem::row<sim_state>& r) {
                ++seen;
                auto it = rows.find(r.key);
                if (it == rows.end()) diverge(std::string(when) + ": row '" + r.key + "' of " + projection_names[p] + " is not in the model");
                const auto& w = it->second;
                if (r.state.sum != w.sum || r.state.count != w.count || r.state.digest != w.digest || r.version != w.version ||
                    r.highest_sequence != w.highest) {
                    diverge(std::string(when) + ": row '" + r.key + "' of " + projection_names[p] + " is {sum " +
                            std::to_string(r.state.sum) + ", count " + std::to_string(r.state.count) + ", version " +
                            std::to_string(r.version) + ", highest " + std::to_string(r.highest_sequence) +
                            "}, the model has {sum " + std::to_string(w.sum) + ", count " + std::to_string(w.count) +
                            ", version " + std::to_string(w.version) + ", highest " + std::to_string(w.highest) + "}");
                }
            });
            if (seen != rows.size()) {
                diverge(std::string(when) + ": " + projection_names[p] + " has " + std::to_string(seen) + " rows, the model " +
                        std::to_string(rows.size()));
            }
            // Point reads find every row too (the scan merges the row table with the journals in
            // key order; a point read looks the journals up first).
            for (const auto& [key, w] : rows) {
                auto r = snap.get<sim_state>(projection_names[p], key);
                if (!r || r->state.digest != w.digest || r->version != w.version) {
                    diverge(std::string(when) + ": reading row '" + key + "' of " + projection_names[p] + " gives " +
                            (r ? "version " + std::to_string(r->version) : std::string("nothing")) +
                            ", the model has version " + std::to_string(w.version));
                }
            }
        }
    }

    void check_dead_letter_reasons() {
        std::uint64_t got[reasons]{};
        for (const auto& d : store_->read().consumer(consumer).dead_letters()) {
            const auto name = name_of(d.why);
            std::size_t r = 0;
            while (r < reasons && name != reason_names[r]) ++r;
            if (r == reasons) diverge("a dead letter has the reason '" + name + "', which the model never gives");
            ++got[r];
        }
        for (std::size_t r = 0; r < reasons; ++r) {
            if (got[r] != model_->dead_by_reason()[r]) {
                diverge("at the end: " + std::to_string(got[r]) + " dead letters '" + reason_name(static_cast<why>(r)) +
                        "', the model has " + std::to_string(model_->dead_by_reason()[r]));
            }
        }
    }

    const settings& settings_;
    const std::atomic<bool>& stop_;  // another world diverged: stop early
    std::uint64_t index_;
    std::uint64_t seed_;
    std::uint64_t size_;
    totals& totals_;
    std::mt19937_64 rng_;  // the driver's choices: batches, faults, restarts, engine phases
    schedule_shape shape_;
    gaps gaps_ = gaps::park;
    bool dead_letter_unknown_ = false;
    std::size_t map_size_ = 0;
    std::size_t journal_rows_ = 0;
    double engine_share_ = 0;
    std::optional<std::uint64_t> replay_at_;
    idem::test::temp_dir dir_;
    idem::store_options options_;
    std::unique_ptr<model> model_;
    std::unique_ptr<schedule> main_;
    std::unique_ptr<schedule> replay_;
    std::uint64_t replay_left_ = 0;
    std::unique_ptr<idem::store> store_;
    std::uint64_t delivered_ = 0;
    fault fault_ = fault::none;
    int fault_remaining_ = 0;  // -1: every try
};

void usage() {
    std::puts(
        "usage: sim [--seed N] [--deliveries N] [--world N] [--long] [--seconds N] [--jobs N] [--verbose]\n"
        "  --seed N        the run's seed (default: from the clock; printed either way)\n"
        "  --deliveries N  stop after N deliveries (default 10000000, or $IDEM_SIM_DELIVERIES)\n"
        "  --world N       run only world N of the seed (to rerun a divergence)\n"
        "  --long          the nightly run: no delivery limit, stop after --seconds (default 3600)\n"
        "  --seconds N     stop starting new worlds after N seconds\n"
        "  --jobs N        worlds run at once (default: the number of cores, at most 4)\n"
        "  --verbose       describe each world");
}

std::uint64_t number(const char* text, const char* option) {
    char* end = nullptr;
    errno = 0;
    const auto v = std::strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') {
        std::fprintf(stderr, "sim: %s needs a number, got '%s'\n", option, text);
        std::exit(1);
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    settings s;
    bool seeded = false;
    bool sized = false;
    bool long_run = false;
    s.jobs = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&] {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "sim: %s needs a value\n", a.c_str());
                std::exit(1);
            }
            return argv[++i];
        };
        if (a == "--seed") {
            s.seed = number(value(), "--seed");
            seeded = true;
        } else if (a == "--deliveries") {
            s.deliveries = number(value(), "--deliveries");
            sized = true;
        } else if (a == "--world") {
            s.only_world = number(value(), "--world");
        } else if (a == "--long") {
            long_run = true;
        } else if (a == "--seconds") {
            s.seconds = static_cast<double>(number(value(), "--seconds"));
        } else if (a == "--jobs") {
            s.jobs = static_cast<unsigned>(number(value(), "--jobs"));
        } else if (a == "--verbose") {
            s.verbose = true;
        } else if (a == "--help" || a == "-h") {
            usage();
            return 0;
        } else {
            std::fprintf(stderr, "sim: unknown option '%s'\n", a.c_str());
            usage();
            return 1;
        }
    }
    if (!seeded) s.seed = static_cast<std::uint64_t>(clock_type::now().time_since_epoch().count()) ^ std::random_device{}();
    if (!sized) {
        if (const char* env = std::getenv("IDEM_SIM_DELIVERIES")) s.deliveries = number(env, "IDEM_SIM_DELIVERIES");
    }
    if (long_run) {
        if (!sized) s.deliveries = UINT64_MAX;
        if (s.seconds == 0) s.seconds = 3600;
    }
    std::printf("sim: seed %llu, %s deliveries%s\n", static_cast<unsigned long long>(s.seed),
                s.deliveries == UINT64_MAX ? "unlimited" : std::to_string(s.deliveries).c_str(),
                s.seconds > 0 ? (", at most " + std::to_string(static_cast<long>(s.seconds)) + " s").c_str() : "");
    std::fflush(stdout);

    // The worlds and their sizes, fixed by the seed alone (not by how the worlds are spread over threads).
    std::vector<std::pair<std::uint64_t, std::uint64_t>> plan;  // (world, deliveries)
    const std::uint64_t cap = std::max<std::uint64_t>(1000, std::min<std::uint64_t>(600'000, s.deliveries / 4));
    auto world_size = [&](std::uint64_t w) {
        std::mt19937_64 size_rng{mix(s.seed ^ mix(w + 1)) ^ 0x512e};
        return std::uniform_int_distribution<std::uint64_t>{cap / 3, cap}(size_rng);
    };
    if (s.only_world) {
        plan.emplace_back(*s.only_world, world_size(*s.only_world));
    } else if (s.deliveries != UINT64_MAX) {
        for (std::uint64_t w = 0, sum = 0; sum < s.deliveries; ++w) {
            const auto size = std::min(world_size(w), s.deliveries - sum);
            plan.emplace_back(w, size);
            sum += size;
        }
    }

    totals t;
    std::mutex m;
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> next{0};
    std::optional<std::string> failure;
    const auto started = clock_type::now();
    auto elapsed = [&] { return std::chrono::duration<double>(clock_type::now() - started).count(); };
    auto work = [&] {
        for (;;) {
            const auto i = next++;
            if (stop || (s.seconds > 0 && elapsed() >= s.seconds)) return;
            std::pair<std::uint64_t, std::uint64_t> job;
            if (i < plan.size()) {
                job = plan[i];
            } else if (s.deliveries == UINT64_MAX) {
                job = {i, world_size(i)};  // the long run: worlds until the time is up
            } else {
                return;
            }
            totals mine;
            try {
                world one{s, job.first, job.second, mine, stop};
                one.run();
                ++mine.worlds;
            } catch (const std::exception& e) {
                std::scoped_lock lock{m};
                if (!failure) failure = dynamic_cast<const divergence*>(&e) != nullptr
                                            ? std::string(e.what())
                                            : "unexpected error in world " + std::to_string(job.first) + ": " + e.what() +
                                                  "\nrerun: sim --seed " + std::to_string(s.seed) + " --world " +
                                                  std::to_string(job.first);
                stop = true;
            }
            std::scoped_lock lock{m};
            t.add(mine);
        }
    };
    std::vector<std::thread> workers;
    for (unsigned j = 0; j < std::max(1u, s.jobs); ++j) workers.emplace_back(work);
    for (auto& w : workers) w.join();
    if (failure) {
        std::printf("%s\nsim: seed %llu: 1 divergence after %llu deliveries\n", failure->c_str(),
                    static_cast<unsigned long long>(s.seed), static_cast<unsigned long long>(t.deliveries));
        return 1;
    }
    const auto secs = elapsed();
    auto ull = [](std::uint64_t v) { return static_cast<unsigned long long>(v); };
    std::printf("sim: seed %llu: %llu deliveries in %llu worlds, %.1f s (%.0f/s), 0 divergences\n", ull(s.seed),
                ull(t.deliveries), ull(t.worlds), secs, static_cast<double>(t.deliveries) / secs);
    std::printf("  through the engine: %llu deliveries in %llu phases, %llu failed completions redelivered\n",
                ull(t.engine_deliveries), ull(t.engine_phases), ull(t.engine_failures));
    std::printf("  store batches: %llu; failed and redelivered: %llu; injected: %llu EIO, %llu MAP_FULL once, %llu MAP_FULL "
                "to the limit, %llu MDB_PANIC\n",
                ull(t.batches), ull(t.failed_batches), ull(t.injected[0]), ull(t.injected[1]), ull(t.injected[2]),
                ull(t.injected[3]));
    std::printf("  restarts: %llu; whole replays: %llu; full state checks: %llu\n", ull(t.restarts), ull(t.replays),
                ull(t.full_checks));
    std::printf("  outcomes:");
    for (std::size_t k = 0; k < kinds; ++k) std::printf(" %s %llu", kind_name(static_cast<kind>(k)), ull(t.outcomes[k]));
    std::printf("\n  dead letters:");
    for (std::size_t r = 1; r < reasons; ++r) {
        if (t.dead[r] > 0) std::printf(" %s %llu", reason_name(static_cast<why>(r)).c_str(), ull(t.dead[r]));
    }
    std::printf("\n");
    return 0;
}
