#include <idem/engine/engine.hpp>

#include "commit_watch.hpp"

#include <idem/projections/store_hooks.hpp>
#include <idem/storage/reused_buffer.hpp>

#include <boost/asio/post.hpp>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <thread>
#include <variant>
#include <vector>

namespace idem {
namespace {

using clock = std::chrono::steady_clock;
using apply_handler = boost::asio::any_completion_handler<engine::apply_signature>;
using marker_handler = boost::asio::any_completion_handler<void(std::error_code)>;

struct pending_apply {
    prepared_batch body;  // prepared on the submitting thread: the writer only applies
    apply_handler handler;
    engine::executor_type ex;
    clock::time_point submitted;
    std::optional<checkpoint> at;  // the source position it was read at
    std::size_t bytes = 0;         // the delivery's body size
};


// A flush or stop request: completes when everything queued before it is durable.
struct pending_marker {
    std::optional<marker_handler> handler;  // none: the destructor's own stop
    engine::executor_type ex;
    bool stop = false;
    std::function<void(store&)> task{};  // async_operate's: run with the store before completing
};

using item = std::variant<pending_apply, pending_marker>;

std::error_code aborted() { return std::make_error_code(std::errc::operation_canceled); }

// The most recent samples of a quantity, for percentiles that follow the current load.
class sample_window {
public:
    void add(double v) {
        if (samples_.size() < capacity) {
            samples_.push_back(v);
        } else {
            samples_[next_] = v;
        }
        next_ = (next_ + 1) % capacity;
        ++count_;
        max_ = std::max(max_, v);
    }
    distribution summary() const {
        distribution d;
        d.count = count_;
        d.max = max_;
        if (samples_.empty()) return d;
        auto sorted = samples_;
        auto at = [&](double q) {
            auto i = static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1));
            std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(i), sorted.end());
            return sorted[i];
        };
        d.p50 = at(0.50);
        d.p99 = at(0.99);
        return d;
    }

private:
    static constexpr std::size_t capacity = 16384;
    std::vector<double> samples_;
    std::size_t next_ = 0;
    std::uint64_t count_ = 0;
    double max_ = 0;
};

double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

}  // namespace

struct engine::impl {
    engine_options options;
    std::unique_ptr<store> st;
    // Told of every durable commit; subscriptions and commit waits hold it, and may outlive us.
    std::shared_ptr<detail::commit_watch> watch;

    mutable std::mutex m;
    std::condition_variable cv;
    std::deque<item> queue;     // accepted, in order
    std::deque<item> waiting;   // submitted past max_in_flight, in order
    std::size_t in_flight = 0;  // accepted applies not yet completed
    bool started = false;
    bool stopping = false;      // no submission is accepted any more
    std::error_code failure;    // sticky: the environment could not be recovered

    // Writer-thread state.
    clock::time_point last_commit_at{};  // when the last batch was committed (periodic pacing)
    bool done = false;

    std::unique_ptr<health_monitor> health;  // the writer reports each batch to it

    // Statistics, under m.
    engine_stats counters;
    sample_window batch_sizes;
    sample_window commit_times;
    sample_window ack_times;
    sample_window prune_times;

    // Prepared deliveries the writer is done with, kept for the next submissions: each holds
    // one parsed item whose strings and vectors keep their capacity, so preparing a delivery
    // into it allocates little, and nothing is freed on a thread other than the one that
    // allocated it (a submitter's item comes back to a submitter). Under pool_m.
    std::mutex pool_m;
    std::vector<prepared_batch> spare;
    prepared_batch bodies;  // writer-only: the batch being applied, its capacity kept

    std::thread writer;

    prepared_batch take_spare();
    void give_back(std::vector<pending_apply>& batch);

    void run();
    bool prune();  // one step; returns whether more has expired
    void commit(std::vector<pending_apply>& batch);
    void release(std::vector<std::pair<pending_apply, outcome>>& ready, std::error_code ec);
    void finish_marker(pending_marker& marker);
    void enqueue(pending_marker marker);  // a flush, stop or task, behind what was submitted
    void admit();  // under m
};

