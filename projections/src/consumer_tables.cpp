// Opening a store: the environment, its storage format, and the consumer's and projections'
// tables and indexes (store::impl); the store's accessors.

#include "store_internal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>

namespace idem {

std::string_view to_string(outcome_kind k) noexcept {
    switch (k) {
    case outcome_kind::applied: return "applied";
    case outcome_kind::duplicate_message: return "duplicate_message";
    case outcome_kind::duplicate_event: return "duplicate_event";
    case outcome_kind::parked: return "parked";
    case outcome_kind::dead_lettered: return "dead_lettered";
    case outcome_kind::ignored: return "ignored";
    }
    return "unknown";
}

store::impl::impl() = default;
store::impl::~impl() = default;

std::uint64_t store::impl::wall_now() const {
    if (options.retention.now) return options.retention.now();
    return wall_clock_ns();
}

void store::impl::open_meta() {
    meta = env->table(std::string(layout::meta_table));
    env->write([&](write_txn& txn) {
        auto v = txn.get(meta, layout::format_key);
        if (!v) {
            std::string value;
            codec::put_u32_le(value, layout::storage_format);
            txn.put(meta, layout::format_key, value);
        } else if (v->size() != 4 || codec::get_u32_le(*v) != layout::storage_format) {
            throw_error(errc::format_mismatch, "'" + options.path.string() + "' holds storage format " +
                                                   (v->size() == 4 ? std::to_string(codec::get_u32_le(*v)) : "?") +
                                                   ", this build reads format " + std::to_string(layout::storage_format));
        }
    });
    open_feed();
}

void store::impl::open_tables() {
    // Everything is opened first and swapped in at the end: a failure half way leaves the
    // previous handles and indexes in place, never a partial set.
    auto new_streams = env->table(layout::streams_table(options.consumer));
    auto new_parked = env->table(layout::parked_table(options.consumer));
    auto new_dead = env->table(layout::dead_letter_table(options.consumer));
    auto new_checkpoints = env->table(layout::checkpoint_table(options.consumer));
    auto new_collisions = env->table(layout::collision_table(options.consumer));
    auto new_ids = std::make_unique<id_log>(*env, layout::inbox_table(options.consumer), layout::inbox_extra_words);
    auto new_event_ids = std::make_unique<detail::event_id_log>(*env, options.consumer, new_ids->table());
    auto new_event_contents =
        std::make_unique<id_log>(*env, layout::event_contents_table(options.consumer), layout::inbox_extra_words);
    std::vector<MDB_dbi> new_tables;
    std::vector<std::unique_ptr<id_log>> new_contributors;
    std::vector<std::unique_ptr<detail::row_journal>> new_journals;
    for (const auto& p : projections) {
        new_tables.push_back(env->table(layout::rows_table(p->name())));
        new_contributors.push_back(std::make_unique<id_log>(*env, layout::contrib_table(p->name())));
        new_journals.push_back(std::make_unique<detail::row_journal>(*env, p->name(), meta));
    }
    streams = new_streams;
    parked = new_parked;
    dead = new_dead;
    checkpoints = new_checkpoints;
    collisions = new_collisions;
    ids = std::move(new_ids);
    event_ids = std::move(new_event_ids);
    event_contents = std::move(new_event_contents);
    tables = std::move(new_tables);
    contributors = std::move(new_contributors);
    journals = std::move(new_journals);
    index_pages();
}

void store::impl::open_projection(const projection_base& p) {
    tables.push_back(env->table(layout::rows_table(p.name())));
    contributors.push_back(std::make_unique<id_log>(*env, layout::contrib_table(p.name())));
    journals.push_back(std::make_unique<detail::row_journal>(*env, p.name(), meta));
    index_pages();
}

void store::impl::rolled_back() {
    kept.clear();  // a failed batch may have changed them
    ids->rolled_back();
    event_contents->rolled_back();
    for (auto& c : contributors) c->rolled_back();
    for (auto& j : journals) j->rolled_back();
}

store::store(store_options options) : impl_(std::make_unique<impl>()) {
    if (options.consumer.empty() || options.consumer.find('/') != std::string::npos) {
        throw_error(errc::invalid_argument, "consumer name '" + options.consumer + "' must be non-empty without '/'");
    }
    impl_->options = std::move(options);
    auto& o = impl_->options;
    const auto& r = o.retention;
    if (r.source && r.inbox_retention && *r.inbox_retention < r.source->bound) {
        throw_error(errc::invalid_argument,
                    "'" + o.path.string() + "': inbox_retention of " + format_duration(*r.inbox_retention) +
                        " is shorter than the source's redelivery bound of " + format_duration(r.source->bound) +
                        (r.source->what.empty() ? std::string() : " (" + r.source->what + ")") +
                        ": ids would be pruned while the source may still redeliver them");
    }
    if (r.resend_within && r.allowed_lateness && *r.allowed_lateness < *r.resend_within) {
        throw_error(errc::invalid_argument,
                    "'" + o.path.string() + "': allowed_lateness of " + format_duration(*r.allowed_lateness) +
                        " is shorter than the source's re-send delay of " + format_duration(*r.resend_within) +
                        ": a re-sent event's effect key could be forgotten before the copy arrives, and be applied twice");
    }
    environment_options eo;
    eo.map_size = std::min(o.tuning.map_size, o.tuning.max_map_size);
    eo.max_map_size = o.tuning.max_map_size;
    eo.sync = o.sync;
    eo.wait_for_writer = o.wait_for_writer;
    impl_->env = environment::open(o.path, eo);
    impl_->open_meta();
    impl_->open_tables();
}

void store::reopen() {
    impl_->rolled_back();
    impl_->env->reopen();
    impl_->open_meta();
    impl_->open_tables();
}

store::~store() = default;

store& store::add_projection(std::unique_ptr<projection_base> p) {
    for (const auto& existing : impl_->projections) {
        if (existing->name() == p->name()) {
            throw_error(errc::invalid_argument, "projection '" + p->name() + "' added twice");
        }
    }
    if (p->name().empty() || p->name().find('/') != std::string::npos) {
        throw_error(errc::invalid_argument, "projection name '" + p->name() + "' must be non-empty without '/'");
    }
    p->check();
    impl_->open_projection(*p);
    impl_->projections.push_back(std::move(p));
    return *this;
}

store& store::upcast(upcaster step) {
    impl_->upcasts.add(std::move(step));
    return *this;
}

snapshot store::read() const { return detail::snapshot_of(impl_->env); }

std::uint64_t store::last_commit() const { return read().commit(); }

std::size_t store::inbox_size() const { return impl_->ids->size(); }

const std::shared_ptr<environment>& detail::store_access::env(const store& s) noexcept { return s.impl_->env; }

const store_options& store::options() const noexcept { return impl_->options; }

}  // namespace idem
