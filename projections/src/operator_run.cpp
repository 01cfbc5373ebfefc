// An operator action (park release, redrive, row rewrite: operator_actions.cpp) runs as one batch
// run: it sees the run through detail::operator_session, and its writes are committed by the
// run's finish in one transaction, like any batch.

#include "operator_session.hpp"
#include "store_internal.hpp"

#include <idem/projections/store_hooks.hpp>

#include <functional>
#include <string>
#include <string_view>

namespace idem {

namespace detail {

// An operator action's view of a batch run (detail::operator_session).
class operator_run final : public operator_session {
public:
    explicit operator_run(batch_run& run) : run_(run) {}
    write_txn& txn() override { return run_.txn_; }
    std::uint64_t commit() const override { return run_.commit_; }
    std::uint64_t now() const override { return run_.time_ns_; }
    MDB_dbi parked_table() const override { return run_.s_.parked; }
    MDB_dbi dead_table() const override { return run_.s_.dead; }
    outcome reapply(const envelope&, std::string_view message_id, std::string_view body) override {
        auto d = taken_back(message_id, body);
        if (!prepare_envelope(run_.s_, d, run_.s_.parser)) {
            throw_error(errc::corrupt_record, "a dead letter to redrive no longer parses: " + d.err.detail);
        }
        d.message_id.assign(message_id);
        return run_.apply_projections(d);
    }
    std::string unprovable(std::string_view message_id, std::string_view body) override {
        auto d = taken_back(message_id, body);
        if (!prepare_envelope(run_.s_, d, run_.s_.parser)) return {};  // malformed: redriven as it is
        if (!d.time_ns) return "it has no usable time: nothing places it against the pruned effect keys";
        // Effect keys are stamped with their event's time and pruned oldest first: at or above a
        // projection's floor every one of them is still there, so its contributing sets judge the
        // event exactly (the horizon may have been moved by a bad clock since it was judged late).
        for (const auto& pt : d.parts) {
            const auto floor = run_.contrib_floors_[pt.projection];
            if (*d.time_ns < floor) {
                return "its event time " + d.ev.time + " is " + std::to_string((floor - *d.time_ns) / 1'000'000) +
                       " ms before where projection '" + run_.s_.projections[pt.projection]->name() +
                       "' pruned its effect keys: nothing proves it new";
            }
        }
        return {};
    }
    void dead_letter(reason why, std::string detail, std::string_view message_id, std::string_view body) override {
        run_.dead(taken_back(message_id, body), why, std::move(detail));
    }
    void write_dead_letters() override { run_.write_dead_letters(); }
    std::uint64_t stream_highest(const std::string& subject) override { return run_.stream(subject).value.highest; }
    void release_after(const std::string& subject, std::uint64_t highest) override {
        set_stream(subject, highest);
        run_.release_parked(subject, run_.stream(subject).value);
    }
    void set_stream(const std::string& subject, std::uint64_t highest) override {
        auto& entry = run_.stream(subject);
        entry.value.highest = highest;
        run_.mark_dirty(entry);
    }
    void unpark(const std::string& key) override { run_.parked_[key] = std::nullopt; }
    bool is_parked(const std::string& key) const override { return run_.parked_value(key).has_value(); }
    void rewrite_row(std::size_t projection, const std::string& key) override {
        run_.mark_dirty(projection, run_.load_row(projection, key, string_table<row_slot>::hash_of(key)));
    }
    layout::clock_record& clock() override { return run_.clock_; }

private:
    // An event read back from the store, as the batch path takes it.
    static batch_run::item taken_back(std::string_view message_id, std::string_view body) {
        batch_run::item d;
        d.from_store = true;
        d.message_id.assign(message_id);
        d.body.assign(body);
        return d;
    }

    batch_run& run_;
};

}  // namespace detail

void store::impl::run_operator(const std::function<bool(detail::operator_session&)>& fn) {
    write_txn txn{*env};
    detail::batch_run run{*this, txn, detail::batch_run::kind::operator_action};
    detail::operator_run op{run};
    if (!fn(op)) {
        rolled_back();  // aborted by txn's destructor
        return;
    }
    run.finish();
    detail::before_commit(options, run.commit());
    txn.commit();
    ids->committed();
    event_contents->committed();
    for (auto& c : contributors) c->committed();
}

void store::operate(const std::function<bool(detail::operator_session&)>& fn) {
    if (impl_->bulk) throw_error(errc::invalid_argument, "an operator action cannot run during a bulk build");
    impl_->until_committed([&] { impl_->run_operator(fn); });
}

}  // namespace idem
