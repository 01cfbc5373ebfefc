#include "replay.hpp"

#include "consumer_setup.hpp"
#include "pull.hpp"

#include <idem/projections/store_hooks.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/store_dir.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace idem::jetstream::detail {

namespace {

// Messages per fetch: no acks, so no window limits it; large fetches keep round trips few.
constexpr int fetch_size = 4096;
constexpr std::int64_t fetch_wait_ms = 1000;
// Fetches that fail in a row while connected before the replay gives up.
constexpr int fetch_failures_allowed = 50;

// An ephemeral pull consumer of the partition's subjects, delivering from the start without
// acks; the server deletes it when unsubscribed, or after a while without interest (a kill).
class replay_subscription {
public:
    replay_subscription(const connection& c, const replay_request& r) : conn_(c) {
        jsSubOptions so;
        jsSubOptions_Init(&so);
        so.Stream = r.stream.c_str();
        so.Config.AckPolicy = js_AckNone;
        so.Config.DeliverPolicy = js_DeliverAll;
        so.Config.InactiveThreshold = std::chrono::nanoseconds(std::chrono::seconds(30)).count();
        so.Config.MemoryStorage = true;
        so.Config.Replicas = 1;
        jsErrCode jerr{};
        check_nats(js_PullSubscribe(&sub_, c.js(), r.filter_subject.c_str(), nullptr, nullptr, &so, &jerr),
                   "creating a replay consumer of '" + r.filter_subject + "' in stream '" + r.stream + "'", jerr);
        // cnats' subscription owns the consumer (deleted when it is unsubscribed); the messages
        // are pulled by the consumer's name (pull.hpp says why).
        try {
            jsConsumerInfo* ci = nullptr;
            check_nats(natsSubscription_GetConsumerInfo(&ci, sub_, nullptr, &jerr),
                       "reading the replay consumer of '" + r.filter_subject + "' in stream '" + r.stream + "'", jerr);
            const std::string name = ci->Name;
            jsConsumerInfo_Destroy(ci);
            fetcher_ = std::make_unique<pull_fetcher>(c, r.stream, name);
        } catch (...) {
            conn_.release({sub_});
            throw;
        }
    }
    ~replay_subscription() {
        fetcher_.reset();
        conn_.release({sub_});
    }
    replay_subscription(const replay_subscription&) = delete;
    replay_subscription& operator=(const replay_subscription&) = delete;

    pull_fetcher& fetcher() const noexcept { return *fetcher_; }

