#include "consumer_setup.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <charconv>

namespace idem::jetstream::detail {

namespace {

constexpr std::chrono::nanoseconds default_ack_wait = std::chrono::seconds(30);
constexpr std::int64_t default_max_deliver = 5;
constexpr std::int64_t default_max_ack_pending = 1000;

std::string name_of(const source_options& o) { return "consumer '" + o.consumer + "' of stream '" + o.stream + "'"; }

consumer_config config_of(const jsConsumerConfig& cc) {
    consumer_config out;
    out.ack_wait = std::chrono::nanoseconds(cc.AckWait);
    out.max_deliver = cc.MaxDeliver <= 0 ? -1 : cc.MaxDeliver;
    for (int i = 0; i < cc.BackOffLen; ++i) out.backoff.emplace_back(cc.BackOff[i]);
    out.max_ack_pending = cc.MaxAckPending;
    out.filter_subject = cc.FilterSubject != nullptr ? cc.FilterSubject : "";
    return out;
}

std::string durations(const std::vector<std::chrono::nanoseconds>& v) {
    std::string out;
    for (auto d : v) out += (out.empty() ? "" : ",") + format_duration(d);
    return out.empty() ? "none" : out;
}

std::string deliver_policy_name(const jsConsumerConfig& cc) {
    switch (cc.DeliverPolicy) {
        case js_DeliverAll: return "all";
        case js_DeliverLast: return "last";
        case js_DeliverNew: return "new";
        case js_DeliverByStartSequence: return "by_start_sequence " + std::to_string(cc.OptStartSeq);
        case js_DeliverByStartTime: return "by_start_time";
        case js_DeliverLastPerSubject: return "last_per_subject";
    }
    return std::to_string(static_cast<int>(cc.DeliverPolicy));
}

// Refuses a bound consumer whose configuration differs from what the options ask for.
void check_matches(const jsConsumerInfo& ci, const consumer_config& have, const source_options& o) {
    auto refuse = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
        throw_error(errc::invalid_argument, name_of(o) + " exists with " + what + " " + theirs + ", not " + ours +
                                                ": change or delete the consumer on purpose, or start with its settings");
    };
    const auto& cc = *ci.Config;
    if (cc.DeliverSubject != nullptr && *cc.DeliverSubject != '\0') {
        throw_error(errc::invalid_argument, name_of(o) + " is a push consumer (deliver subject '" +
                                                std::string(cc.DeliverSubject) + "'); idem needs a pull consumer");
    }
    if (cc.AckPolicy != js_AckExplicit) {
        throw_error(errc::invalid_argument, name_of(o) + " does not use explicit acks; idem acks each message after "
                                                         "its commit and needs AckPolicy explicit");
    }
    // A consumer that starts past the stream's beginning never delivers what lies before it:
    // those events would be missing from the rows without a word.
    const std::uint64_t start_at = std::max<std::uint64_t>(o.start_sequence, 1);
    if (cc.DeliverPolicy != js_DeliverAll &&
        !(cc.DeliverPolicy == js_DeliverByStartSequence && cc.OptStartSeq <= start_at)) {
        throw_error(errc::invalid_argument,
                    name_of(o) + " does not deliver the stream from its start (deliver policy " +
                        deliver_policy_name(cc) + " instead of all): the messages before its start would never be applied; use another "
                        "consumer name, and idem creates one that delivers all");
    }
    const auto& s = o.settings;
    if (!o.filter_subject.empty() && o.filter_subject != have.filter_subject) {
        refuse("filter subject", "'" + have.filter_subject + "'", "'" + o.filter_subject + "'");
    }
    if (s.ack_wait && *s.ack_wait != have.ack_wait) {
        refuse("AckWait", format_duration(have.ack_wait), format_duration(*s.ack_wait));
    }
    if (s.max_deliver && (*s.max_deliver <= 0 ? -1 : *s.max_deliver) != have.max_deliver) {
        refuse("MaxDeliver", std::to_string(have.max_deliver), std::to_string(*s.max_deliver));
    }
    if (s.backoff && *s.backoff != have.backoff) refuse("BackOff", durations(have.backoff), durations(*s.backoff));
    if (s.max_ack_pending && *s.max_ack_pending != have.max_ack_pending) {
        refuse("MaxAckPending", std::to_string(have.max_ack_pending), std::to_string(*s.max_ack_pending));
    }
}

}  // namespace

consumer_config settings_of(const jsConsumerInfo& ci) { return config_of(*ci.Config); }

