// The windowed publisher (publish_window.hpp): cnats' asynchronous publishes with an ack handler
// that counts acks and collects failures, the failures sent again under their own message id.

#include "publish_window.hpp"

#include "broker_watch.hpp"
#include "publish_naming.hpp"

#include <idem/storage/error.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace idem::jetstream::detail {

namespace {

using clock = std::chrono::steady_clock;

// JetStream API error: a stream with this name exists (another publisher created it meanwhile).
constexpr int js_stream_name_in_use = 10058;

std::string seconds_text(std::chrono::nanoseconds d) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
}

}  // namespace

// A message's tag and how long it has been failing.
struct publish_window::origin {
    message_tag tag;
    std::uint64_t attempts = 0;
    std::optional<clock::time_point> failing_since{};
};

// A publish that failed (an error ack, a missing ack, a refused send), waiting to be sent again.
struct publish_window::failure {
    msg_ptr msg;
    origin from;
    natsStatus status = NATS_OK;
    int js_error = 0;
    std::string text;
};

// What cnats' ack thread shares with the publishing thread. Every message in flight has an
// entry in `in_flight` until its ack (counted) or its failure (moved to `failed`) arrives, so
// "both empty" is exactly "everything sent has been acked".
struct publish_window::state {
    std::mutex m;
    std::condition_variable changed;
    std::unordered_map<const natsMsg*, origin> in_flight;
    std::vector<failure> failed;
    window_counts counts;
};

// Runs on cnats' thread for every ack or failure; with an AckHandler the message is ours.
void publish_window::on_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    auto& st = *static_cast<state*>(closure);
    msg_ptr owned{msg};
    std::lock_guard lock{st.m};
    auto it = st.in_flight.find(msg);
    if (it == st.in_flight.end()) return;  // given up on (taken back as pending): nothing to count
    auto from = it->second;
    st.in_flight.erase(it);
    if (pa != nullptr) {
        auto& c = st.counts;
        if (pa->Duplicate) {
            ++c.duplicates;  // inside the Duplicates window: the stream stored nothing
        } else {
            ++c.stored;
            c.first_sequence = c.first_sequence == 0 ? pa->Sequence : std::min(c.first_sequence, pa->Sequence);
            c.last_sequence = std::max(c.last_sequence, pa->Sequence);
        }
    } else {
        failure f{std::move(owned), from, NATS_ERR, 0, {}};
        if (pae != nullptr) {
            f.status = pae->Err;
            f.js_error = static_cast<int>(pae->ErrCode);
            if (pae->ErrText != nullptr) f.text = pae->ErrText;
        }
        st.failed.push_back(std::move(f));
    }
    st.changed.notify_all();
}

// A JetStream context of our own on the shared connection: the connection's context has no
// PublishAsync options (max pending, ack handler), which are fixed when a context is made.
class publish_window::context {
public:
    context(const connection& c, const window_options& o, state& st) {
        jsOptions jo;
        jsOptions_Init(&jo);
        jo.Wait = o.ack_timeout.count();
        jo.PublishAsync.MaxPending = static_cast<int64_t>(o.max_pending);
        jo.PublishAsync.AckHandler = on_ack;
        jo.PublishAsync.AckHandlerClosure = &st;
        jo.PublishAsync.StallWait = o.ack_timeout.count();  // a full window waits for acks or their timeout
        check_nats(natsConnection_JetStream(&js_, c.nc(), &jo), "JetStream context at '" + c.servers() + "'");
    }
    ~context() {
        // Messages still pending on an error path: taken back so they are freed, not acked into freed state.
        natsMsgList pending{};
        if (take_pending(pending)) natsMsgList_Destroy(&pending);
        jsCtx_Destroy(js_);
    }
    context(const context&) = delete;
    context& operator=(const context&) = delete;

    /// Publishes *msg asynchronously; on NATS_OK cnats owns it and *msg is null.
    natsStatus publish(natsMsg** msg, jsPubOptions* po) {
        used_ = true;
        return js_PublishMsgAsync(js_, msg, po);
    }
    /// Takes back the messages still awaiting their ack (the caller owns them); false if none.
    bool take_pending(natsMsgList& out) {
        // cnats 3.4.1 crashes here on a context that never published (its pending map is not made yet).
        return used_ && js_PublishAsyncGetPendingList(&out, js_) == NATS_OK;
    }
    /// Waits until every publish is acked or failed, for at most po->MaxWait.
    natsStatus complete(jsPubOptions* po) { return used_ ? js_PublishAsyncComplete(js_, po) : NATS_OK; }

private:
    jsCtx* js_ = nullptr;
    bool used_ = false;
};

