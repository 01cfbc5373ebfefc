// The JetStream source's run: one thread (the caller's) fetches from the durable pull
// consumer and submits each message to the engine with its stream sequence as checkpoint;
// the engine's completions, which run only after the commit is durable, ack each message
// (or nak it when its batch failed). Up to MaxAckPending messages are in flight, so the
// engine gathers large batches. Messages held longer than half their ack wait get an
// in-progress ack, so a long batch does not make the server deliver them again.
//
// run() reads top-down as its steps: the checks before anything is fetched (retention against
// the redelivery bound, an earlier run's exhausted record, the checkpoint against the stream,
// the claim, the ack floor), the advisory subscription, the fetch loop, then the drain that
// waits for every ack. The state they share is source_impl.hpp; the hole check is
// hole_check.cpp, the exhausted record exhausted_record.cpp.

#include "source_impl.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <thread>

namespace idem::jetstream {

namespace {

using clock = std::chrono::steady_clock;

// How long an idle source waits between checks that its consumer and stream still exist.
constexpr auto health_interval = std::chrono::seconds(5);
// Fetches that fail in a row while connected before the run gives up.
constexpr int fetch_failures_allowed = 50;

std::uint64_t decode_position(std::string_view stored) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < 8 && i < stored.size(); ++i) {
        v |= std::uint64_t(static_cast<unsigned char>(stored[i])) << (8 * i);
    }
    return v;
}

// The stream sequence an advisory names ("stream_seq":N), 0 if none.
std::uint64_t advisory_sequence(std::string_view body) {
    constexpr std::string_view key = "\"stream_seq\":";
    auto at = body.find(key);
    if (at == std::string_view::npos) return 0;
    std::uint64_t v = 0;
    for (auto i = at + key.size(); i < body.size() && body[i] >= '0' && body[i] <= '9'; ++i) {
        v = v * 10 + static_cast<std::uint64_t>(body[i] - '0');
    }
    return v;
}

}  // namespace

std::vector<std::string> split_servers(std::string_view list) { return detail::split_servers(list); }

std::string checkpoint_source(const std::string& stream, const std::string& consumer) {
    return "nats:" + stream + "/" + consumer;
}

source::source(source_options options) : impl_(std::make_unique<impl>()) {
    auto& s = *impl_;
    s.o = std::move(options);
    if (s.o.servers.empty()) throw_error(errc::invalid_argument, "a JetStream source needs at least one server");
    if (s.o.stream.empty()) throw_error(errc::invalid_argument, "a JetStream source needs a stream");
    if (s.o.fetch_batch == 0) throw_error(errc::invalid_argument, "fetch_batch must be positive");
    std::string servers;
    for (const auto& url : s.o.servers) servers += (servers.empty() ? "" : ",") + url;
    s.watch = std::make_unique<detail::broker_watch>(s.o.broker_outage_limit, servers, s.o.on_broker,
                                                     [&s] { return s.stopping(); });
    // A broker that is restarting, or a cluster that is still forming, is waited for.
    s.conn = s.watch->retry([&] { return std::make_unique<detail::connection>(s.o.servers, "idem " + s.o.consumer); });
    s.cc = s.watch->retry([&] {
        (void)detail::read_stream(*s.conn, s.o.stream);  // a missing stream is named before the consumer
        return detail::ensure_consumer(*s.conn, s.o);
    });
    s.bound = detail::bound_of(s.cc, s.o);
    s.source_name = s.o.checkpoint_name.empty() ? checkpoint_source(s.o.stream, s.o.consumer) : s.o.checkpoint_name;
}

source::~source() = default;

const redelivery_bound& source::bound() const { return impl_->bound; }

const source_result& source::result() const { return impl_->result; }

void source::stop() noexcept {
    impl_->stop_requested = true;
    impl_->changed.notify_all();
}