namespace {

// The completions of one batch that share an executor: one post runs them all, in order, so
// a batch of 256 costs the writer one post (one allocation, one lock of the executor's
// queue, at most one wake-up) per executor instead of one per delivery.
struct completion {
    apply_handler handler;
    std::error_code ec;
    outcome o;
};

// Move-only, so that Asio does not take the handler for a copyable one (a vector of
// move-only elements claims to be copyable).
struct completion_group {
    std::vector<completion> items;
    completion_group() = default;
    completion_group(completion_group&&) noexcept = default;
    completion_group& operator=(completion_group&&) noexcept = default;
    completion_group(const completion_group&) = delete;
    completion_group& operator=(const completion_group&) = delete;
};

void post_group(engine::executor_type ex, completion_group group) {
    auto target = ex;
    boost::asio::post(target, [ex = std::move(ex), group = std::move(group)]() mutable {
        // A handler that throws does not stop the ones after it: they run now, in order (a
        // flush's completion, posted after them, must not overtake them), and then the
        // exception leaves run() as it would have from a post of its own; a second one is
        // rethrown from a post of its own.
        std::vector<std::exception_ptr> thrown;
        for (auto& c : group.items) {
            try {
                std::move(c.handler)(c.ec, std::move(c.o));
            } catch (...) {
                thrown.push_back(std::current_exception());
            }
        }
        if (thrown.empty()) return;
        for (std::size_t i = 1; i < thrown.size(); ++i) {
            boost::asio::post(ex, [e = thrown[i]] { std::rethrow_exception(e); });
        }
        std::rethrow_exception(thrown.front());
    });
}

// One completion on its own (a submission refused before it reached the writer).
void post_apply(pending_apply& p, std::error_code ec, outcome o) {
    completion_group group;
    group.items.push_back(completion{std::move(p.handler), ec, std::move(o)});
    post_group(std::move(p.ex), std::move(group));
}

void post_marker(pending_marker& p, std::error_code ec) {
    if (!p.handler) return;
    auto ex = std::move(p.ex);
    boost::asio::post(ex, [h = std::move(*p.handler), ec]() mutable { std::move(h)(ec); });
}

}  // namespace

engine::engine(executor_type ex, engine_options options) : executor_(std::move(ex)), impl_(std::make_unique<impl>()) {
    if (options.max_batch == 0 || options.max_in_flight == 0) {
        throw_error(errc::invalid_argument, "engine options: max_batch and max_in_flight must be positive");
    }
    impl_->options = std::move(options);
    impl_->st = std::make_unique<store>(impl_->options.store);
    impl_->health = std::make_unique<health_monitor>(impl_->options.stall_after);
    impl_->counters.commit_histogram = latency_histogram();
    impl_->counters.ack_histogram = latency_histogram();
    // What an earlier run committed is on disk: a subscription may read it at once.
    impl_->watch = std::make_shared<detail::commit_watch>(*impl_->st, impl_->st->read().commit());
    impl_->writer = std::thread([this] { impl_->run(); });
}

engine::~engine() {
    {
        std::scoped_lock lock{impl_->m};
        if (!impl_->stopping) {
            impl_->stopping = true;
            pending_marker stop{std::nullopt, executor_, true};
            (impl_->waiting.empty() ? impl_->queue : impl_->waiting).emplace_back(std::move(stop));
        }
        impl_->cv.notify_all();
    }
    impl_->writer.join();
    // Subscriptions may outlive the engine: none reads the store once this returns.
    impl_->watch->shutdown();
}

void engine::add_projections(const std::function<void(store&)>& add) {
    {
        std::scoped_lock lock{impl_->m};
        if (impl_->started) {
            throw_error(errc::invalid_argument, "projections are added before the first submission");
        }
    }
    // Not under m: opening tables takes the environment's locks, which a thread holding a
    // snapshot owns while it may call stats() or submit (the opposite order).
    add(*impl_->st);
}

void engine::submit(delivery d, apply_handler handler, executor_type ex, std::optional<checkpoint> at) {
    auto submitted = clock::now();
    // Parsing, payload decoding and key functions run here, on the submitter's thread, so
    // the writer's time per delivery is only what needs its transaction.
    pending_apply p{impl_->take_spare(), std::move(handler), std::move(ex), submitted, std::move(at), d.body.size()};
    try {
        impl_->st->prepare(std::span<const delivery>(&d, 1), p.body);
    } catch (const std::bad_alloc&) {
        post_apply(p, std::make_error_code(std::errc::not_enough_memory), outcome{});
        return;
    } catch (...) {
        // A key function that threw something other than a std::exception (those are dead letters).
        post_apply(p, make_error_code(errc::invalid_argument), outcome{});
        return;
    }
    std::unique_lock lock{impl_->m};
    impl_->started = true;
    if (impl_->stopping) {
        lock.unlock();
        post_apply(p, aborted(), outcome{});
        return;
    }
    if (impl_->waiting.empty() && impl_->in_flight < impl_->options.max_in_flight) {
        ++impl_->in_flight;
        impl_->queue.emplace_back(std::move(p));
        impl_->cv.notify_one();
    } else {
        // Backpressure: held here, not in the writer's queue, until completions make room.
        impl_->waiting.emplace_back(std::move(p));
    }
}