std::chrono::nanoseconds consumer_config::wait_after(std::int64_t k) const {
    if (backoff.empty()) return ack_wait;
    auto i = static_cast<std::size_t>(std::max<std::int64_t>(k - 1, 0));
    return backoff[std::min(i, backoff.size() - 1)];
}

consumer_config ensure_consumer(const connection& c, const source_options& o) {
    for (char ch : o.consumer) {
        if (ch == '.' || ch == ' ' || ch == '*' || ch == '>' || ch == '\t') {
            throw_error(errc::invalid_argument, "consumer name '" + o.consumer +
                                                    "': a durable name holds no '.', ' ', '*' or '>'");
        }
    }
    if (o.consumer.empty()) throw_error(errc::invalid_argument, "a JetStream source needs a consumer name");
    if (o.settings.ack_wait && o.settings.backoff && !o.settings.backoff->empty()) {
        // The server takes BackOff's first delay as the AckWait: the one given would not hold.
        throw_error(errc::invalid_argument, "AckWait " + format_duration(*o.settings.ack_wait) + " and BackOff " +
                                                durations(*o.settings.backoff) +
                                                " together: with a BackOff the server waits its first delay (" +
                                                format_duration(o.settings.backoff->front()) +
                                                ") for the first delivery instead of AckWait; give one of them");
    }
    if (auto ci = consumer_info(c, o.stream, o.consumer)) {
        auto have = config_of(*ci->Config);
        check_matches(*ci, have, o);
        return have;
    }
    // Missing: create it. js_AddConsumer would silently update an existing one, which is why
    // the lookup comes first; a consumer made concurrently by another process is then updated
    // to the same settings, which changes nothing.
    const auto& s = o.settings;
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = o.consumer.c_str();
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    if (o.start_sequence > 0) {  // by start sequence even from 1: a filtered DeliverAll may skip ahead
        cc.DeliverPolicy = js_DeliverByStartSequence;
        cc.OptStartSeq = o.start_sequence;
    }
    cc.AckWait = s.ack_wait.value_or(default_ack_wait).count();
    cc.MaxDeliver = s.max_deliver.value_or(default_max_deliver);
    std::vector<int64_t> backoff;
    if (s.backoff) {
        for (auto d : *s.backoff) backoff.push_back(d.count());
        if (!backoff.empty() && (cc.MaxDeliver <= 0 || cc.MaxDeliver <= static_cast<std::int64_t>(backoff.size()))) {
            throw_error(errc::invalid_argument, "BackOff with " + std::to_string(backoff.size()) +
                                                    " delays needs a MaxDeliver above " +
                                                    std::to_string(backoff.size()) + ", not " +
                                                    std::to_string(cc.MaxDeliver));
        }
        cc.BackOff = backoff.empty() ? nullptr : backoff.data();
        cc.BackOffLen = static_cast<int>(backoff.size());
    }
    cc.MaxAckPending = s.max_ack_pending.value_or(default_max_ack_pending);
    if (!o.filter_subject.empty()) cc.FilterSubject = o.filter_subject.c_str();
    jsConsumerInfo* made = nullptr;
    jsErrCode jerr{};
    check_nats(js_AddConsumer(&made, c.js(), o.stream.c_str(), &cc, nullptr, &jerr),
               "creating " + name_of(o) + " at '" + c.servers() + "'", jerr);
    consumer_info_ptr owned(made, jsConsumerInfo_Destroy);
    return config_of(*owned->Config);
}

redelivery_bound bound_of(const consumer_config& cc, const source_options& o) {
    if (cc.max_deliver <= 0) {
        if (o.redelivery_bound) {
            return {*o.redelivery_bound, "MaxDeliver unlimited, the redelivery bound given: " +
                                             format_duration(*o.redelivery_bound)};
        }
        throw_error(errc::invalid_argument,
                    "consumer '" + o.consumer + "' of stream '" + o.stream +
                        "' has MaxDeliver unlimited (-1): it may redeliver a message at any time, so no inbox "
                        "retention is long enough; give the redelivery bound explicitly (--redelivery-bound) or "
                        "set a MaxDeliver");
    }
    // A message may come again while deliveries are left: after each one the server waits
    // AckWait (or that delivery's BackOff delay), or the nak delay when the source nak'd it.
    std::chrono::nanoseconds total{0};
    for (std::int64_t k = 1; k <= cc.max_deliver; ++k) {
        total += std::max<std::chrono::nanoseconds>(cc.wait_after(k), o.nak_delay);
    }
    std::string what = cc.backoff.empty()
                           ? "AckWait " + format_duration(cc.ack_wait) + " x MaxDeliver " + std::to_string(cc.max_deliver)
                           : "BackOff " + durations(cc.backoff) + " over MaxDeliver " + std::to_string(cc.max_deliver);
    if (o.redelivery_bound && *o.redelivery_bound > total) {
        return {*o.redelivery_bound, "the redelivery bound given: " + format_duration(*o.redelivery_bound) +
                                         " (the consumer's " + what + " = " + format_duration(total) + ")"};
    }
    return {total, what + " = " + format_duration(total)};
}