source_result source::run(engine& e) {
    auto& s = *impl_;
    const auto started = clock::now();
    s.check_retention(e);
    const auto record = s.take_exhausted_record(e);
    s.result = {};
    const auto start = s.resume(e);
    s.result.last_sequence = start.position;  // what a run refused from here on reports
    // This store's claim on the consumer, before anything that the consumer's state decides.
    s.take_claim(e);
    struct claim_release {
        impl& s;
        ~claim_release() {
            if (s.claim) s.claim->release();
            s.claim.reset();
        }
    } release_claim_at_end{s};
    s.check_ack_floor(e, start.position);
    {
        std::scoped_lock lock{s.m};
        s.result.last_sequence = start.position;  // a run that fetches nothing reports the stored checkpoint
    }
    // Pulls by the consumer's name: it is never created here (ensure_consumer did, or found it).
    detail::pull_fetcher fetcher{*s.conn, s.o.stream, s.o.consumer};
    auto advisories = s.subscribe_advisories();
    try {
        s.fetch_until_done(e, fetcher, start.target);
    } catch (...) {
        s.drain(e, advisories, started);
        s.record_exhausted(record);
        throw;
    }
    s.drain(e, advisories, started);
    s.check_exhausted(e);
    s.record_exhausted(record);
    std::scoped_lock lock{s.m};
    if (s.fatal) throw std::system_error(s.fatal, s.fatal_text);
    return s.result;
}

// --- before anything is fetched ------------------------------------------------------------------

void source::impl::check_retention(engine& e) const {
    const auto& retention = e.options().store.retention;
    if (retention.inbox_retention && *retention.inbox_retention < bound.bound) {
        throw_error(errc::invalid_argument,
                    "inbox retention " + format_duration(*retention.inbox_retention) +
                        " is shorter than the redelivery bound of consumer '" + o.consumer + "' of stream '" +
                        o.stream + "', " + bound.what +
                        ": a redelivery after its id was pruned would be applied again");
    }
}

source::impl::start_point source::impl::resume(engine& e) {
    auto now = watch->retry([&] { return detail::read_stream(*conn, o.stream); });
    detail = detail::checkpoint_detail(now);
    std::uint64_t position = 0;
    bool stored_checkpoint = false;
    if (auto stored = e.read().checkpoint_value(e.options().store.consumer, source_name); stored && stored->size() >= 8) {
        position = decode_position(*stored);
        stored_checkpoint = true;
        detail::check_stream(now, position, stored->substr(8), o, o.accept_stream_reset);
    }
    // A store without a checkpoint takes the stream from where it starts now.
    expected_next = std::max<std::uint64_t>({stored_checkpoint ? position + 1 : now.first_sequence, o.start_sequence, 1});
    return {position, now.last_sequence};
}

void source::impl::take_claim(engine& e) {
    claim.reset();
    if (!o.claim) return;
    auto si = detail::stream_info(*conn, o.stream);
    const int replicas = si ? std::max(1, static_cast<int>(si->Config->Replicas)) : 1;
    claim = std::make_unique<detail::consumer_claim>(*conn, o.stream, o.consumer, e.options().store.path, o.claim_ttl,
                                                     replicas);
}

// Every ack follows the commit that raised the checkpoint past its message, so the
// consumer's ack floor is never ahead of this store's checkpoint, unless the consumer
// acked for another store (a new one, or this one restored from an older copy): the
// server will not deliver those messages again, and they would be missing here.
// The server moves the ack floor past messages the consumer never delivers (other subjects
// than its filter, deleted ones): only a message it would deliver in between counts.
void source::impl::check_ack_floor(engine& e, std::uint64_t position) {
    const std::uint64_t floor = std::max(position, o.start_sequence > 0 ? o.start_sequence - 1 : 0);
    auto ci = watch->retry([&] { return detail::consumer_info(*conn, o.stream, o.consumer); });
    if (!ci || o.accept_stream_reset) return;
    const auto missed = ci->AckFloor.Stream <= floor ? std::nullopt : watch->retry([&] {
        return detail::next_matching(*conn, o.stream, cc.filter_subject, floor);
    });
    if (missed && *missed <= ci->AckFloor.Stream) {
        throw_error(errc::invalid_argument,
                    "consumer '" + o.consumer + "' of stream '" + o.stream + "' has acknowledged up to sequence " +
                        std::to_string(ci->AckFloor.Stream) + ", but " + e.options().store.path.string() +
                        " holds the stream only up to " + std::to_string(position) + " (sequence " +
                        std::to_string(*missed) +
                        " lies between): the consumer was used for another store (or this one is an older "
                        "copy), and the messages in between would never be applied here; use another consumer "
                        "name (it replays the stream into this store), or --accept-stream-reset to go on "
                        "without them");
    }
    // A restored backup resuming the checkpoint it was copied with: that is the highest sequence
    // it applied, and messages below it may have been held by a killed run, still unacknowledged
    // (so the floor stays below). What the consumer delivered past the checkpoint was applied
    // and acknowledged by the store this one copies; it never comes again. (Once this source
    // has committed a checkpoint of its own here, the check is over: pauses and other operator
    // actions in between do not end it.)
    const auto snap = e.read();
    const auto copied = snap.copied_from();
    const auto& consumer = e.options().store.consumer;
    if (copied && snap.copied_checkpoint(consumer, source_name) == snap.checkpoint_value(consumer, source_name) &&
        ci->Delivered.Stream > position) {
        throw_error(errc::invalid_argument,
                    e.options().store.path.string() + " is a backup of store " + copied->store_id +
                        " taken at commit " + std::to_string(copied->commit) + ", and consumer '" + o.consumer +
                        "' of stream '" + o.stream + "' has delivered up to sequence " +
                        std::to_string(ci->Delivered.Stream) + ", past its checkpoint " + std::to_string(position) +
                        ": what it delivered there went to the store copied, and acknowledged messages never come "
                        "again; use another consumer name (it replays the stream into this store; what the backup "
                        "holds is recognized), or --accept-stream-reset to go on without them");
    }
}

