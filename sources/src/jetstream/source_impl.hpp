#pragma once

// The JetStream source's state, shared by the files that make up its run: source.cpp (the run,
// step by step, and the acks), hole_check.cpp (whether the stream lost what it was to deliver)
// and exhausted_record.cpp (the record of messages that reached MaxDeliver uncommitted).
// Not installed.

#include <idem/sources/jetstream.hpp>

#include "broker_watch.hpp"
#include "claim.hpp"
#include "connection.hpp"
#include "consumer_setup.hpp"
#include "pull.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idem::jetstream {

struct source::impl {
    using clock = std::chrono::steady_clock;

    /// A message's JetStream metadata, destroyed with it.
    struct meta_ptr {
        jsMsgMetaData* p = nullptr;
        ~meta_ptr() {
            if (p != nullptr) jsMsgMetaData_Destroy(p);
        }
    };

    source_options o;
    std::unique_ptr<detail::connection> conn;
    std::unique_ptr<detail::broker_watch> watch;  // used by the thread of the constructor, then of run()
    detail::consumer_config cc;
    redelivery_bound bound;
    std::atomic<bool> stop_requested{false};

    // A message handed to the engine and not yet acked.
    struct held {
        natsMsg* msg = nullptr;
        std::uint64_t sequence = 0;
        std::uint64_t delivered = 0;
        std::string message_id;
        clock::time_point touched;  // delivered, or last told in progress
    };

    // Shared between the fetching thread and the completions, under m.
    std::mutex m;
    std::condition_variable changed;
    std::unordered_map<std::uint64_t, held> in_flight;  // by submission number
    std::size_t outstanding = 0;  // submitted and not yet acked or nak'd (acks are sent before it drops)
    std::error_code fatal;
    std::string fatal_text;
    clock::time_point paused_until{};  // after a failed commit: wait before fetching more
    clock::time_point next_touch_due{};  // no held message needs an in-progress ack before this
    std::vector<std::uint64_t> exhausted;  // sequences the server will not deliver again (advisories)
    // Each message that reached MaxDeliver without a committed outcome: its sequence, and what
    // the record says of it ("sequence N (Nats-Msg-Id '...') ...").
    std::vector<std::pair<std::uint64_t, std::string>> lost;
    std::vector<std::uint64_t> accepted;  // sequences the operator accepted as handled (--accept-exhausted)
    source_result result;

    std::string source_name;
    std::string detail;  // the stream's incarnation, stored with every checkpoint
    std::unique_ptr<detail::consumer_claim> claim;  // while run() runs (claim set)
    // The stream sequence the next first delivery should have (the fetching thread's): one
    // past the highest message given to this run, or past the checkpoint.
    std::uint64_t expected_next = 1;

    // What an advisory subscription's callback reaches the run through. cnats may still be
    // running that callback on the subscription's own thread after it was unsubscribed, so
    // the gate is shared with the subscription, which lets it go once its last callback has
    // returned (on_advisories_closed); the run closes it before it returns.
    struct advisory_gate {
        std::mutex m;
        impl* target = nullptr;  // null once the run has ended
    };
    /// The run's subscription to the consumer's MaxDeliver advisories (sub null: none).
    struct advisory_subscription {
        natsSubscription* sub = nullptr;
        std::shared_ptr<advisory_gate> gate;
    };
    /// Where run() starts: the stored checkpoint (0: none) and the stream's last sequence then.
    struct start_point {
        std::uint64_t position = 0;
        std::uint64_t target = 0;  // what --until-caught-up waits to see acknowledged
    };
    /// The fetch loop's counters and timers (the fetching thread's).
    struct fetch_loop {
        std::uint64_t target = 0;
        std::chrono::milliseconds catch_up_limit{};  // --until-caught-up's wait with nothing delivered
        int failures = 0;                            // fetches failed in a row while connected
        std::uint64_t submitted = 0;                 // the next submission number
        clock::time_point next_health;
        clock::time_point next_touch;
        clock::time_point next_claim;
        clock::time_point last_delivery;  // or the last time the connection was down
        clock::time_point next_waiting_note;
        std::uint64_t pending = 0;  // messages the consumer still holds past the last one fetched
    };

    // run()'s steps, in order (source.cpp; the exhausted record's in exhausted_record.cpp).
    /// Refuses an inbox retention shorter than the consumer's redelivery bound.
    void check_retention(engine& e) const;
    /// Refuses to start while an earlier run's exhausted record stands, or (accept_exhausted)
    /// takes its sequences as handled and removes it; returns the record's path.
    std::filesystem::path take_exhausted_record(engine& e);
    /// Reads the stream and the stored checkpoint, checks the stream is the one the checkpoint
    /// was taken from, and sets where the first delivery is expected.
    start_point resume(engine& e);
    /// Takes this store's claim on the consumer (claim set).
    void take_claim(engine& e);
    /// Refuses a consumer that acknowledged messages this store never applied.
    void check_ack_floor(engine& e, std::uint64_t position);
    /// Subscribes to the consumer's MaxDeliver advisories (none if the subscription fails).
    advisory_subscription subscribe_advisories();
    /// Fetches and submits until the run stops (a stop, a fatal error, or caught up).
    void fetch_until_done(engine& e, detail::pull_fetcher& fetcher, std::uint64_t target);
    /// Waits for every submitted message's ack or nak, listens for the last advisories when
    /// messages were lost, closes the subscription and completes the result.
    void drain(engine& e, advisory_subscription& advisories, clock::time_point started);
    /// Tells of the lost messages in the run's error and appends them to the record at path.
    void record_exhausted(const std::filesystem::path& path);

    // The fetch loop's steps (source.cpp).
    /// Room in the ack window to fetch into; 0 after waiting for it, nullopt when the run stops.
    std::optional<std::size_t> room_to_fetch();
    /// Tells the broker watch whether a fetch reached the broker.
    void note_reachability(natsStatus status, bool connected);
    /// Tells the engine's watchdog what waits on the broker and whether fetching fails.
    void report_health(engine& e, natsStatus status, bool connected, const fetch_loop& loop) const;
    /// What an empty fetch leads to: a stop when caught up or failing (true), or the idle checks.
    bool idle(engine& e, natsStatus status, bool connected, const detail::pull_fetcher& fetcher, fetch_loop& loop);
    /// Hands the fetched messages up to a hole to the engine, each held until its completion.
    void submit(engine& e, detail::fetched_messages& list, fetch_loop& loop);

    void complete(std::uint64_t token, std::error_code ec, const outcome& out);
    void fail(errc e, std::string text);
    void lose(std::uint64_t sequence, std::string what);
    std::string lost_summary() const;
    bool stopping() const {
        return stop_requested.load() || (o.stop != nullptr && o.stop->load());
    }
    void touch_old_messages(clock::time_point now);
    void check_exhausted(engine& e);
    bool caught_up(std::uint64_t target);
    void check_health();
    void renew_claim();
    void refresh_settings();
    // hole_check.cpp
    /// The index of the first fetched message past a hole in the stream, msgs.size() if none.
    std::size_t cut_at_hole(const std::vector<natsMsg*>& msgs);
    /// What an until_caught_up run waits for, read from the broker now.
    std::string waiting_for(std::uint64_t target);
    static void on_advisory(natsConnection*, natsSubscription*, natsMsg* msg, void* closure);
    static void on_advisories_closed(void* closure);
};

}  // namespace idem::jetstream
