#include "log_run.hpp"

#include <idem/storage/crash_point.hpp>

#include <pthread.h>

#include <algorithm>
#include <span>
#include <thread>

namespace idem::detail {

std::uint64_t file_size_or_zero(const std::filesystem::path& p) {
    std::error_code ec;
    auto n = std::filesystem::file_size(p, ec);
    return ec ? 0 : n;
}

log_run::log_run(store& s, const log_run_options& o) : store_(s), options_(o) {
    batch_.resize(std::max<std::size_t>(o.batch, 1));
    for (const auto& log : o.logs) progress_.total_bytes += file_size_or_zero(log);
}

log_run_result log_run::run(bool resume, bool follow, std::chrono::milliseconds poll, const std::atomic<bool>* stop) {
    poll_ = poll;
    stop_ = stop;
    // The watchdog reads this store while the run lasts (and not after: the store may close).
    struct reading {
        health_monitor* h;
        ~reading() {
            if (h) h->reader({});
        }
    } reading_while_running{options_.health};
    if (options_.health) {
        options_.health->reader([this] { return store_.read(); }, options_.store.consumer);
        if (follow) options_.health->pauses_at_boundaries();
        noted_pause_ = options_.health->pause_reason();  // a run that starts paused records nothing
    }
    auto started = clock::now();
    std::thread reader([&] {
        ::pthread_setname_np(::pthread_self(), "idem-log-reader");
        try {
            read_logs(resume, follow);
        } catch (...) {
            std::lock_guard lock{mutex_};
            failure_ = std::current_exception();
        }
        std::lock_guard lock{mutex_};
        reading_done_ = true;
        changed_.notify_all();
    });
    try {
        apply_loop();
    } catch (...) {
        {
            std::lock_guard lock{mutex_};
            abandoned_ = true;
            queue_.clear();
            changed_.notify_all();
        }
        reader.join();
        throw;
    }
    reader.join();
    if (failure_) std::rethrow_exception(failure_);
    result_.elapsed = clock::now() - started;
    return std::move(result_);
}

/// Prepares the records read so far and queues them; false if the run was abandoned.
/// finished: the batch ends its file, which a rotation left behind (committed even if empty).
bool log_run::hand_over(const std::string& source, const log_position& position, bool finished) {
    if (used_ == 0 && !finished) return true;
    pending p;
    {
        std::lock_guard lock{mutex_};
        if (!recycled_.empty()) {
            p.batch = std::move(recycled_.back());
            recycled_.pop_back();
        }
    }
    store_.prepare(std::span<const delivery>(batch_.data(), used_), p.batch);
    p.at = checkpoint{source, position.offset, encode_log_position(position).substr(8)};
    p.finishes_file = finished;
    p.records = records_read_;
    p.bytes = bytes_read_;
    used_ = 0;
    std::unique_lock lock{mutex_};
    changed_.wait(lock, [&] { return queue_.size() < 2 || abandoned_; });
    if (abandoned_) return false;
    queue_.push_back(std::move(p));
    changed_.notify_all();
    return true;
}

void log_run::apply_loop() {
    for (;;) {
        pending p;
        {
            std::unique_lock lock{mutex_};
            // Woken now and then to record a pause or resume while nothing comes.
            while (!changed_.wait_for(lock, std::chrono::milliseconds(200),
                                      [&] { return !queue_.empty() || reading_done_; })) {
                lock.unlock();
                note_pause();
                lock.lock();
            }
            if (queue_.empty()) return;
            p = std::move(queue_.front());
            queue_.pop_front();
            changed_.notify_all();
        }
        if (options_.health) options_.health->batch_began(p.batch.size());
        std::vector<outcome> outcomes;
        try {
            outcomes = store_.apply(p.batch, p.at);  // expired entries leave inside each batch's transaction
        } catch (...) {
            if (options_.health) options_.health->batch_ended(false);
            throw;
        }
        if (options_.health) {
            // The commit each outcome names; a batch of no records (a rotated file's end) reads it.
            options_.health->batch_ended(true, outcomes.empty() ? store_.last_commit() : outcomes.front().commit);
        }
        if (p.finishes_file) crash_point("after_rotated_log");
        {
            std::lock_guard lock{mutex_};
            recycled_.push_back(std::move(p.batch));  // its strings' capacity serves the next batch
        }
        result_.records = p.records;
        progress_.records = p.records;
        progress_.bytes = p.bytes;
        report();
    }
}

void log_run::note_pause() {
    if (!options_.health) return;
    auto now = options_.health->pause_reason();
    if (now == noted_pause_) return;
    if (now) {
        store_.record_action("pause", *now, "paused: the log follower reads nothing more until resumed");
    } else {
        store_.record_action("resume", "", "resumed: the log follower reads on");
    }
    noted_pause_ = std::move(now);
}

void log_run::report() {
    if (!options_.progress) return;
    progress_.elapsed = clock::now() - started_;
    options_.progress(progress_);
}

}  // namespace idem::detail
