#pragma once

// The run over event logs that consume and rebuild share. Two stages on two threads: a reader
// thread reads records (read_logs.cpp: checkpoints, rotation, truncation, following) and
// prepares each batch (store::prepare: parsing, decoding, key functions); the calling thread
// applies the prepared batches in order (log_run.cpp), each with its log position as the
// checkpoint. At most two prepared batches wait between them.

#include <idem/sources/log_source.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace idem::detail {

/// Returns the size of the file at p, or 0 if it cannot be read.
std::uint64_t file_size_or_zero(const std::filesystem::path& p);

/// Reads the logs in order and applies them in batches, each with its log position as checkpoint.
class log_run {
public:
    log_run(store& s, const log_run_options& o);

    /// resume: start each log at the consumer's checkpoint, and leave an incomplete last
    /// record for a later run (a live log may be mid-append) instead of applying it.
    log_run_result run(bool resume, bool follow, std::chrono::milliseconds poll, const std::atomic<bool>* stop);

    /// Reads a log that changed under its checkpoint again from offset 0 instead of failing.
    void restart_changed_logs(bool yes) { restart_changed_logs_ = yes; }

    /// Following, finishes a rotated file only once it has not grown for this long.
    void rotation_grace(std::chrono::milliseconds grace) { rotation_grace_ = grace; }

private:
    using clock = std::chrono::steady_clock;

    struct pending {
        prepared_batch batch;
        checkpoint at;
        std::uint64_t records = 0;  // records read so far, including this batch
        std::uint64_t bytes = 0;    // bytes read so far, including this batch
        bool finishes_file = false; // ends a rotated file: the next batch starts the log's new file
    };

    bool stopping() const { return (stop_ != nullptr && stop_->load()) || abandoned_.load(); }

    // The reader thread (read_logs.cpp).
    void read_logs(bool resume, bool follow);
    void read_log(const std::filesystem::path& path, bool resume, bool follow);
    void refuse_unless_restarting(const std::string& detail, const std::string& restart) const;
    void refuse_unless_restarting(const std::string& detail) const;
    bool wait_for(const std::filesystem::path& path, bool follow);
    bool read_file(const std::string& source, const std::filesystem::path& path, const std::filesystem::path& file,
                   log_position start, bool follow);
    void note_done(const log_reader& reader, const std::filesystem::path& file, bool left_behind);
    bool hand_over(const std::string& source, const log_position& position, bool finished);

    // The applying thread (log_run.cpp).
    void apply_loop();
    void report();
    void note_pause();  // records a pause or resume of options_.health in the audit

    // Paused (options_.health, idem pause): the reader waits at a batch boundary.
    bool paused() const { return options_.health && options_.health->pause_reason(); }
    std::optional<std::string> noted_pause_;  // applying thread: the pause the audit last recorded

    store& store_;
    const log_run_options& options_;
    const std::atomic<bool>* stop_ = nullptr;
    bool restart_changed_logs_ = false;
    std::chrono::milliseconds rotation_grace_{0};
    std::chrono::milliseconds poll_{100};
    clock::time_point started_ = clock::now();

    // Reader thread only.
    std::uint64_t until_ = UINT64_MAX;  // the log being read is read up to this offset (verify's prefix builds)
    std::vector<delivery> batch_;
    std::size_t used_ = 0;
    std::uint64_t records_read_ = 0;
    std::uint64_t bytes_read_ = 0;

    // Shared, under mutex_.
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<pending> queue_;
    std::vector<prepared_batch> recycled_;
    bool reading_done_ = false;
    std::atomic<bool> abandoned_{false};  // the applier failed: the reader stops (also read without mutex_)
    std::exception_ptr failure_;

    // Applying thread (and the reader's skipped/torn under mutex_; read after join).
    log_progress progress_;
    log_run_result result_;
};

}  // namespace idem::detail
