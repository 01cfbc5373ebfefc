#pragma once

// The tool's built-in commands, one file per command or small group. Each factory returns
// the command(s) with their options; the body asks the context function for what it needs
// of the tool when it runs (the tool's consumer may be set after the commands are made).

#include <idem/cli/tool.hpp>
#include <idem/projections/store.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace idem::jetstream {
struct source_options;
struct stream_publishing;
}

namespace idem::cli::detail {

/// What a command needs of its tool.
struct tool_context {
    std::string name;      ///< the tool's name (messages)
    std::string consumer;  ///< the consumer its stores use
    std::vector<std::shared_ptr<const projection_base>> projections;
    std::function<store_options(const std::filesystem::path&)> store_for;  ///< a store's options at db
    std::function<void(store&)> setup;                                      ///< adds the projections and upcasters
    std::vector<std::function<void(store&)>> installers;  ///< adds projections[i] (a copy of it)
    std::vector<upcaster> upcasters;                      ///< the event upcasting steps setup adds

    /// Returns the projection called n; throws usage_error listing the tool's projections.
    const projection_base& projection_named(const std::string& n) const;
    /// Returns the names of the tool's projections, in the order they were added.
    std::vector<std::string> projection_names() const;
    /// Opens the existing store at db as its writer (waiting for the writer lock with --wait),
    /// with the tool's projections; adjust, when given, changes the options first.
    std::unique_ptr<store> open_writer(const arguments& a, const std::filesystem::path& db,
                                       const std::function<void(store_options&)>& adjust = {}) const;
};

using context_fn = std::function<tool_context()>;

/// Sets how a command publishes to a stream from --replicas, --duplicates-window,
/// --broker-outage-limit and --max-pending (publish.cpp; publish and relay).
void publishing_from(const arguments& a, jetstream::stream_publishing& o);
/// `consume --nats` (jetstream_consume.cpp, with the jetstream feature only).
int consume_jetstream(const tool_context& t, const arguments& a);
/// Sets the stream, consumer and delivery options of `consume --nats` from the command line.
void fill_source_options(const arguments& a, jetstream::source_options& so);
/// `consume --nats --partitions N` (partitioned_consume.cpp).
int consume_partitioned(const tool_context& t, const arguments& a);
/// The options of `consume --nats`.
std::vector<option> jetstream_consume_options();

/// `rebuild` and `consume` (rebuild_consume.cpp).
std::vector<command> log_run_commands(context_fn t);
/// `get`, `dump` and `stats` (read_commands.cpp).
std::vector<command> read_commands(context_fn t);
/// `changes` (changes.cpp).
command changes_command(context_fn t);
/// `deadletters` (deadletters.cpp).
command deadletters_command(context_fn t);
/// `verify` (verify.cpp).
command verify_command(context_fn t);
/// `chaos` (chaos.cpp).
command chaos_command(context_fn t);
/// `prune` (prune.cpp).
command prune_command(context_fn t);
command migrate_command(context_fn t);
/// `why` (why.cpp).
command why_command(context_fn t);
/// `backup` (backup.cpp).
command backup_command(context_fn t);
/// `convert` (convert.cpp).
command convert_command();
/// `parked`, `release`, `redrive` and `audit` (operator_commands.cpp).
std::vector<command> operator_commands(context_fn t);
/// `pause` and `resume` (pause.cpp).
std::vector<command> pause_commands(context_fn t);
#ifdef IDEM_HTTP
/// `serve` (serve.cpp): the HTTP source, reads and metrics.
command serve_command(context_fn t);
#endif
#ifdef IDEM_JETSTREAM
/// `publish` (publish.cpp): logs into a JetStream stream.
command publish_command();
/// `relay` (relay.cpp): a store's change feed into a JetStream stream.
command relay_command(context_fn t);
/// `owners` (partitioned_consume.cpp): a partitioned group's leases.
command owners_command();
#endif

/// Writes json to standard output.
void print(std::string_view json);

}  // namespace idem::cli::detail
