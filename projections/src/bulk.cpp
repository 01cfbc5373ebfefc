// Bulk builds (store::begin_bulk .. end_bulk): every apply() in one write transaction, rows
// kept in memory up to a budget and written in key order.

#include "store_internal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>

namespace idem {

std::vector<outcome> store::impl::run_bulk(const prepared_batch& prepared, std::span<const checkpoint> at) {
    auto outcomes = bulk->deliver_all(prepared.items_, at);
    prune_steps pruned;
    prune_in_batch(*bulk_txn, *bulk, pruned);
    forget_pruned(pruned);  // as spill() does: abandon_bulk() rebuilds the indexes from disk
    bulk->spill(bulk_budget);
    return outcomes;
}

void store::impl::index_pages() {
    const bool huge = options.tuning.huge_index_pages || bulk != nullptr;
    ids->use_huge_pages(huge);
    event_contents->use_huge_pages(huge);
    for (auto& c : contributors) c->use_huge_pages(huge);
}

void store::impl::abandon_bulk() {
    bulk.reset();
    bulk_txn.reset();  // aborts
    rolled_back();
    open_tables();  // the id indexes learned uncommitted ids: rebuild them from disk
}

void store::begin_bulk(std::size_t memory_budget) {
    auto& s = *impl_;
    if (s.bulk) throw_error(errc::invalid_argument, "begin_bulk: a bulk build is already running");
    s.bulk_txn = std::make_unique<write_txn>(*s.env);
    try {
        s.bulk = std::make_unique<detail::batch_run>(s, *s.bulk_txn, detail::batch_run::kind::bulk);
        s.bulk_budget = memory_budget;
        s.index_pages();
    } catch (...) {
        s.abandon_bulk();
        throw;
    }
}

void store::end_bulk() {
    auto& s = *impl_;
    if (!s.bulk) throw_error(errc::invalid_argument, "end_bulk: no bulk build is running");
    try {
        s.bulk->finish();
        detail::before_commit(s.options, s.bulk->commit());
        crash_point("before_commit");
        s.bulk_txn->commit();
        crash_point("after_commit");
    } catch (...) {
        s.abandon_bulk();
        throw;
    }
    s.ids->committed();
    s.event_contents->committed();
    for (auto& c : s.contributors) c->committed();
    s.bulk.reset();
    s.bulk_txn.reset();
    s.index_pages();
}

namespace detail {

void batch_run::spill(std::size_t budget) {
    // The index learns the written ids before the commit; abandon_bulk() rebuilds it from disk.
    for (auto& c : s_.contributors) {
        c->write(txn_);
        c->committed();
    }
    s_.ids->write(txn_);
    s_.ids->committed();
    s_.event_contents->write(txn_);
    s_.event_contents->committed();
    s_.event_ids->write(txn_);
    write_dead_letters();
    write_collisions();
    if (kept_.row_bytes > budget) {
        write_rows();
        for (auto& t : rows_) t.clear();
        kept_.row_bytes = 0;
    }
}

}  // namespace detail
}  // namespace idem
