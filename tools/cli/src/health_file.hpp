#pragma once

// A running consumer's health, shared with other processes: the consumer writes DIR/idem.health
// every second (write, then rename: a reader never sees half of it) and removes it when it
// stops; `idem stats` reads it and says first whether the consumer is stalled.

#include <idem/engine/health.hpp>
#include <idem/storage/writer_lock.hpp>

#include "periodic.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace idem::cli::detail {

/// The file's name inside the store directory.
inline constexpr const char* health_file_name = "idem.health";

/// Writes judge()'s report to DIR/idem.health every interval on a thread of its own, from
/// construction until destruction (which removes the file).
class health_file {
public:
    health_file(std::filesystem::path dir, std::function<health_report()> judge,
                std::chrono::milliseconds every = std::chrono::seconds(1));
    ~health_file();
    health_file(const health_file&) = delete;
    health_file& operator=(const health_file&) = delete;

private:
    void write();

    std::filesystem::path dir_;
    std::function<health_report()> judge_;
    std::chrono::milliseconds every_;
    periodic ticker_;  // last: it writes through the members above
};

/// What DIR/idem.health said when read.
struct health_record {
    std::int64_t pid = 0;
    std::int64_t written_unix_ns = 0;
    std::int64_t every_ms = 1000;
    std::string state;   ///< idle, running, stalled, paused
    std::string reason;
    std::string report;  ///< the whole report, a JSON object
};

/// Reads DIR/idem.health; nullopt if there is none (or it is not a health file).
std::optional<health_record> read_health_file(const std::filesystem::path& dir);

/// The process holding a store's writer lock, and the health it reports if it is a consumer
/// that writes DIR/idem.health (nullopt: a writer that reports none, a rebuild or a prune).
struct store_writer {
    lock_holder holder;
    std::optional<health_record> health;
};
/// Returns the writer of DIR; nullopt when no process holds its writer lock.
std::optional<store_writer> writer_of(const std::filesystem::path& dir);

}  // namespace idem::cli::detail
