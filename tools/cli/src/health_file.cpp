#include "health_file.hpp"

#include <idem/storage/duration.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include <simdjson.h>

namespace idem::cli::detail {

health_file::health_file(std::filesystem::path dir, std::function<health_report()> judge,
                         std::chrono::milliseconds every)
    : dir_(std::move(dir)),
      judge_(std::move(judge)),
      every_(every),
      ticker_(every, [this] { write(); }, true) {}  // written at once, then every interval

health_file::~health_file() {
    ticker_.stop();
    // Only our own: a process that never got the writer lock leaves the holder's file alone.
    if (const auto r = read_health_file(dir_); r && r->pid == ::getpid()) {
        std::error_code ignored;
        std::filesystem::remove(dir_ / health_file_name, ignored);
    }
}

void health_file::write() {
    // Written by the process that holds the store's writer lock only: one that waits for it
    // (--wait), or is refused, says nothing of the store.
    if (writer_lock::holder(dir_).pid != ::getpid()) return;
    std::string text;
    try {
        text = "{\"pid\":" + std::to_string(::getpid()) + ",\"written_unix_ns\":" + std::to_string(wall_clock_ns()) +
               ",\"every_ms\":" + std::to_string(every_.count()) + ",\"health\":" + to_json(judge_()) + "}\n";
    } catch (const std::exception&) {
        // A report that cannot be read (the store is being reopened): the file keeps its last
        // content, and a reader sees its age grow.
        return;
    }
    // Best effort: a full disk must not stop the consumer; the reader then sees an old file.
    const auto tmp = dir_ / (std::string(health_file_name) + ".tmp");  // one writer: the lock's holder
    {
        std::ofstream out{tmp, std::ios::trunc};
        out << text;
        if (!out.flush()) return;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, dir_ / health_file_name, ec);
}

std::optional<health_record> read_health_file(const std::filesystem::path& dir) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(dir / health_file_name, ec)) return std::nullopt;  // not a FIFO
    std::ifstream in{dir / health_file_name};
    if (!in) return std::nullopt;
    std::stringstream buf;
    buf << in.rdbuf();
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(buf.str()).get(doc)) return std::nullopt;
    health_record r;
    simdjson::dom::element health;
    if (doc["pid"].get(r.pid) || doc["written_unix_ns"].get(r.written_unix_ns) || doc["health"].get(health)) {
        return std::nullopt;
    }
    if (doc["every_ms"].get(r.every_ms)) r.every_ms = 1000;
    std::string_view state, reason;
    if (health["state"].get(state) || health["reason"].get(reason)) return std::nullopt;
    r.state = state;
    r.reason = reason;
    r.report = simdjson::minify(health);
    return r;
}

std::optional<store_writer> writer_of(const std::filesystem::path& dir) {
    if (!writer_lock::held(dir)) return std::nullopt;
    store_writer w{writer_lock::holder(dir), read_health_file(dir)};
    if (w.health && w.health->pid != w.holder.pid) w.health.reset();  // another process's, left behind
    return w;
}

}  // namespace idem::cli::detail
