#pragma once

// The options several commands share, and the checks of their values: each check throws a
// usage_error naming the option and the cause.

#include <idem/cli/tool.hpp>
#include <idem/projections/store.hpp>
#include <idem/storage/event_log.hpp>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace idem::cli::detail {

extern const option db_option;
extern const option log_option;
extern const option format_option;
extern const option skip_bad_option;
extern const option batch_option;
extern const option wait_option;
extern const option inbox_retention_option;
extern const option lateness_option;
extern const option transport_option;
extern const option future_skew_option;
extern const option resend_option;
extern const option change_retention_option;
extern const option change_keep_option;
extern const option no_change_feed_option;
extern const option gaps_option;
extern const option stall_after_option;

/// Returns --format as a log format, or nullopt (detected from each file) if not given.
std::optional<log_format> format_from(const arguments& a);

/// Returns --durability (default full).
durability durability_from(const arguments& a);

/// Returns a duration option (7d, 1h, 90m, 30s), or nullopt if not given.
std::optional<std::chrono::nanoseconds> duration_option(const arguments& a, std::string_view name);

/// Returns a duration option where 0 switches the limit off (nullopt), or current when not given.
std::optional<std::chrono::nanoseconds> limit_option(const arguments& a, std::string_view name,
                                                     std::optional<std::chrono::nanoseconds> current);

/// Sets the change feed's retention from --change-retention and --change-keep-commits, and the
/// retention options from --inbox-retention, --allowed-lateness, --max-future-skew and
/// --resend-within, on the event-time clock (logs are read on their own clock, so a rebuild is
/// deterministic).
void retention_from(const arguments& a, store_options& o);

/// Sets the sequence gap policy from --gaps (park, apply or reject; default park).
void gaps_from(const arguments& a, store_options& o);

/// Returns --stall-after (default 60s): the watchdog's threshold (docs/OPERATIONS.md "Stalls and lag").
std::chrono::milliseconds stall_after_from(const arguments& a);

/// Returns a dead-letter reason option; throws usage_error listing the reasons.
reason reason_option(const arguments& a, std::string_view name);

/// Returns the event id of a SOURCE/ID option (split at the last '/').
std::pair<std::string, std::string> event_option(const arguments& a, std::string_view name);

/// Throws the ENOENT system_error every read command gives for a directory without a store.
void require_store(const std::filesystem::path& db);

}  // namespace idem::cli::detail
