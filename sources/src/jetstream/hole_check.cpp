// Whether the stream still holds what the run is to be given: a fetched list that skips
// sequences the stream's state does not explain (purged, trimmed, recreated) is cut there and
// stops the run; an until-caught-up run that waits in vain says what it waits for, and whether
// the stream now ends below its target.

#include "source_impl.hpp"

#include <algorithm>
#include <thread>

namespace idem::jetstream {

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

}  // namespace idem::jetstream
