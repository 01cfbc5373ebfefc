// engine::prometheus(): the engine's counters, latencies and health in the Prometheus text
// exposition format (units in names, _total counters, histograms for latencies).

#include <idem/engine/engine.hpp>

#include <sys/statvfs.h>

#include <algorithm>
#include <charconv>
#include <string>
#include <type_traits>
#include <sstream>

namespace idem {

namespace {

// A sample value: integers as they are, doubles in the shortest form that reads back the same
// (a stream's default 6 digits would print a Unix time as 1.79669e+09, ~1000 s off).
template <class T>
std::string num(T v) {
    if constexpr (std::is_floating_point_v<T>) {
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, static_cast<double>(v));
        return std::string(buf, r.ptr);
    } else {
        return std::to_string(v);
    }
}

}  // namespace

void histogram::add(double v) {
    const auto at = std::lower_bound(bounds.begin(), bounds.end(), v);
    ++counts[static_cast<std::size_t>(at - bounds.begin())];
    sum += v;
    ++count;
}

histogram latency_histogram() {
    histogram h;
    h.bounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    h.counts.assign(h.bounds.size() + 1, 0);
    return h;
}

std::string engine::prometheus() const {
    const auto s = stats();
    const auto h = health();
    const auto& o = options();
    const auto& consumer = o.store.consumer;
    std::ostringstream out;
    auto label = [&](std::string extra = {}) {
        std::string l = "{consumer=\"" + consumer + "\"";
        if (!extra.empty()) l += "," + extra;
        return l + "}";
    };
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
            << name << label() << ' ' << num(value) << '\n';
    };
    out << "# HELP idem_deliveries_total Deliveries completed, by outcome.\n"
        << "# TYPE idem_deliveries_total counter\n";
    for (std::size_t k = 0; k < outcome_kinds; ++k) {
        out << "idem_deliveries_total"
            << label("outcome=\"" + std::string(to_string(static_cast<outcome_kind>(k))) + "\"") << ' '
            << s.outcomes[k] << '\n';
    }
    out << "idem_deliveries_total" << label("outcome=\"error\"") << ' ' << s.failed << '\n';
    metric("idem_batches_total", "counter", "Batches committed.", s.batches);
    metric("idem_syncs_total", "counter", "Commits synced to disk.", s.syncs);
    metric("idem_last_commit", "gauge", "Commit number of the last committed batch.", s.last_commit);
    metric("idem_queue_depth", "gauge", "Deliveries accepted and waiting for the writer.", s.queue_depth);
    metric("idem_in_flight", "gauge", "Deliveries accepted and not yet completed.", s.in_flight);
    metric("idem_waiting", "gauge", "Deliveries held back by the in-flight limit.", s.waiting);
    auto summary = [&](const char* name, const char* help, const distribution& d) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " summary\n";
        out << name << label("quantile=\"0.5\"") << ' ' << num(d.p50) << '\n';
        out << name << label("quantile=\"0.99\"") << ' ' << num(d.p99) << '\n';
        out << name << "_count" << label() << ' ' << d.count << '\n';
    };
    auto buckets = [&](const char* name, const char* help, const histogram& hist) {
        out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
        std::uint64_t cumulative = 0;
        for (std::size_t i = 0; i < hist.bounds.size(); ++i) {
            cumulative += hist.counts[i];
            out << name << "_bucket" << label("le=\"" + num(hist.bounds[i]) + "\"") << ' ' << cumulative << '\n';
        }
        out << name << "_bucket" << label("le=\"+Inf\"") << ' ' << hist.count << '\n';
        out << name << "_sum" << label() << ' ' << num(hist.sum) << '\n';
        out << name << "_count" << label() << ' ' << hist.count << '\n';
    };
    summary("idem_batch_size", "Deliveries per committed batch (recent).", s.batch_size);
    summary("idem_commit_seconds", "Apply and commit time per batch (recent).", s.commit_seconds);
    summary("idem_ack_seconds", "Submission to completion per delivery (recent).", s.ack_seconds);
    buckets("idem_commit_duration_seconds", "Apply and commit (and sync) time per batch.", s.commit_histogram);
    buckets("idem_ack_duration_seconds", "Submission to durable completion per delivery.", s.ack_histogram);
    out << "# HELP idem_pruned_total Retention: entries pruned, by table.\n# TYPE idem_pruned_total counter\n"
        << "idem_pruned_total" << label("table=\"inbox\"") << ' ' << s.pruned_ids << '\n'
        << "idem_pruned_total" << label("table=\"contributors\"") << ' ' << s.pruned_contributors << '\n';
    summary("idem_prune_seconds", "Time per prune step (recent).", s.prune_seconds);

    // Health: the watchdog's verdict and the figures it judges.
    metric("idem_stalled", "gauge", "1 while the watchdog finds the consumer stalled (see idem stats for the reason).",
           h.state == health_state::stalled ? 1 : 0);
    metric("idem_paused", "gauge", "1 while an operator has paused the consumer.", h.state == health_state::paused ? 1 : 0);
    metric("idem_stall_threshold_seconds", "gauge", "The watchdog's threshold.",
           std::chrono::duration<double>(o.stall_after).count());
    metric("idem_last_commit_timestamp_seconds", "gauge", "Wall time of the last commit of this process (0: none yet).",
           static_cast<double>(h.last_commit_unix_ns) / 1e9);
    metric("idem_lag_seconds", "gauge", "Now minus the highest event time applied, while input waits (0: caught up).",
           h.lag_seconds);
    metric("idem_lag_events", "gauge", "Events the sources know are waiting.", h.lag_events);
    metric("idem_lag_bytes", "gauge", "Log bytes not yet read.", h.lag_bytes);
    metric("idem_oldest_queued_seconds", "gauge", "Age of the oldest delivery accepted and not yet committed.",
           h.oldest_queued_seconds);
    metric("idem_parked_streams", "gauge", "Streams holding events behind a sequence gap.", h.parked_streams);
    metric("idem_oldest_parked_gap_seconds", "gauge", "How long the oldest parked gap has waited.", h.oldest_gap_seconds);
    metric("idem_failing_sources", "gauge", "Sources whose last attempt failed.", h.failing_sources);

    // What the inbox keeps against how long sources redeliver, and the disk the store is on.
    const auto& r = o.store.retention;
    if (r.inbox_retention) {
        metric("idem_inbox_retention_seconds", "gauge", "How long message ids are kept.",
               std::chrono::duration<double>(*r.inbox_retention).count());
    }
    if (r.source) {
        metric("idem_redelivery_bound_seconds", "gauge", "How long the source may redeliver a message.",
               std::chrono::duration<double>(r.source->bound).count());
    }
    struct statvfs fs{};
    if (::statvfs(o.store.path.c_str(), &fs) == 0) {
        metric("idem_store_filesystem_avail_bytes", "gauge", "Bytes free to the store's writer on its filesystem.",
               static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize));
        metric("idem_store_filesystem_size_bytes", "gauge", "Size of the store's filesystem.",
               static_cast<double>(fs.f_blocks) * static_cast<double>(fs.f_frsize));
    }
    return out.str();
}

}  // namespace idem
