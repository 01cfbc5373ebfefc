#pragma once

// An operator's pause of a store's consumer, kept in DIR/idem.pause (idem pause writes it,
// idem resume removes it): a consumer that runs watches it and stops fetching at its next
// batch boundary while it is there; one that starts finds it and starts paused.

#include <idem/engine/engine.hpp>

#include "periodic.hpp"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace idem::cli::detail {

/// The file's name inside the store directory.
inline constexpr const char* pause_file_name = "idem.pause";

/// What DIR/idem.pause holds.
struct pause_record {
    std::string reason;
    std::string by;               ///< who paused: user@host (pid)
    std::int64_t at_unix_ns = 0;  ///< when
};

/// Reads DIR/idem.pause; nullopt if there is none. A file that is not a pause record is one with
/// its text as the reason (a pause is never lost to a damaged file).
std::optional<pause_record> read_pause_file(const std::filesystem::path& dir);
/// Writes DIR/idem.pause (a temporary file renamed into place, then the directory synced).
void write_pause_file(const std::filesystem::path& dir, const pause_record& p);
/// Removes DIR/idem.pause; whether there was one.
bool remove_pause_file(const std::filesystem::path& dir);

/// Watches DIR/idem.pause on a thread of its own and sets monitor's pause from it: at once on
/// construction, then within about every of each change. Stops on destruction.
class pause_watch {
public:
    pause_watch(std::filesystem::path dir, health_monitor& monitor,
                std::function<void(const std::optional<std::string>&)> on_change = {},
                std::chrono::milliseconds every = std::chrono::milliseconds(200));
    pause_watch(const pause_watch&) = delete;
    pause_watch& operator=(const pause_watch&) = delete;

private:
    void look();

    std::filesystem::path dir_;
    health_monitor& monitor_;
    std::function<void(const std::optional<std::string>&)> on_change_;
    std::optional<std::string> seen_;  // the ticker's
    periodic ticker_;  // last: it looks through the members above
};

/// Refuses (errc::invalid_argument) a run that would apply input and end while DIR is paused (a
/// consume without --follow, one --until-caught-up): it would ignore the pause or never end.
void refuse_if_paused(const std::filesystem::path& dir, std::string_view run);

/// A pause_watch's on_change for an engine's consumer: records each pause and resume it sees in
/// the store's audit, on the engine's writer (engine::async_operate), between batches.
std::function<void(const std::optional<std::string>&)> record_pauses_in(engine& e);

}  // namespace idem::cli::detail