publish_window::publish_window(const connection& c, const window_options& o,
                               std::function<std::string(const message_tag&)> where)
    : o_(o), where_(std::move(where)), conn_(c), st_(std::make_unique<state>()) {
    if (o_.max_pending == 0) throw_error(errc::invalid_argument, "max_pending is 0");
    js_ = std::make_unique<context>(c, o_, *st_);
    max_payload_ = natsConnection_GetMaxPayload(c.nc());
}

publish_window::~publish_window() = default;

bool publish_window::send(msg_ptr msg, message_tag tag) { return send_from(std::move(msg), origin{tag}); }

bool publish_window::send_from(msg_ptr msg, const origin& from) {
    const natsMsg* key = msg.get();
    {
        std::lock_guard lock{st_->m};
        st_->in_flight[key] = from;  // before the send: the ack may come back before it returns
    }
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = o_.ack_timeout.count();
    natsMsg* raw = msg.release();
    auto s = js_->publish(&raw, &po);
    if (s == NATS_OK) return true;  // cnats owns it now (raw is null)
    msg.reset(raw);                 // refused before it left: still ours
    {
        std::lock_guard lock{st_->m};
        st_->in_flight.erase(key);
        if (s == NATS_MAX_PAYLOAD) return false;
        const char* last = nats_GetLastError(nullptr);
        st_->failed.push_back(failure{std::move(msg), from, s, 0, last != nullptr ? last : ""});
    }
    if (s == NATS_TIMEOUT) take_back_pending();  // the window stayed full for ack_timeout: the oldest acks are lost, not late
    return true;
}

void publish_window::resend_failed() { resend(false); }

bool publish_window::has_failures() {
    std::lock_guard lock{st_->m};
    return !st_->failed.empty();
}

// Sends failed messages again under their own message id; throws once one has been failing
// for longer than retry_for, or was refused by the stream itself (a JetStream error code).
void publish_window::resend(bool wait_first) {
    std::vector<failure> failed;
    {
        std::lock_guard lock{st_->m};
        failed.swap(st_->failed);
    }
    if (failed.empty()) return;
    // A failure rarely comes alone (a restart, a failover): one pause per round, not per message.
    std::this_thread::sleep_for(wait_first ? std::chrono::milliseconds(250) : std::chrono::milliseconds(50));
    const auto now = clock::now();
    for (auto& f : failed) {
        if (!f.from.failing_since) f.from.failing_since = now;
        const auto failing = now - *f.from.failing_since;
        if (f.js_error != 0 || failing > o_.retry_for) give_up(f, failing);
        ++f.from.attempts;
        ++retries_;
        // A message that once fitted still fits: the payload limit is the server's, fixed per connection.
        send_from(std::move(f.msg), f.from);
    }
}

void publish_window::finish() {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = o_.ack_timeout.count();
    js_->complete(&po);  // the usual case: everything acked, nothing failed
    for (;;) {
        {
            std::unique_lock lock{st_->m};
            if (st_->in_flight.empty() && st_->failed.empty()) break;
            if (st_->failed.empty()) {
                auto progressed = st_->changed.wait_for(
                    lock, o_.ack_timeout, [&] { return !st_->failed.empty() || st_->in_flight.empty(); });
                if (!progressed) {
                    lock.unlock();
                    take_back_pending();
                }
            }
        }
        resend(true);
    }
}

window_counts publish_window::counts() {
    std::lock_guard lock{st_->m};
    auto c = st_->counts;
    c.retries = retries_;
    return c;
}

// Acks that never came (a connection lost after the publish left): the messages are taken
// back from cnats and count as failed, to be sent again.
void publish_window::take_back_pending() {
    natsMsgList pending{};
    if (!js_->take_pending(pending)) return;  // NATS_NOT_FOUND: none
    std::lock_guard lock{st_->m};
    for (int i = 0; i < pending.Count; ++i) {
        auto it = st_->in_flight.find(pending.Msgs[i]);
        if (it == st_->in_flight.end()) continue;
        auto from = it->second;
        st_->in_flight.erase(it);
        st_->failed.push_back(failure{msg_ptr{pending.Msgs[i]}, from, NATS_TIMEOUT, 0, "no ack"});
        pending.Msgs[i] = nullptr;
    }
    natsMsgList_Destroy(&pending);
}