    // Messages the consumer has yet to deliver.
    std::uint64_t pending(const replay_request& r) const {
        jsConsumerInfo* ci = nullptr;
        jsErrCode jerr{};
        check_nats(natsSubscription_GetConsumerInfo(&ci, sub_, nullptr, &jerr),
                   "reading the replay consumer of '" + r.filter_subject + "' in stream '" + r.stream + "'", jerr);
        const auto n = ci->NumPending;
        jsConsumerInfo_Destroy(ci);
        return n;
    }

private:
    const connection& conn_;
    natsSubscription* sub_ = nullptr;
    std::unique_ptr<pull_fetcher> fetcher_;
};

// The last sequence of the partition's subjects now (0: none).
std::uint64_t last_sequence(const connection& c, const replay_request& r) {
    natsMsg* m = nullptr;
    jsErrCode jerr{};
    auto st = js_GetLastMsg(&m, c.js(), r.stream.c_str(), r.filter_subject.c_str(), nullptr, &jerr);
    if (st == NATS_NOT_FOUND) return 0;
    check_nats(st, "reading the last message of '" + r.filter_subject + "' in stream '" + r.stream + "'", jerr);
    const auto seq = natsMsg_GetSequence(m);
    natsMsg_Destroy(m);
    return seq;
}

[[noreturn]] void abandon(const replay_request& r, const std::string& why) {
    throw std::system_error(std::make_error_code(std::errc::operation_canceled),
                            "replay of '" + r.filter_subject + "' into " + r.copy.path.string() + " " + why +
                                "; nothing was put in place");
}

using fetched = fetched_messages;

// Fetches up to n messages, waiting while none come; returns none once the consumer has
// nothing left (the messages up to the target were removed meanwhile: limits, purge).
void fetch(fetched& out, const connection& c, const replay_subscription& sub, const replay_request& r, int n,
           const std::atomic<bool>& quit) {
    int failures = 0;
    for (;;) {
        if ((r.stop != nullptr && r.stop->load()) || quit.load()) abandon(r, "was stopped");
        auto st = sub.fetcher().fetch(out, n, std::chrono::milliseconds(fetch_wait_ms));
        if (!out.msgs.empty()) return;
        if (st == NATS_OK || st == NATS_TIMEOUT || st == NATS_NOT_FOUND) {
            if (sub.pending(r) == 0) return;
            continue;
        }
        if (natsConnection_Status(c.nc()) == NATS_CONN_STATUS_CONNECTED && ++failures > fetch_failures_allowed) {
            throw_nats(st, "fetching the replay of '" + r.filter_subject + "' in stream '" + r.stream + "'" +
                               (st == NATS_ERR ? " (" + sub.fetcher().failure() + ")" : ""));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

// A delivered message's stream sequence and the messages its consumer has left after it.
struct position {
    std::uint64_t sequence = 0;
    std::uint64_t pending = 0;
};

position position_of(natsMsg* msg, const replay_request& r) {
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, msg) != NATS_OK) {
        throw_error(errc::broker_failed, "replay of '" + r.filter_subject + "' in stream '" + r.stream +
                                             "': a message came without its stream sequence");
    }
    position p{meta->Sequence.Stream, meta->NumPending};
    jsMsgMetaData_Destroy(meta);
    return p;
}

// A batch read and prepared (parsed, decoded) by the reader thread, waiting for the writer.
struct prepared {
    prepared_batch batch;
    std::uint64_t last = 0;  // the highest stream sequence in it
    std::size_t count = 0;
};

// Reads the partition up to target into a bulk build of s, starting with the messages in
// first: a reader thread fetches and prepares the batches while this one applies them (at most
// two wait between them), as the log rebuild does. Returns the messages and the last sequence
// applied.
replay_result read_into(store& s, const connection& c, replay_subscription& sub, const replay_request& r,
                        std::uint64_t target, const std::string& incarnation, fetched& first) {
    std::mutex m;
    std::condition_variable changed;
    std::deque<prepared> ready;
    bool finished = false;
    std::exception_ptr failed;
    std::atomic<bool> quit{false};
    std::thread reader([&] {
        try {
            std::vector<delivery> batch;
            fetched next;
            fetched* in_hand = &first;
            std::uint64_t last = 0;
            while (!in_hand->msgs.empty()) {
                batch.clear();
                batch.reserve(in_hand->msgs.size());
                for (natsMsg* msg : in_hand->msgs) {
                    delivery d;
                    // The live path's identity: the Nats-Msg-Id within this stream, else the envelope's.
                    const char* id = nullptr;
                    if (natsMsgHeader_Get(msg, "Nats-Msg-Id", &id) == NATS_OK && id != nullptr) d.message_id = id;
                    d.body.assign(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
                    d.transport = r.stream;
                    batch.push_back(std::move(d));
                    last = std::max(last, position_of(msg, r).sequence);
                }
                prepared p;
                s.prepare(batch, p.batch);
                p.last = last;
                p.count = batch.size();
                {
                    std::unique_lock lock{m};
                    changed.wait(lock, [&] { return ready.size() < 2 || quit.load(); });
                    if (quit.load()) break;
                    ready.push_back(std::move(p));
                }
                changed.notify_all();
                if (last >= target) break;
                fetch(next, c, sub, r, fetch_size, quit);
                in_hand = &next;
            }
        } catch (...) {
            std::scoped_lock lock{m};
            failed = std::current_exception();
        }
        {
            std::scoped_lock lock{m};
            finished = true;
        }
        changed.notify_all();
    });
    replay_result out;
    try {
        for (;;) {
            prepared p;
            {
                std::unique_lock lock{m};
                changed.wait(lock, [&] { return !ready.empty() || finished; });
                if (ready.empty()) {
                    if (failed) std::rethrow_exception(failed);
                    break;
                }
                p = std::move(ready.front());
                ready.pop_front();
            }
            changed.notify_all();
            if (r.stop != nullptr && r.stop->load()) abandon(r, "was stopped");
            // The live path's fence, asked before each batch: a lease that may have expired
            // abandons the build now rather than at its end.
            if (r.copy.fence) r.copy.fence();
            s.apply(p.batch, checkpoint{r.checkpoint_name, p.last, incarnation, true});
            out.messages += p.count;
            out.checkpoint = p.last;
            crash_point("during_replay");
        }
    } catch (...) {
        {
            std::scoped_lock lock{m};
            quit = true;
        }
        changed.notify_all();
        reader.join();
        throw;
    }
    reader.join();
    return out;
}

}  // namespace

std::filesystem::path replay_directory(const std::filesystem::path& path) {
    auto p = path;
    p += ".bulk";
    return p;
}

replay_result replay_partition(const replay_request& r) {
    if (r.threshold == 0 || std::filesystem::exists(r.copy.path)) return {};
    if (r.stop != nullptr && r.stop->load()) return {.stopped = true};
    const auto fresh = replay_directory(r.copy.path);
    remove_store_dir(fresh);  // left by a replay that was killed: start over
    replay_result result;
    try {
        connection c{r.servers, "idem replay " + r.filter_subject};
        const auto stream = read_stream(c, r.stream);
        const auto target = last_sequence(c, r);
        if (target == 0) return {};
        replay_subscription sub{c, r};
        // How many messages the partition holds, from the first one's delivery (the consumer's own
        // count, asked right after its creation on a replicated stream, may not be there yet).
        fetched first;
        const std::atomic<bool> go_on{false};
        fetch(first, c, sub, r, 1, go_on);
        if (first.msgs.empty()) return {};
        const auto pending = position_of(first.msgs[0], r).pending + 1;
        if (pending < r.threshold) return {};

        auto so = r.copy;
        so.path = fresh;
        so.sync = durability::none;  // one sync at the end instead of one per batch
        // A bulk build cannot grow the map half way: reserve the partition's share of the stream
        // several times over (the file only grows as it is written).
        if (auto si = stream_info(c, r.stream); si && si->State.Msgs > 0) {
            const auto bytes = si->State.Bytes / si->State.Msgs * pending;
            so.tuning.map_size = std::min<std::size_t>(so.tuning.max_map_size, std::max<std::size_t>(so.tuning.map_size, 8 * bytes));
        }
        {
            store s{so};
            if (r.add_projections) r.add_projections(s);
            s.begin_bulk(r.memory_budget);
            result = read_into(s, c, sub, r, target, checkpoint_detail(stream), first);
            if (r.stop != nullptr && r.stop->load()) abandon(r, "was stopped");
            s.end_bulk();  // its commit calls the fence
            idem::detail::store_env(s)->sync(true);
        }
        sync_dir(fresh.parent_path());
        // Never put in place under a lease that may be lost: the fence and the bucket both say so.
        if (r.copy.fence) r.copy.fence();
        if (r.still_held && !r.still_held()) {
            throw_error(errc::lease_lost, "replay of '" + r.filter_subject + "' into " + r.copy.path.string() +
                                              ": the lease was lost; nothing was put in place");
        }
        crash_point("during_swap");
        std::filesystem::rename(fresh, r.copy.path);
        sync_dir(r.copy.path.parent_path());
    } catch (...) {
        std::error_code ec;
        std::filesystem::remove_all(fresh, ec);
        if (r.stop != nullptr && r.stop->load()) return {.stopped = true};
        throw;
    }
    result.replayed = true;
    return result;
}

}  // namespace idem::jetstream::detail