source::impl::advisory_subscription source::impl::subscribe_advisories() {
    advisory_subscription a;
    const std::string advisory = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + o.stream + "." + o.consumer;
    a.gate = std::make_shared<advisory_gate>();
    a.gate->target = this;
    auto* closure = new std::shared_ptr<advisory_gate>(a.gate);
    if (natsConnection_Subscribe(&a.sub, conn->nc(), advisory.c_str(), &on_advisory, closure) != NATS_OK) {
        a.sub = nullptr;
        delete closure;  // no subscription: no callback
    } else {
        // Freed after the subscription's last callback. Should it be closed already (the
        // connection went), its callbacks may still run: the closure's few bytes then stay.
        (void)natsSubscription_SetOnCompleteCB(a.sub, &on_advisories_closed, closure);
    }
    return a;
}

// --- the fetch loop ------------------------------------------------------------------------------

void source::impl::fetch_until_done(engine& e, detail::pull_fetcher& fetcher, std::uint64_t target) {
    e.monitor().pauses_at_boundaries();
    fetch_loop loop;
    loop.target = target;
    // --until-caught-up waits this long, connected and with nothing delivered, then stops.
    auto longest = cc.ack_wait;
    for (auto d : cc.backoff) longest = std::max(longest, d);
    loop.catch_up_limit = o.caught_up_wait.value_or(std::max<std::chrono::milliseconds>(
        std::chrono::seconds(60), std::chrono::duration_cast<std::chrono::milliseconds>(2 * longest)));
    loop.next_health = clock::now() + health_interval;
    loop.next_touch = clock::now();
    loop.next_claim = clock::now() + (claim ? claim->period() : std::chrono::milliseconds(0));
    loop.last_delivery = clock::now();
    loop.next_waiting_note = clock::now();
    for (;;) {
        if (claim && clock::now() >= loop.next_claim) {
            renew_claim();
            loop.next_claim = clock::now() + claim->period();
        }
        const auto room = room_to_fetch();
        if (!room) break;
        if (clock::now() >= loop.next_touch) {
            touch_old_messages(clock::now());
            loop.next_touch = clock::now() + std::chrono::milliseconds(100);
        }
        if (e.monitor().pause_reason()) {
            // Paused by an operator: nothing more is fetched; what is held completes and is acked.
            e.monitor().pause_taken();
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            loop.last_delivery = clock::now();  // --until-caught-up does not count the pause as waiting
            continue;
        }
        if (*room == 0) continue;
        auto want = static_cast<int>(std::min(*room, o.fetch_batch));
        detail::fetched_messages list;
        auto status = fetcher.fetch(list, want, o.fetch_wait);
        const bool connected = natsConnection_Status(conn->nc()) == NATS_CONN_STATUS_CONNECTED;
        note_reachability(status, connected);
        if (list.msgs.empty() && status == NATS_TIMEOUT && connected) loop.pending = 0;  // nothing to fetch
        report_health(e, status, connected, loop);
        if (list.msgs.empty()) {
            if (idle(e, status, connected, fetcher, loop)) break;
            continue;
        }
        loop.failures = 0;
        loop.last_delivery = clock::now();
        submit(e, list, loop);
        if (o.until_caught_up) {
            bool reached = false;
            {
                std::scoped_lock lock{m};
                reached = result.last_sequence >= target;
            }
            if (reached && caught_up(target)) break;
        }
    }
}

