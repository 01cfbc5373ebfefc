#include "row_journal.hpp"

#include <idem/projections/layout.hpp>

#include <idem/storage/codec.hpp>
#include <idem/storage/error.hpp>

#include <lmdb.h>

#include <algorithm>
#include <iterator>

namespace idem::detail {

namespace {

void put_value(std::string& out, std::string_view row_key, std::string_view record) {
    out.clear();
    codec::put_u32_le(out, static_cast<std::uint32_t>(row_key.size()));
    out.append(row_key);
    out.append(record);
}

// Copies the record out of the journal's page before the row table's put changes pages.
void put_row(write_txn& txn, MDB_dbi rows, std::string_view key, std::string_view record) {
    thread_local std::string copy;
    copy.assign(record);
    txn.put(rows, key, copy);
}

// Calls fn(sequence, row key, record) for each journal entry of table from sequence from on.
template <class F>
void for_each_entry(const txn_base& txn, MDB_dbi table, std::uint64_t from, F&& fn) {
    cursor c{txn, table};
    for (auto e = from <= 1 ? c.first() : c.seek(codec::u64_key(from)); e; e = c.next()) {
        const auto [key, record] = row_journal::split(e->second);
        fn(codec::get_u64_be(e->first), key, record);
    }
}

// Sets a key's latest sequence in a journal's map; a key new to the map also goes to order
// (a view of the map's own copy, which stays put).
void note_latest(string_table<std::uint64_t>& map, std::vector<std::string_view>& order, std::string_view key,
                 std::uint64_t hash, std::uint64_t seq) {
    auto [entry, inserted] = map.try_emplace(key, hash);
    entry->value = seq;
    if (inserted) order.push_back(entry->key);
}

// Merges the newest of a list of sorted runs into the one before it.
void merge_newest(std::vector<std::vector<std::string_view>>& runs) {
    auto& a = runs[runs.size() - 2];
    const auto& b = runs.back();
    std::vector<std::string_view> merged;
    merged.reserve(a.size() + b.size());
    std::merge(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(merged));
    a = std::move(merged);
    runs.pop_back();
}

void empty_table(write_txn& txn, MDB_dbi table, const std::string& what) {
    if (int rc = mdb_drop(txn.handle(), table, 0); rc != 0) throw_lmdb(rc, "cannot empty " + what);
}

}  // namespace

std::string row_journal::meta_key(std::string_view projection) { return layout::journal_key(projection); }

std::string row_journal::table_name(std::string_view projection, std::uint64_t parity) {
    return layout::journal_table(projection, parity);
}

std::pair<std::string_view, std::string_view> row_journal::split(std::string_view value) {
    if (value.size() < 4 || value.size() - 4 < codec::get_u32_le(value)) {
        throw_error(errc::corrupt_record, "truncated journal entry");
    }
    const auto n = codec::get_u32_le(value);
    return {value.substr(4, n), value.substr(4 + n)};
}

std::pair<std::uint64_t, std::string_view> row_journal::decode_meta(std::optional<std::string_view> v) {
    if (!v || v->size() < 8) return {0, {}};
    return {codec::get_u64_le(*v), v->substr(8)};
}

std::uint64_t row_journal::key_hash(std::string_view row_key) {
    // Without a NUL before its 00 00 ending, a row key is its aggregate key as is.
    const auto body = row_key.substr(0, row_key.size() - std::min<std::size_t>(2, row_key.size()));
    if (body.find('\0') == std::string_view::npos) return key_map::hash_of(body);
    const auto decoded = codec::decode_table_key(row_key);
    return key_map::hash_of(decoded ? std::string_view(decoded->aggregate) : row_key);
}

row_journal::row_journal(environment& env, const std::string& projection, MDB_dbi meta)
    : projection_(projection), meta_key_(meta_key(projection)), meta_(meta) {
    tables_[0] = env.table(table_name(projection, 0));
    tables_[1] = env.table(table_name(projection, 1));
}

void row_journal::catch_up(const txn_base& txn) {
    if (!stale_) {
        // Another writer (another process) changed the journals if the epoch, the fold cursor
        // or the active journal's last sequence moved.
        const auto [epoch, folded_to] = decode_meta(txn.get(meta_, meta_key_));
        cursor c{txn, active()};
        const auto last = c.last();
        const auto last_seq = last ? codec::get_u64_be(last->first) : 0;
        if (epoch == epoch_ && folded_to == cursor_ && last_seq + 1 == next_seq_) return;
    }
    load(txn);
}

void row_journal::load(const txn_base& txn) {
    const auto [epoch, folded_to] = decode_meta(txn.get(meta_, meta_key_));
    epoch_ = epoch;
    cursor_.assign(folded_to);
    active_.clear();
    active_runs_.clear();
    new_keys_.clear();
    frozen_.clear();
    frozen_order_.clear();
    folded_ = 0;
    next_seq_ = 1;
    for_each_entry(txn, active(), 1, [&](std::uint64_t seq, std::string_view key, std::string_view) {
        note_latest(active_, new_keys_, key, key_hash(key), seq);
        next_seq_ = seq + 1;
    });
    sort_new_keys();
    for_each_entry(txn, frozen(), 1, [&](std::uint64_t seq, std::string_view key, std::string_view) {
        note_latest(frozen_, frozen_order_, key, key_hash(key), seq);
    });
    std::sort(frozen_order_.begin(), frozen_order_.end());
    if (!cursor_.empty()) {
        folded_ = static_cast<std::size_t>(
            std::upper_bound(frozen_order_.begin(), frozen_order_.end(), std::string_view(cursor_)) -
            frozen_order_.begin());
    }
    stale_ = false;
}

void row_journal::sort_new_keys() {
    if (new_keys_.empty()) return;
    std::sort(new_keys_.begin(), new_keys_.end());
    active_runs_.push_back(std::move(new_keys_));
    new_keys_.clear();
    // Merge while the newest run is at least half the size of the one before it: the runs'
    // sizes fall geometrically, so there are few of them and each key is merged O(log n) times.
    while (active_runs_.size() >= 2 && 2 * active_runs_.back().size() >= active_runs_[active_runs_.size() - 2].size()) {
        merge_newest(active_runs_);
    }
}

row_journal::key_run row_journal::active_in_order() {
    sort_new_keys();
    while (active_runs_.size() >= 2) merge_newest(active_runs_);
    key_run all = active_runs_.empty() ? key_run{} : std::move(active_runs_.front());
    active_runs_.clear();
    return all;
}

std::optional<std::string_view> row_journal::record_at(const txn_base& txn, MDB_dbi table, std::uint64_t seq) const {
    auto v = txn.get(table, codec::u64_key(seq));
    if (!v) {
        throw_error(errc::corrupt_record, "journal of projection '" + projection_ + "' lacks entry " +
                                              std::to_string(seq) + " its index holds");
    }
    return split(*v).second;
}

std::optional<std::string_view> row_journal::find(const txn_base& txn, std::string_view row_key,
                                                  std::uint64_t hash) const {
    if (const auto* e = active_.find(row_key, hash)) return record_at(txn, active(), e->value);
    if (const auto* e = frozen_.find(row_key, hash)) return record_at(txn, frozen(), e->value);
    return std::nullopt;
}

void row_journal::append(write_txn& txn, std::string_view row_key, std::string_view record, std::uint64_t hash) {
    thread_local std::string value;
    put_value(value, row_key, record);
    const auto seq = next_seq_;
    stale_ = true;  // until the index below matches what the transaction holds
    txn.put(active(), codec::u64_key(seq), value, MDB_APPEND);
    note_latest(active_, new_keys_, row_key, hash, seq);
    next_seq_ = seq + 1;
    stale_ = false;
}

void row_journal::write_meta(write_txn& txn) {
    std::string value;
    codec::put_u64_le(value, epoch_);
    value.append(cursor_);
    txn.put(meta_, meta_key_, value);
}

void row_journal::fold(write_txn& txn, MDB_dbi rows, std::size_t n, std::size_t swap_at) {
    sort_new_keys();  // the keys this batch appended join the active journal's runs
    if (n == 0) return;
    stale_ = true;  // an exception half way leaves the index ahead of the aborted transaction
    bool changed = false;
    if (folded_ < frozen_order_.size()) {
        const auto end = std::min(frozen_order_.size(), folded_ + n);
        for (auto i = folded_; i < end; ++i) {
            const auto key = frozen_order_[i];
            const auto hash = key_hash(key);
            if (active_.find(key, hash)) continue;  // superseded: folded with the active journal later
            put_row(txn, rows, key, *record_at(txn, frozen(), frozen_.find(key, hash)->value));
        }
        folded_ = end;
        cursor_ = frozen_order_[end - 1];
        changed = true;
    }
    if (!frozen_order_.empty() && folded_ == frozen_order_.size()) {
        empty_table(txn, frozen(), "the frozen journal of projection '" + projection_ + "'");
        frozen_order_.clear();
        frozen_.clear();
        folded_ = 0;
        cursor_.clear();
        changed = true;
    }
    if (swap_at == 0) {
        // Automatic: sixteen rows per leaf of the row table, so that a fold writes each leaf
        // it touches for about sixteen rows.
        MDB_stat st{};
        if (int rc = mdb_stat(txn.handle(), rows, &st); rc != 0) throw_lmdb(rc, "cannot read the row table's size");
        swap_at = std::max<std::size_t>(1024, 16 * st.ms_leaf_pages);
    }
    if (frozen_order_.empty() && active_entries() >= swap_at) {
        ++epoch_;  // the active journal is frozen; the emptied one takes new rows
        frozen_order_ = active_in_order();
        frozen_ = std::move(active_);  // the nodes move, so the views in frozen_order_ stay valid
        active_.clear();
        next_seq_ = 1;
        cursor_.clear();
        changed = true;
    }
    if (changed) write_meta(txn);
    stale_ = false;
}

void row_journal::fold_all(write_txn& txn, MDB_dbi rows) {
    stale_ = true;
    for (auto i = folded_; i < frozen_order_.size(); ++i) {
        const auto key = frozen_order_[i];
        const auto hash = key_hash(key);
        if (!active_.find(key, hash)) put_row(txn, rows, key, *record_at(txn, frozen(), frozen_.find(key, hash)->value));
    }
    for (const auto key : active_in_order()) {
        put_row(txn, rows, key, *record_at(txn, this->active(), active_.find(key, key_hash(key))->value));
    }
    const bool had = !frozen_.empty() || !active_.empty() || !cursor_.empty();
    if (!frozen_.empty()) empty_table(txn, frozen(), "the frozen journal of projection '" + projection_ + "'");
    if (!active_.empty()) empty_table(txn, this->active(), "the journal of projection '" + projection_ + "'");
    frozen_order_.clear();
    frozen_.clear();
    active_.clear();
    folded_ = 0;
    next_seq_ = 1;
    cursor_.clear();
    if (had) {
        epoch_ += 2;  // the same table stays active, and readers see that the journals were reset
        write_meta(txn);
    }
    stale_ = false;
}

journal_view journal_view::read(const txn_base& txn, const journal_state& state) {
    journal_view view;
    // The frozen journal first: the active one's records are newer.
    for (const auto& t : {state.frozen, state.active}) {
        if (!t) continue;
        for_each_entry(txn, *t, 1, [&](std::uint64_t, std::string_view key, std::string_view record) {
            view.latest[key] = record;
        });
    }
    return view;
}

journal_state journal_state::read(const txn_base& txn, std::optional<MDB_dbi> meta, std::optional<MDB_dbi> table0,
                                  std::optional<MDB_dbi> table1, std::string_view projection) {
    journal_state st;
    if (meta) st.epoch = row_journal::decode_meta(txn.get(*meta, row_journal::meta_key(projection))).first;
    st.active = st.epoch % 2 == 0 ? table0 : table1;
    st.frozen = st.epoch % 2 == 0 ? table1 : table0;
    if (st.active) {
        cursor c{txn, *st.active};
        if (auto last = c.last()) st.active_last = codec::get_u64_be(last->first);
    }
    if (st.frozen) st.frozen_entries = txn.entries(*st.frozen);
    return st;
}

void journal_index::rebuild(const txn_base& txn, const journal_state& state) {
    active_.clear();
    frozen_.clear();
    if (state.frozen) {
        for_each_entry(txn, *state.frozen, 1,
                       [&](std::uint64_t seq, std::string_view key, std::string_view) { frozen_[std::string(key)] = seq; });
    }
    epoch_ = state.epoch;
    frozen_entries_ = state.frozen_entries;
    active_seen_ = 0;
    built_ = true;
}

bool journal_index::find(const txn_base& txn, const journal_state& state, std::string_view row_key,
                         std::optional<std::string_view>& out) {
    std::scoped_lock lock{mutex_};
    if (!built_ || state.epoch > epoch_) rebuild(txn, state);
    // An older epoch, or a frozen journal this index was read without (it was emptied by then).
    if (state.epoch != epoch_ || (state.frozen_entries > 0 && frozen_entries_ == 0)) return false;
    if (state.active && state.active_last > active_seen_) {
        // The snapshot's transaction sees no entry past its active_last.
        for_each_entry(txn, *state.active, active_seen_ + 1, [&](std::uint64_t seq, std::string_view key, std::string_view) {
            active_[std::string(key)].push_back(seq);
            active_seen_ = seq;
        });
    }
    out.reset();
    if (auto it = active_.find(row_key); it != active_.end() && state.active) {
        // The latest sequence this snapshot sees (later ones were appended after it began).
        auto seqs = it->second.rbegin();
        while (seqs != it->second.rend() && *seqs > state.active_last) ++seqs;
        if (seqs != it->second.rend()) {
            if (auto v = txn.get(*state.active, codec::u64_key(*seqs))) {
                out = row_journal::split(*v).second;
                return true;
            }
            return false;  // not where the index says: let the caller read the journals itself
        }
    }
    if (auto it = frozen_.find(row_key); it != frozen_.end() && state.frozen && state.frozen_entries > 0) {
        if (auto v = txn.get(*state.frozen, codec::u64_key(it->second))) {
            out = row_journal::split(*v).second;
            return true;
        }
        return false;
    }
    return true;  // in no journal this snapshot sees: the row table has it (or nobody)
}

const std::vector<std::pair<std::string_view, std::string_view>>& journal_view::sorted() {
    if (!sorted_built_) {
        sorted_.assign(latest.begin(), latest.end());
        std::sort(sorted_.begin(), sorted_.end());
        sorted_built_ = true;
    }
    return sorted_;
}

}  // namespace idem::detail
