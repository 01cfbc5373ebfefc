// One instance of a partitioned group: a loop that renews the leases it holds, takes free
// partitions up to its share, gives extras up, and runs one JetStream source per owned partition
// into that partition's own environment. Each partition's commits are fenced: the store calls
// the fence inside every write transaction, and it refuses once the lease may have expired on
// the server (the last renewal's send time + TTL - margin), so an owner paused past its lease
// commits nothing when it wakes. Each owner binds its own durable consumer, named after the
// revision that took the lease, and deletes those of earlier owners: the acks of a stale owner
// go to a consumer that no longer exists and cannot ack a message for the new one.

#include <idem/sources/jetstream_partitions.hpp>

#include "connection.hpp"
#include "lease.hpp"
#include "replay.hpp"

#include <idem/storage/error.hpp>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_future.hpp>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

namespace idem::jetstream {

namespace {

using clock = std::chrono::steady_clock;

std::int64_t now_ns() { return clock::now().time_since_epoch().count(); }

std::uint64_t decode_position(std::string_view stored) {
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < 8 && i < stored.size(); ++i) {
        v |= std::uint64_t(static_cast<unsigned char>(stored[i])) << (8 * i);
    }
    return v;
}

// The stream's subject must be "<prefix>.>": partition k is then "<prefix>.<k>.>".
std::string stream_prefix(const detail::connection& c, const std::string& stream) {
    auto si = detail::stream_info(c, stream);
    if (!si) throw_error(errc::broker_failed, "stream '" + stream + "' does not exist at '" + c.servers() + "'");
    if (si->Config->SubjectsLen != 1) {
        throw_error(errc::invalid_argument, "stream '" + stream + "' captures " + std::to_string(si->Config->SubjectsLen) +
                                                " subjects: a partitioned stream captures one, '<prefix>.>'");
    }
    std::string subject = si->Config->Subjects[0];
    if (subject.size() < 3 || !subject.ends_with(".>")) {
        throw_error(errc::invalid_argument, "stream '" + stream + "' captures '" + subject +
                                                "': a partitioned stream captures '<prefix>.>'");
    }
    return subject.substr(0, subject.size() - 2);
}

// Whether a partition's run ended on the loss of its lease rather than on a fault of its own: the
// fence refused a commit (errc::lease_lost), or the broker failed it, as it does once a new owner
// deleted the consumer. Such a partition goes on under its next owner. Any other error (the
// stream changed under the checkpoint, the store failing, messages exhausted) would stop that
// owner the same way: it stops the group's run.
bool ended_with_the_lease(const std::exception_ptr& error) {
    try {
        std::rethrow_exception(error);
    } catch (const std::system_error& e) {
        return e.code() == errc::lease_lost || e.code() == errc::broker_failed;
    } catch (...) {
        return false;
    }
}

// The error of partition k's run, its message prefixed with the partition and the group.
std::exception_ptr named_after(std::uint32_t k, const std::string& consumer, const std::exception_ptr& error) {
    const auto what = "partition " + std::to_string(k) + " of consumer '" + consumer + "': ";
    try {
        std::rethrow_exception(error);
    } catch (const std::system_error& e) {
        std::string text = e.what();
        const auto suffix = ": " + e.code().message();  // system_error appends it again
        if (text.ends_with(suffix)) text.resize(text.size() - suffix.size());
        return std::make_exception_ptr(std::system_error(e.code(), what + text));
    } catch (const std::exception& e) {
        return std::make_exception_ptr(std::runtime_error(what + e.what()));
    } catch (...) {
        return error;
    }
}

}  // namespace

// What a partition's fence checks inside each write transaction. Once it refuses a commit it
// stays closed (latched) and marks the copy for replay: a later batch that committed would
// raise the checkpoint past the refused messages, and a new owner's consumer, which starts
// after the checkpoint, would never deliver them.
struct fence_state {
    std::atomic<std::int64_t> deadline{0};  // steady ns; commits refused after
    std::atomic<bool> latched{false};
    std::filesystem::path marker;  // "<db>/p<k>.replay": the copy must not be resumed from

    void latch() {
        if (latched.exchange(true)) return;
        std::ofstream{marker};  // created before the refusal is reported (a kill -9 leaves it)
    }
};