std::optional<std::size_t> source::impl::room_to_fetch() {
    std::unique_lock lock{m};
    if (fatal) return std::nullopt;
    if (stopping()) return std::nullopt;
    // MaxAckPending -1 is unlimited on the server: hold as many as the default would.
    auto window = cc.max_ack_pending > 0 ? static_cast<std::size_t>(cc.max_ack_pending)
                                         : std::max<std::size_t>(1000, 2 * o.fetch_batch);
    const auto room = window > outstanding ? window - outstanding : 0;
    // Completions free the window one message at a time: fetching as soon as one
    // is free would cost a round trip per message. Wait for half a fetch's worth
    // (a commit frees a whole batch at once, so this rarely waits long).
    const auto enough = std::max<std::size_t>(1, std::min(o.fetch_batch, window) / 2);
    if (room < enough || clock::now() < paused_until) {
        // The window is (nearly) full or a commit failed:
        // wait for completions, waking to keep held messages in progress.
        changed.wait_for(lock, std::chrono::milliseconds(50));
        lock.unlock();
        touch_old_messages(clock::now());
        return 0;
    }
    return room;
}

void source::impl::note_reachability(natsStatus status, bool connected) {
    // Out of reach while disconnected (cnats reconnects meanwhile) or while JetStream has
    // no responders; back once the server answers. A silent link that stays connected
    // shows in the health check's requests.
    if (!connected) {
        watch->unreachable("disconnected from '" + conn->servers() + "'");
    } else if (status == NATS_OK || status == NATS_NOT_FOUND) {
        watch->reachable();
    } else if (detail::transient(status)) {
        watch->unreachable(std::string("fetching from consumer '") + o.consumer + "': " + natsStatus_GetText(status));
    }
}

void source::impl::report_health(engine& e, natsStatus status, bool connected, const fetch_loop& loop) const {
    std::string error;
    if (!connected) {
        error = "disconnected from '" + conn->servers() + "'";
    } else if (status != NATS_OK && status != NATS_TIMEOUT && status != NATS_NOT_FOUND) {
        error = std::string("fetching from consumer '") + o.consumer + "': " + natsStatus_GetText(status);
    }
    e.monitor().source("jetstream " + o.stream + "/" + o.consumer, loop.pending, "events", error);
}

bool source::impl::idle(engine& e, natsStatus status, bool connected, const detail::pull_fetcher& fetcher,
                        fetch_loop& loop) {
    if (status != NATS_OK && status != NATS_TIMEOUT && status != NATS_NOT_FOUND && connected &&
        !detail::transient(status) && ++loop.failures > fetch_failures_allowed) {
        detail::throw_nats(status, "fetching from consumer '" + o.consumer + "' of stream '" + o.stream + "'" +
                                       (status == NATS_ERR ? " (" + fetcher.failure() + ")" : ""));
    }
    if (status != NATS_OK && status != NATS_TIMEOUT && status != NATS_NOT_FOUND) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Idle: is the run done, and is the consumer still there?
    if (o.until_caught_up && caught_up(loop.target)) return true;
    if (natsConnection_Status(conn->nc()) != NATS_CONN_STATUS_CONNECTED) loop.last_delivery = clock::now();
    if (o.until_caught_up && clock::now() - loop.last_delivery > loop.catch_up_limit) {
        const auto what = waiting_for(loop.target);
        std::scoped_lock lock{m};
        fail(what.find("below that") != std::string::npos ? errc::stream_changed : errc::broker_failed,
             "--until-caught-up waited " + format_duration(loop.catch_up_limit) + " with nothing delivered for " +
                 what + "; the run stopped without catching up (--caught-up-wait sets how long it waits)");
        return true;
    }
    if (o.until_caught_up && clock::now() >= loop.next_waiting_note &&
        clock::now() - loop.last_delivery > std::chrono::seconds(2)) {
        if (o.on_waiting) o.on_waiting("waiting for " + waiting_for(loop.target));
        loop.next_waiting_note = clock::now() + health_interval;
    }
    check_exhausted(e);
    if (clock::now() >= loop.next_health) {
        if (natsConnection_Status(conn->nc()) == NATS_CONN_STATUS_CONNECTED) {
            try {
                check_health();
                watch->reachable();
            } catch (const detail::broker_unreachable& err) {
                watch->unreachable(err.what());
            }
        }
        loop.next_health = clock::now() + health_interval;
    }
    return false;
}

