// `idem publish`: the stream set up (or checked), then every log record published asynchronously
// with a bounded number of acks outstanding; failed publishes are sent again under the same
// Nats-Msg-Id until they are acked or retry_for has passed.

#include <idem/sources/jetstream_publish.hpp>

#include "broker_watch.hpp"
#include "connection.hpp"
#include "publish_naming.hpp"

#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace idem::jetstream {

namespace {

using clock = std::chrono::steady_clock;
using detail::check_nats;

// JetStream API error: a stream with this name exists (another publisher created it meanwhile).
constexpr int js_stream_name_in_use = 10058;

struct msg_deleter {
    void operator()(natsMsg* m) const noexcept { natsMsg_Destroy(m); }
};
using msg_ptr = std::unique_ptr<natsMsg, msg_deleter>;

// Where a message came from, for the error that names it, and how long it has been failing.
struct origin {
    std::size_t log = 0;
    std::uint64_t line = 0;
    std::uint64_t attempts = 0;
    std::optional<clock::time_point> failing_since{};
};

// A publish that failed (an error ack, a missing ack, a refused send), waiting to be sent again.
struct failure {
    msg_ptr msg;
    origin from;
    natsStatus status = NATS_OK;
    int js_error = 0;
    std::string text;
};

// What cnats' ack thread shares with the publishing thread. Every message in flight has an
// entry in `in_flight` until its ack (counted) or its failure (moved to `failed`) arrives, so
// "both empty" is exactly "everything read has been acked".
struct ack_state {
    std::mutex m;
    std::condition_variable changed;
    std::unordered_map<const natsMsg*, origin> in_flight;
    std::vector<failure> failed;
    std::uint64_t stored = 0;
    std::uint64_t duplicates = 0;
    std::uint64_t first_sequence = 0;
    std::uint64_t last_sequence = 0;
};

// Runs on cnats' thread for every ack or failure; with an AckHandler the message is ours.
void on_ack(jsCtx*, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    auto& st = *static_cast<ack_state*>(closure);
    msg_ptr owned{msg};
    std::lock_guard lock{st.m};
    auto it = st.in_flight.find(msg);
    if (it == st.in_flight.end()) return;  // given up on (taken back as pending): nothing to count
    auto from = it->second;
    st.in_flight.erase(it);
    if (pa != nullptr) {
        if (pa->Duplicate) {
            ++st.duplicates;  // inside the Duplicates window: the stream stored nothing
        } else {
            ++st.stored;
            st.first_sequence = st.first_sequence == 0 ? pa->Sequence : std::min(st.first_sequence, pa->Sequence);
            st.last_sequence = std::max(st.last_sequence, pa->Sequence);
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
class publish_context {
public:
    publish_context(const detail::connection& c, const publish_options& o, ack_state& st) {
        jsOptions jo;
        jsOptions_Init(&jo);
        jo.Wait = o.ack_timeout.count();
        jo.PublishAsync.MaxPending = static_cast<int64_t>(o.max_pending);
        jo.PublishAsync.AckHandler = on_ack;
        jo.PublishAsync.AckHandlerClosure = &st;
        jo.PublishAsync.StallWait = o.ack_timeout.count();  // a full window waits for acks or their timeout
        check_nats(natsConnection_JetStream(&js_, c.nc(), &jo), "JetStream context at '" + c.servers() + "'");
    }
    ~publish_context() {
        // Messages still pending on an error path: taken back so they are freed, not acked into freed state.
        natsMsgList pending{};
        if (take_pending(pending)) natsMsgList_Destroy(&pending);
        jsCtx_Destroy(js_);
    }
    publish_context(const publish_context&) = delete;
    publish_context& operator=(const publish_context&) = delete;

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

std::string seconds_text(std::chrono::nanoseconds d) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
    return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + " s";
}

std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
    return out;
}

// Creates the stream if it is missing; checks that an existing one captures the subject.
void set_up_stream(const detail::connection& c, const publish_options& o, const detail::publish_subject& subject,
                   publish_result& r) {
    auto si = detail::stream_info(c, o.stream);
    if (!si) {
        jsStreamConfig sc;
        jsStreamConfig_Init(&sc);
        const char* subjects[] = {subject.pattern().c_str()};
        sc.Name = o.stream.c_str();
        sc.Subjects = subjects;
        sc.SubjectsLen = 1;
        sc.Storage = js_FileStorage;
        sc.Replicas = static_cast<int64_t>(o.replicas);
        if (o.duplicates_window) sc.Duplicates = o.duplicates_window->count();
        jsStreamInfo* created = nullptr;
        jsErrCode jerr{};
        auto s = js_AddStream(&created, c.js(), &sc, nullptr, &jerr);
        if (s == NATS_OK) {
            si.reset(created);
            r.stream_created = true;
        } else if (static_cast<int>(jerr) == js_stream_name_in_use) {
            si = detail::stream_info(c, o.stream);  // made meanwhile by someone else: checked below
        } else {
            const auto what = "cannot create stream '" + o.stream + "' capturing '" + subject.pattern() + "' at '" +
                              c.servers() + "'";
            check_nats(s, what, jerr);
        }
        if (!si) {
            throw_error(errc::broker_failed,
                        "stream '" + o.stream + "' at '" + c.servers() + "' vanished while created");
        }
    }
    const auto& config = *si->Config;
    for (int i = 0; i < config.SubjectsLen; ++i) r.stream_subjects.emplace_back(config.Subjects[i]);
    if (r.stream_subjects.empty()) r.stream_subjects.push_back(o.stream);  // a stream without subjects takes its name
    r.duplicates_window = std::chrono::nanoseconds(config.Duplicates);
    r.replicas = static_cast<int>(config.Replicas);
    auto captured = std::any_of(r.stream_subjects.begin(), r.stream_subjects.end(),
                                [&](const std::string& f) { return detail::captures(f, subject.sent()); });
    if (!captured) {
        throw_error(errc::invalid_argument, "stream '" + o.stream + "' at '" + c.servers() +
                                                "' does not capture subject '" + subject.sent() +
                                                "' (its subjects: " + join(r.stream_subjects) +
                                                "); choose one of them, or another stream");
    }
}

std::vector<std::string> server_list(const std::vector<std::string>& given);

// Connects, waiting as long as a failing message would be retried for servers that are
// starting (a script that starts a cluster and publishes at once).
std::unique_ptr<detail::connection> connect(const publish_options& o) {
    const auto servers = server_list(o.servers);
    std::string text;
    for (const auto& url : servers) text += (text.empty() ? "" : ",") + url;
    detail::broker_watch watch{o.retry_for, text, {}, {}};
    return watch.retry([&] { return std::make_unique<detail::connection>(servers, "idem publish", o.ack_timeout); });
}

std::vector<std::string> server_list(const std::vector<std::string>& given) {
    std::vector<std::string> out;
    for (const auto& g : given) {
        for (auto& s : detail::split_servers(g)) out.push_back(std::move(s));
    }
    if (out.empty()) throw_error(errc::invalid_argument, "no NATS server given");
    return out;
}

class publisher {
public:
    publisher(const publish_options& o, publish_result& r)
        : o_(o),
          r_(r),
          subject_(o.subject_template.empty() ? detail::publish_subject(o.subject)
                                              : detail::publish_subject(o.subject, o.subject_template)),
          conn_(connect(o)) {
        // A cluster that is still forming (no meta leader, peers not current) times out or answers
        // "temporarily unavailable": waited for as long as a failing message would be.
        detail::broker_watch watch{o.retry_for, conn_->servers(), {}, {}};
        watch.retry([&] {
            set_up_stream(*conn_, o_, subject_, r_);
            return true;
        });
        js_ = std::make_unique<publish_context>(*conn_, o_, st_);
        max_payload_ = natsConnection_GetMaxPayload(conn_->nc());
    }

    publisher(const publisher&) = delete;
    publisher& operator=(const publisher&) = delete;

    void read(std::size_t log) {
        log_reader_options ro;
        ro.skip_bad = o_.skip_bad;
        ro.format = o_.format;
        log_reader reader{o_.logs[log], ro};
        log_record rec;
        while (reader.next(rec)) {
            ++r_.records;
            send_record(rec, log);
            resend_failed(false);
        }
        r_.skipped += reader.skipped();
        if (auto torn = reader.torn_tail()) {
            r_.torn_tails.push_back(o_.logs[log].string() + ": incomplete last record at offset " +
                                    std::to_string(*torn) + " not published (" + reader.torn_detail() + ")");
        }
    }

    // Waits until every message read has been acked, sending failed ones again meanwhile.
    void finish() {
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = o_.ack_timeout.count();
        js_->complete(&po);  // the usual case: everything acked, nothing failed
        for (;;) {
            {
                std::unique_lock lock{st_.m};
                if (st_.in_flight.empty() && st_.failed.empty()) break;
                if (st_.failed.empty()) {
                    auto progressed = st_.changed.wait_for(
                        lock, o_.ack_timeout, [&] { return !st_.failed.empty() || st_.in_flight.empty(); });
                    if (!progressed) {
                        lock.unlock();
                        take_back_pending();
                    }
                }
            }
            resend_failed(true);
        }
        std::lock_guard lock{st_.m};
        r_.stored = st_.stored;
        r_.duplicates = st_.duplicates;
        r_.published = st_.stored + st_.duplicates;
        r_.first_sequence = st_.first_sequence;
        r_.last_sequence = st_.last_sequence;
    }

private:
    void send_record(const log_record& rec, std::size_t log) {
        parse_error err;
        const bool valid = parser_.parse(rec.body, ev_, err);
        const std::string id =
            (valid && o_.msg_id == msg_id_policy::envelope) ? detail::publish_msg_id(ev_) : std::string{};
        // The header costs "NATS/1.0\r\nNats-Msg-Id: <id>\r\n\r\n" on top of the body.
        const auto size = static_cast<std::int64_t>(rec.body.size() + (id.empty() ? 0 : id.size() + 30));
        if (size > max_payload_) {
            too_large(log, rec.line, rec.body.size());
            return;
        }
        if (!valid) ++r_.malformed;  // published all the same: the consumer dead-letters it, with its reason
        const auto subject = subject_.for_event(valid ? std::string_view(ev_.subject) : std::string_view{});
        natsMsg* raw = nullptr;
        check_nats(natsMsg_Create(&raw, subject.c_str(), nullptr, rec.body.data(), static_cast<int>(rec.body.size())),
                   "message for " + where(log, rec.line));
        msg_ptr msg{raw};
        if (!id.empty()) {
            check_nats(natsMsgHeader_Set(msg.get(), "Nats-Msg-Id", id.c_str()),
                       "Nats-Msg-Id of " + where(log, rec.line));
        }
        send(std::move(msg), origin{log, rec.line});
    }

    void send(msg_ptr msg, origin from) {
        const natsMsg* key = msg.get();
        {
            std::lock_guard lock{st_.m};
            st_.in_flight[key] = from;  // before the send: the ack may come back before it returns
        }
        jsPubOptions po;
        jsPubOptions_Init(&po);
        po.MaxWait = o_.ack_timeout.count();
        natsMsg* raw = msg.release();
        auto s = js_->publish(&raw, &po);
        if (s == NATS_OK) return;  // cnats owns it now (raw is null)
        msg.reset(raw);            // refused before it left: still ours
        {
            std::lock_guard lock{st_.m};
            st_.in_flight.erase(key);
            if (s != NATS_MAX_PAYLOAD) {
                const char* last = nats_GetLastError(nullptr);
                st_.failed.push_back(failure{std::move(msg), from, s, 0, last != nullptr ? last : ""});
            }
        }
        if (s == NATS_MAX_PAYLOAD) {
            too_large(from.log, from.line, static_cast<std::size_t>(natsMsg_GetDataLength(msg.get())));
        } else if (s == NATS_TIMEOUT) {
            take_back_pending();  // the window stayed full for ack_timeout: the oldest acks are lost, not late
        }
    }

    // Sends failed messages again under their own message id; throws once one has been failing
    // for longer than retry_for, or was refused by the stream itself (a JetStream error code).
    void resend_failed(bool wait_first) {
        std::vector<failure> failed;
        {
            std::lock_guard lock{st_.m};
            failed.swap(st_.failed);
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
            ++r_.retries;
            send(std::move(f.msg), f.from);
        }
    }

    // Acks that never came (a connection lost after the publish left): the messages are taken
    // back from cnats and count as failed, to be sent again.
    void take_back_pending() {
        natsMsgList pending{};
        if (!js_->take_pending(pending)) return;  // NATS_NOT_FOUND: none
        std::lock_guard lock{st_.m};
        for (int i = 0; i < pending.Count; ++i) {
            auto it = st_.in_flight.find(pending.Msgs[i]);
            if (it == st_.in_flight.end()) continue;
            auto from = it->second;
            st_.in_flight.erase(it);
            st_.failed.push_back(failure{msg_ptr{pending.Msgs[i]}, from, NATS_TIMEOUT, 0, "no ack"});
            pending.Msgs[i] = nullptr;
        }
        natsMsgList_Destroy(&pending);
    }

    [[noreturn]] void give_up(const failure& f, clock::duration failing) {
        std::string text = "publishing " + where(f.from.log, f.from.line) + " to '" + natsMsg_GetSubject(f.msg.get()) +
                           "' at '" + conn_->servers() + "' failed: " + natsStatus_GetText(f.status);
        if (!f.text.empty() && f.text != natsStatus_GetText(f.status)) text += " (" + f.text + ")";
        if (f.js_error != 0) text += " [JetStream error " + std::to_string(f.js_error) + "]";
        if (f.from.attempts > 0) {
            text += " after " + std::to_string(f.from.attempts + 1) + " attempts over " + seconds_text(failing);
        }
        throw_error(errc::broker_failed, text);
    }

    void too_large(std::size_t log, std::uint64_t line, std::size_t bytes) {
        ++r_.too_large;
        r_.too_large_records.push_back(where(log, line) + " (" + std::to_string(bytes) +
                                       " bytes; the server's max payload is " + std::to_string(max_payload_) + ")");
    }

    std::string where(std::size_t log, std::uint64_t line) const {
        return o_.logs[log].string() + " line " + std::to_string(line);
    }

    const publish_options& o_;
    publish_result& r_;
    detail::publish_subject subject_;
    ack_state st_;  // declared before the connection and the context: cnats' thread never sees it gone
    std::unique_ptr<detail::connection> conn_;
    std::unique_ptr<publish_context> js_;
    std::int64_t max_payload_ = 0;
    envelope_parser parser_;
    envelope ev_;  // reused: its strings keep their capacity from record to record
};

}  // namespace

publish_result publish(const publish_options& options) {
    if (options.stream.empty()) throw_error(errc::invalid_argument, "no stream given");
    if (options.logs.empty()) throw_error(errc::invalid_argument, "no log given");
    if (options.replicas < 1 || options.replicas > 5) {
        throw_error(errc::invalid_argument, "replicas " + std::to_string(options.replicas) + " is not between 1 and 5");
    }
    if (options.max_pending == 0) throw_error(errc::invalid_argument, "max_pending is 0");
    for (const auto& log : options.logs) {
        // Every log readable before the stream is touched: a typo creates no stream.
        log_reader_options ro;
        ro.format = options.format;
        log_reader check{log, ro};
    }
    const auto start = clock::now();
    publish_result r;
    publisher p{options, r};
    for (std::size_t i = 0; i < options.logs.size(); ++i) p.read(i);
    p.finish();
    r.elapsed = clock::now() - start;
    return r;
}

std::string subject_token(std::string_view subject) { return detail::subject_token(subject); }

std::optional<std::string> subject_of_token(std::string_view token) { return detail::subject_of_token(token); }

}  // namespace idem::jetstream
