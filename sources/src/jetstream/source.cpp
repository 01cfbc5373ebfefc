// The JetStream source's run: one thread (the caller's) fetches from the durable pull
// consumer and submits each message to the engine with its stream sequence as checkpoint;
// the engine's completions, which run only after the commit is durable, ack each message
// (or nak it when its batch failed). Up to MaxAckPending messages are in flight, so the
// engine gathers large batches. Messages held longer than half their ack wait get an
// in-progress ack, so a long batch does not make the server deliver them again.

#include <idem/sources/jetstream.hpp>

#include "broker_watch.hpp"
#include "claim.hpp"
#include "connection.hpp"
#include "consumer_setup.hpp"
#include "pull.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idem::jetstream {

namespace {

using clock = std::chrono::steady_clock;

// How long an idle source waits between checks that its consumer and stream still exist.
constexpr auto health_interval = std::chrono::seconds(5);
// Fetches that fail in a row while connected before the run gives up.
constexpr int fetch_failures_allowed = 50;

struct meta_ptr {
    jsMsgMetaData* p = nullptr;
    ~meta_ptr() {
        if (p != nullptr) jsMsgMetaData_Destroy(p);
    }
};

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

// Appends text and a newline to path and syncs it: the record outlives a crash right after.
void append_synced(const std::filesystem::path& path, const std::string& text) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "writing " + path.string());
    const std::string line = text + "\n";
    std::size_t done = 0;
    int err = 0;
    while (done < line.size()) {
        auto n = ::write(fd, line.data() + done, line.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        done += static_cast<std::size_t>(n);
    }
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    if (err != 0) throw std::system_error(err, std::generic_category(), "writing " + path.string());
}

}  // namespace

std::filesystem::path exhausted_record(const std::filesystem::path& store, const std::string& checkpoint_source) {
    std::string name = "jetstream-exhausted.";
    for (char c : checkpoint_source) {
        const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        name += plain ? c : '_';
    }
    return store / name;
}

std::vector<std::string> split_servers(std::string_view list) { return detail::split_servers(list); }

std::string checkpoint_source(const std::string& stream, const std::string& consumer) {
    return "nats:" + stream + "/" + consumer;
}

struct source::impl {
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
    std::size_t cut_at_hole(const std::vector<natsMsg*>& msgs);
    void renew_claim();
    std::string waiting_for(std::uint64_t target);
    void refresh_settings();
    // What the advisory subscription's callback reaches the run through. cnats may still be
    // running that callback on the subscription's own thread after it was unsubscribed, so
    // the gate is shared with the subscription, which lets it go once its last callback has
    // returned (on_advisories_closed); the run closes it before it returns.
    struct advisory_gate {
        std::mutex m;
        impl* target = nullptr;  // null once the run has ended
    };
    static void on_advisory(natsConnection*, natsSubscription*, natsMsg* msg, void* closure);
    static void on_advisories_closed(void* closure);
};

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