struct partitioned_consumer::impl {
    partitioned_options o;
    std::unique_ptr<detail::connection> conn;
    std::unique_ptr<detail::lease_bucket> leases;
    std::string prefix;
    std::atomic<bool> stop_requested{false};
    boost::asio::io_context io;
    std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
    std::thread completions;
    partitioned_result result;

    // One owned partition.
    struct owned {
        std::uint32_t k = 0;
        std::uint64_t taken_revision = 0;  // names this owner's durable consumer
        std::uint64_t revision = 0;        // the lease's current revision
        std::shared_ptr<fence_state> fence;
        std::unique_ptr<engine> eng;
        std::mutex m;                  // guards src while the partition's thread sets it
        std::unique_ptr<source> src;   // set by the partition's thread
        std::atomic<bool> stop{false};
        std::thread th;
        std::atomic<bool> done{false};
        std::exception_ptr error;
        source_result run_result;
        std::uint64_t final_checkpoint = 0;  // read by finish() before the environment closes
    };
    std::map<std::uint32_t, std::unique_ptr<owned>> held;
    int excess_ticks = 0;  // consecutive ticks that found more held than the share
    // Partitions given up for balance whose copy is kept until another instance takes the lease:
    // k -> the copy's checkpoint. Should the group stop before anyone takes one, the copy
    // (current when it was given up) stays in this instance's dump.
    std::map<std::uint32_t, std::uint64_t> released;
    bool reached = false;  // --until-caught-up: every partition reached its target
    std::vector<std::uint64_t> targets;  // --until-caught-up: the last sequence of each partition

    bool stopping() const { return stop_requested.load() || (o.stop != nullptr && o.stop->load()); }
    std::chrono::nanoseconds ttl() const { return leases->ttl(); }
    std::int64_t deadline_after(std::int64_t sent) const {
        auto t = std::chrono::duration_cast<std::chrono::nanoseconds>(ttl()).count();
        return sent + t - t / 5;  // a fifth of the TTL for timer slack and clock rate
    }

    void start(std::uint32_t k, std::uint64_t revision, std::int64_t sent);
    void finish(owned& p, bool drop);
    void drop_copy(std::uint32_t k);
    void write_owned_file();
    void write_owned_file(std::vector<std::uint32_t> ks);
    std::vector<std::uint32_t> with_kept_copies(std::vector<std::uint32_t> ks);
    std::vector<std::uint32_t> listed_at_start;  // DIR/owned as the previous run left it
    void drop_foreign_copies();
    std::uint64_t checkpoint_of(owned& p);
    std::string durable_prefix(std::uint32_t k) const { return o.source.consumer + "-p" + std::to_string(k) + "-r"; }
    void delete_old_consumers(std::uint32_t k, const std::string& keep);
    std::exception_ptr failure_of(const owned& p, bool any) const;
    void renew_held();
    void forget_taken_copies();
    void tick();
    bool take(std::uint32_t k);
    bool caught_up();
    void read_targets();
};

partitioned_consumer::partitioned_consumer(partitioned_options options) : impl_(std::make_unique<impl>()) {
    auto& s = *impl_;
    s.o = std::move(options);
    if (s.o.partitions == 0 || s.o.partitions > 4096) {
        throw_error(errc::invalid_argument, "partitions: " + std::to_string(s.o.partitions) + " is not within 1-4096");
    }
    if (s.o.instance.empty()) throw_error(errc::invalid_argument, "a partitioned consumer needs an instance name");
    for (char c : s.o.instance) {
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_')) {
            throw_error(errc::invalid_argument, "instance name '" + s.o.instance +
                                                    "': only letters, digits, '-' and '_' are allowed");
        }
    }
    if (s.o.lease_ttl < std::chrono::milliseconds(500)) {
        throw_error(errc::invalid_argument, "lease TTL below 500 ms leaves no time to renew");
    }
    if (s.o.source.servers.empty()) throw_error(errc::invalid_argument, "a partitioned consumer needs a server");
    s.conn = std::make_unique<detail::connection>(s.o.source.servers, "idem " + s.o.instance);
    s.prefix = stream_prefix(*s.conn, s.o.source.stream);
    auto si = detail::stream_info(*s.conn, s.o.source.stream);
    s.leases = std::make_unique<detail::lease_bucket>(*s.conn, s.o.source.consumer, s.o.lease_ttl,
                                                      std::max(1, static_cast<int>(si->Config->Replicas)));
    std::filesystem::create_directories(s.o.db);
}