void source::impl::submit(engine& e, detail::fetched_messages& list, fetch_loop& loop) {
    const auto cut = cut_at_hole(list.msgs);
    for (auto i = cut; i < list.msgs.size(); ++i) {
        // Past a hole: not applied; offered again to the run that goes on (a reset accepted).
        (void)detail::nak(*conn, list.msgs[i], std::chrono::milliseconds(0));
    }
    for (std::size_t i = 0; i < cut; ++i) {
        natsMsg* msg = list.msgs[i];
        list.msgs[i] = nullptr;  // owned here now
        // Metadata and headers are read on this thread, before anyone else sees the message.
        meta_ptr meta;
        held h;
        h.msg = msg;
        h.touched = clock::now();
        if (natsMsg_GetMetaData(&meta.p, msg) == NATS_OK) {
            h.sequence = meta.p->Sequence.Stream;
            h.delivered = meta.p->NumDelivered;
            loop.pending = meta.p->NumPending;
        }
        const char* id = nullptr;
        if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) h.message_id = id;
        delivery d;
        d.body.assign(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
        d.message_id = h.message_id;
        d.transport = o.stream;  // a Nats-Msg-Id is unique within its stream only
        checkpoint at{source_name, h.sequence, detail, true};
        const auto token = loop.submitted++;
        {
            std::scoped_lock lock{m};
            ++result.fetched;
            if (h.delivered > 1) ++result.redelivered;
            ++outstanding;
            in_flight.emplace(token, std::move(h));
        }
        e.async_apply(std::move(d), std::move(at), [this, token](std::error_code ec, outcome out) {
            complete(token, ec, out);
        });
    }
    list.clear();  // destroys what was not taken: the messages past a hole, nak'd above
}

// --- after the loop ------------------------------------------------------------------------------

