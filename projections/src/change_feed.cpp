// The change feed (docs/CHANGES.md): a batch records the rows it changed in its own transaction,
// retention removes whole commits oldest first, and a snapshot reads them back by position.

#include "store_internal.hpp"

#include <idem/storage/codec.hpp>
#include <idem/storage/envelope.hpp>
#include <idem/storage/crash_point.hpp>

#include <algorithm>
#include <charconv>
#include <random>

namespace idem {

std::string_view to_string(change_kind k) noexcept { return k == change_kind::reset ? "reset" : "row"; }

std::string change_position::to_string() const { return std::to_string(commit) + "." + std::to_string(index); }

std::optional<change_position> change_position::parse(std::string_view text) {
    auto number = [](std::string_view digits, auto& out) {
        auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
        return !digits.empty() && ec == std::errc() && end == digits.data() + digits.size();
    };
    change_position at;
    const auto dot = text.find('.');
    if (dot == std::string_view::npos) {
        if (!number(text, at.commit)) return std::nullopt;
        at.index = UINT32_MAX;  // after every entry of that commit
        return at;
    }
    if (!number(text.substr(0, dot), at.commit) || !number(text.substr(dot + 1), at.index)) return std::nullopt;
    return at;
}

namespace detail {

std::string new_store_id() {
    std::random_device random;
    std::string out;
    constexpr char digits[] = "0123456789abcdef";
    for (int i = 0; i < 4; ++i) {
        auto word = random();
        for (int n = 0; n < 8; ++n, word >>= 4) out.push_back(digits[word & 0xf]);
    }
    return out;
}

void mark_as_copy(environment& env, std::uint64_t commit) {
    auto meta = env.table(std::string(layout::meta_table));
    // Every consumer (its counters are in meta) and its checkpoint table, opened before the write.
    std::vector<std::pair<std::string, MDB_dbi>> checkpoints;
    {
        std::vector<std::string> consumers;
        {
            read_txn r{env};
            cursor c{r, meta};
            const std::string_view prefix = "stats/";
            for (auto e = c.seek(prefix); e && e->first.starts_with(prefix); e = c.next()) {
                consumers.emplace_back(e->first.substr(prefix.size()));
            }
        }
        for (const auto& consumer : consumers) {
            checkpoints.emplace_back(consumer, env.table(layout::checkpoint_table(consumer)));
        }
    }
    env.write([&](write_txn& txn) {
        const auto id = txn.get(meta, layout::store_id_key);
        const std::string from = id ? std::string(*id) : std::string();
        txn.put(meta, layout::store_id_key, new_store_id());
        txn.put(meta, layout::copied_from_key, from + " " + std::to_string(commit));
        for (const auto& [consumer, table] : checkpoints) {
            cursor c{txn, table};
            for (auto e = c.first(); e; e = c.next()) {
                txn.put(meta, layout::copied_checkpoint_key(consumer, e->first), e->second);
            }
        }
    });
}

}  // namespace detail

namespace {

std::uint64_t u64_le_or_zero(std::optional<std::string_view> v) { return v && v->size() >= 8 ? codec::get_u64_le(*v) : 0; }

}  // namespace

// --- writing --------------------------------------------------------------------------------------

void store::impl::open_feed() {
    changes = env->table(std::string(layout::changes_table));
    change_times = env->table(std::string(layout::change_times_table));
    env->write([&](write_txn& txn) {
        if (!txn.get(meta, layout::store_id_key)) txn.put(meta, layout::store_id_key, detail::new_store_id());
    });
}

void store::succeed(const std::string& store_id, std::uint64_t after_commit) {
    auto& s = *impl_;
    if (s.bulk) throw_error(errc::invalid_argument, "succeed: not during a bulk build");
    s.env->write([&](write_txn& txn) {
        const auto last = u64_le_or_zero(txn.get(s.meta, layout::commit_key));
        if (last > after_commit) {
            throw_error(errc::invalid_argument, "succeed: '" + s.options.path.string() + "' has made commit " +
                                                    std::to_string(last) + ", past " + std::to_string(after_commit));
        }
        if (!store_id.empty()) txn.put(s.meta, layout::store_id_key, store_id);
        txn.put(s.meta, layout::commit_key, layout::u64_value(after_commit));
    });
    s.kept.clear();
}

namespace detail {

void batch_run::record_change(std::size_t p, std::string_view key, const codec::row_header& header,
                              std::string_view state) {
    const auto& proj = *s_.projections[p];
    if (!proj.records_changes() || !s_.options.change_feed) return;
    change_.clear();
    layout::encode_change(change_, change_kind::row, header.applied, header.state_version, proj.name(), key, state);
    // Keys rise with the commit and the index: each entry goes after the table's last.
    txn_.put(s_.changes, layout::change_key({commit_, changes_++}), change_, MDB_APPEND);
}

void batch_run::record_resets() {
    // A bulk build replaces a projection's rows wholesale: one entry says to read them all again.
    for (const auto& proj : s_.projections) {
        if (!proj->records_changes() || !s_.options.change_feed) continue;
        change_.clear();
        layout::encode_change(change_, change_kind::reset, 0, proj->state_version(), proj->name(), {}, {});
        txn_.put(s_.changes, layout::change_key({commit_, changes_++}), change_, MDB_APPEND);
    }
}

void batch_run::record_change_time() {
    if (changes_ == 0) return;
    txn_.put(s_.change_times, codec::u64_key(commit_), layout::u64_value(time_ns_), MDB_APPEND);
}

}  // namespace detail

// --- retention --------------------------------------------------------------------------------------

std::size_t store::impl::prune_changes(write_txn& txn, std::uint64_t newest, std::size_t budget,
                                       std::chrono::steady_clock::time_point deadline, bool& more) {
    const auto& r = options.changes;
    if ((!r.max_age && !r.keep_commits) || budget == 0) return 0;
    cursor feed{txn, changes};
    // Commits at or below this go by count; by age, those made before the cutoff.
    const std::uint64_t by_count = r.keep_commits && newest > *r.keep_commits ? newest - *r.keep_commits : 0;
    const auto now = wall_now();
    const std::uint64_t cutoff = r.max_age && now > detail::count_ns(*r.max_age) ? now - detail::count_ns(*r.max_age) : 0;
    cursor times{txn, change_times};
    std::size_t removed = 0;
    std::optional<change_position> pruned;
    std::uint64_t timed = 0;  // the commit whose time `times` stands on
    std::uint64_t time = 0;
    for (auto e = feed.first(); e; e = feed.first()) {
        const auto at = layout::decode_change_key(e->first);
        if (at.commit > by_count) {
            if (timed != at.commit) {
                auto t = times.seek(codec::u64_key(at.commit));
                timed = at.commit;
                time = t && codec::get_u64_be(t->first) == at.commit ? u64_le_or_zero(t->second) : 0;
            }
            if (time == 0 || time >= cutoff) break;
        }
        if (removed == budget || std::chrono::steady_clock::now() > deadline) {
            more = true;
            break;
        }
        feed.del();
        ++removed;
        pruned = at;
    }
    if (!pruned) return 0;
    // The times of commits with no entry left go too.
    for (auto t = times.first(); t && codec::get_u64_be(t->first) < pruned->commit; t = times.first()) times.del();
    txn.put(meta, layout::changes_pruned_key, layout::encode_position(*pruned));
    crash_point("during_prune");
    return removed;
}

// --- reading ----------------------------------------------------------------------------------------

std::vector<change> snapshot::changes(std::uint64_t since_commit, std::size_t limit) const {
    return changes_after({since_commit, UINT32_MAX}, limit);
}

std::vector<change> snapshot::changes_after(change_position after, std::size_t limit) const {
    auto& s = *impl_;
    std::vector<change> out;
    const auto meta = s.table(std::string(layout::meta_table));
    const auto pruned = layout::decode_position(meta ? s.txn.get(*meta, layout::changes_pruned_key) : std::nullopt);
    if (after < pruned) {
        throw_error(errc::changes_pruned,
                    "change feed of '" + s.env->path().string() + "': entries after " +
                        (after.index == UINT32_MAX ? "commit " + std::to_string(after.commit) : after.to_string()) +
                        " were asked for, but the feed was pruned through commit " + std::to_string(pruned.commit) +
                        "; the oldest commit kept whole is " + std::to_string(pruned.commit + 1) +
                        " (read the rows afresh, then follow from the snapshot's commit)");
    }
    const auto feed = s.table(std::string(layout::changes_table));
    if (!feed) return out;
    const auto times = s.table(std::string(layout::change_times_table));
    cursor c{s.txn, *feed};
    const change_position from = after.index == UINT32_MAX ? change_position{after.commit + 1, 0}
                                                            : change_position{after.commit, after.index + 1};
    std::uint64_t time_of = 0;
    std::uint64_t time = 0;
    for (auto e = c.seek(layout::change_key(from)); e; e = c.next()) {
        auto entry = layout::decode_change(e->first, e->second);
        // Whole commits: past the limit, only the rest of the commit being read.
        if (out.size() >= limit && entry.position.commit != out.back().position.commit) break;
        if (entry.position.commit != time_of) {
            time_of = entry.position.commit;
            time = times ? u64_le_or_zero(s.txn.get(*times, codec::u64_key(time_of))) : 0;
        }
        entry.time_ns = time;
        out.push_back(std::move(entry));
    }
    return out;
}

change_feed_info snapshot::change_feed() const {
    auto& s = *impl_;
    change_feed_info info;
    if (const auto meta = s.table(std::string(layout::meta_table))) {
        info.pruned_through = layout::decode_position(s.txn.get(*meta, layout::changes_pruned_key)).commit;
    }
    const auto feed = s.table(std::string(layout::changes_table));
    if (!feed) return info;
    info.entries = s.txn.entries(*feed);
    cursor c{s.txn, *feed};
    if (auto first = c.first()) info.first_commit = layout::decode_change_key(first->first).commit;
    if (auto last = c.last()) info.last_commit = layout::decode_change_key(last->first).commit;
    if (const auto times = s.table(std::string(layout::change_times_table)); times && info.first_commit != 0) {
        info.oldest_time_ns = u64_le_or_zero(s.txn.get(*times, codec::u64_key(info.first_commit)));
    }
    return info;
}

void append_change_json(std::string& out, const change& c, const projection_base* p) {
    out += R"({"position":")";
    out += c.position.to_string();
    out += R"(","commit":)";
    out += std::to_string(c.position.commit);
    out += R"(,"kind":")";
    out += to_string(c.kind);
    out += R"(","projection":)";
    append_json_string(out, c.projection);
    if (c.kind == change_kind::row) {
        out += R"(,"key":)";
        append_json_string(out, c.key);
        out += R"(,"version":)";
        out += std::to_string(c.version);
    }
    out += R"(,"time_ns":)";
    out += std::to_string(c.time_ns);
    if (c.kind == change_kind::row) {
        out += R"(,"state":)";
        if (p) {
            p->write_json(*p->load(c.state, c.state_version), out);
        } else {
            out += "null";
        }
    }
    out += "}";
}

std::optional<snapshot::store_copy> snapshot::copied_from() const {
    auto& s = *impl_;
    const auto meta = s.table(std::string(layout::meta_table));
    auto v = meta ? s.txn.get(*meta, layout::copied_from_key) : std::nullopt;
    if (!v) return std::nullopt;
    const auto space = v->find(' ');
    store_copy c;
    c.store_id = std::string(v->substr(0, space));
    if (space != std::string_view::npos) c.commit = std::strtoull(std::string(v->substr(space + 1)).c_str(), nullptr, 10);
    return c;
}

std::optional<std::string> snapshot::copied_checkpoint(std::string_view consumer, std::string_view source) const {
    auto& s = *impl_;
    const auto meta = s.table(std::string(layout::meta_table));
    auto v = meta ? s.txn.get(*meta, layout::copied_checkpoint_key(consumer, source)) : std::nullopt;
    return v ? std::optional<std::string>(std::string(*v)) : std::nullopt;
}

std::string snapshot::store_id() const {
    auto& s = *impl_;
    const auto meta = s.table(std::string(layout::meta_table));
    auto v = meta ? s.txn.get(*meta, layout::store_id_key) : std::nullopt;
    return v ? std::string(*v) : std::string();
}

}  // namespace idem