partitioned_consumer::~partitioned_consumer() {
    auto& s = *impl_;
    for (auto& [k, p] : s.held) {
        p->stop = true;
        if (p->th.joinable()) p->th.join();
        p->eng.reset();
    }
    s.work.reset();
    if (s.completions.joinable()) s.completions.join();
}

void partitioned_consumer::stop() noexcept { impl_->stop_requested = true; }

const partitioned_result& partitioned_consumer::result() const { return impl_->result; }

void partitioned_consumer::impl::drop_copy(std::uint32_t k) {
    std::error_code ec;
    std::filesystem::remove_all(o.db / partition_directory(k), ec);
    std::filesystem::remove(replay_marker(o.db, k), ec);
}

// DIR/owned lists the partitions this instance holds, one a line, replaced atomically: what
// `idem dump` of DIR shows.
void partitioned_consumer::impl::write_owned_file() {
    std::vector<std::uint32_t> ks;
    for (const auto& [k, p] : held) ks.push_back(k);
    write_owned_file(ks);
}

void partitioned_consumer::impl::write_owned_file(std::vector<std::uint32_t> ks) { write_owned(o.db, std::move(ks)); }

// ks and the copies this instance kept on an earlier stop that no one has taken since (their
// leases free and naming it as the keeper): what DIR/owned lists at the stop, so that a run that
// took nothing, as one started with --until-caught-up after the group caught up, still shows
// them. Not while running: another instance may take such a partition any time, and two files
// would then list it.
std::vector<std::uint32_t> partitioned_consumer::impl::with_kept_copies(std::vector<std::uint32_t> ks) {
    for (std::uint32_t k = 0; k < o.partitions; ++k) {
        if (std::find(ks.begin(), ks.end(), k) != ks.end()) continue;
        if (!std::filesystem::exists(o.db / partition_directory(k))) continue;
        bool kept_here = false;
        try {
            auto lease = leases->read(k);
            kept_here = lease.instance.empty() && lease.kept && lease.kept_by == o.instance;
        } catch (const std::system_error&) {
            // No broker: as the file listed it when this run started.
            kept_here = std::find(listed_at_start.begin(), listed_at_start.end(), k) != listed_at_start.end();
        }
        if (kept_here) ks.push_back(k);
    }
    return ks;
}

// Before serving anything: a copy of a partition another instance holds now is stale.
void partitioned_consumer::impl::drop_foreign_copies() {
    for (const auto& entry : std::filesystem::directory_iterator(o.db)) {
        auto name = entry.path().filename().string();
        if (!entry.is_directory() || name.size() < 2 || name[0] != 'p') continue;
        std::uint32_t k = 0;
        auto [end, ec] = std::from_chars(name.data() + 1, name.data() + name.size(), k);
        if (ec != std::errc() || end != name.data() + name.size()) continue;
        auto lease = leases->read(k);
        if (k >= o.partitions || (!lease.instance.empty() && lease.instance != o.instance)) drop_copy(k);
    }
}

std::uint64_t partitioned_consumer::impl::checkpoint_of(owned& p) {
    std::scoped_lock lock{p.m};  // the partition's thread opens the engine
    if (!p.eng) return 0;
    auto name = checkpoint_source(o.source.stream, o.source.consumer) + ".p" + std::to_string(p.k);
    auto stored = p.eng->read().checkpoint_value(o.engine.store.consumer, name);
    return stored && stored->size() >= 8 ? decode_position(*stored) : 0;
}

void partitioned_consumer::impl::delete_old_consumers(std::uint32_t k, const std::string& keep) {
    jsConsumerNamesList* names = nullptr;
    jsErrCode jerr{};
    if (js_ConsumerNames(&names, conn->js(), o.source.stream.c_str(), nullptr, &jerr) != NATS_OK) return;
    const auto pre = durable_prefix(k);
    for (int i = 0; i < names->Count; ++i) {
        std::string n = names->List[i];
        if (n.starts_with(pre) && n != keep) (void)js_DeleteConsumer(conn->js(), o.source.stream.c_str(), n.c_str(), nullptr, &jerr);
    }
    jsConsumerNamesList_Destroy(names);
}

