#include "log_run.hpp"

#include "interrupt.hpp"
#include "options.hpp"
#include "text.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace idem::cli::detail {

progress_bar::progress_bar(std::string label) : label_(std::move(label)), tty_(::isatty(STDERR_FILENO) == 1) {}

void progress_bar::update(const log_progress& p) {
    if (!tty_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(200) && p.bytes < p.total_bytes) return;
    last_ = now;
    const double s = std::max(seconds(p.elapsed), 1e-9);
    const double fraction = p.total_bytes == 0 ? 1.0 : std::min(1.0, double(p.bytes) / double(p.total_bytes));
    constexpr int width = 30;
    auto filled = static_cast<int>(fraction * width);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.append(static_cast<std::size_t>(width - filled), '.');
    const double rate = double(p.records) / s;
    const double bytes_rate = double(p.bytes) / s;
    std::string eta = "-";
    if (bytes_rate > 0 && p.total_bytes >= p.bytes) {
        eta = fixed(double(p.total_bytes - p.bytes) / bytes_rate, 0) + "s";
    }
    std::fprintf(stderr, "\r%s [%s] %3.0f%%  %s events  %s events/s  ETA %s   ", label_.c_str(), bar.c_str(),
                 fraction * 100, with_commas(p.records).c_str(), with_commas(std::uint64_t(rate)).c_str(), eta.c_str());
    std::fflush(stderr);
    drawn_ = true;
}

void progress_bar::finish() {
    if (drawn_) std::fputs("\n", stderr);
    drawn_ = false;
}

void log_run_from(const tool_context& t, const arguments& a, const std::filesystem::path& db, log_run_options& o,
                  progress_bar& bar) {
    o.store = t.store_for(db);
    for (const auto& l : a.all("log")) o.logs.emplace_back(l);
    o.setup = t.setup;
    o.format = format_from(a);
    o.skip_bad = a.flag("skip-bad");
    o.batch = static_cast<std::size_t>(a.positive("batch", o.batch));
    o.progress = [&bar](const log_progress& p) { bar.update(p); };
    o.stop = &stop_requested;
    o.store.wait_for_writer = writer_wait(t.name, a, db);
    if (auto transport = a.get("transport")) o.transport = *transport;
    retention_from(a, o.store);
    gaps_from(a, o.store);
}

void write_outcomes(json_writer& w, const consumer_stats& s) {
    w.begin_object();
    for (std::size_t i = 0; i < outcome_kinds; ++i) w.field(to_string(static_cast<outcome_kind>(i)), s.outcomes[i]);
    w.field("released", s.released);
    w.end_object();
}

namespace {

std::string run_json(const log_run_result& r) {
    std::string out;
    json_writer w{out};
    w.begin_object();
    w.field("records", r.records).field("skipped", r.skipped);
    w.key("seconds").fixed(seconds(r.elapsed), 3);
    w.field("events_per_second", std::uint64_t(double(r.records) / std::max(seconds(r.elapsed), 1e-9)));
    write_outcomes(w.key("outcomes"), r.stats);  // the store's totals (as before this_run existed)
    write_outcomes(w.key("this_run"), r.run);
    write_outcomes(w.key("store_totals"), r.stats);
    w.key("torn").begin_array();
    for (const auto& torn : r.torn) {
        w.begin_object().field("log", torn.log.string()).field("offset", torn.offset).field("detail", torn.detail);
        w.end_object();
    }
    w.end_array().end_object();
    out += "\n";
    return out;
}

std::string outcomes_text(const consumer_stats& s) {
    auto at = [&](outcome_kind k) { return with_commas(s.outcomes[static_cast<std::size_t>(k)]); };
    return "applied " + at(outcome_kind::applied) + ", duplicate message " + at(outcome_kind::duplicate_message) +
           ", duplicate event " + at(outcome_kind::duplicate_event) + ", parked " + at(outcome_kind::parked) +
           " (released " + with_commas(s.released) + "), dead-lettered " + at(outcome_kind::dead_lettered) +
           ", ignored " + at(outcome_kind::ignored);
}

std::string summary_line(std::string_view what, const log_run_result& r) {
    std::string line = std::string(what) + ": " + with_commas(r.records) + " events in " + fixed(seconds(r.elapsed), 2) +
                       " s (" + with_commas(std::uint64_t(double(r.records) / std::max(seconds(r.elapsed), 1e-9))) +
                       " events/s); this run: " + outcomes_text(r.run) + "; store totals: " + outcomes_text(r.stats);
    if (r.skipped != 0) line += ", " + with_commas(r.skipped) + " corrupt records skipped";
    for (const auto& t : r.torn) {
        line += "\n  " + t.log.string() + ": incomplete last record at offset " + std::to_string(t.offset) +
                " not applied (" + t.detail + ")";
    }
    return line;
}

}  // namespace

int report_run(const std::string& what, const log_run_result& r) {
    std::fprintf(stderr, "%s\n", summary_line(what, r).c_str());
    print(run_json(r));
    return 0;
}

}  // namespace idem::cli::detail
