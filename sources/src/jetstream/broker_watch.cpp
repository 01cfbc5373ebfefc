#include "broker_watch.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <thread>
#include <utility>

namespace idem::jetstream::detail {

broker_watch::broker_watch(std::chrono::milliseconds limit, std::string servers,
                           std::function<void(const broker_event&)> report, std::function<bool()> stopping)
    : limit_(limit), servers_(std::move(servers)), report_(std::move(report)), stopping_(std::move(stopping)) {}

void broker_watch::reachable() {
    backoff_ = std::chrono::milliseconds(250);
    if (!out_) return;
    out_ = false;
    if (report_) report_(broker_event{true, "", clock::now() - since_, limit_});
}

void broker_watch::unreachable(const std::string& why) {
    const auto now = clock::now();
    if (!out_) {
        out_ = true;
        since_ = now;
        ++outages_;
        if (report_) report_(broker_event{false, why, std::chrono::nanoseconds(0), limit_});
    }
    if (now - since_ > limit_) {
        throw_error(errc::broker_failed, "the broker at '" + servers_ + "' has been out of reach for " +
                                             format_duration(std::chrono::duration_cast<std::chrono::nanoseconds>(now - since_)) +
                                             ", longer than the outage limit of " + format_duration(limit_) +
                                             "; the last failure: " + why);
    }
}

bool broker_watch::pause() {
    const auto until = clock::now() + backoff_;
    backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(2000));
    while (clock::now() < until) {
        if (stopping_ && stopping_()) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return !(stopping_ && stopping_());
}

}  // namespace idem::jetstream::detail