void partitioned_consumer::impl::start(std::uint32_t k, std::uint64_t revision, std::int64_t sent) {
    auto p = std::make_unique<owned>();
    p->k = k;
    p->taken_revision = revision;
    p->revision = revision;
    p->fence = std::make_shared<fence_state>();
    p->fence->deadline = deadline_after(sent);
    p->fence->marker = replay_marker(o.db, k);
    if (std::filesystem::exists(p->fence->marker)) drop_copy(k);  // a refused commit: replay it all
    engine_options eo = o.engine;
    eo.store.path = o.db / partition_directory(k);
    std::weak_ptr<fence_state> weak = p->fence;
    const std::string what = "partition " + std::to_string(k) + " of consumer '" + o.source.consumer + "'";
    eo.store.fence = [weak, what] {
        auto f = weak.lock();
        if (!f || f->latched || now_ns() > f->deadline.load()) {
            if (f) f->latch();
            throw_error(errc::lease_lost, what + ": the lease may have expired; the commit is refused");
        }
    };

    source_options so = o.source;
    so.consumer = durable_prefix(k) + std::to_string(revision);
    so.filter_subject = prefix + "." + std::to_string(k) + ".>";
    so.checkpoint_name = checkpoint_source(o.source.stream, o.source.consumer) + ".p" + std::to_string(k);
    so.until_caught_up = false;
    so.claim = false;  // the partition's lease fences it
    // A commit that failed for any reason closes the fence too (from its completion: a storage
    // failure is not seen inside the transaction that follows it).
    // The partition's run stops there too: every later commit would be refused, and each
    // refusal naks a message, spending its deliveries (MaxDeliver) for nothing.
    so.on_ack = [cb = o.on_ack, k, weak, stop = &p->stop](const ack_event& ev) {
        if (!ev.acked) {
            if (auto f = weak.lock()) f->latch();
            stop->store(true);
        }
        if (cb) cb(k, ev);
    };
    so.stop = &p->stop;
    detail::replay_request rr;
    rr.servers = o.source.servers;
    rr.stream = o.source.stream;
    rr.filter_subject = so.filter_subject;
    rr.checkpoint_name = so.checkpoint_name;
    rr.copy = eo.store;
    rr.add_projections = o.add_projections;
    rr.threshold = o.replay_threshold;
    rr.memory_budget = o.replay_memory_budget;
    rr.stop = &p->stop;
    rr.still_held = [this, k] { return leases->read(k).instance == o.instance; };
    auto* raw = p.get();
    // Setting the consumer up (created on a replicated stream, earlier owners' deleted) takes
    // round trips to the cluster, and a replay takes a while: both run on the partition's
    // thread, so the run's thread keeps renewing the leases (this one's too) meanwhile. The
    // engine opens the copy once a replay (if any) has put it in place.
    p->th = std::thread([this, raw, so, eo, rr]() mutable {
        try {
            delete_old_consumers(raw->k, so.consumer);
            if (detail::replay_partition(rr).stopped) {
                raw->done = true;
                return;
            }
            auto eng = std::make_unique<engine>(io.get_executor(), eo);
            if (o.add_projections) eng->add_projections(o.add_projections);
            {
                std::scoped_lock lock{raw->m};
                raw->eng = std::move(eng);
            }
            so.start_sequence = checkpoint_of(*raw) + 1;  // an older or replayed copy resumes; none replays from the start
            auto src = std::make_unique<source>(so);
            {
                std::scoped_lock lock{raw->m};
                raw->src = std::move(src);
            }
            if (!raw->stop) raw->run_result = raw->src->run(*raw->eng);
        } catch (...) {
            raw->error = std::current_exception();
            if (raw->src) raw->run_result = raw->src->result();  // what it did up to the error
        }
        raw->done = true;
    });
    held.emplace(k, std::move(p));
    ++result.taken;
    if (o.on_lease) o.on_lease(k, true, revision, "taken");
}

