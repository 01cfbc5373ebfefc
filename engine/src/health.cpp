#include <idem/engine/health.hpp>

#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <tuple>

namespace idem {

namespace {

using clock = health_monitor::clock;

double seconds_between(clock::time_point from, clock::time_point to) {
    return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

std::string whole_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f s", s);
    return buf;
}

void number(std::string& out, const char* key, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ",\"%s\":%.3f", key, v);
    out += buf;
}

void number(std::string& out, const char* key, std::uint64_t v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, ",\"%s\":%" PRIu64, key, v);
    out += buf;
}

}  // namespace

std::string_view to_string(health_state s) {
    switch (s) {
        case health_state::idle: return "idle";
        case health_state::running: return "running";
        case health_state::stalled: return "stalled";
        case health_state::paused: return "paused";
    }
    return "unknown";
}

std::string to_json(const health_report& r) {
    std::string out = "{\"state\":";
    append_json_string(out, to_string(r.state));
    out += ",\"reason\":";
    append_json_string(out, r.reason);
    number(out, "last_commit", r.last_commit);
    number(out, "seconds_since_commit", r.seconds_since_commit);
    out += ",\"last_commit_unix_ns\":" + std::to_string(r.last_commit_unix_ns);
    number(out, "queued", r.queued);
    number(out, "oldest_queued_seconds", r.oldest_queued_seconds);
    number(out, "lag_events", r.lag_events);
    number(out, "lag_bytes", r.lag_bytes);
    number(out, "lag_seconds", r.lag_seconds);
    number(out, "event_time_ns", r.event_time_ns);
    number(out, "parked_streams", r.parked_streams);
    number(out, "oldest_gap_seconds", r.oldest_gap_seconds);
    out += ",\"oldest_gap_stream\":";
    append_json_string(out, r.oldest_gap_stream);
    number(out, "failing_sources", r.failing_sources);
    out += '}';
    return out;
}

health_monitor::health_monitor(std::chrono::milliseconds stall_after) : stall_after_(stall_after) {}

void health_monitor::batch_began(std::size_t n) {
    std::scoped_lock lock{m_};
    batch_since_ = clock::now();
    batch_size_ = n;
}

void health_monitor::batch_ended(bool committed, std::uint64_t commit) {
    std::scoped_lock lock{m_};
    batch_since_.reset();
    if (!committed) return;
    last_commit_at_ = clock::now();
    last_commit_unix_ns_ = static_cast<std::int64_t>(wall_clock_ns());
    last_commit_ = commit;
}

void health_monitor::queued(std::size_t n, std::optional<clock::time_point> oldest) {
    std::scoped_lock lock{m_};
    queued_ = n;
    oldest_queued_ = n == 0 ? std::nullopt : oldest;
}

void health_monitor::source(std::string_view name, std::uint64_t pending, std::string_view unit,
                            std::string_view error) {
    const auto now = clock::now();
    std::scoped_lock lock{m_};
    auto it = sources_.find(name);
    if (it == sources_.end()) it = sources_.emplace(std::string(name), source_state{}).first;
    auto& s = it->second;
    // Waiting counts from when input appeared, and again from each report that shows progress.
    if (pending != 0 && (s.pending == 0 || pending < s.pending)) s.waiting_since = now;
    s.pending = pending;
    s.unit = unit;
    if (!error.empty() && s.error.empty()) s.failing_since = now;
    s.error = error;
}

void health_monitor::paused(std::optional<std::string> reason) {
    std::scoped_lock lock{m_};
    if (reason != paused_) pause_taken_ = false;
    paused_ = std::move(reason);
}

void health_monitor::pauses_at_boundaries() {
    std::scoped_lock lock{m_};
    awaits_pause_ = true;
}

void health_monitor::pause_taken() {
    std::scoped_lock lock{m_};
    if (paused_) pause_taken_ = true;
}

namespace {

std::pair<std::uint64_t, std::vector<parked_stream>> store_facts(const snapshot& s, const std::string& consumer) {
    const auto view = s.consumer(consumer);
    std::vector<parked_stream> parked;
    if (view.parked() != 0) parked = view.parked_streams();
    return {view.retention().event_time, std::move(parked)};
}

}  // namespace

std::optional<std::string> health_monitor::pause_reason() const {
    std::scoped_lock lock{m_};
    return paused_;
}

health_report health_monitor::report(const snapshot& s, const std::string& consumer) const {
    const auto [event_time, parked] = store_facts(s, consumer);
    return judge(event_time, parked);
}

void health_monitor::reader(std::function<snapshot()> read, std::string consumer) {
    std::scoped_lock lock{reader_m_};
    read_ = std::move(read);
    consumer_ = std::move(consumer);
}

