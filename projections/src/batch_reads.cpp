// What a batch run reads through its own state (rows, streams, parked events) and what the
// live writer keeps of it from one batch to the next (docs/RUNTIME.md, "Rows kept between
// batches"): whether the kept rows still hold, reading what they do not, and marking what a
// batch changed for finish() to write.

#include "store_internal.hpp"

#include <idem/storage/codec.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace idem::detail {

namespace {

/// A shortcut that rests on a table holding what the writer left there: off when the table's
/// entry count is not what the last commit left, on again once the table is empty.
void trust_while_unchanged(bool& shortcut, std::size_t entries, std::size_t left) {
    if (entries != left) shortcut = false;
    if (entries == 0) shortcut = true;
}

}  // namespace

void batch_run::take_kept() {
    // Kept rows are the state of the commit they were kept at: any commit since was not the live
    // writer's (another process, an operator action), and a bulk build or an operator action may
    // change rows they hold. Past their budget they go too, and are read again as needed.
    auto& kept = s_.kept;
    if (!live_ || kept.commit + 1 != commit_ || kept.row_bytes + kept.stream_bytes > s_.options.tuning.kept_rows_bytes) {
        kept.clear();
    }
    const auto parked = txn_.entries(s_.parked);
    parked_possible_ = parked != 0;
    if (live_) {
        // An empty table: from here on every parked event is counted by its stream while they
        // are kept, as long as the table holds what they count (nothing else parked or released one).
        trust_while_unchanged(kept_.parked_counted, parked, kept_.parked_entries);
        // Likewise the streams: kept from an empty table on, they are all of them (a store being
        // filled from a log looks up no new subject in the table).
        trust_while_unchanged(kept_.streams_complete, txn_.entries(s_.streams), kept_.stream_entries);
    }
    parked_in_table_ = parked_possible_ && !kept_.parked_counted;
}

void batch_run::count_size(row_slot& row, std::size_t encoded) {
    // Its encoded size stands in for its decoded state's: counted once, grown as the row grows.
    if (encoded <= row.counted) return;
    kept_.row_bytes += encoded - row.counted;
    row.counted = static_cast<std::uint32_t>(std::min<std::size_t>(encoded, UINT32_MAX));
}

row_entry& batch_run::load_row(std::size_t p, const std::string& key, std::uint64_t hash) {
    if (rows_.size() <= p) rows_.resize(s_.projections.size());
    if (auto* cached = rows_[p].find(key, hash)) return *cached;
    // Read first, then keep: a row whose state cannot be read (a migration that throws) leaves
    // no slot behind.
    const auto& proj = *s_.projections[p];
    const auto row_key = codec::row_key(key);
    auto record = s_.journals[p]->find(txn_, row_key, hash);
    if (!record) record = txn_.get(s_.tables[p], row_key);
    row_slot read;
    if (record) {
        auto decoded = codec::decode_row(*record);
        read.header = decoded.header;
        read.state = proj.load(decoded.state, decoded.header.state_version);  // migrated if older
    } else {
        read.header.state_version = proj.state_version();
        read.state = proj.make_state();
    }
    auto& entry = *rows_[p].try_emplace(key, hash).first;
    entry.value = std::move(read);
    kept_.row_bytes += 2 * key.size() + 192;
    count_size(entry.value, record ? record->size() : 0);
    return entry;
}

stream_entry& batch_run::stream(const std::string& subject) {
    return stream(subject, string_table<stream_state>::hash_of(subject));
}

stream_entry& batch_run::stream(const std::string& subject, std::uint64_t hash) {
    auto [entry, inserted] = streams_.try_emplace(subject, hash);
    if (inserted) {
        if (kept_.streams_complete) {
            // Not kept: not in the table either.
        } else if (auto v = txn_.get(s_.streams, subject); v && v->size() >= 8) {
            entry->value.highest = codec::get_u64_le(*v);
        }
        kept_.stream_bytes += 2 * subject.size() + 64;
    }
    return *entry;
}

void batch_run::mark_dirty(std::size_t p, row_entry& row) {
    if (row.value.dirty) return;
    dirty_rows_.emplace_back(p, &row);
    row.value.dirty = true;
}

void batch_run::mark_dirty(stream_entry& stream) {
    if (stream.value.dirty) return;
    dirty_streams_.push_back(&stream);
    stream.value.dirty = true;
}

std::optional<std::string> batch_run::parked_value(const std::string& key) const {
    if (auto it = parked_.find(key); it != parked_.end()) return it->second;
    if (auto v = txn_.get(s_.parked, key)) return std::string(*v);
    return std::nullopt;
}

std::string batch_run::parked_event_id(std::string_view value) const {
    const auto stored = layout::decode_parked_value(value);
    if (stored.event_id) return std::string(*stored.event_id);
    // Parked before the value carried it: the envelope says (one that no longer parses matches none).
    envelope ev;
    parse_error err;
    return s_.parser.parse(stored.body, ev, err) ? ev.event_id() : std::string();
}

}  // namespace idem::detail
