#include "run.hpp"

#include <idem/projections/store_hooks.hpp>
#include <idem/sources/rebuild.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/error.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <fstream>
#include <set>
#include <stdexcept>
#include <system_error>

namespace idem::testing::detail {

namespace {

/// Thrown by the before-commit hook: the in-process crash before a commit.
struct simulated_crash {};

/// A directory for one store, removed with its contents when the run ends.
class scratch {
public:
    explicit scratch(const std::filesystem::path& parent) {
        static std::atomic<std::uint64_t> counter{0};
        path_ = parent / ("s" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~scratch() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    scratch(const scratch&) = delete;
    scratch& operator=(const scratch&) = delete;
    const std::filesystem::path& path() const noexcept { return path_; }

private:
    std::filesystem::path path_;
};

rows_image read_rows(const snapshot& snap, const run_context& c) {
    rows_image out;
    for (const auto& p : c.projections) {
        try {
            snap.scan_raw(p->name(), [&](const snapshot::raw_row_view& r) {
                auto state = p->load(r.state, r.state_version);
                row_image image{r.version, {}};
                p->write_json(*state, image.state);
                out.insert_or_assign({p->name(), std::string(r.key)}, std::move(image));
            });
        } catch (const std::system_error& e) {
            if (e.code() != errc::unknown_projection) throw;  // a projection without rows yet
        }
    }
    return out;
}

store_options base_options(const run_context& c, const std::filesystem::path& path) {
    store_options o;
    o.consumer = "chaos";
    if (c.configure) c.configure(o);
    o.path = path;
    o.sync = durability::none;  // a process crash loses nothing the page cache holds; only power loss would
    if (!o.retention.inbox_retention) o.retention.inbox_retention = std::chrono::seconds(1);
    return o;
}

/// One schedule's live store: reopened after each crash, on a clock the schedule moves.
class live_store {
public:
    live_store(const run_context& c, const std::filesystem::path& path) : c_(c) {
        options_ = base_options(c, path / "live");
        auto clock = clock_;
        options_.retention.now = [clock] { return *clock; };
        auto crash = crash_next_commit_;
        idem::detail::set_before_commit(options_, [crash](std::uint64_t) {
            if (*crash) {
                *crash = false;
                throw simulated_crash{};
            }
        });
        open();
    }

    void open() {
        store_ = std::make_unique<store>(options_);
        for (const auto& install : c_.installers) install(*store_);
        environment_ = idem::detail::store_env(*store_);
    }
    void close() {
        store_.reset();
        environment_.reset();
    }
    // A crashed process loses its store object: every index, cache and parked entry it held
    // in memory, and its open write transaction (aborted: none of its pages reach the map).
    // What it committed stays in the page cache (durability::none), which is what the LMDB
    // environment maps, so the next store rebuilds everything from the environment kept open
    // here instead of mapping the same pages again (forked children still open their own).
    void reopen() {
        store_.reset();
        open();
    }

    void deliver(const std::vector<delivery>& batch, const step& s) {
        switch (s.crash) {
            case crash_kind::none:
                store_->apply(batch);
                return;
            case crash_kind::before_commit:
                *crash_next_commit_ = true;
                try {
                    store_->apply(batch);
                } catch (const simulated_crash&) {
                }
                if (*crash_next_commit_)
                    throw std::logic_error("chaos: a batch committed without passing its before-commit hook");
                break;
            case crash_kind::after_commit:
                store_->apply(batch);
                break;
            case crash_kind::killed:
                in_child(s.point, [&](store& child) { child.apply(batch); });
                break;
        }
        // After a crash the consumer restarts and the source redelivers everything unacknowledged.
        reopen();
        store_->apply(batch);
    }

    void prune(const step& s) {
        *clock_ += static_cast<std::uint64_t>(options_.retention.inbox_retention->count()) + 1'000'000'000ULL;
        if (s.crash == crash_kind::killed) {
            in_child(s.point, [](store& child) {
                while (child.prune().more) {
                }
            });
            reopen();
        }
        while (store_->prune().more) {
        }
    }

    rows_image rows() const { return read_rows(store_->read(), c_); }
    std::size_t kills() const noexcept { return kills_; }

private:
    // Runs fn over the store in a forked child armed to be killed at point; the child may
    // also finish (the point not reached), which is not a crash but is as good a schedule.
    template <class F>
    void in_child(const std::string& point, F fn) {
        close();  // the child opens the environment itself: an LMDB handle must not cross fork()
        const pid_t pid = ::fork();
        if (pid < 0) throw std::system_error(errno, std::generic_category(), "chaos: fork");
        if (pid == 0) {
            int status = 0;
            try {
                store child{options_};
                for (const auto& install : c_.installers) install(child);
                idem::detail::arm_crash_point(point, 1);
                fn(child);
            } catch (...) {
                status = 3;
            }
            ::_exit(status);
        }
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0) {
            if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "chaos: waitpid");
        }
        const bool killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        if (killed) ++kills_;
        const bool finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!killed && !finished) {
            throw std::runtime_error("chaos: the child run to be killed at " + point + " failed (status " +
                                     std::to_string(status) + ")");
        }
        open();
    }

