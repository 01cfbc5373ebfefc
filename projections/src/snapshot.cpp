// The reader: a consistent read-only view of an environment (snapshot isolation).

#include "store_internal.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/codec.hpp>
#include <idem/storage/crash_point.hpp>
#include <idem/storage/duration.hpp>

#include <tuple>

namespace idem {

snapshot snapshot::open(const std::filesystem::path& path) {
    environment_options eo;
    eo.read_only = true;
    return detail::snapshot_of(environment::open(path, eo));
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

snapshot detail::store_access::snapshot_of(std::shared_ptr<environment> env) {
    return snapshot{std::make_unique<snapshot::impl>(std::move(env))};
}

snapshot::impl::impl(std::shared_ptr<environment> e) : env(std::move(e)), txn(begin_snapshot(*env)) {}

snapshot::snapshot(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
snapshot::~snapshot() = default;
snapshot::snapshot(snapshot&&) noexcept = default;
snapshot& snapshot::operator=(snapshot&&) noexcept = default;

std::optional<MDB_dbi> snapshot::impl::table(const std::string& name) const {
    auto dbi = env->try_table(name);
    unsigned flags = 0;
    // A table created after this snapshot began has a handle this transaction cannot use.
    if (dbi && mdb_dbi_flags(txn.handle(), *dbi, &flags) != 0) return std::nullopt;
    return dbi;
}

MDB_dbi snapshot::impl::row_table(std::string_view projection) const {
    auto t = table(layout::rows_table(projection));
    if (!t) throw_error(errc::unknown_projection, "no projection '" + std::string(projection) + "' in '" +
                                                       env->path().string() + "'");
    return *t;
}

detail::journal_view& snapshot::impl::journal(std::string_view projection) const {
    std::scoped_lock lock{mutex_};
    auto& j = journals(projection);
    if (!j.view) j.view = detail::journal_view::read(txn, j.state);
    return *j.view;
}

bool snapshot::impl::find_journaled(std::string_view projection, std::string_view row_key,
                                    std::optional<std::string_view>& v) const {
    std::scoped_lock lock{mutex_};
    auto& j = journals(projection);
    return j.index->find(txn, j.state, row_key, v);
}

snapshot::impl::journals_entry& snapshot::impl::journals(std::string_view projection) const {
    auto it = journals_.find(projection);
    if (it == journals_.end()) {
        const auto name = std::string(projection);
        journals_entry j;
        j.state = detail::journal_state::read(txn, table(std::string(layout::meta_table)), table(detail::row_journal::table_name(name, 0)),
                                              table(detail::row_journal::table_name(name, 1)), name);
        j.index = std::static_pointer_cast<detail::journal_index>(env->attachment(
            "journal-index/" + name, [] { return std::static_pointer_cast<void>(std::make_shared<detail::journal_index>()); }));
        it = journals_.emplace(name, std::move(j)).first;
    }
    return it->second;
}

namespace {

// Decodes a row's record, naming the projection and the row if it is damaged.
snapshot::raw_row_view decode(std::string_view projection, std::string_view key, std::string_view record) {
    codec::row_record r;
    try {
        r = codec::decode_row(record);
    } catch (const std::system_error& e) {
        std::string_view what = e.what();  // "<detail>: <the code's message>": the code is said once, below
        if (const auto suffix = ": " + e.code().message(); what.ends_with(suffix)) what.remove_suffix(suffix.size());
        throw_error(errc::corrupt_record, "projection '" + std::string(projection) + "', row '" + layout::truncate(key) +
                                              "': " + std::string(what));
    }
    return {key, r.header.applied, r.header.highest_sequence, r.header.state_version, r.state, r.checked};
}

}  // namespace

std::optional<snapshot::raw_row_view> snapshot::raw_row(std::string_view projection, std::string_view key) const {
    const auto t = impl_->row_table(projection);
    const auto row_key = codec::row_key(key);
    std::optional<std::string_view> v;
    if (!impl_->find_journaled(projection, row_key, v)) {
        const auto& journaled = impl_->journal(projection).latest;
        if (auto it = journaled.find(row_key); it != journaled.end()) v = it->second;
    }
    if (!v) v = impl_->txn.get(t, row_key);
    if (!v) return std::nullopt;
    return decode(projection, key, *v);
}

struct snapshot::row_reader::state {
    using overlay = std::vector<std::pair<std::string_view, std::string_view>>;
    state(cursor c, std::string p, const overlay& j) : rows(std::move(c)), projection(std::move(p)), journaled(&j) {}
    cursor rows;
    std::string projection;
    const overlay* journaled;  // rows the journals hold, by row key: they replace the table's
    std::size_t at = 0;
    std::optional<cursor::entry> table_row;
    std::string key;
    bool started = false;
};

snapshot::row_reader::row_reader(std::unique_ptr<state> s) : state_(std::move(s)) {}
snapshot::row_reader::~row_reader() = default;
snapshot::row_reader::row_reader(row_reader&&) noexcept = default;
snapshot::row_reader& snapshot::row_reader::operator=(row_reader&&) noexcept = default;

snapshot::row_reader snapshot::read_rows(std::string_view projection) const {
    const auto t = impl_->row_table(projection);
    return row_reader{std::make_unique<row_reader::state>(cursor{impl_->txn, t}, std::string(projection),
                                                          impl_->journal(projection).sorted())};
}

std::optional<snapshot::raw_row_view> snapshot::row_reader::next() {
    auto& s = *state_;
    if (!s.started) {
        s.table_row = s.rows.first();
        s.started = true;
    }
    // The table's rows and the journals' in one key order; a journaled row replaces the table's.
    std::string_view row_key;
    std::string_view record;
    const auto& journaled = *s.journaled;
    const bool journal_left = s.at < journaled.size();
    if (!s.table_row && !journal_left) return std::nullopt;
    if (journal_left && (!s.table_row || journaled[s.at].first <= s.table_row->first)) {
        std::tie(row_key, record) = journaled[s.at++];
        if (s.table_row && s.table_row->first == row_key) s.table_row = s.rows.next();
    } else {
        std::tie(row_key, record) = *s.table_row;
        s.table_row = s.rows.next();
    }
    auto k = codec::decode_table_key(row_key);
    if (!k || !k->is_row) throw_error(errc::corrupt_record, "unreadable key in projection '" + s.projection + "'");
    s.key.assign(k->aggregate);
    return decode(s.projection, s.key, record);
}

void snapshot::scan_raw(std::string_view projection, const std::function<void(const raw_row_view&)>& fn) const {
    auto rows = read_rows(projection);
    while (auto r = rows.next()) fn(*r);
}

std::uint64_t snapshot::commit() const {
    auto t = impl_->table(std::string(layout::meta_table));
    if (!t) return 0;
    auto v = impl_->txn.get(*t, layout::commit_key);
    return v && v->size() >= 8 ? codec::get_u64_le(*v) : 0;
}

std::optional<std::uint64_t> snapshot::checkpoint(std::string_view consumer, std::string_view source) const {
    auto v = checkpoint_value(consumer, source);
    if (!v) return std::nullopt;
    return codec::get_u64_le(*v);
}

std::optional<std::string> snapshot::checkpoint_value(std::string_view consumer, std::string_view source) const {
    auto t = impl_->table(layout::checkpoint_table(consumer));
    if (!t) return std::nullopt;
    auto v = impl_->txn.get(*t, source);
    if (!v || v->size() < 8) return std::nullopt;
    return std::string(*v);
}

std::vector<std::pair<std::string, std::uint64_t>> snapshot::checkpoints(std::string_view consumer) const {
    std::vector<std::pair<std::string, std::uint64_t>> out;
    auto t = impl_->table(layout::checkpoint_table(consumer));
    if (!t) return out;
    cursor c{impl_->txn, *t};
    for (auto e = c.first(); e; e = c.next()) {
        if (e->second.size() >= 8) out.emplace_back(std::string(e->first), codec::get_u64_le(e->second));
    }
    return out;
}

consumer_view snapshot::consumer(std::string_view name) const { return consumer_view{*impl_, name}; }

projection_view snapshot::projection(std::string_view name) const { return projection_view{*impl_, name}; }

// --- a projection's contributing sets ------------------------------------------------------

void projection_view::scan_contributors(std::string_view key, const std::function<void(std::string_view effect)>& fn) const {
    auto t = snap_->table(layout::contrib_table(name_));
    if (!t) return;
    // The log is in commit order, not by row: a query walks all of it (diagnostics only;
    // the writer answers membership from its in-memory index).
    const auto prefix = codec::contributor_key(key, {});
    cursor c{snap_->txn, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto id = e->second.substr(8);
        if (id.starts_with(prefix)) fn(id.substr(prefix.size()));
    }
}

std::size_t projection_view::contributors(std::string_view key) const {
    std::size_t n = 0;
    scan_contributors(key, [&](std::string_view) { ++n; });
    return n;
}

bool projection_view::contributed(std::string_view key, std::string_view effect) const {
    bool found = false;
    scan_contributors(key, [&](std::string_view e) { found = found || e == effect; });
    return found;
}

std::size_t projection_view::contributor_entries() const {
    auto t = snap_->table(layout::contrib_table(name_));
    return t ? snap_->txn.entries(*t) : 0;
}

std::uint64_t projection_view::contributor_floor() const {
    auto m = snap_->table(std::string(layout::meta_table));
    return m ? layout::u64_or_zero(snap_->txn.get(*m, layout::contrib_floor_key(name_))) : 0;
}

// --- a consumer's tables -------------------------------------------------------------------

consumer_stats consumer_view::stats() const {
    auto t = snap_->table(std::string(layout::meta_table));
    if (!t) return {};
    return layout::decode_stats(snap_->txn.get(*t, layout::stats_key(name_)));
}

std::size_t consumer_view::inbox_size() const {
    auto t = snap_->table(layout::inbox_table(name_));
    return t ? snap_->txn.entries(*t) : 0;
}

std::size_t consumer_view::parked() const {
    auto t = snap_->table(layout::parked_table(name_));
    return t ? snap_->txn.entries(*t) : 0;
}

std::size_t consumer_view::dead_letter_count() const {
    auto t = snap_->table(layout::dead_letter_table(name_));
    return t ? snap_->txn.entries(*t) : 0;
}

std::optional<consumer_view::inbox_record> consumer_view::inbox_lookup(std::string_view message_id) const {
    auto t = snap_->table(layout::inbox_table(name_));
    if (!t) return std::nullopt;
    cursor c{snap_->txn, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto entry = layout::decode_inbox_entry(e->second);
        if (entry && entry->message_id == message_id) return entry->record;
    }
    return std::nullopt;
}

std::optional<std::pair<std::string, consumer_view::inbox_record>> consumer_view::inbox_lookup_transport_id(
    std::string_view transport_id) const {
    auto t = snap_->table(layout::inbox_table(name_));
    if (!t) return std::nullopt;
    cursor c{snap_->txn, *t};
    for (auto e = c.first(); e; e = c.next()) {
        auto entry = layout::decode_inbox_entry(e->second);
        if (!entry || !entry->message_id.ends_with(transport_id)) continue;
        // A transport id ("m..." or "t<n>:<transport>..."), not an event id that ends alike.
        const auto key = entry->message_id;
        if (!layout::is_transport_key(key)) continue;
        if (split_message_id(key).second != transport_id) continue;
        return std::pair{std::string(key), entry->record};
    }
    return std::nullopt;
}

consumer_view::retention_state consumer_view::retention() const {
    retention_state r;
    if (auto m = snap_->table(std::string(layout::meta_table))) {
        auto clock = layout::decode_clock(snap_->txn.get(*m, layout::clock_key(name_)));
        r.event_time = clock.event_time;
        r.inbox_floor = clock.inbox_floor;
        r.jump_time = clock.jump_votes.empty() ? 0 : clock.jump_time;
        r.jump_votes = clock.jump_votes.size();
        r.jump_sources = clock.jump_sources.size();
    }
    if (auto t = snap_->table(layout::inbox_table(name_))) {
        cursor c{snap_->txn, *t};
        if (auto first = c.first(); first && first->second.size() >= 8) r.oldest = codec::get_u64_le(first->second);
    }
    return r;
}

std::optional<consumer_view::parked_record> consumer_view::parked_lookup(std::string_view message_id) const {
    auto t = snap_->table(layout::parked_table(name_));
    if (!t) return std::nullopt;
    cursor c{snap_->txn, *t};
    for (auto e = c.first(); e; e = c.next()) {
        if (layout::decode_parked(e->second).first != message_id) continue;
        auto key = layout::decode_parked_key(e->first);
        if (!key) continue;
        parked_record r;
        r.subject = std::move(key->first);
        r.sequence = key->second;
        std::uint64_t highest = 0;
        if (auto streams = snap_->table(layout::streams_table(name_))) {
            highest = layout::u64_or_zero(snap_->txn.get(*streams, r.subject));
        }
        r.waiting_for = highest + 1;
        return r;
    }
    return std::nullopt;
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

std::vector<dead_letter> consumer_view::collisions() const {
    return read_dead_letters(snap_->txn, snap_->table(layout::collision_table(name_)));
}

std::vector<dead_letter> consumer_view::dead_letters() const {
    return read_dead_letters(snap_->txn, snap_->table(layout::dead_letter_table(name_)));
}

}  // namespace idem

namespace idem::detail {

void check_read_version(std::string_view projection, std::uint32_t row_version, std::uint32_t declared) {
    if (row_version == declared) return;
    throw_error(errc::state_version_mismatch,
                "projection '" + std::string(projection) + "': a row has state version " + std::to_string(row_version) +
                    ", and the state type read declares " + std::to_string(declared) +
                    ": read it through its projection (snapshot::get(projection, key)), which migrates older rows");
}

}  // namespace idem::detail
