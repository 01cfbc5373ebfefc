#include "options.hpp"

#include <idem/storage/duration.hpp>

#include <cerrno>
#include <system_error>

namespace idem::cli::detail {

const option db_option{"db", "DIR", "the LMDB environment directory", true, false};
const option log_option{"log", "FILE", "an event log (JSON Lines or binary); repeat for several, read in order", true,
                        true};
const option format_option{"format", "jsonl|binary", "the logs' format (default: detected from each file)"};
const option skip_bad_option{"skip-bad", "", "skip corrupt records of binary logs and count them"};
const option batch_option{"batch", "N",
                          "events per batch at most (consume: per write transaction, default 25000; rebuild: "
                          "default 10000)"};
const option wait_option{"wait", "",
                         "if another process writes the store, wait until it is done (Ctrl-C gives up) instead "
                         "of refusing at once"};
const option inbox_retention_option{"inbox-retention", "D",
                                    "prune inbox ids older than D of event time as the run goes (7d, 1h, 90m)"};
const option lateness_option{"allowed-lateness", "D",
                             "prune effect keys older than the highest event time minus D; older unsequenced "
                             "events are dead-lettered as late_event"};
const option transport_option{"transport", "NAME",
                              "the transport the logs' msgids belong to (default: each log's file name without "
                              "rotation suffixes); a consume continuing a rebuild's inbox needs the same"};
const option future_skew_option{"max-future-skew", "D",
                                "with a horizon, events more than D ahead of the event time are dead-lettered as "
                                "future_event unless 3 agree (default 24h; 0 to switch off)"};
const option resend_option{"resend-within", "D",
                           "the logs re-send events under new ids and times up to D later: refuse an "
                           "--allowed-lateness shorter than that"};

const option change_retention_option{"change-retention", "D",
                                     "keep the change feed's entries for D of wall time (default 7d; 0: no age limit)"};
const option change_keep_option{"change-keep-commits", "N",
                                "keep only the change feed's entries of the last N commits (default: no count limit)"};
const option no_change_feed_option{"no-change-feed", "",
                                   "record no change feed entries (a store nobody follows: one write less per changed row)"};
const option stall_after_option{"stall-after", "D",
                                "declare the consumer stalled when work waits and nothing is committed, a source fails, "
                                "or a gap stays parked for longer than D (default 60s): idem stats and /readyz say why"};
const option gaps_option{"gaps", "park|apply|reject",
                         "an event whose sequence skips ahead of its subject's: park (default) holds it until the gap "
                         "fills; apply applies it now (earlier ones coming later are duplicates: what a stream of "
                         "`idem relay` needs, whose versions skip); reject dead-letters it as sequence_gap"};

std::optional<log_format> format_from(const arguments& a) {
    auto v = a.get("format");
    if (!v) return std::nullopt;
    if (*v == "jsonl") return log_format::jsonl;
    if (*v == "binary") return log_format::binary;
    throw usage_error("option '--format': '" + *v + "' is neither jsonl nor binary");
}

durability durability_from(const arguments& a) {
    auto v = a.get("durability").value_or("full");
    if (v == "full") return durability::full;
    if (v == "periodic") return durability::periodic;
    if (v == "none") return durability::none;
    throw usage_error("option '--durability': '" + v + "' is not full, periodic or none");
}

std::optional<std::chrono::nanoseconds> duration_option(const arguments& a, std::string_view name) {
    auto v = a.get(name);
    if (!v) return std::nullopt;
    auto d = parse_duration(*v);
    if (!d) throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not a duration (7d, 1h, 90m, 30s)");
    return d;
}

std::optional<std::chrono::nanoseconds> limit_option(const arguments& a, std::string_view name,
                                                     std::optional<std::chrono::nanoseconds> current) {
    if (a.get(name) == "0") return std::nullopt;  // "0 to switch off", as the helps say: no unit needed
    if (auto d = duration_option(a, name)) return d->count() > 0 ? d : std::nullopt;
    return current;
}

void retention_from(const arguments& a, store_options& o) {
    o.retention.clock = retention_clock::event;
    if (auto d = duration_option(a, "inbox-retention")) o.retention.inbox_retention = d;
    if (auto d = duration_option(a, "allowed-lateness")) o.retention.allowed_lateness = d;
    o.retention.max_future_skew = limit_option(a, "max-future-skew", o.retention.max_future_skew);
    o.changes.max_age = limit_option(a, "change-retention", o.changes.max_age);
    if (a.flag("no-change-feed")) o.change_feed = false;
    if (a.get("change-keep-commits")) {
        const auto n = a.number("change-keep-commits", 0);
        o.changes.keep_commits = n == 0 ? std::nullopt : std::optional<std::uint64_t>(n);
    }
    if (auto d = duration_option(a, "resend-within")) o.retention.resend_within = d;
    const auto& r = o.retention;
    if (r.resend_within && r.allowed_lateness && *r.allowed_lateness < *r.resend_within) {
        throw usage_error("option '--allowed-lateness': " + format_duration(*r.allowed_lateness) +
                          " is shorter than the logs' re-send delay of " + format_duration(*r.resend_within) +
                          " (--resend-within): a re-sent event could be applied twice");
    }
}

void gaps_from(const arguments& a, store_options& o) {
    auto v = a.get("gaps");
    if (!v) return;
    if (*v == "park") {
        o.gaps = gap_policy::park;
    } else if (*v == "apply") {
        o.gaps = gap_policy::apply;
    } else if (*v == "reject") {
        o.gaps = gap_policy::reject;
    } else {
        throw usage_error("option '--gaps': '" + *v + "' is not park, apply or reject");
    }
}

reason reason_option(const arguments& a, std::string_view name) {
    auto v = a.get(name);
    auto r = reason_from_string(*v);
    if (!r) {
        std::string known;
        for (auto k : dead_letter_reasons()) known += (known.empty() ? "" : ", ") + std::string(to_string(k));
        throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not a reason (" + known + ")");
    }
    return *r;
}

std::pair<std::string, std::string> event_option(const arguments& a, std::string_view name) {
    auto v = a.get(name);
    auto slash = v->rfind('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == v->size()) {
        throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not SOURCE/ID");
    }
    return {v->substr(0, slash), v->substr(slash + 1)};
}

void require_store(const std::filesystem::path& db) {
    if (!std::filesystem::exists(db / "data.mdb")) {
        throw std::system_error(ENOENT, std::system_category(), db.string() + ": no idem environment here");
    }
}

std::chrono::milliseconds stall_after_from(const arguments& a) {
    const auto d = duration_option(a, "stall-after");
    if (!d) return std::chrono::seconds(60);
    if (*d < std::chrono::milliseconds(1)) throw usage_error("option '--stall-after' must be at least 1ms");
    return std::chrono::duration_cast<std::chrono::milliseconds>(*d);
}

}  // namespace idem::cli::detail