// Stops partition p's run (everything in flight acked or nak'd) and closes its environment;
// drop removes the copy (a lost lease, or one given up while running).
void partitioned_consumer::impl::finish(owned& p, bool drop) {
    p.stop = true;  // the source checks it between fetches
    if (p.th.joinable()) p.th.join();
    if (p.eng) {
        // An engine whose environment could not be recovered completes its stop with that
        // error: the partition is still stopped and given up (the error is the run's, once),
        // never left half-finished for a second stop that would find its engine stopped.
        try {
            p.eng->async_stop(boost::asio::use_future).get();
            p.final_checkpoint = checkpoint_of(p);
        } catch (const std::exception&) {  // use_future throws boost::system::system_error
            if (!p.error) p.error = std::current_exception();
        }
    }
    p.eng.reset();
    result.fetched += p.run_result.fetched;
    p.src.reset();
    if (drop) drop_copy(p.k);
}

// Renews every held lease; a lease that is no longer ours is dropped at once, and so is a
// partition whose fence refused a commit or whose run ended by itself. A partition whose run
// ended on an error of its own stops the group's run with it (thrown once the partition is given
// up), also when its lease was lost meanwhile: its next owner would meet the same error.
void partitioned_consumer::impl::renew_held() {
    for (auto it = held.begin(); it != held.end();) {
        auto& p = *it->second;
        const auto sent = now_ns();
        std::optional<std::uint64_t> rev;
        bool known = true;
        try {
            rev = leases->renew(p.k, o.instance, checkpoint_of(p), p.revision);
        } catch (const std::system_error&) {
            known = false;  // the broker is away: the fence closes by itself at the deadline
        }
        if (known && !rev) {
            p.fence->deadline.store(0);
            if (o.on_lease) o.on_lease(p.k, false, p.revision, "lost");
            finish(p, true);
            ++result.lost;
            const auto error = failure_of(p, false);
            it = held.erase(it);
            write_owned_file();
            if (error) std::rethrow_exception(error);
            continue;
        }
        if (rev) {
            p.revision = *rev;
            p.fence->deadline.store(deadline_after(sent));
        }
        if (p.fence->latched && !stopping()) {
            // A refused commit: this copy may miss messages below its checkpoint. Give the
            // partition up with the copy; whoever takes it next replays it.
            finish(p, true);
            (void)leases->release(p.k, p.revision);
            if (o.on_lease) o.on_lease(p.k, false, p.revision, "commit refused");
            ++result.given_up;
            const auto error = failure_of(p, false);
            it = held.erase(it);
            write_owned_file();
            if (error) std::rethrow_exception(error);
            continue;
        }
        if (p.done && !stopping()) {
            // An error of its own stops the group's run: the stop gives the partition up as it
            // gives up every other, its copy kept and listed (what it committed up to the error).
            if (auto error = failure_of(p, false)) std::rethrow_exception(error);
            // The run ended by itself (its consumer deleted, the broker refusing): give the
            // lease up, so that this or another instance takes the partition afresh.
            p.fence->deadline.store(0);
            finish(p, false);
            const auto error = failure_of(p, true);
            (void)leases->release(p.k, p.revision);
            if (o.on_lease) o.on_lease(p.k, false, p.revision, "run ended");
            it = held.erase(it);
            write_owned_file();
            if (error) std::rethrow_exception(error);
            continue;
        }
        ++it;
    }
}

// The error partition p's run ended with, named after the partition, if it stops the group's run:
// any error (any), or one of the partition's own rather than of a lost lease; null otherwise.
std::exception_ptr partitioned_consumer::impl::failure_of(const owned& p, bool any) const {
    if (!p.error || (!any && ended_with_the_lease(p.error))) return nullptr;
    return named_after(p.k, o.source.consumer, p.error);
}

// Drops the copies of partitions given up for balance that another instance has taken since.
void partitioned_consumer::impl::forget_taken_copies() {
    for (auto it = released.begin(); it != released.end();) {
        auto lease = leases->read(it->first);
        if (!lease.instance.empty() && lease.instance != o.instance) {
            drop_copy(it->first);
            it = released.erase(it);
        } else {
            ++it;
        }
    }
}

