#pragma once

// What rebuild, consume and verify share: reading their options into a log run, a progress
// bar, and the report of a finished run.

#include "commands.hpp"
#include "json_writer.hpp"

#include <idem/sources/compare.hpp>
#include <idem/sources/consume.hpp>
#include <idem/sources/rebuild.hpp>

#include <chrono>
#include <string>

namespace idem::cli::detail {

/// A progress bar on stderr when it is a terminal; nothing otherwise.
class progress_bar {
public:
    explicit progress_bar(std::string label);
    /// Redraws the bar (at most five times a second).
    void update(const log_progress& p);
    /// Ends the bar's line if it was drawn.
    void finish();

private:
    std::string label_;
    bool tty_;
    bool drawn_ = false;
    std::chrono::steady_clock::time_point last_{};
};

/// Fills what rebuild, consume and verify share from their options: the store at db, the
/// logs and their format, the projections, the batch size, and progress shown on bar.
void log_run_from(const tool_context& t, const arguments& a, const std::filesystem::path& db, log_run_options& o,
                  progress_bar& bar);

/// Writes a consumer's outcome counts as an object.
void write_outcomes(json_writer& w, const consumer_stats& s);

/// Prints a run's summary line on stderr and its JSON on stdout; returns the exit status.
int report_run(const std::string& what, const log_run_result& r);

}  // namespace idem::cli::detail