health_report health_monitor::report() const {
    std::uint64_t event_time = 0;
    std::vector<parked_stream> parked;
    {
        std::scoped_lock lock{reader_m_};
        if (read_) std::tie(event_time, parked) = store_facts(read_(), consumer_);
    }
    return judge(event_time, parked);
}

health_report health_monitor::judge(std::uint64_t event_time, const std::vector<parked_stream>& parked) const {
    const auto now = clock::now();
    const auto wall_ns = static_cast<std::int64_t>(wall_clock_ns());
    std::scoped_lock lock{m_};
    health_report r;
    r.event_time_ns = event_time;
    r.last_commit = last_commit_;
    r.last_commit_unix_ns = last_commit_unix_ns_;
    if (last_commit_at_) r.seconds_since_commit = seconds_between(*last_commit_at_, now);
    r.queued = queued_ + (batch_since_ ? batch_size_ : 0);
    if (batch_since_ || oldest_queued_) {
        auto oldest = batch_since_.value_or(now);
        if (oldest_queued_) oldest = std::min(oldest, *oldest_queued_);
        r.oldest_queued_seconds = seconds_between(oldest, now);
    }
    for (const auto& [name, src] : sources_) {
        (src.unit == "bytes" ? r.lag_bytes : r.lag_events) += src.pending;
        if (!src.error.empty()) ++r.failing_sources;
    }
    const bool waiting = r.queued != 0 || r.lag_events != 0 || r.lag_bytes != 0;
    if (waiting && event_time != 0 && wall_ns > static_cast<std::int64_t>(event_time)) {
        r.lag_seconds = static_cast<double>(wall_ns - static_cast<std::int64_t>(event_time)) / 1e9;
    }

    // Gaps: aged from when this process first saw the stream parked (an inbox stamp may be on
    // the event-time clock, which says nothing of how long the gap has waited here).
    r.parked_streams = parked.size();
    std::erase_if(gaps_seen_, [&](const auto& seen) {
        return std::none_of(parked.begin(), parked.end(), [&](const parked_stream& p) { return p.subject == seen.first; });
    });
    for (const auto& p : parked) {
        auto seen = gaps_seen_.try_emplace(p.subject, now).first->second;
        const double age = seconds_between(seen, now);
        if (age >= r.oldest_gap_seconds) {
            r.oldest_gap_seconds = age;
            r.oldest_gap_stream = p.subject;
        }
    }

    // The verdict: the first reason found, in this order.
    const double limit = std::chrono::duration<double>(stall_after_).count();
    const auto progress_since = [&](clock::time_point t) {
        return last_commit_at_ ? std::max(t, *last_commit_at_) : std::max(t, started_);
    };
    auto stalled = [&](std::string why) {
        r.state = health_state::stalled;
        r.reason = std::move(why);
        return r;
    };
    if (paused_ && (!awaits_pause_ || pause_taken_)) {
        r.state = health_state::paused;
        r.reason = "paused by an operator: " + *paused_;
        return r;
    }
    if (batch_since_ && seconds_between(*batch_since_, now) > limit) {
        return stalled("the writer has been applying one batch of " + std::to_string(batch_size_) + " deliveries for " +
                       whole_seconds(seconds_between(*batch_since_, now)) +
                       " (a handler that does not return, or a disk that does not answer)");
    }
    if (oldest_queued_ && seconds_between(progress_since(*oldest_queued_), now) > limit) {
        return stalled(std::to_string(queued_) + " deliveries have waited " +
                       whole_seconds(seconds_between(*oldest_queued_, now)) + " for the writer, and nothing was committed for " +
                       whole_seconds(seconds_between(progress_since(*oldest_queued_), now)));
    }
    for (const auto& [name, src] : sources_) {
        if (!src.error.empty() && seconds_between(src.failing_since, now) > limit) {
            return stalled("source " + name + " has failed for " + whole_seconds(seconds_between(src.failing_since, now)) +
                           ": " + src.error);
        }
    }
    for (const auto& [name, src] : sources_) {
        if (src.pending != 0 && seconds_between(progress_since(src.waiting_since), now) > limit) {
            return stalled("source " + name + " has " + std::to_string(src.pending) + " " + src.unit +
                           " waiting, and nothing was applied for " +
                           whole_seconds(seconds_between(progress_since(src.waiting_since), now)));
        }
    }
    if (!parked.empty() && r.oldest_gap_seconds > limit) {
        for (const auto& p : parked) {
            if (p.subject != r.oldest_gap_stream) continue;
            std::string missing;
            if (!p.missing.empty()) missing = ", waiting for sequence " + std::to_string(p.missing.front().from);
            return stalled("stream " + p.subject + " has had events parked behind a gap for " +
                           whole_seconds(r.oldest_gap_seconds) + missing +
                           " (idem release gives up on the gap: docs/OPERATIONS.md)");
        }
    }
    r.state = waiting ? health_state::running : health_state::idle;
    return r;
}

}  // namespace idem
