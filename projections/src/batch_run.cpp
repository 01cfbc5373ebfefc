// One batch, in one write transaction, read top-down as the idempotency argument:
//
//   store::apply           retries the whole batch after growing the map; nothing is half-stored
//   impl::run              one transaction: deliver all, prune what expired, finish, commit
//   deliver_all            each delivery in order, its outcome counted, the checkpoint staged
//   deliver                the inbox: a message id seen before is a duplicate (or, with other
//                          content, an id conflict), else recorded with this batch; the lookups
//                          are inbox_lookup.cpp
//   process                the stream: a sequence at or below the stream's is a duplicate, one
//                          past a gap is parked; unsequenced: the event-time horizon
//   release_parked         the parked successors a sequence frees, each prepared as a delivery
//                          is and taken through process again
//   apply_projections      per row: its sequence and contributing set say whether it holds the
//                          effect; handlers run on copies, all-or-nothing per event
//   finish                 rows, ids, effect keys, streams, parked events, dead letters,
//                          checkpoint, counters and the commit number, in the same transaction
//
// Outcomes are returned only after the commit succeeded. The guards these steps consult follow
// them; what they read (rows, streams, parked events) is batch_reads.cpp, what they bring into
// cache ahead of time batch_prefetch.cpp, the texts their outcomes carry outcome_texts.cpp, and
// the operator's view of a run is operator_run.cpp.

#include "store_internal.hpp"

#include "outcome_texts.hpp"

#include <idem/projections/explain.hpp>

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/log_position.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>

#include <algorithm>
#include <utility>