stream_state read_stream(const connection& c, const std::string& stream) {
    auto si = stream_info(c, stream);
    if (!si) {
        throw_error(errc::broker_failed, "stream '" + stream + "' does not exist at '" + c.servers() +
                                             "' (create it first, for example with idem publish)");
    }
    return {si->State.FirstSeq, si->State.LastSeq, si->Created};
}

std::optional<std::uint64_t> next_matching(const connection& c, const std::string& stream, const std::string& filter,
                                           std::uint64_t after) {
    // The stream API's message get with next_by_subj (nats-server 2.9): the first message at or
    // after seq on the subject filter.
    std::string request = "{\"seq\":" + std::to_string(after + 1) + ",\"next_by_subj\":\"";
    for (char ch : filter.empty() ? std::string(">") : filter) {
        if (ch == '"' || ch == '\\') request += '\\';
        request += ch;
    }
    request += "\"}";
    natsMsg* reply = nullptr;
    const auto subject = "$JS.API.STREAM.MSG.GET." + stream;
    check_nats(natsConnection_Request(&reply, c.nc(), subject.c_str(), request.data(), static_cast<int>(request.size()),
                                      5000),
               "reading stream '" + stream + "' after sequence " + std::to_string(after) + " at '" + c.servers() + "'",
               jsErrCode{});
    const std::string body(natsMsg_GetData(reply), static_cast<std::size_t>(natsMsg_GetDataLength(reply)));
    natsMsg_Destroy(reply);
    // {"type":..,"message":{"subject":..,"seq":N,..}} or {"type":..,"error":{"code":404,..}}
    const auto message = body.find("\"message\":");
    if (message == std::string::npos) {
        if (body.find("\"code\":404") != std::string::npos) return std::nullopt;
        throw_error(errc::broker_failed, "reading stream '" + stream + "' after sequence " + std::to_string(after) +
                                             ": unexpected answer " + body.substr(0, 200));
    }
    const auto key = body.find("\"seq\":", message);
    if (key == std::string::npos) {
        throw_error(errc::broker_failed, "reading stream '" + stream + "': an answer without a sequence");
    }
    std::uint64_t seq = 0;
    const auto digits = body.data() + key + 6;
    std::from_chars(digits, body.data() + body.size(), seq);
    return seq;
}

std::string checkpoint_detail(const stream_state& s) { return "created=" + std::to_string(s.created); }

std::string stream_change(const stream_state& now, std::uint64_t position, const std::string& detail,
                          const source_options& o) {
    std::string why;
    if (detail != checkpoint_detail(now)) {
        why = "was deleted and created again (" + detail + " at the checkpoint, " + checkpoint_detail(now) + " now)";
    } else if (now.last_sequence < position) {
        why = "ends at sequence " + std::to_string(now.last_sequence) + ", before the checkpoint at " +
              std::to_string(position);
    } else if (now.first_sequence > position + 1) {
        why = "starts at sequence " + std::to_string(now.first_sequence) + ": the messages after the checkpoint at " +
              std::to_string(position) + " up to " + std::to_string(now.first_sequence - 1) +
              " were removed (purged, or past the stream's limits) before they were applied";
        if (!o.filter_subject.empty()) {
            why += " (whether they were on subjects the filter '" + o.filter_subject +
                   "' takes cannot be told once they are gone)";
        }
    }
    return why;
}

void check_stream(const stream_state& now, std::uint64_t position, const std::string& detail,
                  const source_options& o, bool accept) {
    const auto why = stream_change(now, position, detail, o);
    if (why.empty() || accept) return;
    throw_error(errc::stream_changed, "stream '" + o.stream + "' " + why +
                                          "; nothing was fetched. To take the stream as it is now, start again "
                                          "with --accept-stream-reset");
}

}  // namespace idem::jetstream::detail
