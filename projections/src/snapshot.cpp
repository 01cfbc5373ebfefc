// The reader: a consistent read-only view of an environment (snapshot isolation).

#include "store_internal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>

#include <map>
#include <mutex>
#include <tuple>

namespace idem {

snapshot snapshot::open(const std::filesystem::path& path) {
    environment_options eo;
    eo.read_only = true;
    return snapshot{environment::open(path, eo)};
}

namespace {

// A snapshot may only use handles opened before its transaction began, on the same handle
// generation: refresh, begin, and start over if the environment was reopened in between.
read_txn begin_snapshot(environment& env) {
    for (;;) {
        auto generation = env.generation();
        env.refresh_tables();
        read_txn txn{env};
        if (env.generation() == generation) return txn;
    }
}

}  // namespace

namespace detail {
/// The journals of each projection as one snapshot sees them.
struct snapshot_journals_entry {
    journal_state state;
    std::shared_ptr<journal_index> index;  // shared by the environment's snapshots in this process
    std::optional<journal_view> view;      // read on first need: scans, and point reads the index cannot answer
};
struct snapshot_journals {
    std::mutex mutex;
    std::map<std::string, snapshot_journals_entry, std::less<>> projections;
};
}  // namespace detail

snapshot::snapshot(std::shared_ptr<environment> env)
    : env_(std::move(env)), txn_(begin_snapshot(*env_)), journals_(std::make_shared<detail::snapshot_journals>()) {}

std::optional<MDB_dbi> snapshot::table(const std::string& name) const {
    auto dbi = env_->try_table(name);
    unsigned flags = 0;
    // A table created after this snapshot began has a handle this transaction cannot use.
    if (dbi && mdb_dbi_flags(txn_.handle(), *dbi, &flags) != 0) return std::nullopt;
    return dbi;
}

MDB_dbi snapshot::row_table(std::string_view projection) const {
    auto t = table(layout::rows_table(projection));
    if (!t) throw_error(errc::unknown_projection, "no projection '" + std::string(projection) + "' in '" +
                                                       env_->path().string() + "'");
    return *t;
}

detail::journal_view& snapshot::journal(std::string_view projection) const {
    std::scoped_lock lock{journals_->mutex};
    auto& j = journals(projection);
    if (!j.view) j.view = detail::journal_view::read(txn_, j.state);
    return *j.view;
}

detail::snapshot_journals_entry& snapshot::journals(std::string_view projection) const {
    auto it = journals_->projections.find(projection);
    if (it == journals_->projections.end()) {
        const auto name = std::string(projection);
        detail::snapshot_journals_entry j;
        j.state = detail::journal_state::read(txn_, table(std::string(layout::meta_table)), table(detail::row_journal::table_name(name, 0)),
                                              table(detail::row_journal::table_name(name, 1)), name);
        j.index = std::static_pointer_cast<detail::journal_index>(env_->attachment(
            "journal-index/" + name, [] { return std::static_pointer_cast<void>(std::make_shared<detail::journal_index>()); }));
        it = journals_->projections.emplace(name, std::move(j)).first;
    }
    return it->second;
}

std::optional<snapshot::raw_row_view> snapshot::raw_row(std::string_view projection, std::string_view key) const {
    const auto t = row_table(projection);
    const auto row_key = codec::row_key(key);
    std::optional<std::string_view> v;
    bool answered = false;
    {
        std::scoped_lock lock{journals_->mutex};
        auto& j = journals(projection);
        answered = j.index->find(txn_, j.state, row_key, v);
    }
    if (!answered) {
        const auto& journaled = journal(projection).latest;
        if (auto it = journaled.find(row_key); it != journaled.end()) v = it->second;
    }
    if (!v) v = txn_.get(t, row_key);
    if (!v) return std::nullopt;
    auto r = codec::decode_row(*v);
    return raw_row_view{key, r.header.applied, r.header.highest_sequence, r.header.state_version, r.state};
}

snapshot::row_reader snapshot::read_rows(std::string_view projection) const {
    const auto t = row_table(projection);
    return row_reader{cursor{txn_, t}, std::string(projection), journal(projection).sorted()};
}

std::optional<snapshot::raw_row_view> snapshot::row_reader::next() {
    if (!started_) {
        table_row_ = cursor_.first();
        started_ = true;
    }
    // The table's rows and the journals' in one key order; a journaled row replaces the table's.
    std::string_view row_key;
    std::string_view record;
    const bool journal_left = at_ < journaled_->size();
    if (!table_row_ && !journal_left) return std::nullopt;
    if (journal_left && (!table_row_ || (*journaled_)[at_].first <= table_row_->first)) {
        std::tie(row_key, record) = (*journaled_)[at_++];
        if (table_row_ && table_row_->first == row_key) table_row_ = cursor_.next();
    } else {
        std::tie(row_key, record) = *table_row_;
        table_row_ = cursor_.next();
    }
    auto k = codec::decode_table_key(row_key);
    if (!k || !k->is_row) throw_error(errc::corrupt_record, "unreadable key in projection '" + projection_ + "'");
    key_.assign(k->aggregate);
    auto r = codec::decode_row(record);
    return raw_row_view{key_, r.header.applied, r.header.highest_sequence, r.header.state_version, r.state};
}

void snapshot::scan_raw(std::string_view projection, const std::function<void(const raw_row_view&)>& fn) const {
    auto rows = read_rows(projection);
    while (auto r = rows.next()) fn(*r);
}

void snapshot::scan_contributors(std::string_view projection, std::string_view key,
                                 const std::function<void(std::string_view effect)>& fn) const {
    auto t = table(layout::contrib_table(projection));
    if (!t) return;
    // The log is in commit order, not by row: a query walks all of it (diagnostics only;
    // the writer answers membership from its in-memory index).
    const auto prefix = codec::contributor_key(key, {});
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto id = e->second.substr(8);
        if (id.starts_with(prefix)) fn(id.substr(prefix.size()));
    }
}