namespace idem {

std::vector<outcome> store::apply(std::span<const delivery> batch, const std::optional<checkpoint>& at) {
    return apply(prepare(batch), at);
}

std::vector<outcome> store::apply(const prepared_batch& batch, const std::optional<checkpoint>& at) {
    return at ? apply(batch, std::span<const checkpoint>(&*at, 1)) : apply(batch, std::span<const checkpoint>());
}

std::vector<outcome> store::apply(const prepared_batch& batch, std::span<const checkpoint> at) {
    if (impl_->bulk) {
        try {
            return impl_->run_bulk(batch, at);
        } catch (...) {
            impl_->abandon_bulk();
            throw;
        }
    }
    return impl_->until_committed([&] { return impl_->run(batch, at); });
}

outcome store::apply(const delivery& d) { return apply(std::span<const delivery>(&d, 1)).front(); }

std::vector<outcome> store::impl::run(const prepared_batch& prepared, std::span<const checkpoint> at) {
    crash_point("after_decode");
    write_txn txn{*env};
    detail::batch_run run{*this, txn, detail::batch_run::kind::live};
    auto outcomes = run.deliver_all(prepared.items_, at);
    prune_steps pruned;
    prune_in_batch(txn, run, pruned);  // expired entries leave with the batch's own commit
    run.finish();
    detail::before_commit(options, run.commit());
    crash_point("before_commit");
    txn.commit();
    kept.commit = run.commit();  // the rows it kept are now this commit's
    crash_point("after_commit");
    forget_pruned(pruned);
    ids->committed();
    event_contents->committed();
    for (auto& c : contributors) c->committed();
    return outcomes;
}

namespace detail {

batch_run::batch_run(store::impl& s, write_txn& txn, kind k)
    : s_(s),
      txn_(txn),
      bulk_(k == kind::bulk),
      live_(k == kind::live),
      kept_(live_ ? s_.kept : own_),
      rows_(kept_.rows),
      streams_(kept_.streams) {
    s_.ids->catch_up(txn_);
    s_.event_contents->catch_up(txn_);
    s_.event_ids->clear();
    for (auto& c : s_.contributors) c->catch_up(txn_);
    for (std::size_t p = 0; p < s_.journals.size(); ++p) {
        s_.journals[p]->catch_up(txn_);
        if (bulk_) s_.journals[p]->fold_all(txn_, s_.tables[p]);
    }
    if (auto v = txn_.get(s_.meta, layout::commit_key); v && v->size() >= 8) commit_ = codec::get_u64_le(*v) + 1;
    stats = layout::decode_stats(txn_.get(s_.meta, layout::stats_key(s_.options.consumer)));
    clock_ = layout::decode_clock(txn_.get(s_.meta, layout::clock_key(s_.options.consumer)));
    for (const auto& p : s_.projections) {
        contrib_floors_.push_back(layout::u64_or_zero(txn_.get(s_.meta, layout::contrib_floor_key(p->name()))));
    }
    take_kept();
}

std::vector<outcome> batch_run::deliver_all(std::span<const std::unique_ptr<prepared_batch::item>> batch,
                                            std::span<const checkpoint> at) {
    source_ = at.size() == 1 ? at.front().source : std::string();
    std::vector<outcome> outcomes;
    outcomes.reserve(batch.size());
    for (std::size_t i = 0; i < batch.size(); ++i) {
        prefetch_ahead(batch, i);  // what later deliveries read comes in while this one applies
        if (i == batch.size() / 2 && i != 0) crash_point("mid_batch");
        outcomes.push_back(deliver(*batch[i]));
        outcomes.back().commit = commit_;
        ++stats.outcomes[static_cast<std::size_t>(outcomes.back().kind)];
    }
    for (const auto& c : at) {
        if (c.keep_highest) {
            auto stored = checkpoints_.contains(c.source) ? std::optional<std::string_view>(checkpoints_[c.source])
                                                          : txn_.get(s_.checkpoints, c.source);
            // Positions compare within one incarnation of the source (the detail: a stream's creation).
            if (stored && stored->size() >= 8 && stored->substr(8) == c.detail &&
                codec::get_u64_le(*stored) >= c.position) {
                continue;
            }
        }
        checkpoints_[c.source] = layout::encode_checkpoint(c.position, c.detail);
    }
    return outcomes;
}

outcome batch_run::deliver(const item& d) {
    const bool malformed = d.err.why != reason::none;
    // Without a valid envelope only a transport id can identify a redelivery.
    std::string transport;
    if (malformed && !d.transport_id.empty()) transport = transport_message_id(d.transport, d.transport_id);
    const std::string& message_id = malformed ? transport : d.message_id;
    const auto hash = malformed ? id_log::hash_of(message_id) : d.message_hash;
    std::optional<std::string> collision;  // the transport id was first used by another event
    if (auto seen = seen_message(d, message_id, hash, malformed, collision)) return std::move(*seen);
    // An event id names one event whatever transport carries it: under a new message id, an event
    // id processed with other content is an id conflict too.
    std::optional<outcome> conflict;
    bool record_contents = false;  // event_contents records the event id (it came under a transport id)
    if (!malformed) conflict = event_id_conflict(d, message_id, hash, record_contents);
    clock_before_ = clock_.event_time;
    // A conflict is the same event again: it neither votes nor moves the clock.
    const bool future = !conflict && d.time_ns && ahead(*d.time_ns, d.identity, d.ev.source);
    // The clock's 0 means "no event time yet": an event stamped 1970-01-01T00:00:00Z sets it 1 ns
    // later, so that the events after it are checked against it.
    if (!conflict && d.time_ns && !future) clock_.event_time = std::max({clock_.event_time, *d.time_ns, std::uint64_t{1}});
    const auto stamp = s_.options.retention.clock == retention_clock::event ? clock_.event_time : time_ns_;
    // A collision's id is in the inbox already (the first event's); this event is not recorded under it.
    const bool record = !message_id.empty() && !collision;
    if (record) s_.ids->stage(message_id, stamp, hash);
    // Transport ids ('m' unnamed transport, 't' named) are what `why --event` must map back to the event.
    if (record && !malformed && layout::is_transport_key(message_id)) {
        s_.event_ids->stage(message_id, d.ev, stamp);
    }
    auto result = conflict  ? std::move(*conflict)
                  : malformed ? dead(d, d.err.why, outcome_text::malformed(d.err.detail), message_id)
                              : process(d, future);
    // An entry under the event id itself is its own identity: it keeps the event's shape instead.
    layout::inbox_first first{d.fingerprint, commit_, result.kind, result.why,
                              layout::is_event_key(message_id) ? d.shape : d.identity};
    if (record) s_.ids->annotate_last(layout::encode_inbox_first(first));
    if (record_contents) {
        s_.event_contents->stage(d.event_key, stamp, d.event_key_hash);
        first.event_mark = d.shape;  // keyed by the event id, as event-key entries are
        s_.event_contents->annotate_last(layout::encode_inbox_first(first));
    }
    if (collision) {
        outcome_text::append_collision_outcome(*collision, result);
        collisions_.push_back(layout::encode_dead_letter(reason::transport_collision, *collision, message_id, d.body, time_ns_));
        result.detail = result.detail.empty() ? *collision : *collision + "; " + result.detail;
    }
    return result;
}

outcome batch_run::process(const item& d, bool future) {
    const auto& ev = d.ev;
    if (!ev.sequence) {
        if (future) return future_event(d);
        if (!d.parts.empty()) {
            if (auto rejected = late(d)) return std::move(*rejected);
        }
        return apply_projections(d);
    }
    auto seq = *ev.sequence;
    // The parked key escapes the subject (at most doubling it) and appends 10 bytes: measure only when it may not fit.
    if (2 * ev.subject.size() + 10 > txn_.env().max_key_size() &&
        layout::parked_key(ev.subject, seq).size() > txn_.env().max_key_size()) {
        return dead(d, reason::key_too_long, outcome_text::subject_too_long(ev));
    }
    auto& entry = stream(ev.subject, d.subject_hash);  // a reference into a deque: stable while the batch runs
    auto& st = entry.value;
    const auto highest = st.highest;
    if (seq <= highest) {
        return outcome{outcome_kind::duplicate_event, reason::none, outcome_text::sequence_applied(ev, seq, highest), 0};
    }
    if (seq > highest + 1) {
        if (s_.options.gaps == gap_policy::reject) {
            return dead(d, reason::sequence_gap, outcome_text::sequence_gap(ev, seq, highest + 1));
        }
        if (s_.options.gaps == gap_policy::park) {
            auto key = layout::parked_key(ev.subject, seq);
            if (auto existing = parked_value(key)) {
                if (parked_event_id(*existing) == ev.event_id()) {
                    return outcome{outcome_kind::duplicate_event, reason::none, outcome_text::already_parked(ev, seq), 0};
                }
                return dead(d, reason::sequence_conflict, outcome_text::sequence_held(ev, seq));
            }
            parked_[key] = layout::encode_parked(d.message_id, ev.event_id(), d.body);
            parked_possible_ = true;
            ++st.parked;
            return outcome{outcome_kind::parked, reason::none, outcome_text::parked(ev, seq, highest + 1), 0};
        }
    }
    // A dead-lettered event still moves its stream on: it is kept for the operator, and
    // holding every later event of the stream behind it would stall the aggregate.
    auto result = future ? future_event(d) : apply_projections(d);
    st.highest = std::max(highest, seq);
    mark_dirty(entry);
    // A released event's successors are released by the loop that released it.
    if (!d.from_store) release_parked(ev.subject, st);
    return result;
}

void batch_run::release_parked(const std::string& subject, stream_state& st) {
    if (s_.options.gaps != gap_policy::park || !parked_possible_) return;
    // Most streams wait for nothing: no parked key to build and look up after each of their events.
    if (!parked_in_table_ && st.parked == 0) return;
    std::optional<item> released;  // made for the first, reused along the stream
    for (;;) {
        auto key = layout::parked_key(subject, st.highest + 1);
        auto value = parked_value(key);
        if (!value) return;
        parked_[key] = std::nullopt;
        if (st.parked > 0) --st.parked;
        const auto stored = layout::decode_parked_value(*value);
        auto& d = released ? *released : released.emplace();
        d.from_store = true;
        d.body.assign(stored.body);
        if (!prepare_envelope(s_, d, s_.parser)) {
            throw_error(errc::corrupt_record, "parked event of '" + subject + "' no longer parses: " + d.err.detail);
        }
        d.message_id.assign(stored.message_id);  // the id it was recorded under when parked
        d.message_hash = id_log::hash_of(d.message_id);
        // Judged against the event time as it is now (parked, it did not move it), without a vote.
        auto result = process(d, far_ahead(d.time_ns));
        ++stats.released;
        if (result.kind == outcome_kind::dead_lettered) {
            ++stats.outcomes[static_cast<std::size_t>(outcome_kind::dead_lettered)];
        }
    }
}

outcome batch_run::apply_projections(const item& d) {
    const auto& ev = d.ev;
    meta m{ev.id, ev.source, ev.type, ev.subject, ev.sequence, ev.time, {}};
    unstage();  // the boxes a dead-lettered event staged return to the spares
    auto& staged = staged_;
    const bool handled = !d.parts.empty();
    // An event that changes one row may run an in-place handler on the row's state itself: a
    // throw leaves it unchanged, and there is no other row to keep in step with it.
    const bool one_row = d.parts.size() == 1 && d.parts.front().keys.size() == 1;
    const auto limit = txn_.env().max_key_size();

    for (const auto& pt : d.parts) {
        if (pt.failed != reason::none) return dead(d, pt.failed, pt.detail);
        const auto p = pt.projection;
        const auto& proj = *s_.projections[p];
        const auto& effect = pt.effect;
        for (std::size_t k = 0; k < pt.keys.size(); ++k) {
            const auto& key = pt.keys[k];
            const auto& contributor = pt.contributors[k];
            if (contributor.size() > limit) {
                return dead(d, reason::key_too_long,
                            outcome_text::key_too_long(ev, proj.name(), key,
                                                       effect ? effect->size() : ev.event_id().size(), limit));
            }
            row_entry* loaded = nullptr;
            try {
                loaded = &load_row(p, key, pt.key_hashes[k]);
            } catch (const migration_failed& e) {
                return dead(d, reason::upcast_failed, outcome_text::upcast_failed(ev, key, e.what()));
            }
            auto& slot = loaded->value;
            const bool own_stream = ev.sequence && key == ev.subject;
            if (own_stream && *ev.sequence <= slot.header.highest_sequence) continue;
            if (holds(p, contributor, pt.contributor_hashes[k])) continue;
            const bool in_place = one_row && pt.handler->in_place;
            auto copy = in_place ? nullptr : copy_of(p, *slot.state);
            m.key = key;
            try {
                pt.handler->apply(in_place ? *slot.state : *copy, pt.decoded.get(), m);
            } catch (const std::exception& e) {
                return dead(d, reason::handler_failed, outcome_text::handler_threw(ev, proj.name(), key, e.what()));
            }
            staged.push_back(staged_change{p, loaded, std::move(copy), &contributor, pt.contributor_hashes[k], own_stream});
        }
    }
    if (!handled) {
        if (s_.options.unknown_types == unknown_type_policy::dead_letter) {
            return dead(d, reason::unknown_type, outcome_text::unknown_type(ev));
        }
        return outcome{outcome_kind::ignored, reason::none, outcome_text::not_handled(ev), 0};
    }
    if (staged.empty()) {
        return outcome{outcome_kind::duplicate_event, reason::none, outcome_text::every_row_holds(ev), 0};
    }
    // All handlers succeeded: only now does the event touch the batch's rows. Contributing-set
    // entries carry the event time (the horizon prunes by it), or the consumer's without one.
    const auto stamp = d.time_ns.value_or(clock_.event_time);  // prepare parsed ev.time
    for (auto& c : staged) {
        auto& slot = c.row->value;
        if (c.state) std::swap(slot.state, c.state);  // the row's previous state becomes a spare in unstage()
        slot.header.applied += 1;
        if (c.own_stream) slot.header.highest_sequence = std::max(slot.header.highest_sequence, *ev.sequence);
        mark_dirty(c.projection, *c.row);
        s_.contributors[c.projection]->stage(*c.contributor, stamp, c.contributor_hash);
    }
    unstage();
    return outcome{outcome_kind::applied, reason::none, {}, 0};
}

std::unique_ptr<detail::state_box> batch_run::copy_of(std::size_t p, const detail::state_box& state) {
    if (spare_states_.size() <= p) spare_states_.resize(s_.projections.size());
    auto& spares = spare_states_[p];
    if (spares.empty()) return state.clone();
    auto box = std::move(spares.back());
    spares.pop_back();
    state.copy_to(*box);
    return box;
}

void batch_run::unstage() {
    constexpr std::size_t kept = 16;  // per projection: more than any event's rows in practice
    for (auto& c : staged_) {
        if (c.state && spare_states_[c.projection].size() < kept) spare_states_[c.projection].push_back(std::move(c.state));
    }
    staged_.clear();
}

// --- finish: what it writes ----------------------------------------------------------------------

void batch_run::finish() {
    std::string value;
    write_rows();
    for (auto& c : s_.contributors) c->write(txn_);
    s_.ids->write(txn_);
    s_.event_contents->write(txn_);
    s_.event_ids->write(txn_);
    write_dead_letters();
    write_collisions();
    std::vector<std::pair<std::string_view, std::uint64_t>> dirty_streams;
    for (auto* e : dirty_streams_) {
        dirty_streams.emplace_back(e->key, e->value.highest);
        e->value.dirty = false;
    }
    dirty_streams_.clear();
    std::sort(dirty_streams.begin(), dirty_streams.end());
    for (const auto& [subject, highest] : dirty_streams) {
        value.clear();
        codec::put_u64_le(value, highest);
        txn_.put(s_.streams, subject, value);
    }
    for (const auto& [key, v] : parked_) {
        if (v) {
            txn_.put(s_.parked, key, *v);
        } else {
            txn_.del(s_.parked, key);
        }
    }
    if (live_) {
        kept_.parked_entries = txn_.entries(s_.parked);
        kept_.stream_entries = txn_.entries(s_.streams);
    }
    for (const auto& [source, stored] : checkpoints_) txn_.put(s_.checkpoints, source, stored);
    if (bulk_) record_resets();
    record_change_time();
    stats.batches += 1;
    txn_.put(s_.meta, layout::stats_key(s_.options.consumer), layout::encode_stats(stats));
    txn_.put(s_.meta, layout::clock_key(s_.options.consumer), layout::encode_clock(clock_));
    value.clear();
    codec::put_u64_le(value, commit_);
    txn_.put(s_.meta, layout::commit_key, value);
}

void batch_run::write_rows() {
    std::string value;
    struct dirty_row {
        std::pair<std::size_t, std::string> id;  // projection, row key
        std::uint64_t hash;                      // of the aggregate key (row_journal::key_hash)
        row_slot* slot;
        const std::string* key;                  // the aggregate key
    };
    std::vector<dirty_row> dirty;
    dirty.reserve(dirty_rows_.size());
    for (auto [p, e] : dirty_rows_) dirty.push_back({{p, codec::row_key(e->key)}, e->hash, &e->value, &e->key});
    dirty_rows_.clear();
    std::sort(dirty.begin(), dirty.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    std::string state;
    std::size_t table = SIZE_MAX;
    std::string last;  // the table's last key before this write: keys after it are appended
    std::optional<cursor> appender;
    std::vector<std::size_t> journaled(s_.journals.size());
    for (auto& [id, hash, slot, key] : dirty) {
        const auto& proj = *s_.projections[id.first];
        slot->header.state_version = proj.state_version();
        state.clear();
        proj.save(*slot->state, state);
        value.clear();
        codec::encode_row(value, slot->header, state);
        slot->dirty = false;
        count_size(*slot, value.size());
        if (!bulk_) {
            record_change(id.first, *key, slot->header, state);
            s_.journals[id.first]->append(txn_, id.second, value, hash);
            ++journaled[id.first];
            continue;
        }
        // A bulk build writes each table's keys in order: its B-tree is walked left to right once.
        if (id.first != table) {
            table = id.first;
            appender.emplace(txn_, s_.tables[table]);
            auto e = appender->last();
            last = e ? std::string(e->first) : std::string();
        }
        if (last.empty() || id.second > last) {
            appender->put(id.second, value, MDB_APPEND);  // through one cursor: no search from the root
        } else {
            txn_.put(s_.tables[id.first], id.second, value);
        }
    }
    // Each batch folds twice what it journaled: the frozen journal is empty before the active
    // one is due to take its place.
    for (std::size_t p = 0; p < journaled.size(); ++p) {
        s_.journals[p]->fold(txn_, s_.tables[p], 2 * journaled[p], s_.options.tuning.journal_rows);
    }
}

namespace {

// Appends records to a table keyed by position (u64 BE, after every existing one) and forgets them.
void append_at_positions(write_txn& txn, MDB_dbi table, std::vector<std::string>& records) {
    if (records.empty()) return;
    cursor c{txn, table};
    auto last = c.last();
    std::uint64_t position = last ? codec::get_u64_be(last->first) + 1 : 1;
    for (const auto& r : records) txn.put(table, codec::u64_key(position++), r, MDB_APPEND);
    records.clear();
}

}  // namespace

void batch_run::write_dead_letters() { append_at_positions(txn_, s_.dead, dead_letters_); }

void batch_run::write_collisions() { append_at_positions(txn_, s_.collisions, collisions_); }

// --- the guards the steps consult ----------------------------------------------------------------

bool batch_run::future_guarded() const {
    const auto& r = s_.options.retention;
    return r.max_future_skew && (r.allowed_lateness || (r.inbox_retention && r.clock == retention_clock::event));
}

bool batch_run::ahead(std::uint64_t time, std::uint64_t identity, std::string_view source) {
    // An event far ahead of the consumer's event time is held against it (one bad clock must not
    // move the horizon for everyone) until enough such events agree that the source jumped forward.
    const auto& r = s_.options.retention;
    if (!future_guarded()) return false;
    const auto skew = count_ns(*r.max_future_skew);
    // Past the wall clock, the event's own source is no witness: one misconfigured producer
    // repeats its bad time as often as it sends.
    const bool past_wall = beyond_wall(time);
    if (clock_.event_time == 0) {
        if (!past_wall) return false;  // the first event sets the clock, unless it claims the future
    } else if (time <= clock_.event_time || time - clock_.event_time <= skew) {
        return false;
    }
    // Votes are distinct events: the same outlier re-sent under new message ids votes once.
    auto& votes = clock_.jump_votes;
    auto& sources = clock_.jump_sources;
    const auto from = layout::source_identity(source);
    const auto lo = std::min(time, clock_.jump_time);
    const auto hi = std::max(time, clock_.jump_time);
    if (!votes.empty() && hi - lo <= skew) {
        clock_.jump_time = lo;
        if (std::find(votes.begin(), votes.end(), identity) == votes.end()) votes.push_back(identity);
        if (std::find(sources.begin(), sources.end(), from) == sources.end()) sources.push_back(from);
    } else {
        clock_.jump_time = time;
        votes.assign(1, identity);
        sources.assign(1, from);
    }
    const std::size_t needed = std::max<std::uint32_t>(1, r.future_confirmations);
    if (votes.size() < needed) return true;
    if (past_wall && sources.size() < std::min<std::size_t>(2, needed)) return true;
    clock_.jump_time = 0;
    votes.clear();
    sources.clear();
    return false;
}

bool batch_run::beyond_wall(std::uint64_t time) const {
    const auto& skew = s_.options.retention.max_future_skew;
    return skew && time > time_ns_ && time - time_ns_ > count_ns(*skew);
}

bool batch_run::far_ahead(std::optional<std::uint64_t> time) const {
    const auto& skew = s_.options.retention.max_future_skew;
    if (!time || !skew || !future_guarded()) return false;
    if (clock_.event_time == 0) return beyond_wall(*time);
    return *time > clock_.event_time && *time - clock_.event_time > count_ns(*skew);
}

outcome batch_run::future_event(const item& d) {
    ++stats.future_events;
    const auto& ev = d.ev;
    const auto skew = format_duration(*s_.options.retention.max_future_skew);
    const bool no_event_time = clock_.event_time == 0;
    const auto ahead_ms = (*d.time_ns - (no_event_time ? time_ns_ : clock_.event_time)) / 1'000'000;
    std::optional<std::size_t> past_wall_sources;
    if (beyond_wall(*d.time_ns)) past_wall_sources = clock_.jump_sources.size();
    return dead(d, reason::future_event, outcome_text::future_event(ev, ahead_ms, no_event_time, skew, past_wall_sources));
}

std::optional<outcome> batch_run::late(const item& d) {
    // The contributing sets of these rows prove an unsequenced event new only above their floor
    // (where they may have been pruned) and, by policy, the horizon.
    const auto& lateness = s_.options.retention.allowed_lateness;
    std::uint64_t floor = 0;
    if (lateness && clock_before_ > count_ns(*lateness)) floor = clock_before_ - count_ns(*lateness);
    for (const auto& pt : d.parts) floor = std::max(floor, contrib_floors_[pt.projection]);
    if (!lateness && floor == 0) return std::nullopt;
    const auto& ev = d.ev;
    const auto& time = d.time_ns;
    if (!time) {
        ++stats.late_events;
        return dead(d, reason::late_event, outcome_text::no_usable_time(ev));
    }
    if (*time >= floor) return std::nullopt;
    ++stats.late_events;
    return dead(d, reason::late_event, outcome_text::older_than_horizon(ev, (floor - *time) / 1'000'000));
}

bool batch_run::holds(std::size_t p, const std::string& contributor, std::uint64_t hash) const {
    // An entry counts until the horizon (as of the delivery being judged) passes its stamp, whether
    // or not a prune step has removed it yet: outcomes never depend on when pruning ran, so batch
    // sizes and a rebuild give the same ones. An expired entry may have been recorded again since.
    auto e = s_.contributors[p]->find(txn_, contributor, hash);
    if (!e) return false;
    const auto& lateness = s_.options.retention.allowed_lateness;
    if (!lateness || clock_before_ <= count_ns(*lateness)) return true;
    const auto horizon = clock_before_ - count_ns(*lateness);
    if (e->stamp >= horizon) return true;
    e = s_.contributors[p]->find_newest(txn_, contributor, hash);
    return e && e->stamp >= horizon;
}

outcome batch_run::dead(const item& d, reason why, std::string detail, std::string_view message_id) {
    // Read from a log: the dead letter keeps where (source, line, byte offset) as fields; the
    // outcome says it in its text, as `deadletters` and `why` do (path:line, or the byte offset
    // once resumed mid-file).
    layout::dead_letter_origin at;
    if (!d.from_store && log_source_path(source_)) at = {source_, d.line, d.offset};
    dead_letters_.push_back(layout::encode_dead_letter(why, detail, message_id, d.body, time_ns_, at, d.body_digest));
    if (!at.source.empty()) {
        dead_letter located;
        located.detail = std::move(detail);
        located.source = at.source;
        located.line = at.line;
        located.offset = at.offset;
        detail = located_detail(located);
    }
    return outcome{outcome_kind::dead_lettered, why, std::move(detail), 0};
}

}  // namespace detail

}  // namespace idem