void partitioned_consumer::impl::tick() {
    leases->heartbeat(o.instance);
    renew_held();
    forget_taken_copies();
    // An instance that is stopping neither gives up nor takes: what it gives up now, no one may
    // take before the group has stopped (the partition would be in no dump), and what it takes
    // now it would hold with a copy that has not caught up.
    if (stopping()) return;
    if (!targets.empty() && caught_up()) {
        reached = true;
        stop_requested = true;
        return;
    }
    // Balance: at most ceil(N / live) each. A partition is given up only once the excess has
    // lasted two ticks: a count of live instances that is briefly high (one starting and
    // stopping again, one whose heartbeat is about to be deleted on stop) moves nothing.
    auto live = std::max<std::size_t>(leases->live_instances().size(), 1);
    const auto share = static_cast<std::size_t>((o.partitions + live - 1) / live);
    excess_ticks = held.size() > share ? excess_ticks + 1 : 0;
    if (excess_ticks >= 2) {
        auto it = std::prev(held.end());
        auto& p = *it->second;
        finish(p, false);
        const auto error = failure_of(p, false);
        if (leases->release(p.k, p.revision)) {
            released[p.k] = p.final_checkpoint;  // the copy goes once another instance took it
        } else {
            drop_copy(p.k);
        }
        if (o.on_lease) o.on_lease(p.k, false, p.revision, "rebalanced");
        ++result.given_up;
        held.erase(it);
        write_owned_file();
        if (error) std::rethrow_exception(error);
        return;
    }
    // Take free partitions, starting at a place of this instance's own so that instances
    // starting together try different ones first.
    // Partitions this instance has a copy of come first: they resume instead of replaying.
    const auto first = partition_of_token(o.instance, o.partitions);
    std::vector<std::uint32_t> order;
    for (std::uint32_t i = 0; i < o.partitions; ++i) order.push_back((first + i) % o.partitions);
    std::stable_partition(order.begin(), order.end(), [this](std::uint32_t k) {
        return std::filesystem::exists(o.db / partition_directory(k));
    });
    for (auto k : order) {
        if (held.size() >= share || stopping()) break;
        if (held.contains(k)) continue;
        if (!take(k)) continue;
        renew_held();  // starting a partition takes a while (a consumer on a replicated stream)
    }
}

// Takes partition k if it is free (or still names this instance, restarted) and starts it.
bool partitioned_consumer::impl::take(std::uint32_t k) {
    const auto sent = now_ns();
    auto lease = leases->read(k);
    // --until-caught-up: a partition given up on stop by an owner that had reached the target
    // is caught up in that owner's copy; taking it would only replay it into a second one.
    if (!targets.empty() && lease.kept && lease.checkpoint >= targets[k]) return false;
    std::optional<std::uint64_t> rev;
    if (lease.instance == o.instance) {
        rev = leases->renew(k, o.instance, lease.checkpoint, lease.revision);  // this instance, restarted
    } else if (lease.instance.empty()) {
        rev = leases->try_take(k, o.instance, 0);
    }
    if (!rev) return false;
    if (stopping()) {  // asked to stop while taking it: give it back unstarted
        (void)leases->release(k, *rev);
        return false;
    }
    released.erase(k);  // taken back: its kept copy resumes
    start(k, *rev, sent);
    write_owned_file();
    return true;
}

// The last sequence of each partition's subjects in the stream, as it is now.
void partitioned_consumer::impl::read_targets() {
    targets.assign(o.partitions, 0);
    for (std::uint32_t k = 0; k < o.partitions; ++k) {
        const auto filter = prefix + "." + std::to_string(k) + ".>";
        natsMsg* m = nullptr;
        jsErrCode jerr{};
        auto st = js_GetLastMsg(&m, conn->js(), o.source.stream.c_str(), filter.c_str(), nullptr, &jerr);
        if (st == NATS_NOT_FOUND) continue;  // nothing in that partition yet
        detail::check_nats(st, "reading the last message of '" + filter + "' in stream '" + o.source.stream + "'", jerr);
        targets[k] = natsMsg_GetSequence(m);
        natsMsg_Destroy(m);
    }
}