void publish_window::give_up(const failure& f, clock::duration failing) const {
    std::string text = "publishing " + where_(f.from.tag) + " to '" + natsMsg_GetSubject(f.msg.get()) + "' at '" +
                       conn_.servers() + "' failed: " + natsStatus_GetText(f.status);
    if (!f.text.empty() && f.text != natsStatus_GetText(f.status)) text += " (" + f.text + ")";
    if (f.js_error != 0) text += " [JetStream error " + std::to_string(f.js_error) + "]";
    if (f.from.attempts > 0) {
        text += " after " + std::to_string(f.from.attempts + 1) + " attempts over " + seconds_text(failing);
    }
    throw_error(errc::broker_failed, text);
}

stream_setup set_up_stream(const connection& c, const stream_request& r, std::chrono::milliseconds retry_for) {
    stream_setup out;
    // A cluster that is still forming (no meta leader, peers not current) times out or answers
    // "temporarily unavailable": waited for as long as a failing message would be.
    broker_watch watch{retry_for, c.servers(), {}, {}};
    auto si = watch.retry([&] {
        auto info = stream_info(c, r.stream);
        if (info) return info;
        jsStreamConfig sc;
        jsStreamConfig_Init(&sc);
        const char* subjects[] = {r.pattern.c_str()};
        sc.Name = r.stream.c_str();
        sc.Subjects = subjects;
        sc.SubjectsLen = 1;
        sc.Storage = js_FileStorage;
        sc.Replicas = static_cast<int64_t>(r.replicas);
        if (r.duplicates_window) sc.Duplicates = r.duplicates_window->count();
        jsStreamInfo* created = nullptr;
        jsErrCode jerr{};
        auto s = js_AddStream(&created, c.js(), &sc, nullptr, &jerr);
        if (s == NATS_OK) {
            info.reset(created);
            out.created = true;
        } else if (static_cast<int>(jerr) == js_stream_name_in_use) {
            info = stream_info(c, r.stream);  // made meanwhile by someone else: checked below
        } else {
            check_nats(s, "cannot create stream '" + r.stream + "' capturing '" + r.pattern + "' at '" + c.servers() + "'",
                       jerr);
        }
        if (!info) {
            throw_error(errc::broker_failed, "stream '" + r.stream + "' at '" + c.servers() + "' vanished while created");
        }
        return info;
    });
    const auto& config = *si->Config;
    for (int i = 0; i < config.SubjectsLen; ++i) out.subjects.emplace_back(config.Subjects[i]);
    if (out.subjects.empty()) out.subjects.push_back(r.stream);  // a stream without subjects takes its name
    out.duplicates_window = std::chrono::nanoseconds(config.Duplicates);
    out.replicas = static_cast<int>(config.Replicas);
    auto captured = std::any_of(out.subjects.begin(), out.subjects.end(),
                                [&](const std::string& f) { return captures(f, r.sent); });
    if (!captured) {
        throw_error(errc::invalid_argument, "stream '" + r.stream + "' at '" + c.servers() +
                                                "' does not capture subject '" + r.sent + "' (its subjects: " +
                                                join(out.subjects) + "); choose one of them, or another stream");
    }
    return out;
}

std::unique_ptr<connection> connect_publisher(const std::vector<std::string>& given, const std::string& name,
                                              std::chrono::milliseconds ack_timeout,
                                              std::chrono::milliseconds retry_for) {
    std::vector<std::string> servers;
    for (const auto& g : given) {
        for (auto& s : split_servers(g)) servers.push_back(std::move(s));
    }
    if (servers.empty()) throw_error(errc::invalid_argument, "no NATS server given");
    std::string text;
    for (const auto& url : servers) text += (text.empty() ? "" : ",") + url;
    broker_watch watch{retry_for, text, {}, {}};
    return watch.retry([&] { return std::make_unique<connection>(servers, name, ack_timeout); });
}

}  // namespace idem::jetstream::detail
