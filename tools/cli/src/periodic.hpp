#pragma once

// A thread that calls a function every interval, from construction until stop() or
// destruction: what the health file and the pause watch of a running consumer tick on.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace idem::cli::detail {

class periodic {
public:
    /// at_once: the first call right away, not after the first interval.
    periodic(std::chrono::milliseconds every, std::function<void()> fn, bool at_once = false)
        : thread_([this, every, fn = std::move(fn), at_once] {
              if (at_once) fn();
              std::unique_lock lock{m_};
              while (!cv_.wait_for(lock, every, [this] { return stop_; })) {
                  lock.unlock();
                  fn();
                  lock.lock();
              }
          }) {}
    ~periodic() { stop(); }
    periodic(const periodic&) = delete;
    periodic& operator=(const periodic&) = delete;

    /// Stops the thread and waits for it (a call in progress ends first).
    void stop() {
        {
            std::scoped_lock lock{m_};
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
    }

private:
    std::mutex m_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;  // last: it starts once the members it uses exist
};

}  // namespace idem::cli::detail