std::string source::impl::lost_summary() const {
    // Under m.
    std::string text = std::to_string(lost.size()) + " message" + (lost.size() == 1 ? "" : "s") + " of stream '" +
                       o.stream + "' reached MaxDeliver " + std::to_string(cc.max_deliver) +
                       " without a committed outcome, and the server will not deliver " +
                       (lost.size() == 1 ? "it" : "them") + " again: ";
    for (std::size_t i = 0; i < lost.size() && i < 5; ++i) text += (i ? "; " : "") + lost[i].second;
    if (lost.size() > 5) text += "; and " + std::to_string(lost.size() - 5) + " more";
    return text + ". Publish them again once the cause is fixed";
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

// The index of the first message of a fetched list that lies past a hole, its size if none.
// A first delivery beyond expected_next skipped sequences; the stream's own state must explain
// them (other subjects than the filter, or messages still to be redelivered). One it does not
// (the stream now starts past expected_next: purged or trimmed before they were given to this
// run; or it was recreated, or ends before them) stops the run as the start-up check does.
std::size_t source::impl::cut_at_hole(const std::vector<natsMsg*>& msgs) {
    auto next = expected_next;
    auto before_jump = next;
    std::optional<std::size_t> jump;
    for (std::size_t i = 0; i < msgs.size(); ++i) {
        meta_ptr meta;
        if (natsMsg_GetMetaData(&meta.p, msgs[i]) != NATS_OK) continue;
        const auto seq = meta.p->Sequence.Stream;
        if (seq > next && !jump) {
            jump = i;
            before_jump = next;
        }
        next = std::max(next, seq + 1);
    }
    if (!jump || o.accept_stream_reset) {
        expected_next = next;
        return msgs.size();
    }
    detail::stream_state now;
    try {
        now = detail::read_stream(*conn, o.stream);
    } catch (const std::system_error&) {
        // The broker is away: the skipped sequences cannot be judged now. The messages from the
        // jump on are offered again (nak'd) and judged when they come back.
        expected_next = before_jump;
        return *jump;
    }
    const auto given = before_jump - 1;  // the highest sequence given to the run before the jump
    // The messages just delivered exist: a cluster's answer that ends before them comes from a
    // replica that lags (a recreated stream shows in its creation time). And that answer may be
    // briefly off while the stream changes leader: a hole is believed when the stream still
    // shows it twice more, half a second apart (a removal stays).
    auto judge = [&] {
        auto seen = now;
        seen.last_sequence = std::max(seen.last_sequence, next - 1);
        return detail::stream_change(seen, given, detail, o);
    };
    auto why = judge();
    for (int look = 0; look < 2 && !why.empty(); ++look) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        try {
            now = detail::read_stream(*conn, o.stream);
        } catch (const std::system_error&) {
            expected_next = before_jump;
            return *jump;
        }
        why = judge();
    }
    if (why.empty()) {
        expected_next = next;
        return msgs.size();
    }
    meta_ptr meta;
    std::uint64_t at = 0;
    if (natsMsg_GetMetaData(&meta.p, msgs[*jump]) == NATS_OK) at = meta.p->Sequence.Stream;
    std::scoped_lock lock{m};
    fail(errc::stream_changed,
         "stream '" + o.stream + "' changed while consumer '" + o.consumer + "' consumed it: it " + why +
             " (the run had been given the messages up to sequence " + std::to_string(given) + ", then sequence " +
             std::to_string(at) + " came); sequence " + std::to_string(at) +
             " and what follows were not applied, and the run stopped. To take the stream as it is now, start "
             "again with --accept-stream-reset");
    return *jump;
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

// What an until_caught_up run waits for, read from the broker now.
std::string source::impl::waiting_for(std::uint64_t target) {
    std::string text = "consumer '" + o.consumer + "' of stream '" + o.stream +
                       "' to have acknowledged up to sequence " + std::to_string(target) +
                       ", the stream's last when the run began";
    try {
        auto ci = detail::consumer_info(*conn, o.stream, o.consumer);
        auto now = detail::read_stream(*conn, o.stream);
        if (ci) {
            const auto unacked = static_cast<std::uint64_t>(ci->NumAckPending);
            text += ": its ack floor is " + std::to_string(ci->AckFloor.Stream) + ", " + std::to_string(unacked) +
                    (unacked == 1 ? " message waits" : " messages wait") +
                    " for an ack (redelivered once its AckWait runs out), " + std::to_string(ci->NumPending) +
                    " still to be delivered";
        }
        text += "; the stream's last sequence is now " + std::to_string(now.last_sequence);
        if (now.last_sequence < target) {
            text += ", below that: the stream lost messages after the run began (its replicas disagree, or it "
                    "was purged)";
        }
    } catch (const std::system_error& err) {
        text += " (" + std::string(err.what()) + ")";
    }
    return text;
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

source_result source::run(engine& e) {
    auto& s = *impl_;
    const auto started = clock::now();
    const auto& retention = e.options().store.retention;
    if (retention.inbox_retention && *retention.inbox_retention < s.bound.bound) {
        throw_error(errc::invalid_argument,
                    "inbox retention " + format_duration(*retention.inbox_retention) +
                        " is shorter than the redelivery bound of consumer '" + s.o.consumer + "' of stream '" +
                        s.o.stream + "', " + s.bound.what +
                        ": a redelivery after its id was pruned would be applied again");
    }
    // A message an earlier run could not commit on its last delivery is not delivered again:
    // the run that saw it stopped and left a record, and no later run goes on as if nothing
    // happened until the operator says the messages were handled.
    const auto record = exhausted_record(e.options().store.path, s.source_name);
    if (std::filesystem::exists(record)) {
        std::ifstream in{record};
        std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
        while (!text.empty() && text.back() == '\n') text.pop_back();
        if (text.empty()) text = "(the record is empty: it could not be written; the run that stopped named the messages)";
        for (auto& ch : text) ch = ch == '\n' ? ';' : ch;  // a line per message
        if (!s.o.accept_exhausted) {
            throw_error(errc::delivery_exhausted,
                        "an earlier run of consumer '" + s.o.consumer + "' of stream '" + s.o.stream +
                            "' stopped because messages reached MaxDeliver without a committed outcome (recorded in " +
                            record.string() + "): " + text +
                            "; publish them again (or decide to go without them), then start once with "
                            "--accept-exhausted");
        }
        // The record's lines begin "sequence N": those are handled now.
        for (std::size_t at = text.find("sequence "); at != std::string::npos; at = text.find(";sequence ", at + 1)) {
            if (text[at] == ';') ++at;
            std::uint64_t seq = 0;
            std::from_chars(text.data() + at + 9, text.data() + text.size(), seq);
            if (seq != 0) s.accepted.push_back(seq);
        }
        std::filesystem::remove(record);
    }
    s.result = {};
    auto now = s.watch->retry([&] { return detail::read_stream(*s.conn, s.o.stream); });
    s.detail = detail::checkpoint_detail(now);
    std::uint64_t position = 0;
    bool stored_checkpoint = false;
    if (auto stored = e.read().checkpoint_value(e.options().store.consumer, s.source_name); stored && stored->size() >= 8) {
        position = decode_position(*stored);
        stored_checkpoint = true;
        detail::check_stream(now, position, stored->substr(8), s.o, s.o.accept_stream_reset);
    }
    // A store without a checkpoint takes the stream from where it starts now.
    s.expected_next = std::max<std::uint64_t>({stored_checkpoint ? position + 1 : now.first_sequence,
                                               s.o.start_sequence, 1});
    s.result.last_sequence = position;  // what a run refused from here on reports
    // This store's claim on the consumer, before anything that the consumer's state decides.
    s.claim.reset();
    if (s.o.claim) {
        auto si = detail::stream_info(*s.conn, s.o.stream);
        const int replicas = si ? std::max(1, static_cast<int>(si->Config->Replicas)) : 1;
        s.claim = std::make_unique<detail::consumer_claim>(*s.conn, s.o.stream, s.o.consumer, e.options().store.path,
                                                           s.o.claim_ttl, replicas);
    }
    struct claim_release {
        impl& s;
        ~claim_release() {
            if (s.claim) s.claim->release();
            s.claim.reset();
        }
    } release_claim_at_end{s};
    // Every ack follows the commit that raised the checkpoint past its message, so the
    // consumer's ack floor is never ahead of this store's checkpoint, unless the consumer
    // acked for another store (a new one, or this one restored from an older copy): the
    // server will not deliver those messages again, and they would be missing here.
    // The server moves the ack floor past messages the consumer never delivers (other subjects
    // than its filter, deleted ones): only a message it would deliver in between counts.
    const std::uint64_t floor = std::max(position, s.o.start_sequence > 0 ? s.o.start_sequence - 1 : 0);
    if (auto ci = s.watch->retry([&] { return detail::consumer_info(*s.conn, s.o.stream, s.o.consumer); });
        ci && ci->AckFloor.Stream > floor && !s.o.accept_stream_reset) {
        const auto missed =
            s.watch->retry([&] { return detail::next_matching(*s.conn, s.o.stream, s.cc.filter_subject, floor); });
        if (missed && *missed <= ci->AckFloor.Stream) {
            throw_error(errc::invalid_argument,
                        "consumer '" + s.o.consumer + "' of stream '" + s.o.stream +
                            "' has acknowledged up to sequence " + std::to_string(ci->AckFloor.Stream) + ", but " +
                            e.options().store.path.string() + " holds the stream only up to " +
                            std::to_string(position) + " (sequence " + std::to_string(*missed) +
                            " lies between): the consumer was used for another store (or this one is an older "
                            "copy), and the messages in between would never be applied here; use another consumer "
                            "name (it replays the stream into this store), or --accept-stream-reset to go on "
                            "without them");
        }
    }
    const std::uint64_t target = now.last_sequence;
    {
        std::scoped_lock lock{s.m};
        s.result.last_sequence = position;  // a run that fetches nothing reports the stored checkpoint
    }

    // Pulls by the consumer's name: it is never created here (ensure_consumer did, or found it).
    detail::pull_fetcher fetcher{*s.conn, s.o.stream, s.o.consumer};
    natsSubscription* advisories = nullptr;
    const std::string advisory = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + s.o.stream + "." + s.o.consumer;
    auto gate = std::make_shared<impl::advisory_gate>();
    gate->target = &s;
    auto* closure = new std::shared_ptr<impl::advisory_gate>(gate);
    if (natsConnection_Subscribe(&advisories, s.conn->nc(), advisory.c_str(), &impl::on_advisory, closure) != NATS_OK) {
        advisories = nullptr;
        delete closure;  // no subscription: no callback
    } else {
        // Freed after the subscription's last callback. Should it be closed already (the
        // connection went), its callbacks may still run: the closure's few bytes then stay.
        (void)natsSubscription_SetOnCompleteCB(advisories, &impl::on_advisories_closed, closure);
    }

    auto record_exhausted = [&](const std::filesystem::path& path) {
        std::string text;
        {
            std::scoped_lock lock{s.m};
            if (s.lost.empty()) return;
            // Lost messages are told of even when another error stopped the run first.
            if (s.fatal == errc::delivery_exhausted) {
                s.fatal_text = s.lost_summary();
            } else {
                s.fatal_text += "; besides, " + s.lost_summary();
            }
            for (const auto& l : s.lost) text += (text.empty() ? "" : "\n") + l.second;
        }
        try {
            append_synced(path, text);
            std::scoped_lock lock{s.m};
            if (s.lost.size() > 5) s.fatal_text += " (each is listed in " + path.string() + ")";
        } catch (const std::system_error& err) {
            std::scoped_lock lock{s.m};
            // Then this message is all the operator gets: every sequence, as ranges.
            std::vector<std::uint64_t> seqs;
            for (const auto& l : s.lost) seqs.push_back(l.first);
            std::sort(seqs.begin(), seqs.end());
            std::string ranges;
            for (std::size_t i = 0; i < seqs.size();) {
                auto j = i;
                while (j + 1 < seqs.size() && seqs[j + 1] <= seqs[j] + 1) ++j;
                ranges += (ranges.empty() ? "" : ", ") + std::to_string(seqs[i]) +
                          (seqs[j] != seqs[i] ? "-" + std::to_string(seqs[j]) : std::string());
                i = j + 1;
            }
            s.fatal_text += " (and it could not be recorded: " + std::string(err.what()) + "; the sequences: " +
                            ranges + ")";
        }
    };

    std::uint64_t submitted = 0;
    auto finish = [&] {
        // Everything handed out is acked or nak'd before the subscription goes (a message
        // refers to it), and the server has the acks before the run returns.
        std::unique_lock lock{s.m};
        s.changed.wait(lock, [&] { return s.outstanding == 0; });
        lock.unlock();
        try {
            s.conn->flush(std::chrono::seconds(5));
        } catch (const std::system_error&) {
            // Disconnected: acks not yet sent are lost, and the messages come again as duplicates.
        }
        lock.lock();
        const bool exhausted_stop = !s.lost.empty();
        lock.unlock();
        if (exhausted_stop) {
            // Messages an earlier run held may reach MaxDeliver after this run stops, and the
            // server tells of each once: listen until none is held (bounded by the longest wait).
            auto longest = s.cc.ack_wait;
            for (auto d : s.cc.backoff) longest = std::max(longest, d);
            const auto until = clock::now() + longest + std::chrono::seconds(2);
            while (clock::now() < until) {
                try {
                    auto ci = detail::consumer_info(*s.conn, s.o.stream, s.o.consumer);
                    if (!ci || ci->NumAckPending == 0) break;
                } catch (const std::system_error&) {
                    break;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(200));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last advisories' way here
            s.check_exhausted(e);
        }
        {
            std::scoped_lock gate_lock{gate->m};
            gate->target = nullptr;  // a callback still running on cnats' thread no longer reaches s
        }
        s.conn->release({advisories});
        s.refresh_settings();
        std::scoped_lock result_lock{s.m};
        s.result.disconnects = s.conn->events().disconnects.load();
        s.result.broker_outages = s.watch->outages();
        s.result.elapsed = clock::now() - started;
    };

    // --until-caught-up waits this long, connected and with nothing delivered, then stops.
    auto longest = s.cc.ack_wait;
    for (auto d : s.cc.backoff) longest = std::max(longest, d);
    const auto catch_up_limit = s.o.caught_up_wait.value_or(std::max<std::chrono::milliseconds>(
        std::chrono::seconds(60), std::chrono::duration_cast<std::chrono::milliseconds>(2 * longest)));
    try {
        int failures = 0;
        auto next_health = clock::now() + health_interval;
        auto next_touch = clock::now();
        auto next_claim = clock::now() + (s.claim ? s.claim->period() : std::chrono::milliseconds(0));
        auto last_delivery = clock::now();  // or the last time the connection was down
        auto next_waiting_note = clock::now();
        for (;;) {
            if (s.claim && clock::now() >= next_claim) {
                s.renew_claim();
                next_claim = clock::now() + s.claim->period();
            }
            std::size_t room = 0;
            {
                std::unique_lock lock{s.m};
                if (s.fatal) break;
                if (s.stopping()) break;
                // MaxAckPending -1 is unlimited on the server: hold as many as the default would.
                auto window = s.cc.max_ack_pending > 0 ? static_cast<std::size_t>(s.cc.max_ack_pending)
                                                       : std::max<std::size_t>(1000, 2 * s.o.fetch_batch);
                room = window > s.outstanding ? window - s.outstanding : 0;
                // Completions free the window one message at a time: fetching as soon as one
                // is free would cost a round trip per message. Wait for half a fetch's worth
                // (a commit frees a whole batch at once, so this rarely waits long).
                const auto enough = std::max<std::size_t>(1, std::min(s.o.fetch_batch, window) / 2);
                if (room < enough || clock::now() < s.paused_until) {
                    // The window is (nearly) full or a commit failed:
                    // wait for completions, waking to keep held messages in progress.
                    s.changed.wait_for(lock, std::chrono::milliseconds(50));
                    lock.unlock();
                    s.touch_old_messages(clock::now());
                    continue;
                }
            }
            if (clock::now() >= next_touch) {
                s.touch_old_messages(clock::now());
                next_touch = clock::now() + std::chrono::milliseconds(100);
            }
            auto want = static_cast<int>(std::min(room, s.o.fetch_batch));
            detail::fetched_messages list;
            auto status = fetcher.fetch(list, want, s.o.fetch_wait);
            const bool connected = natsConnection_Status(s.conn->nc()) == NATS_CONN_STATUS_CONNECTED;
            // Out of reach while disconnected (cnats reconnects meanwhile) or while JetStream has
            // no responders; back once the server answers. A silent link that stays connected
            // shows in the health check's requests.
            if (!connected) {
                s.watch->unreachable("disconnected from '" + s.conn->servers() + "'");
            } else if (status == NATS_OK || status == NATS_NOT_FOUND) {
                s.watch->reachable();
            } else if (detail::transient(status)) {
                s.watch->unreachable(std::string("fetching from consumer '") + s.o.consumer + "': " +
                                     natsStatus_GetText(status));
            }
            if (list.msgs.empty()) {
                if (status != NATS_OK && status != NATS_TIMEOUT && status != NATS_NOT_FOUND && connected &&
                    !detail::transient(status) && ++failures > fetch_failures_allowed) {
                    detail::throw_nats(status, "fetching from consumer '" + s.o.consumer + "' of stream '" +
                                                   s.o.stream + "'" + (status == NATS_ERR ? " (" + fetcher.failure() + ")" : ""));
                }
                if (status != NATS_OK && status != NATS_TIMEOUT && status != NATS_NOT_FOUND) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(100));
                }
                // Idle: is the run done, and is the consumer still there?
                if (s.o.until_caught_up && s.caught_up(target)) break;
                if (natsConnection_Status(s.conn->nc()) != NATS_CONN_STATUS_CONNECTED) last_delivery = clock::now();
                if (s.o.until_caught_up && clock::now() - last_delivery > catch_up_limit) {
                    const auto what = s.waiting_for(target);
                    std::scoped_lock lock{s.m};
                    s.fail(what.find("below that") != std::string::npos ? errc::stream_changed : errc::broker_failed,
                           "--until-caught-up waited " + format_duration(catch_up_limit) +
                               " with nothing delivered for " + what +
                               "; the run stopped without catching up (--caught-up-wait sets how long it waits)");
                    break;
                }
                if (s.o.until_caught_up && clock::now() >= next_waiting_note &&
                    clock::now() - last_delivery > std::chrono::seconds(2)) {
                    if (s.o.on_waiting) s.o.on_waiting("waiting for " + s.waiting_for(target));
                    next_waiting_note = clock::now() + health_interval;
                }
                s.check_exhausted(e);
                if (clock::now() >= next_health) {
                    if (natsConnection_Status(s.conn->nc()) == NATS_CONN_STATUS_CONNECTED) {
                        try {
                            s.check_health();
                            s.watch->reachable();
                        } catch (const detail::broker_unreachable& err) {
                            s.watch->unreachable(err.what());
                        }
                    }
                    next_health = clock::now() + health_interval;
                }
                continue;
            }
            failures = 0;
            last_delivery = clock::now();
            const auto cut = s.cut_at_hole(list.msgs);
            for (auto i = cut; i < list.msgs.size(); ++i) {
                // Past a hole: not applied; offered again to the run that goes on (a reset accepted).
                (void)detail::nak(*s.conn, list.msgs[i], std::chrono::milliseconds(0));
            }
            for (std::size_t i = 0; i < cut; ++i) {
                natsMsg* msg = list.msgs[i];
                list.msgs[i] = nullptr;  // owned here now
                // Metadata and headers are read on this thread, before anyone else sees the message.
                meta_ptr meta;
                impl::held h;
                h.msg = msg;
                h.touched = clock::now();
                if (natsMsg_GetMetaData(&meta.p, msg) == NATS_OK) {
                    h.sequence = meta.p->Sequence.Stream;
                    h.delivered = meta.p->NumDelivered;
                }
                const char* id = nullptr;
                if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) h.message_id = id;
                delivery d;
                d.body.assign(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
                d.message_id = h.message_id;
                d.transport = s.o.stream;  // a Nats-Msg-Id is unique within its stream only
                checkpoint at{s.source_name, h.sequence, s.detail, true};
                const auto token = submitted++;
                {
                    std::scoped_lock lock{s.m};
                    ++s.result.fetched;
                    if (h.delivered > 1) ++s.result.redelivered;
                    ++s.outstanding;
                    s.in_flight.emplace(token, std::move(h));
                }
                e.async_apply(std::move(d), std::move(at), [&s, token](std::error_code ec, outcome out) {
                    s.complete(token, ec, out);
                });
            }
            list.clear();  // destroys what was not taken: the messages past a hole, nak'd above
            if (s.o.until_caught_up) {
                bool reached = false;
                {
                    std::scoped_lock lock{s.m};
                    reached = s.result.last_sequence >= target;
                }
                if (reached && s.caught_up(target)) break;
            }
        }
    } catch (...) {
        finish();
        record_exhausted(record);
        throw;
    }
    finish();
    s.check_exhausted(e);
    record_exhausted(record);
    std::scoped_lock lock{s.m};
    if (s.fatal) throw std::system_error(s.fatal, s.fatal_text);
    return s.result;
}

}  // namespace idem::jetstream
