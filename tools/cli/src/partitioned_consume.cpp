// `consume --nats --partitions N`: one instance of a partitioned group (leases in NATS KV, one
// environment per owned partition under --db), and `owners`: who holds which partition.

#include "audit_file.hpp"
#include "commands.hpp"
#include "interrupt.hpp"
#include "json_writer.hpp"
#include "nats_library.hpp"
#include "options.hpp"
#include "text.hpp"

#include <idem/sources/jetstream_partitions.hpp>
#include <idem/sources/jetstream_publish.hpp>
#include <idem/storage/duration.hpp>

#include <chrono>
#include <cstdio>

namespace idem::cli::detail {

namespace {

// --ack-log in partitioned mode: one JSON line per ack or nak and per lease taken or lost, with
// the partition and the wall time.
void write_ack(audit_file& audit, std::uint32_t k, const jetstream::ack_event& ev) {
    std::string line;
    json_writer w{line};
    w.begin_object()
        .field("partition", std::uint64_t{k})
        .field("seq", ev.stream_sequence)
        .field("msgid", ev.message_id)
        .field("acked", ev.acked)
        .field("outcome", ev.acked ? std::string(to_string(ev.result.kind)) : std::string("error"))
        .field("time_ns", wall_clock_ns());
    w.end_object();
    audit.write_line(std::move(line));
}

void write_lease(audit_file& audit, std::uint32_t k, bool owned, std::uint64_t revision, std::string_view why) {
    std::string line;
    json_writer w{line};
    w.begin_object()
        .field("partition", std::uint64_t{k})
        .field("lease", owned ? "taken" : "ended")
        .field("revision", revision)
        .field("why", why)
        .field("time_ns", wall_clock_ns());
    w.end_object();
    audit.write_line(std::move(line));
}

// A name that stays the same when the same --db is started again on the same host, so a
// restarted instance finds its own leases.
std::string default_instance(const std::filesystem::path& db) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string name;
    for (const char* c = host; *c != 0; ++c) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-';
        name += ok ? *c : '_';
    }
    auto path = std::filesystem::weakly_canonical(std::filesystem::absolute(db)).string();
    const auto h = jetstream::partition_of_token(path, 0xFFFFFFFFu);  // a hash of the path
    char hex[9];
    std::snprintf(hex, sizeof hex, "%08x", h);
    return name + "-" + hex;
}

// owners --key K --partitions N: where each key lives, one JSON line each (the partition the
// servers' mapping gives it, as partition_of computes it, and the instance holding it now).
int key_owners(const arguments& a, const std::vector<jetstream::lease_owner>& list) {
    if (!a.get("partitions")) throw usage_error("option '--key' needs --partitions N (the N of the mapping)");
    const auto n = a.positive("partitions", 1);
    if (n > 4096) throw usage_error("option '--partitions': " + a.required("partitions") + " is more than 4096");
    std::string out;
    for (const auto& key : a.all("key")) {
        const auto k = jetstream::partition_of(key, static_cast<std::uint32_t>(n));
        std::string instance;
        for (const auto& l : list) {
            if (l.partition == k) instance = l.instance;
        }
        json_writer w{out};
        w.begin_object()
            .field("key", key)
            .field("token", jetstream::subject_token(key))
            .field("partition", std::uint64_t{k})
            .field("instance", instance);
        w.end_object();
        out += "\n";
    }
    print(out);
    return 0;
}

int owners(const arguments& a) {
    nats_library_scope nats;
    auto list = jetstream::read_owners(jetstream::split_servers(a.required("nats")), a.required("consumer"));
    if (!a.all("key").empty()) return key_owners(a, list);
    if (a.get("partitions")) throw usage_error("option '--partitions' goes with --key");
    std::string out;
    json_writer w{out};
    w.begin_object();
    for (const auto& l : list) {
        w.key(std::to_string(l.partition)).begin_object().field("instance", l.instance).field("revision", l.revision);
        w.field("checkpoint", l.checkpoint).field("kept", l.kept);
        if (l.kept) w.field("kept_by", l.kept_by);
        w.end_object();
    }
    w.end_object();
    print(out + "\n");
    return 0;
}

}  // namespace