    const run_context& c_;
    store_options options_;
    std::shared_ptr<std::uint64_t> clock_ = std::make_shared<std::uint64_t>(1'700'000'000'000'000'000ULL);
    std::shared_ptr<bool> crash_next_commit_ = std::make_shared<bool>(false);
    std::unique_ptr<store> store_;
    std::shared_ptr<environment> environment_;  ///< kept open across in-process crashes (see reopen)
    std::size_t kills_ = 0;
};

void install_all(const run_context& c, store& s) {
    for (const auto& install : c.installers) install(s);
}

}  // namespace

void check_stop(const run_context& c) {
    if (c.stop != nullptr && c.stop->load()) {
        throw std::system_error(std::make_error_code(std::errc::operation_canceled), "chaos: stopped");
    }
}

rows_image run_reference(const run_context& c, const std::vector<event>& events,
                         const std::vector<std::size_t>& which) {
    scratch dir{c.directory};
    store s{base_options(c, dir.path() / "reference")};
    install_all(c, s);
    std::vector<delivery> batch;
    for (auto i : which) batch.push_back(delivery{events[i].body, {}});
    s.apply(batch);
    return read_rows(s.read(), c);
}

schedule_rows run_schedule(const run_context& c, const std::vector<event>& events, const std::vector<step>& steps) {
    scratch dir{c.directory};
    schedule_rows out;
    const auto log = dir.path() / "delivered.jsonl";
    {
        std::ofstream log_out{log};
        live_store live{c, dir.path()};
        for (const auto& s : steps) {
            check_stop(c);
            switch (s.kind) {
                case step_kind::deliver: {
                    std::vector<delivery> batch;
                    for (const auto& d : s.batch) {
                        batch.push_back(delivery{body_of(events[d.event], d), {}});
                        log_out << batch.back().body << '\n';
                    }
                    live.deliver(batch, s);
                    break;
                }
                case step_kind::prune:
                    live.prune(s);
                    break;
                case step_kind::reopen:
                    live.reopen();
                    break;
            }
        }
        out.live = live.rows();
        out.kills = live.kills();
        if (!log_out.flush())
            throw std::system_error(errno, std::generic_category(), "chaos: cannot write " + log.string());
    }
    if (c.rebuild) {
        rebuild_options o;
        o.store = base_options(c, dir.path() / "rebuilt");
        o.logs = {log};
        o.setup = [&c](store& s) { install_all(c, s); };
        o.batch = 3;  // batch boundaries inside the log, like a live consumer's
        o.memory_budget = std::size_t{64} << 20;
        build(o);
        out.rebuilt = read_rows(snapshot::open(o.store.path), c);
    }
    return out;
}

std::vector<std::size_t> events_of(const std::vector<step>& steps) {
    std::set<std::size_t> seen;
    for (const auto& s : steps) {
        for (const auto& d : s.batch) seen.insert(d.event);
    }
    return {seen.begin(), seen.end()};
}

}  // namespace idem::testing::detail
