#pragma once

// Riding out a broker outage: a run that loses its broker (a restart, a reset or silent link,
// a cluster without a leader) reconnects and retries, says so once when the outage begins and
// once when it ends, and gives up with errc::broker_failed only when the broker has been out
// of reach for longer than the limit (source_options::broker_outage_limit). Start-up requests
// go through retry(), so a cluster that is still forming is waited for in the same way.

#include "connection.hpp"

#include <idem/sources/jetstream.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace idem::jetstream::detail {

/// Whether the broker answers, as one thread sees it. Not thread-safe: one thread calls it.
class broker_watch {
public:
    /// limit: how long an outage may last; servers: named in messages; report: told when an
    /// outage begins and ends (may be empty); stopping: a wait in retry() ends when it is true.
    broker_watch(std::chrono::milliseconds limit, std::string servers, std::function<void(const broker_event&)> report,
                 std::function<bool()> stopping);

    /// The broker answered: an outage in progress ends.
    void reachable();
    /// The broker did not answer (why): an outage begins or goes on. Throws
    /// std::system_error(errc::broker_failed) naming why once it has lasted longer than the limit.
    void unreachable(const std::string& why);
    /// Outages seen so far (each counted when it began).
    std::uint64_t outages() const noexcept { return outages_; }

    /// Returns f(), calling it again after a pause while it throws broker_unreachable, until the
    /// outage outlasts the limit (then throws as unreachable()) or stopping() (then rethrows).
    template <class F>
    auto retry(F&& f) -> decltype(f()) {
        for (;;) {
            try {
                auto r = f();
                reachable();
                return r;
            } catch (const broker_unreachable& e) {
                unreachable(e.what());
                if (!pause()) throw;
            }
        }
    }

private:
    // Sleeps before the next try (250 ms, doubling up to 2 s); false if stopping() meanwhile.
    bool pause();

    using clock = std::chrono::steady_clock;
    std::chrono::milliseconds limit_;
    std::string servers_;
    std::function<void(const broker_event&)> report_;
    std::function<bool()> stopping_;
    bool out_ = false;
    clock::time_point since_{};
    std::chrono::milliseconds backoff_{250};
    std::uint64_t outages_ = 0;
};

}  // namespace idem::jetstream::detail
