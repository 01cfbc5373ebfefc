#include "pause_file.hpp"

#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/store_dir.hpp>

#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>

#include <simdjson.h>

namespace idem::cli::detail {

namespace {

// The pause found at start, set on the monitor before anything is fetched: a consumer that
// starts paused fetches nothing.
std::optional<std::string> initial(const std::filesystem::path& dir, health_monitor& monitor) {
    std::optional<std::string> reason;
    if (auto p = read_pause_file(dir)) reason = p->reason;
    monitor.paused(reason);
    return reason;
}

}  // namespace

std::optional<pause_record> read_pause_file(const std::filesystem::path& dir) {
    std::error_code ec;
    if (!std::filesystem::exists(dir / pause_file_name, ec)) return std::nullopt;
    // Anything else at the name (a directory, a FIFO) is a pause too, with its kind as the reason:
    // never opened, so nothing blocks on it.
    if (!std::filesystem::is_regular_file(dir / pause_file_name, ec)) return pause_record{"(not a file)", "", 0};
    std::ifstream in{dir / pause_file_name};
    if (!in) return std::nullopt;
    std::stringstream buf;
    buf << in.rdbuf();
    const auto text = buf.str();
    pause_record p;
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    std::string_view reason, by;
    if (parser.parse(text).get(doc) || doc["reason"].get(reason)) {
        p.reason = text;
        return p;
    }
    p.reason = reason;
    if (!doc["by"].get(by)) p.by = by;
    if (doc["at_unix_ns"].get(p.at_unix_ns)) p.at_unix_ns = 0;
    return p;
}

void write_pause_file(const std::filesystem::path& dir, const pause_record& p) {
    std::string text = "{\"reason\":";
    append_json_string(text, p.reason);
    text += ",\"by\":";
    append_json_string(text, p.by);
    text += ",\"at_unix_ns\":" + std::to_string(p.at_unix_ns) + "}\n";
    // A name of this process's own: two commands at once each rename a whole file into place.
    const auto tmp = dir / (std::string(pause_file_name) + ".tmp-" + std::to_string(::getpid()));
    {
        std::ofstream out{tmp, std::ios::trunc};
        out << text;
        if (!out.flush()) {
            throw std::system_error(errno ? errno : EIO, std::system_category(), "cannot write " + tmp.string());
        }
    }
    std::filesystem::rename(tmp, dir / pause_file_name);
    sync_dir(dir);
}

bool remove_pause_file(const std::filesystem::path& dir) {
    const bool removed = std::filesystem::remove(dir / pause_file_name);
    if (removed) sync_dir(dir);
    return removed;
}

pause_watch::pause_watch(std::filesystem::path dir, health_monitor& monitor,
                         std::function<void(const std::optional<std::string>&)> on_change,
                         std::chrono::milliseconds every)
    : dir_(std::move(dir)),
      monitor_(monitor),
      on_change_(std::move(on_change)),
      seen_(initial(dir_, monitor)),
      ticker_(every, [this] { look(); }) {}

void refuse_if_paused(const std::filesystem::path& dir, std::string_view run) {
    const auto p = read_pause_file(dir);
    if (!p) return;
    throw std::system_error(make_error_code(errc::invalid_argument),
                            dir.string() + " is paused (" + (p->reason.empty() ? "no reason given" : p->reason) +
                                (p->by.empty() ? "" : ", by " + p->by) + "): " + std::string(run) +
                                " would apply events and end regardless; idem resume --db " + dir.string() +
                                " first, or follow (--follow) to start paused");
}

std::function<void(const std::optional<std::string>&)> record_pauses_in(engine& e) {
    return [&e](const std::optional<std::string>& reason) {
        e.async_operate(
            [reason](store& s) {
                if (reason) {
                    s.record_action("pause", *reason, "paused: the consumer fetches nothing more until resumed");
                } else {
                    s.record_action("resume", "", "resumed: the consumer fetches again");
                }
            },
            [](std::error_code) {});  // a failed record leaves the pause in force; stats shows it
    };
}

void pause_watch::look() {
    std::optional<std::string> now;
    try {
        if (auto p = read_pause_file(dir_)) now = p->reason;
    } catch (const std::exception&) {
        return;  // unreadable for a moment: as it was
    }
    if (now == seen_) return;
    seen_ = now;
    monitor_.paused(now);
    if (on_change_) on_change_(now);
}

}  // namespace idem::cli::detail