void source::impl::drain(engine& e, advisory_subscription& advisories, clock::time_point started) {
    // Everything handed out is acked or nak'd before the subscription goes (a message
    // refers to it), and the server has the acks before the run returns.
    std::unique_lock lock{m};
    changed.wait(lock, [&] { return outstanding == 0; });
    lock.unlock();
    try {
        conn->flush(std::chrono::seconds(5));
    } catch (const std::system_error&) {
        // Disconnected: acks not yet sent are lost, and the messages come again as duplicates.
    }
    lock.lock();
    const bool exhausted_stop = !lost.empty();
    lock.unlock();
    if (exhausted_stop) {
        // Messages an earlier run held may reach MaxDeliver after this run stops, and the
        // server tells of each once: listen until none is held (bounded by the longest wait).
        auto longest = cc.ack_wait;
        for (auto d : cc.backoff) longest = std::max(longest, d);
        const auto until = clock::now() + longest + std::chrono::seconds(2);
        while (clock::now() < until) {
            try {
                auto ci = detail::consumer_info(*conn, o.stream, o.consumer);
                if (!ci || ci->NumAckPending == 0) break;
            } catch (const std::system_error&) {
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last advisories' way here
        check_exhausted(e);
    }
    {
        std::scoped_lock gate_lock{advisories.gate->m};
        advisories.gate->target = nullptr;  // a callback still running on cnats' thread no longer reaches this
    }
    conn->release({advisories.sub});
    refresh_settings();
    std::scoped_lock result_lock{m};
    result.disconnects = conn->events().disconnects.load();
    result.broker_outages = watch->outages();
    result.elapsed = clock::now() - started;
}

// --- the completions and what the loop consults --------------------------------------------------

void source::impl::fail(errc e, std::string text) {
    // Under m.
    if (fatal) return;
    fatal = make_error_code(e);
    fatal_text = std::move(text);
}

void source::impl::lose(std::uint64_t sequence, std::string what) {
    // Under m. Every such message is named, not only the first: the server tells of each once.
    // One that failed its last delivery here is told of by an advisory too: named once.
    if (std::any_of(lost.begin(), lost.end(), [&](const auto& l) { return l.first == sequence; })) return;
    lost.emplace_back(sequence, "sequence " + std::to_string(sequence) + std::move(what));
    fail(errc::delivery_exhausted, "");
}

void source::impl::complete(std::uint64_t token, std::error_code ec, const outcome& out) {
    held h;
    {
        std::scoped_lock lock{m};
        auto it = in_flight.find(token);
        h = std::move(it->second);
        in_flight.erase(it);
    }
    // Out of the map, no other thread touches the message: ack it without the lock.
    ack_event ev{h.sequence, h.delivered, h.message_id, !ec, ec ? outcome{} : out};
    // Before the ack leaves: a process killed in between leaves a line whose ack never reached the
    // server (the message comes again and is acked again), never an ack without its line.
    if (o.on_ack) o.on_ack(ev);
    natsStatus sent = NATS_OK;
    if (!ec && claim && clock::now() >= claim->held_until()) {
        // The claim may have expired, and another store may hold the consumer now: an ack could
        // take the message from it. Committed here, the message comes again (a duplicate) to
        // whichever store holds the claim once its AckWait runs out.
    } else if (!ec) {
        sent = detail::ack(*conn, h.msg, o.ack_sync, std::chrono::seconds(5));
    } else {
        sent = detail::nak(*conn, h.msg, o.nak_delay);
    }
    natsMsg_Destroy(h.msg);
    {
        std::scoped_lock lock{m};
        if (!ec) {
            ++result.acked;
            ++result.outcomes[static_cast<std::size_t>(out.kind)];
            result.last_sequence = std::max(result.last_sequence, h.sequence);
            std::erase(exhausted, h.sequence);  // its last delivery committed: nothing is lost
        } else {
            ++result.nakked;
            paused_until = clock::now() + o.nak_delay;
            if (cc.max_deliver > 0 && static_cast<std::int64_t>(h.delivered) >= cc.max_deliver) {
                lose(h.sequence,
                     (h.message_id.empty() ? std::string() : " (Nats-Msg-Id '" + h.message_id + "')") +
                     " failed to commit on its last delivery (" + ec.message() + ")");
            }
        }
        (void)sent;  // a lost ack only makes the server deliver the message again: a duplicate
        --outstanding;
        // Under the lock: the moment it is released, run() may return and the source go.
        changed.notify_all();
    }
}

void source::impl::touch_old_messages(clock::time_point now) {
    std::scoped_lock lock{m};
    // Messages are held far shorter than half an ack wait as a rule: a pass over the whole
    // window (MaxAckPending entries) runs only once one may be due, not every wake-up.
    if (now < next_touch_due) return;
    auto due = clock::time_point::max();
    for (auto& [token, h] : in_flight) {
        auto half = cc.wait_after(static_cast<std::int64_t>(h.delivered)) / 2;
        if (now - h.touched > half) {
            (void)detail::in_progress(*conn, h.msg);
            h.touched = now;
        }
        due = std::min(due, h.touched + std::chrono::duration_cast<clock::duration>(half));
    }
    // A message fetched from now on is due no earlier than the shortest wait allows.
    auto shortest = cc.ack_wait;
    if (!cc.backoff.empty()) shortest = *std::min_element(cc.backoff.begin(), cc.backoff.end());
    const auto fresh = now + std::chrono::duration_cast<clock::duration>(shortest / 2);
    next_touch_due = std::min(due, fresh);
}

void source::impl::on_advisory(natsConnection*, natsSubscription*, natsMsg* msg, void* closure) {
    auto& gate = **static_cast<std::shared_ptr<advisory_gate>*>(closure);
    auto seq = advisory_sequence(std::string_view(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg))));
    natsMsg_Destroy(msg);
    if (seq == 0) return;
    std::scoped_lock gate_lock{gate.m};
    if (gate.target == nullptr) return;  // the run has ended: the source may be gone
    std::scoped_lock lock{gate.target->m};
    gate.target->exhausted.push_back(seq);
}

void source::impl::on_advisories_closed(void* closure) { delete static_cast<std::shared_ptr<advisory_gate>*>(closure); }