void engine::operate(std::function<void(store&)> task, marker_handler handler, executor_type ex) {
    impl_->enqueue(pending_marker{std::move(handler), std::move(ex), false, std::move(task)});
}

void engine::flush(marker_handler handler, executor_type ex, bool stop) {
    impl_->enqueue(pending_marker{std::move(handler), std::move(ex), stop});
}

void engine::impl::enqueue(pending_marker marker) {
    std::unique_lock lock{m};
    started = true;
    if (stopping) {
        lock.unlock();
        post_marker(marker, aborted());
        return;
    }
    if (marker.stop) stopping = true;
    (waiting.empty() ? queue : waiting).emplace_back(std::move(marker));
    cv.notify_one();
}

prepared_batch engine::impl::take_spare() {
    std::scoped_lock lock{pool_m};
    if (spare.empty()) return prepared_batch{};
    auto b = std::move(spare.back());
    spare.pop_back();
    return b;
}

void engine::impl::give_back(std::vector<pending_apply>& batch) {
    // At most as many as may be in flight at once: the pool never outgrows the engine's window.
    std::scoped_lock lock{pool_m};
    for (auto& p : batch) {
        if (spare.size() >= options.max_in_flight) break;
        // A prepared item keeps the capacity of the largest delivery it held: one that held a
        // large one is freed rather than kept idle in the pool (storage/reused_buffer.hpp's bound).
        if (p.bytes <= reused_capacity_max) spare.push_back(std::move(p.body));
    }
}

void engine::impl::admit() {
    while (!waiting.empty()) {
        if (auto* p = std::get_if<pending_apply>(&waiting.front())) {
            if (in_flight >= options.max_in_flight) return;
            ++in_flight;
            (void)p;
        }
        queue.push_back(std::move(waiting.front()));
        waiting.pop_front();
    }
}

void engine::impl::run() {
    std::vector<pending_apply> batch;
    bool busy = false;  // the last pass found work without waiting for it
    // Pruning runs on this thread, which owns the write transactions: a deadline in its own
    // wait, not a timer on the embedder's executor (that would keep io_context::run() busy).
    const bool pruning = options.store.retention.inbox_retention || options.store.retention.allowed_lateness;
    auto next_prune = clock::now() + options.prune_interval;
    bool prune_more = false;
    while (!done) {
        std::optional<pending_marker> marker;
        {
            std::unique_lock lock{m};
            auto has_work = [&] { return !queue.empty(); };
            auto full = [&] { return queue.size() >= options.max_batch; };
            if (!has_work()) {
                busy = false;
                if (!pruning) {
                    cv.wait(lock, has_work);
                } else if (!prune_more) {
                    cv.wait_until(lock, next_prune, has_work);
                }
            }
            if (options.store.sync == durability::periodic) {
                // At most one commit (one fsync) per interval: what arrives meanwhile joins it.
                cv.wait_until(lock, last_commit_at + options.sync_interval, full);
            } else if (busy && options.max_delay.count() > 0 && !full()) {
                // Under load, linger briefly to fill the batch; an idle writer never waits.
                cv.wait_for(lock, options.max_delay, full);
            }
            while (!queue.empty() && batch.size() < options.max_batch) {
                if (auto* next = std::get_if<pending_marker>(&queue.front())) {
                    if (batch.empty()) {
                        marker = std::move(*next);
                        queue.pop_front();
                    }
                    break;
                }
                batch.push_back(std::move(std::get<pending_apply>(queue.front())));
                queue.pop_front();
            }
            busy = true;
        }
        if (!batch.empty()) {
            commit(batch);
            batch.clear();
        } else if (marker) {
            finish_marker(*marker);
        }
        bool idle = false;
        if (pruning) {
            std::scoped_lock lock{m};
            idle = queue.empty();
        }
        // Under load every batch removes expired entries in its own transaction; a separate
        // step (its own commit) runs only when no batch is waiting, so it delays none for long.
        if (pruning && idle && !done && (prune_more || clock::now() >= next_prune)) {
            prune_more = prune();  // one bounded step
            if (!prune_more) next_prune = clock::now() + options.prune_interval;
        }
    }
}

