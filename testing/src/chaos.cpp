// The kit's entry point: parses the envelopes, runs the reference and the seeded schedules,
// and shrinks the first failure into the report.

#include <idem/testing.hpp>

#include "report.hpp"
#include "run.hpp"
#include "schedule.hpp"
#include "shrink.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

namespace idem::testing {

/// The envelopes a run works with: the distinct events that parse, and those that do not.
struct parsed_envelopes {
    std::vector<detail::event> events;
    std::size_t malformed = 0;
    std::string first_malformed;
};

struct chaos::impl {
    chaos_options options;
    detail::run_context context;

    // An envelope that does not parse is a dead letter wherever it is delivered (the reference,
    // every schedule, a rebuild) and changes no row, so leaving it out changes no comparison.
    parsed_envelopes parse(std::span<const std::string> envelopes) const {
        envelope_parser parser;
        parsed_envelopes out;
        std::set<std::string> seen;
        for (std::size_t i = 0; i < envelopes.size(); ++i) {
            detail::event e;
            e.body = envelopes[i];
            e.number = i + 1;
            parse_error err;
            if (!parser.parse(e.body, e.env, err)) {
                if (out.malformed++ == 0) {
                    out.first_malformed = "envelope " + std::to_string(i + 1) + " (" + std::string(to_string(err.why)) +
                                          (err.detail.empty() ? "" : ": " + err.detail) + ")";
                }
                continue;
            }
            if (seen.insert(e.env.event_id()).second) out.events.push_back(std::move(e));
        }
        if (out.events.empty()) {
            throw std::invalid_argument(out.malformed == 0 ? std::string("chaos: no envelopes to run")
                                                           : "chaos: no envelope parses (" + std::to_string(out.malformed) +
                                                                 " do not; the first: " + out.first_malformed + ")");
        }
        if (context.projections.empty()) throw std::invalid_argument("chaos: no projections added");
        return out;
    }
};

namespace {

/// The run's working directory, removed with its contents at the end.
class work_dir {
public:
    explicit work_dir(const std::filesystem::path& parent) {
        static std::atomic<unsigned> counter{0};
        const auto base = parent.empty() ? default_parent() : parent;
        path_ = base / ("idem-chaos-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
        std::filesystem::remove_all(path_);
        std::filesystem::create_directories(path_);
    }
    ~work_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    work_dir(const work_dir&) = delete;
    work_dir& operator=(const work_dir&) = delete;
    const std::filesystem::path& path() const noexcept { return path_; }

private:
    // $TMPDIR when the user set one; else memory (/dev/shm) where it can be written: a schedule
    // commits hundreds of small transactions and reopens its store after every crash.
    static std::filesystem::path default_parent() {
        if (const char* tmp = std::getenv("TMPDIR"); tmp != nullptr && *tmp != '\0') return tmp;
        std::error_code ec;
        if (std::filesystem::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
        return std::filesystem::temp_directory_path();
    }

    std::filesystem::path path_;
};

/// The cores this process may run on (its CPU affinity, as nproc counts them; a container's
/// cpuset), else the machine's.
std::size_t usable_cores() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
        return static_cast<std::size_t>(CPU_COUNT(&set));
    }
    return std::max(1U, std::thread::hardware_concurrency());
}

}  // namespace

chaos::chaos(chaos_options options) : impl_(std::make_unique<impl>()) {
    impl_->options = std::move(options);
}

chaos::~chaos() = default;

chaos& chaos::add_projection(std::shared_ptr<const projection_base> prototype, std::function<void(store&)> install) {
    impl_->context.projections.push_back(std::move(prototype));
    impl_->context.installers.push_back(std::move(install));
    return *this;
}

chaos& chaos::upcast(upcaster step) {
    impl_->context.installers.push_back([step = std::move(step)](store& s) { s.upcast(step); });
    return *this;
}

chaos& chaos::configure(std::function<void(store_options&)> fn) {
    impl_->context.configure = std::move(fn);
    return *this;
}

std::vector<std::string> chaos::schedule(std::span<const std::string> envelopes, std::uint64_t seed) const {
    const auto events = impl_->parse(envelopes).events;
    const auto& o = impl_->options;
    std::vector<std::string> out;
    for (const auto& s : detail::generate(seed, events, {o.resends, o.forked_crashes})) {
        out.push_back(detail::describe(s, events));
    }
    return out;
}

chaos_report chaos::run(std::span<const std::string> envelopes) const {
    auto parsed = impl_->parse(envelopes);
    const auto& events = parsed.events;
    const auto& o = impl_->options;
    work_dir dir{o.directory};
    auto context = impl_->context;
    context.directory = dir.path();
    context.rebuild = o.rebuild;
    context.stop = o.stop;

    std::mutex references_mutex;
    std::map<std::vector<std::size_t>, detail::rows_image> references;
    auto reference = [&](const std::vector<std::size_t>& which) -> const detail::rows_image& {
        std::scoped_lock lock{references_mutex};  // a map's entries stay put: the reference outlives the lock
        auto it = references.find(which);
        if (it == references.end()) it = references.emplace(which, detail::run_reference(context, events, which)).first;
        return it->second;
    };
    chaos_report report;
    report.events = events.size();
    report.malformed = parsed.malformed;
    report.first_malformed = std::move(parsed.first_malformed);
    // A schedule fails if its live store or its rebuild differs from the reference of the
    // events it delivers (a shrunk schedule may deliver fewer of them).
    auto difference = [&](const std::vector<detail::step>& steps, std::size_t& kills) -> std::optional<chaos_difference> {
        const auto& expected = reference(detail::events_of(steps));
        const auto got = detail::run_schedule(context, events, steps);
        kills += got.kills;
        if (auto d = detail::first_difference(expected, got.live, "live store")) return d;
        if (got.rebuilt) return detail::first_difference(expected, *got.rebuilt, "rebuild from the delivered log");
        return std::nullopt;
    };

    // Schedules are taken in seed order by the workers; the one reported is the first failing
    // schedule in that order, the one a single worker would report, whatever finished first.
    std::mutex mutex;
    std::condition_variable changed;
    std::size_t next = 0, passed = 0, running = 0;
    std::optional<std::size_t> failed;  // the first failing schedule so far, and its difference
    std::optional<chaos_difference> found;
    std::optional<std::size_t> error_at;  // the first schedule that threw, and what it threw
    std::exception_ptr error;
    auto take = [&]() -> std::optional<std::size_t> {
        std::scoped_lock lock{mutex};
        if (next >= o.schedules || (failed && next > *failed) || error) return std::nullopt;
        return next++;
    };
    auto run_one = [&](std::size_t i) {
        std::size_t kills = 0;
        std::optional<chaos_difference> d;
        std::exception_ptr thrown;
        try {
            detail::check_stop(context);
            d = difference(detail::generate(o.seed + i, events, {o.resends, o.forked_crashes}), kills);
        } catch (...) {
            thrown = std::current_exception();
        }
        std::scoped_lock lock{mutex};
        report.kills += kills;
        if (thrown) {
            if (!error_at || i < *error_at) {
                error_at = i;
                error = thrown;
            }
        } else if (d) {
            if (!failed || i < *failed) {
                failed = i;
                found = std::move(d);
            }
        } else {
            ++passed;
        }
        changed.notify_all();
    };
    // Progress is told on the calling thread, once for each schedule passed, until a stop.
    std::size_t told = 0;
    auto tell = [&](std::size_t upto) {
        for (; told < upto && (context.stop == nullptr || !context.stop->load());) {
            ++told;
            if (o.progress) o.progress(told, o.schedules);
        }
    };
    // A forked child must come from a process of one thread: forked_crashes runs one worker.
    const std::size_t cores = usable_cores();
    const std::size_t workers =
        o.forked_crashes ? 1 : std::clamp<std::size_t>(o.workers != 0 ? o.workers : cores, 1, o.schedules);
    if (workers <= 1) {
        while (auto i = take()) {
            run_one(*i);
            tell(passed);
        }
    } else {
        std::vector<std::jthread> threads;
        running = workers;
        for (std::size_t k = 0; k < workers; ++k) {
            threads.emplace_back([&] {
                while (auto i = take()) run_one(*i);
                std::scoped_lock lock{mutex};
                --running;
                changed.notify_all();
            });
        }
        std::unique_lock lock{mutex};
        for (;;) {
            changed.wait(lock, [&] { return running == 0 || passed > told; });
            const auto upto = passed;
            const bool finished = running == 0;
            lock.unlock();
            tell(upto);
            lock.lock();
            if (finished) break;
        }
    }
    detail::check_stop(context);
    if (error && (!failed || *error_at < *failed)) std::rethrow_exception(error);
    if (!failed) {
        report.schedules = o.schedules;
        return report;
    }
    const auto seed = o.seed + *failed;
    auto steps = detail::generate(seed, events, {o.resends, o.forked_crashes});
    report.schedules = *failed + 1;
    report.seed = seed;
    report.steps_before = steps.size();
    report.deliveries_before = detail::deliveries(steps);
    // Shrinking runs one schedule at a time (its kills are not counted).
    const detail::failure_test fails = [&](const std::vector<detail::step>& candidate) {
        std::size_t kills = 0;
        return difference(candidate, kills);
    };
    auto small = detail::shrink(std::move(steps), std::move(*found), fails, o.max_shrink_runs);
    for (const auto& s : small.steps) report.steps.push_back(detail::describe(s, events));
    report.deliveries = detail::deliveries(small.steps);
    report.confirmed = fails(small.steps).has_value();
    report.difference = std::move(small.difference);
    return report;
}

}  // namespace idem::testing