std::size_t snapshot::contributors(std::string_view projection, std::string_view key) const {
    std::size_t n = 0;
    scan_contributors(projection, key, [&](std::string_view) { ++n; });
    return n;
}

bool snapshot::contributed(std::string_view projection, std::string_view key, std::string_view effect) const {
    bool found = false;
    scan_contributors(projection, key, [&](std::string_view e) { found = found || e == effect; });
    return found;
}

std::uint64_t snapshot::commit() const {
    auto t = table(std::string(layout::meta_table));
    if (!t) return 0;
    auto v = txn_.get(*t, layout::commit_key);
    return v && v->size() >= 8 ? codec::get_u64_le(*v) : 0;
}

std::optional<std::uint64_t> snapshot::checkpoint(std::string_view consumer, std::string_view source) const {
    auto t = table(layout::checkpoint_table(consumer));
    if (!t) return std::nullopt;
    auto v = txn_.get(*t, source);
    if (!v || v->size() < 8) return std::nullopt;
    return codec::get_u64_le(*v);
}

std::optional<std::string> snapshot::checkpoint_value(std::string_view consumer, std::string_view source) const {
    auto t = table(layout::checkpoint_table(consumer));
    if (!t) return std::nullopt;
    auto v = txn_.get(*t, source);
    if (!v || v->size() < 8) return std::nullopt;
    return std::string(*v);
}

std::vector<std::pair<std::string, std::uint64_t>> snapshot::checkpoints(std::string_view consumer) const {
    std::vector<std::pair<std::string, std::uint64_t>> out;
    auto t = table(layout::checkpoint_table(consumer));
    if (!t) return out;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        if (e->second.size() >= 8) out.emplace_back(std::string(e->first), codec::get_u64_le(e->second));
    }
    return out;
}

consumer_stats snapshot::stats(std::string_view consumer) const {
    auto t = table(std::string(layout::meta_table));
    if (!t) return {};
    return layout::decode_stats(txn_.get(*t, layout::stats_key(consumer)));
}

std::size_t snapshot::inbox_size(std::string_view consumer) const {
    auto t = table(layout::inbox_table(consumer));
    return t ? txn_.entries(*t) : 0;
}