bool engine::impl::prune() {
    auto started_at = clock::now();
    try {
        auto r = st->prune(options.prune_step);
        std::scoped_lock lock{m};
        counters.pruned_ids += r.ids;
        counters.pruned_contributors += r.contributors;
        if (r.ids + r.contributors > 0) prune_times.add(seconds_since(started_at));
        return r.more;
    } catch (const std::exception&) {
        // A failed step removed nothing (its transaction aborted); the next interval retries.
        std::scoped_lock lock{m};
        ++counters.prune_failures;
        return false;
    }
}

void engine::impl::commit(std::vector<pending_apply>& batch) {
    auto started_at = clock::now();
    health->batch_began(batch.size());
    bodies.clear();
    bodies.reserve(batch.size());
    std::vector<checkpoint> positions;  // one per source
    for (auto& p : batch) {
        bodies.append(std::move(p.body));
        if (!p.at) continue;
        auto same = std::find_if(positions.begin(), positions.end(),
                                 [&](const checkpoint& c) { return c.source == p.at->source; });
        if (same == positions.end()) {
            positions.push_back(*p.at);
        } else if (!p.at->keep_highest || p.at->detail != same->detail || p.at->position >= same->position) {
            *same = *p.at;
        }
    }

    std::vector<outcome> outcomes;
    std::error_code ec;
    {
        std::scoped_lock lock{m};
        ec = failure;
    }
    if (!ec) {
        try {
            outcomes = st->apply(bodies, std::span<const checkpoint>(positions));
        } catch (const std::system_error& e) {
            ec = e.code();
        } catch (const std::exception&) {
            ec = make_error_code(errc::storage_failed);
        }
    }
    bool fatal = ec && ec == errc::panic;
    if (ec && !fatal && ec != errc::map_full) {
        // A failed meta-page write leaves LMDB's environment fatal while the commit reports
        // EIO or ENOSPC: probe with a read, so the environment is reopened now and not after
        // one more batch fails (and reads fail meanwhile).
        try {
            (void)st->read();
        } catch (const std::system_error& e) {
            fatal = e.code() == errc::panic;
        }
    }
    if (fatal) {
        // The environment is unusable: reopen it and rebuild every index from disk, so that a
        // commit whose outcome is unknown is judged by what is on disk when it is redelivered.
        try {
            st->reopen();
        } catch (const std::system_error& e) {
            std::scoped_lock lock{m};
            failure = e.code();
        }
    }

    for (std::size_t i = 0; i < batch.size(); ++i) {  // each item goes back to its holder, for the pool
        batch[i].body.clear();
        batch[i].body.take(bodies, i);
    }
    bodies.clear();
    give_back(batch);
    std::vector<std::pair<pending_apply, outcome>> ready;
    ready.reserve(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
        ready.emplace_back(std::move(batch[i]), ec ? outcome{} : std::move(outcomes[i]));
    }
    last_commit_at = clock::now();
    if (!ec) {
        // With full and periodic durability the commit returned after LMDB's fsync.
        std::scoped_lock lock{m};
        ++counters.batches;
        if (options.store.sync != durability::none) ++counters.syncs;
        counters.last_commit = ready.front().second.commit;
        counters.durable_commit = counters.last_commit;
        batch_sizes.add(static_cast<double>(ready.size()));
        const double took = seconds_since(started_at);
        commit_times.add(took);
        counters.commit_histogram.add(took);
    }
    health->batch_ended(!ec, ec ? 0 : ready.front().second.commit);
    // Subscribers and commit waits learn of it now; they read the feed on their own executors.
    if (!ec) watch->advance(ready.front().second.commit);
    // On failure none of the batch was applied: every delivery gets the error.
    release(ready, ec);
}

