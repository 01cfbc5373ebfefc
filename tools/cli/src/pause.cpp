// `pause` and `resume`: an operator stops a store's consumer fetching at its next batch boundary
// (it keeps serving reads and metrics), and lets it go on. The pause is DIR/idem.pause
// (pause_file.hpp), so it survives a restart; the running consumer records each change in the
// store's audit, and with no consumer running the command records it itself.

#include "commands.hpp"
#include "health_file.hpp"
#include "json_writer.hpp"
#include "options.hpp"
#include "pause_file.hpp"
#include "text.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/writer_lock.hpp>

#include <pwd.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

namespace idem::cli::detail {

namespace {

std::string who() {
    char host[256] = "";
    ::gethostname(host, sizeof host - 1);
    const passwd* pw = ::getpwuid(::geteuid());
    return std::string(pw ? pw->pw_name : std::to_string(::geteuid())) + "@" + host + " (pid " +
           std::to_string(::getpid()) + ")";
}

// The process writing db, if one does: it must be a consumer that reports its health (and so
// watches the pause); a writer that does not (a rebuild, which replaces the directory, a prune,
// a partitioned instance) is refused, so that no pause is taken that nothing honours. A consumer
// that has just taken the lock writes its health file at once: it is given 2 s to.
std::optional<lock_holder> consumer_writing(const std::filesystem::path& db, std::string_view what) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (;;) {
        const auto writer = writer_of(db);
        if (!writer) return std::nullopt;
        if (writer->health) return writer->holder;
        if (std::chrono::steady_clock::now() >= until) {
            throw std::system_error(make_error_code(errc::store_locked),
                                    db.string() + " is being written by " + describe(writer->holder) + ", which does not " +
                                        std::string(what) +
                                        " (a rebuild, which replaces the store, a prune or a migration): " +
                                        std::string(what) + " after it ends");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

// Waits until the running consumer's health, written after since, says paused with reason
// (want set) or not paused (want unset).
bool wait_for_state(const std::filesystem::path& db, const std::optional<std::string>& want, std::int64_t since,
                    std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
        if (!writer_lock::held(db)) return true;  // it ended: the next one starts as the file says
        const auto h = read_health_file(db);
        if (h && h->written_unix_ns > since) {
            if (want ? h->state == "paused" && h->reason == "paused by an operator: " + *want : h->state != "paused") {
                return true;
            }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
}

std::chrono::milliseconds timeout_of(const arguments& a) {
    const auto d = duration_option(a, "timeout");
    return d ? std::chrono::duration_cast<std::chrono::milliseconds>(*d) : std::chrono::milliseconds(30000);
}

int finish(const tool_context& t, const char* command, const std::filesystem::path& db, bool paused,
           const std::string& reason, const std::string& how) {
    std::string out;
    json_writer w{out};
    w.begin_object().field("paused", paused).field("reason", reason).field("recorded_by", how).end_object();
    out += "\n";
    std::fprintf(stderr, "%s %s: %s %s (%s)\n", t.name.c_str(), command, db.c_str(),
                 paused ? "is paused" : "is resumed", how.c_str());
    print(out);
    return 0;
}

[[noreturn]] void not_confirmed(const std::filesystem::path& db, const lock_holder& running, const char* what) {
    throw std::system_error(std::make_error_code(std::errc::timed_out),
                            "the consumer writing " + db.string() + " (" + describe(running) + ") has not said it " +
                                what + " within --timeout; it reads its pause file every 200 ms and takes it at the "
                                "end of the batch in progress: idem stats shows when it has");
}

int pause(const tool_context& t, const arguments& a) {
    const std::filesystem::path db = a.required("db");
    require_store(db);
    const auto reason = a.get("reason").value_or("");
    if (const auto running = consumer_writing(db, "pause")) {
        const auto at = static_cast<std::int64_t>(wall_clock_ns());
        write_pause_file(db, pause_record{reason, who(), at});
        if (!wait_for_state(db, reason, at, timeout_of(a))) not_confirmed(db, *running, "is paused");
        return finish(t, "pause", db, true, reason, "the running consumer, " + describe(*running));
    }
    // No consumer runs: under the writer lock (a consumer that starts meanwhile waits for it, or
    // this is refused, having changed nothing), so that the file and the audit agree.
    auto s = t.open_writer(a, db);
    write_pause_file(db, pause_record{reason, who(), static_cast<std::int64_t>(wall_clock_ns())});
    s->record_action("pause", reason, "paused while no consumer ran: the next one starts paused");
    return finish(t, "pause", db, true, reason, "this command; no consumer was running");
}

int resume(const tool_context& t, const arguments& a) {
    const std::filesystem::path db = a.required("db");
    require_store(db);
    const auto reason = a.get("reason").value_or("");
    if (!read_pause_file(db)) throw usage_error(db.string() + " is not paused");
    if (const auto running = consumer_writing(db, "resume")) {
        const auto at = static_cast<std::int64_t>(wall_clock_ns());
        remove_pause_file(db);
        if (!wait_for_state(db, std::nullopt, at, timeout_of(a))) not_confirmed(db, *running, "resumed");
        return finish(t, "resume", db, false, reason, "the running consumer, " + describe(*running));
    }
    auto s = t.open_writer(a, db);
    if (!remove_pause_file(db)) throw usage_error(db.string() + " is not paused");
    s->record_action("resume", reason, "resumed while no consumer ran");
    return finish(t, "resume", db, false, reason, "this command; no consumer was running");
}

}  // namespace

std::vector<command> pause_commands(context_fn t) {
    const option reason{"reason", "TEXT", "why (kept in the audit)"};
    const option timeout{"timeout", "D", "how long to wait for a running consumer to say it did (default 30s)"};
    return {
        command{"pause",
                "stop the store's consumer fetching at its next batch boundary (it acks what it holds and keeps "
                "serving reads and metrics; serve answers POST /events 503): until idem resume, across restarts; "
                "recorded in the audit",
                {db_option, reason, timeout, wait_option},
                [t](const arguments& a) { return pause(t(), a); }},
        command{"resume", "let a paused consumer fetch again; recorded in the audit",
                {db_option, reason, timeout, wait_option},
                [t](const arguments& a) { return resume(t(), a); }},
    };
}

}  // namespace idem::cli::detail