int consume_partitioned(const tool_context& t, const arguments& a) {
    jetstream::partitioned_options po;
    fill_source_options(a, po.source);
    // --until-caught-up: the group's condition (every partition's owner reached the partition's
    // last sequence), not each partition's source by itself.
    po.until_caught_up = po.source.until_caught_up;
    po.source.until_caught_up = false;
    if (a.get("replica")) throw usage_error("option '--replica' is replicated mode: not with --partitions");
    if (a.get("subject")) throw usage_error("option '--subject' does not apply with --partitions (each partition has its own)");
    po.partitions = static_cast<std::uint32_t>(a.positive("partitions", 1));
    if (po.partitions > 4096) throw usage_error("option '--partitions': " + a.required("partitions") + " is more than 4096");
    po.stop = po.source.stop;  // Ctrl-C, SIGTERM
    po.db = a.required("db");
    po.instance = a.get("instance").value_or(default_instance(po.db));
    if (auto ttl = duration_option(a, "lease-ttl")) {
        po.lease_ttl = std::chrono::duration_cast<std::chrono::milliseconds>(*ttl);
    }
    po.replay_threshold = a.number("replay-threshold", po.replay_threshold);
    po.engine.store = t.store_for(po.db);
    po.engine.store.sync = durability_from(a);
    retention_from(a, po.engine.store);
    gaps_from(a, po.engine.store);
    po.engine.store.retention.clock = retention_clock::wall;
    po.engine.max_in_flight = std::max<std::size_t>(po.engine.max_in_flight, 2 * po.source.fetch_batch);
    po.add_projections = t.setup;
    std::optional<audit_file> audit;
    if (auto p = a.get("ack-log")) audit.emplace(*p, "ack-log");
    if (audit) {
        po.on_ack = [&](std::uint32_t k, const jetstream::ack_event& ev) { write_ack(*audit, k, ev); };
        po.on_lease = [&](std::uint32_t k, bool owned, std::uint64_t rev, std::string_view why) {
            write_lease(*audit, k, owned, rev, why);
        };
    }
    stop_signals signals;
    jetstream::partitioned_consumer pc{po};
    // A run that stops on an error (a partition's, named in it) prints its summary too, then the
    // error (exit 2).
    std::exception_ptr failed;
    std::string error;
    try {
        pc.run();
    } catch (const std::exception& e) {
        failed = std::current_exception();
        error = e.what();
    }
    const auto& r = pc.result();
    std::string out;
    json_writer w{out};
    w.begin_object()
        .field("instance", po.instance)
        .field("taken", r.taken)
        .field("lost", r.lost)
        .field("given_up", r.given_up)
        .field("fetched", r.fetched)
        .field("caught_up", r.caught_up);
    w.key("owned_at_stop").begin_array();
    for (auto k : r.owned_at_stop) w.value(std::uint64_t{k});
    w.end_array();
    if (!error.empty()) w.field("error", error);
    w.end_object();
    std::fprintf(stderr, "instance %s of consumer '%s': %s leases taken, %s lost, %s given up\n", po.instance.c_str(),
                 po.source.consumer.c_str(), with_commas(r.taken).c_str(), with_commas(r.lost).c_str(),
                 with_commas(r.given_up).c_str());
    print(out + "\n");
    if (failed) std::rethrow_exception(failed);
    return 0;
}

command owners_command() {
    return command{"owners",
                   "print a partitioned group's leases as JSON: partition -> {instance (\"\" when free), revision, "
                   "checkpoint, kept and kept_by (free, given up on stop by an owner that kept its copy up to checkpoint)}",
                   {{"nats", "URL[,URL...]", "the NATS servers", true},
                    {"consumer", "NAME", "the group's consumer name (its lease bucket is idem-leases-NAME)", true},
                    {"key", "K",
                     "instead: one JSON line per key with its subject token, its partition and the instance holding "
                     "it now (\"\" when free)",
                     false, true},
                    {"partitions", "N", "with --key: the N of the servers' mapping"}},
                   owners};
}

}  // namespace idem::cli::detail