std::size_t snapshot::parked(std::string_view consumer) const {
    auto t = table(layout::parked_table(consumer));
    return t ? txn_.entries(*t) : 0;
}

std::size_t snapshot::dead_letter_count(std::string_view consumer) const {
    auto t = table(layout::dead_letter_table(consumer));
    return t ? txn_.entries(*t) : 0;
}

std::optional<snapshot::inbox_record> snapshot::inbox_lookup(std::string_view consumer,
                                                             std::string_view message_id) const {
    auto t = table(layout::inbox_table(consumer));
    if (!t) return std::nullopt;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto entry = layout::decode_inbox_entry(e->second);
        if (entry && entry->message_id == message_id) return entry->record;
    }
    return std::nullopt;
}

std::optional<std::pair<std::string, snapshot::inbox_record>> snapshot::inbox_lookup_transport_id(
    std::string_view consumer, std::string_view transport_id) const {
    auto t = table(layout::inbox_table(consumer));
    if (!t) return std::nullopt;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto entry = layout::decode_inbox_entry(e->second);
        if (!entry || !entry->message_id.ends_with(transport_id)) continue;
        // A transport id ("m..." or "t<n>:<transport>..."), not an event id that ends alike.
        const auto key = entry->message_id;
        if (!key.starts_with('m') && !key.starts_with('t')) continue;
        if (split_message_id(key).second != transport_id) continue;
        return std::pair{std::string(key), entry->record};
    }
    return std::nullopt;
}

snapshot::retention_state snapshot::retention(std::string_view consumer) const {
    retention_state r;
    if (auto m = table(std::string(layout::meta_table))) {
        auto clock = layout::decode_clock(txn_.get(*m, layout::clock_key(consumer)));
        r.event_time = clock.event_time;
        r.inbox_floor = clock.inbox_floor;
    }
    if (auto t = table(layout::inbox_table(consumer))) {
        cursor c{txn_, *t};
        if (auto first = c.first(); first && first->second.size() >= 8) r.oldest = codec::get_u64_le(first->second);
    }
    return r;
}

std::optional<snapshot::parked_record> snapshot::parked_lookup(std::string_view consumer,
                                                               std::string_view message_id) const {
    auto t = table(layout::parked_table(consumer));
    if (!t) return std::nullopt;
    cursor c{txn_, *t};
    for (auto e = c.first(); e; e = c.next()) {
        if (layout::decode_parked(e->second).first != message_id) continue;
        auto key = layout::decode_parked_key(e->first);
        if (!key) continue;
        parked_record r;
        r.subject = std::move(key->first);
        r.sequence = key->second;
        std::uint64_t highest = 0;
        if (auto streams = table(layout::streams_table(consumer))) highest = layout::u64_or_zero(txn_.get(*streams, r.subject));
        r.waiting_for = highest + 1;
        return r;
    }
    return std::nullopt;
}

std::size_t snapshot::contributor_entries(std::string_view projection) const {
    auto t = table(layout::contrib_table(projection));
    return t ? txn_.entries(*t) : 0;
}

std::uint64_t snapshot::contributor_floor(std::string_view projection) const {
    auto m = table(std::string(layout::meta_table));
    return m ? layout::u64_or_zero(txn_.get(*m, layout::contrib_floor_key(projection))) : 0;
}

namespace {

// A table of dead-letter records (dead letters, transport collisions), in position order.
std::vector<dead_letter> read_dead_letters(const read_txn& txn, std::optional<MDB_dbi> table) {
    std::vector<dead_letter> out;
    if (!table) return out;
    cursor c{txn, *table};
    for (auto e = c.first(); e; e = c.next()) out.push_back(layout::decode_dead_letter(codec::get_u64_be(e->first), e->second));
    return out;
}

}  // namespace

std::vector<dead_letter> snapshot::collisions(std::string_view consumer) const {
    return read_dead_letters(txn_, table(layout::collision_table(consumer)));
}

std::vector<dead_letter> snapshot::dead_letters(std::string_view consumer) const {
    return read_dead_letters(txn_, table(layout::dead_letter_table(consumer)));
}

}  // namespace idem
