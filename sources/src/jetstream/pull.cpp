#include "pull.hpp"

#include <cstring>
#include <string_view>

namespace idem::jetstream::detail {

namespace {

using clock = std::chrono::steady_clock;

// A delivery's status code: 0 for a message of the stream, else the status of the request it
// answers (100 heartbeat, 404 no messages, 408 expired, 409 ...).
int status_of(natsMsg* msg) {
    // A status has a header and no body; a message of the stream may have either.
    if (natsMsg_GetDataLength(msg) > 0) return 0;
    const char* value = nullptr;
    if (natsMsgHeader_Get(msg, "Status", &value) != NATS_OK || value == nullptr) return 0;
    int code = 0;
    for (const char* p = value; *p >= '0' && *p <= '9'; ++p) code = code * 10 + (*p - '0');
    return code == 0 ? -1 : code;
}

std::string description_of(natsMsg* msg) {
    const char* value = nullptr;
    if (natsMsgHeader_Get(msg, "Description", &value) != NATS_OK || value == nullptr) return "no description";
    return value;
}

natsStatus publish_to_reply(const connection& c, natsMsg* msg, std::string_view body) {
    const char* reply = natsMsg_GetReply(msg);
    if (reply == nullptr || *reply == '\0') return NATS_ILLEGAL_STATE;
    return natsConnection_Publish(c.nc(), reply, body.data(), static_cast<int>(body.size()));
}

}  // namespace

void fetched_messages::clear() noexcept {
    for (auto* m : msgs) natsMsg_Destroy(m);
    msgs.clear();
}

pull_fetcher::pull_fetcher(const connection& c, const std::string& stream, const std::string& consumer)
    : conn_(c), next_subject_("$JS.API.CONSUMER.MSG.NEXT." + stream + "." + consumer) {
    natsInbox* inbox = nullptr;
    check_nats(natsInbox_Create(&inbox), "NATS inbox");
    inbox_ = inbox;
    natsInbox_Destroy(inbox);
    check_nats(natsConnection_SubscribeSync(&sub_, c.nc(), (inbox_ + ".*").c_str()),
               "subscribing to the deliveries of consumer '" + consumer + "' of stream '" + stream + "'");
    // The consumer's window bounds what is delivered; never drop a delivery for want of room.
    (void)natsSubscription_SetPendingLimits(sub_, -1, -1);
}

pull_fetcher::~pull_fetcher() { conn_.release({sub_}); }

natsStatus pull_fetcher::fetch(fetched_messages& out, int n, std::chrono::milliseconds wait) {
    out.clear();
    if (n <= 0) return NATS_INVALID_ARG;
    const auto wanted = static_cast<std::size_t>(n);
    auto take = [&](natsMsg* msg) { out.msgs.push_back(msg); };

    // What earlier requests delivered after their fetch had returned: handed out first.
    while (out.msgs.size() < wanted) {
        natsMsg* msg = nullptr;
        auto s = natsSubscription_NextMsg(&msg, sub_, 0);
        if (s == NATS_SLOW_CONSUMER) continue;
        if (s != NATS_OK) break;
        if (status_of(msg) == 0) {
            take(msg);
        } else {
            natsMsg_Destroy(msg);  // a status of a request that is over
        }
    }
    if (!out.msgs.empty()) return NATS_OK;

    const auto deadline = clock::now() + wait;
    // First ask for what is there now (a 404 at once if nothing), then wait for it, as cnats does.
    bool no_wait = n > 1;
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
        if (left.count() <= 0) return NATS_TIMEOUT;
        const std::string reply = inbox_ + "." + std::to_string(++requests_);
        // The server's expiry a little before the wait's end, so its 408 ends the request here.
        const auto expires = left.count() >= 20 ? left - std::chrono::milliseconds(10) : left;
        std::string body = "{\"batch\":" + std::to_string(n) +
                           ",\"expires\":" + std::to_string(std::chrono::nanoseconds(expires).count()) +
                           (no_wait ? ",\"no_wait\":true}" : "}");
        auto s = natsConnection_PublishRequest(conn_.nc(), next_subject_.c_str(), reply.c_str(), body.data(),
                                               static_cast<int>(body.size()));
        if (s != NATS_OK) return s;
        bool resend = false;
        while (!resend) {
            const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
            if (remaining.count() <= 0) return out.msgs.empty() ? NATS_TIMEOUT : NATS_OK;
            natsMsg* msg = nullptr;
            s = natsSubscription_NextMsg(&msg, sub_, remaining.count());
            if (s == NATS_SLOW_CONSUMER) continue;
            if (s != NATS_OK) return out.msgs.empty() ? s : NATS_OK;
            const int code = status_of(msg);
            if (code == 0) {
                take(msg);
                if (out.msgs.size() == wanted) return NATS_OK;
                continue;
            }
            const bool ours = std::strcmp(natsMsg_GetSubject(msg), reply.c_str()) == 0;
            const auto text = description_of(msg);
            natsMsg_Destroy(msg);
            if (!ours || code == 100) continue;  // an older request's end, or a heartbeat
            if (!out.msgs.empty()) return NATS_OK;
            if (code == 404 && no_wait) {
                no_wait = false;  // nothing there now: ask again, and wait this time
                resend = true;
                continue;
            }
            if (code == 404 || code == 408) return NATS_NOT_FOUND;  // the server answered: nothing now
            failure_ = "the server answered the pull request with " + std::to_string(code) + " " + text;
            return NATS_ERR;
        }
    }
}

natsStatus ack(const connection& c, natsMsg* msg, bool sync, std::chrono::milliseconds timeout) {
    if (!sync) return publish_to_reply(c, msg, "+ACK");
    const char* reply = natsMsg_GetReply(msg);
    if (reply == nullptr || *reply == '\0') return NATS_ILLEGAL_STATE;
    natsMsg* answer = nullptr;
    auto s = natsConnection_RequestString(&answer, c.nc(), reply, "+ACK", timeout.count());
    natsMsg_Destroy(answer);
    return s;
}

natsStatus nak(const connection& c, natsMsg* msg, std::chrono::milliseconds delay) {
    if (delay.count() <= 0) return publish_to_reply(c, msg, "-NAK");
    return publish_to_reply(c, msg, "-NAK {\"delay\": " + std::to_string(std::chrono::nanoseconds(delay).count()) + "}");
}

natsStatus in_progress(const connection& c, natsMsg* msg) { return publish_to_reply(c, msg, "+WPI"); }

}  // namespace idem::jetstream::detail
