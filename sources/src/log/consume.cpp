// A live, resumable consume of event logs: a log run that starts each log at its checkpoint.

#include <idem/sources/consume.hpp>

#include "log_run.hpp"

namespace idem {

consumer_stats difference(const consumer_stats& after, const consumer_stats& before) {
    auto minus = [](std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; };
    consumer_stats d;
    for (std::size_t i = 0; i < outcome_kinds; ++i) d.outcomes[i] = minus(after.outcomes[i], before.outcomes[i]);
    d.released = minus(after.released, before.released);
    d.batches = minus(after.batches, before.batches);
    d.late_events = minus(after.late_events, before.late_events);
    d.id_conflicts = minus(after.id_conflicts, before.id_conflicts);
    d.pruned_ids = minus(after.pruned_ids, before.pruned_ids);
    d.pruned_contributors = minus(after.pruned_contributors, before.pruned_contributors);
    return d;
}

log_run_result consume(const consume_options& options) {
    store s{options.store};
    if (options.setup) options.setup(s);
    const auto before = s.read().consumer(options.store.consumer).stats();
    detail::log_run run{s, options};
    run.restart_changed_logs(options.restart_changed_logs);
    run.rotation_grace(options.rotation_grace);
    auto result = run.run(true, options.follow, options.poll, options.stop);
    result.stats = s.read().consumer(options.store.consumer).stats();
    result.run = difference(result.stats, before);
    return result;
}

}  // namespace idem