// A message the server gave up on is lost unless its outcome is committed: one still in
// flight decides in complete(); otherwise the inbox is asked for its message id.
void source::impl::check_exhausted(engine& e) {
    std::vector<std::uint64_t> seqs;
    {
        std::scoped_lock lock{m};
        std::erase_if(exhausted, [&](std::uint64_t seq) {
            // Its advisory may come again after the run that recorded it: the operator handled it.
            return std::find(accepted.begin(), accepted.end(), seq) != accepted.end();
        });
        for (auto seq : exhausted) {
            bool held_now = std::any_of(in_flight.begin(), in_flight.end(),
                                        [&](const auto& kv) { return kv.second.sequence == seq; });
            if (!held_now) seqs.push_back(seq);
        }
        for (auto seq : seqs) std::erase(exhausted, seq);
    }
    for (auto seq : seqs) {
        natsMsg* msg = nullptr;
        jsErrCode jerr{};
        if (js_GetMsg(&msg, conn->js(), o.stream.c_str(), seq, nullptr, &jerr) != NATS_OK) continue;  // gone: nothing to apply
        const char* id = nullptr;
        std::string message_id;
        std::string nats_id;
        if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) {
            nats_id = id;
            message_id = transport_message_id(o.stream, id);
        } else {
            envelope ev;
            parse_error err;
            envelope_parser parser;
            if (parser.parse(std::string_view(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg))),
                             ev, err)) {
                message_id = ev.msgid.empty() ? ev.message_id() : transport_message_id(o.stream, ev.msgid);
            }
        }
        natsMsg_Destroy(msg);
        if (!message_id.empty() && e.read().consumer(e.options().store.consumer).inbox_lookup(message_id)) continue;
        std::scoped_lock lock{m};
        lose(seq, (nats_id.empty() ? std::string() : " (Nats-Msg-Id '" + nats_id + "')") +
             " was not committed by its last delivery");
    }
}

void source::impl::check_health() {
    if (natsConnection_Status(conn->nc()) != NATS_CONN_STATUS_CONNECTED) return;  // judged once reconnected
    auto now = detail::read_stream(*conn, o.stream);
    if (detail::checkpoint_detail(now) != detail) {
        std::scoped_lock lock{m};
        fail(errc::stream_changed, "stream '" + o.stream + "' was deleted and created again while it was consumed");
        return;
    }
    if (!detail::consumer_info(*conn, o.stream, o.consumer)) {
        std::scoped_lock lock{m};
        fail(errc::broker_failed, "consumer '" + o.consumer + "' of stream '" + o.stream +
                                      "' was deleted while it was consumed");
    }
}

// Whether everything up to target is acked (nothing of this run in flight): the consumer's
// ack floor reached it, or nothing is pending at all (a filtered consumer whose last message
// is below target).
bool source::impl::caught_up(std::uint64_t target) {
    {
        std::scoped_lock lock{m};
        if (outstanding != 0) return false;
    }
    if (target == 0) return true;
    try {
        conn->flush(std::chrono::seconds(5));  // the acks sent so far are processed
        auto ci = detail::consumer_info(*conn, o.stream, o.consumer);
        if (!ci) return false;
        return ci->AckFloor.Stream >= target || (ci->NumPending == 0 && ci->NumAckPending == 0);
    } catch (const std::system_error&) {
        return false;  // disconnected: asked again later
    }
}

// Renews this store's claim on the consumer; one another store took over stops the run.
void source::impl::renew_claim() {
    std::string other;
    try {
        other = claim->renew();
    } catch (const std::system_error&) {
        return;  // the broker is away: no ack leaves once the claim may have expired
    }
    if (other.empty()) return;
    std::scoped_lock lock{m};
    fail(errc::lease_lost, "consumer '" + o.consumer + "' of stream '" + o.stream + "' was claimed by " + other +
                               " while this run held it (no renewal reached the broker within the claim's time); "
                               "this run stopped, and what it committed without an ack comes to that store too");
}

// The consumer's settings read again (changed on purpose while the run ran): what the run's
// summary reports.
void source::impl::refresh_settings() {
    try {
        auto ci = detail::consumer_info(*conn, o.stream, o.consumer);
        if (!ci) return;
        auto have = detail::settings_of(*ci);
        auto b = detail::bound_of(have, o);
        std::scoped_lock lock{m};
        cc = std::move(have);
        bound = std::move(b);
    } catch (const std::system_error&) {
        // No broker, or a bound it no longer gives: the one read at the start stays.
    }
}

}  // namespace idem::jetstream