void engine::impl::release(std::vector<std::pair<pending_apply, outcome>>& ready, std::error_code ec) {
    {
        std::scoped_lock lock{m};
        for (auto& [p, o] : ready) {
            if (ec) {
                ++counters.failed;
            } else {
                ++counters.outcomes[static_cast<std::size_t>(o.kind)];
            }
            const double waited = seconds_since(p.submitted);
            ack_times.add(waited);
            counters.ack_histogram.add(waited);
        }
        in_flight -= ready.size();
        admit();
        counters.in_flight = in_flight;
        counters.waiting = waiting.size();
        if (!queue.empty()) cv.notify_one();
    }
    // Consecutive completions on one executor go in one post (a batch's are usually all on
    // the embedder's executor); order per executor is kept.
    completion_group group;
    std::optional<engine::executor_type> group_ex;
    for (auto& [p, o] : ready) {
        if (group_ex && !(p.ex == *group_ex)) {
            post_group(std::move(*group_ex), std::move(group));
            group = {};
            group_ex.reset();
        }
        if (!group_ex) {
            group_ex = std::move(p.ex);
            group.items.reserve(ready.size());
        }
        group.items.push_back(completion{std::move(p.handler), ec, std::move(o)});
    }
    if (group_ex) post_group(std::move(*group_ex), std::move(group));
}

void engine::impl::finish_marker(pending_marker& marker) {
    // Everything before the marker was committed (and, unless durability is none, synced).
    if (options.store.sync == durability::none && marker.stop) {
        try {
            detail::store_env(*st)->sync(true);  // not promised, but cheap at the end
        } catch (const std::system_error&) {
        }
    }
    std::error_code ec;
    {
        std::scoped_lock lock{m};
        ec = failure;
        if (marker.stop) done = true;
    }
    if (!ec && marker.task) {
        try {
            marker.task(*st);
        } catch (const std::system_error& e) {
            ec = e.code();
        } catch (const std::exception&) {
            ec = make_error_code(errc::storage_failed);
        }
        // A commit the task made is durable as a batch's is: readers and subscriptions learn of it.
        try {
            const auto commit = st->last_commit();
            {
                std::scoped_lock lock{m};
                counters.last_commit = counters.durable_commit = std::max(counters.durable_commit, commit);
            }
            watch->advance(commit);
        } catch (const std::system_error&) {
        }
    }
    if (marker.stop) watch->stop();  // outstanding subscriptions and commit waits end now
    post_marker(marker, ec);
}

void engine::wait_commit(std::uint64_t commit, marker_handler handler, executor_type ex) {
    impl_->watch->wait_commit(commit, std::move(handler), std::move(ex));
}

subscription engine::subscribe(change_position after, std::size_t limit) {
    return subscription(detail::new_subscription(impl_->watch, after, limit), executor_);
}

subscription engine::subscribe(std::uint64_t after_commit, std::size_t limit) {
    return subscribe(change_position{after_commit, UINT32_MAX}, limit);
}

snapshot engine::read() const { return impl_->st->read(); }

const engine_options& engine::options() const noexcept { return impl_->options; }

std::uint64_t engine::durable_commit() const {
    std::scoped_lock lock{impl_->m};
    return impl_->counters.durable_commit;
}

snapshot engine::read(std::uint64_t at_least) const {
    auto s = impl_->st->read();
    if (s.commit() < at_least) {
        throw_error(errc::invalid_argument, "commit " + std::to_string(at_least) + " is not in '" +
                                                impl_->options.store.path.string() + "' (it is at " +
                                                std::to_string(s.commit()) + ")");
    }
    return s;
}

engine_stats engine::stats() const {
    std::scoped_lock lock{impl_->m};
    auto s = impl_->counters;
    s.queue_depth = impl_->queue.size();
    s.waiting = impl_->waiting.size();
    s.in_flight = impl_->in_flight;
    s.batch_size = impl_->batch_sizes.summary();
    s.commit_seconds = impl_->commit_times.summary();
    s.ack_seconds = impl_->ack_times.summary();
    s.prune_seconds = impl_->prune_times.summary();
    return s;
}

health_report engine::health() const {
    std::size_t queued = 0;
    std::optional<clock::time_point> oldest;
    {
        std::scoped_lock lock{impl_->m};
        for (const auto* items : {&impl_->queue, &impl_->waiting}) {  // in submission order
            for (const auto& i : *items) {
                if (const auto* p = std::get_if<pending_apply>(&i)) {
                    if (!oldest) oldest = p->submitted;
                    ++queued;
                }
            }
        }
    }
    impl_->health->queued(queued, oldest);
    return impl_->health->report(read(), impl_->options.store.consumer);
}

health_monitor& engine::monitor() noexcept { return *impl_->health; }

}  // namespace idem