// Whether every partition has an owner (or, given up on stop, a last owner that kept its copy)
// whose published checkpoint reached the partition's target. A lease that names this instance
// while this run does not hold it (left by its earlier run, killed before it gave it up, or a
// release that did not reach the broker) has no owner yet: this run takes it first, since a
// copy it neither holds nor kept is in no dump, not even its own.
bool partitioned_consumer::impl::caught_up() {
    for (std::uint32_t k = 0; k < o.partitions; ++k) {
        auto lease = leases->read(k);
        if (lease.instance.empty() && !lease.kept) return false;
        if (lease.instance == o.instance && !held.contains(k)) return false;
        if (lease.checkpoint < targets[k]) return false;
    }
    return true;
}

partitioned_result partitioned_consumer::run() {
    auto& s = *impl_;
    s.work.emplace(s.io.get_executor());
    s.completions = std::thread([&s] { s.io.run(); });
    s.listed_at_start = read_owned(s.o.db).value_or(std::vector<std::uint32_t>{});
    s.drop_foreign_copies();
    s.write_owned_file();
    if (s.o.until_caught_up) s.read_targets();
    const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(s.ttl() / 4);
    std::exception_ptr failure;
    // Say this instance is alive a tick before taking anything: instances started together
    // then count each other at their first take and split the partitions at once, instead of
    // one taking them all and handing most over again (each handover a replay).
    try {
        s.leases->heartbeat(s.o.instance);
        for (auto waited = std::chrono::milliseconds(0); waited < period && !s.stopping();
             waited += std::chrono::milliseconds(20)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    } catch (const std::system_error&) {
    }
    while (!s.stopping()) {
        try {
            s.tick();
        } catch (const std::system_error& e) {
            if (e.code() != errc::broker_failed) {
                failure = std::current_exception();
                break;
            }
            // The broker is away: the fences close at their deadlines; renewals go on.
        } catch (const std::exception&) {
            // Any other failure (a partition's run may end with one) still takes the stop path
            // below: every partition stopped and its lease given up before it is rethrown.
            failure = std::current_exception();
            break;
        }
        for (auto waited = std::chrono::milliseconds(0); waited < period && !s.stopping();
             waited += std::chrono::milliseconds(20)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    // Stop: first the heartbeat goes, so that the others no longer count this instance and
    // give nothing up for it; then every partition acks what it holds, its copy is recorded as
    // kept with its checkpoint and its lease is given up; the copies stay (what this instance
    // held when it stopped is what its dump shows).
    try {
        s.leases->leave(s.o.instance);
    } catch (const std::system_error&) {
    }
    for (auto& [k, p] : s.held) {
        s.finish(*p, false);
        s.result.owned_at_stop.push_back(k);
        try {
            (void)s.leases->release(k, p->revision, s.o.instance, p->final_checkpoint);
        } catch (const std::system_error&) {
        }
        if (s.o.on_lease) s.o.on_lease(k, false, p->revision, "stopped");
        if (auto error = s.failure_of(*p, true); error && !failure) failure = error;
    }
    s.held.clear();
    // Partitions given up for balance that no one has taken: their copies stay in this
    // instance's dump and are recorded as kept, with their checkpoints. One another instance
    // holds, or kept on its own stop, is that instance's to show: this copy goes.
    for (auto it = s.released.begin(); it != s.released.end();) {
        const auto k = it->first;
        bool kept = false;
        try {
            for (int attempt = 0; attempt < 3 && !kept; ++attempt) {
                auto lease = s.leases->read(k);
                if (!lease.instance.empty() || lease.kept) break;
                // Free (our release, expired, or taken and given back unstarted by an instance
                // stopping meanwhile): recorded as kept, by compare-and-set unless expired;
                // read again if it moved.
                kept = s.leases->release(k, lease.revision, s.o.instance, it->second).has_value();
            }
        } catch (const std::system_error&) {
        }
        if (kept) {
            s.result.owned_at_stop.push_back(k);
            ++it;
        } else {
            s.drop_copy(k);
            it = s.released.erase(it);
        }
    }
    // Held at the stop, and the kept copies: what DIR/owned lists, the result says too.
    s.result.owned_at_stop = s.with_kept_copies(s.result.owned_at_stop);
    std::sort(s.result.owned_at_stop.begin(), s.result.owned_at_stop.end());
    s.write_owned_file(s.result.owned_at_stop);
    s.result.caught_up = s.reached;
    s.work.reset();
    s.completions.join();
    if (failure) std::rethrow_exception(failure);
    return s.result;
}

}  // namespace idem::jetstream
