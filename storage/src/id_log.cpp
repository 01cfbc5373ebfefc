#include <idem/storage/id_log.hpp>

#include <idem/storage/codec.hpp>

#include <algorithm>
#include <functional>

namespace idem {

id_log::id_log(environment& env, const std::string& table, std::size_t extra_words)
    : table_(env.table(table)), extra_words_(std::min(extra_words, max_extra)) {
    slots_.resize(1024);
    read_txn txn{env};
    rebuild(txn);
}

std::uint64_t id_log::hash_of(std::string_view id) noexcept {
    return std::hash<std::string_view>{}(id);
}

void id_log::insert(std::uint64_t hash, std::uint64_t position) {
    if ((occupied_ + 1) * 10 > slots_.size() * 7) {
        // Rehash the live entries, dropping tombstones; double only if they fill half the table.
        auto size = slots_.size();
        if ((count_ + 1) * 2 > size) size *= 2;
        std::vector<slot> old(size);
        old.swap(slots_);
        count_ = 0;
        occupied_ = 0;
        for (const auto& s : old) {
            if (s.position != 0 && live(s)) insert(s.hash, s.position - 1);
        }
    }
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask;; i = (i + 1) & mask) {
        if (slots_[i].position == 0 || !live(slots_[i])) {
            if (slots_[i].position == 0) ++occupied_;
            slots_[i] = slot{hash, position + 1};
            ++count_;
            return;
        }
    }
}

void id_log::rebuild(const txn_base& txn) {
    std::fill(slots_.begin(), slots_.end(), slot{});
    count_ = 0;
    occupied_ = 0;
    next_position_ = 1;
    head_ = 1;
    cursor c{txn, table_};
    for (auto e = c.first(); e; e = c.next()) {
        auto position = codec::get_u64_be(e->first);
        if (count_ == 0) head_ = position;
        insert(hash_of(id_of(e->second)), position);
        next_position_ = position + 1;
    }
}

void id_log::catch_up(const txn_base& txn) {
    cursor c{txn, table_};
    auto first = c.first();
    if (!first) {
        if (next_position_ != 1) rebuild(txn);  // another writer emptied it
        return;
    }
    head_ = std::max(head_, codec::get_u64_be(first->first));  // another writer may have pruned
    auto last = c.last();
    auto last_position = codec::get_u64_be(last->first);
    if (last_position + 1 == next_position_) {
        return;
    }
    if (last_position + 1 < next_position_) {
        rebuild(txn);  // the log went backwards: it was replaced under us
        return;
    }
    for (auto e = c.seek(codec::u64_key(next_position_)); e; e = c.next()) {
        auto position = codec::get_u64_be(e->first);
        insert(hash_of(id_of(e->second)), position);
        next_position_ = position + 1;
    }
}

bool id_log::contains(const txn_base& txn, std::string_view id) const {
    auto hash = hash_of(id);
    return staged(id, hash) != nullptr || indexed(txn, id, hash).has_value();
}

bool id_log::stage_if_new(const txn_base& txn, std::string_view id, std::uint64_t stamp) {
    return stage_if_new(txn, id, stamp, hash_of(id));
}

bool id_log::contains(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    return staged(id, hash) != nullptr || indexed(txn, id, hash).has_value();
}

std::optional<id_log::entry> id_log::find(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    if (const auto* s = staged(id, hash)) return entry{0, s->stamp, s->extra};
    return indexed(txn, id, hash);
}

void id_log::stage(std::string_view id, std::uint64_t stamp, std::uint64_t hash) { stage_hashed(id, stamp, hash); }

bool id_log::stage_if_new(const txn_base& txn, std::string_view id, std::uint64_t stamp, std::uint64_t hash) {
    if (staged(id, hash) != nullptr || indexed(txn, id, hash)) return false;
    stage_hashed(id, stamp, hash);
    return true;
}

void id_log::annotate_last(const std::array<std::uint64_t, max_extra>& extra) {
    if (!staged_.empty()) staged_.back().extra = extra;
}

id_log::entry id_log::decode(std::uint64_t position, std::string_view value) const {
    entry e;
    e.position = position;
    if (value.size() >= 8) e.stamp = codec::get_u64_le(value);
    for (std::size_t w = 0; w < extra_words_ && value.size() >= 8 * (w + 2); ++w) {
        e.extra[w] = codec::get_u64_le(value.substr(8 * (w + 1)));
    }
    return e;
}

std::optional<id_log::entry> id_log::indexed(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask; slots_[i].position != 0; i = (i + 1) & mask) {
        if (slots_[i].hash != hash || !live(slots_[i])) continue;
        // Confirm against the log: equal hashes are not equal ids, and another writer may have pruned it.
        auto position = slots_[i].position - 1;
        auto value = txn.get(table_, codec::u64_key(position));
        if (value && value->size() >= 8 * (1 + extra_words_) && id_of(*value) == id) {
            return decode(position, *value);
        }
    }
    return std::nullopt;
}

const id_log::staged_id* id_log::staged(std::string_view id, std::uint64_t hash) const {
    if (staged_.empty()) return nullptr;
    std::size_t mask = staged_slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask; staged_slots_[i] != 0; i = (i + 1) & mask) {
        const auto& s = staged_[staged_slots_[i] - 1];
        if (s.hash == hash && s.id == id) return &s;
    }
    return nullptr;
}

void id_log::stage(std::string_view id, std::uint64_t stamp) { stage_hashed(id, stamp, hash_of(id)); }

void id_log::stage_hashed(std::string_view id, std::uint64_t stamp, std::uint64_t hash) {
    if ((staged_.size() + 1) * 10 > staged_slots_.size() * 7) {
        staged_slots_.assign(std::max<std::size_t>(64, staged_slots_.size() * 2), 0);
        std::size_t mask = staged_slots_.size() - 1;
        for (std::size_t k = 0; k < staged_.size(); ++k) {
            auto i = static_cast<std::size_t>(staged_[k].hash) & mask;
            while (staged_slots_[i] != 0) i = (i + 1) & mask;
            staged_slots_[i] = static_cast<std::uint32_t>(k + 1);
        }
    }
    std::size_t mask = staged_slots_.size() - 1;
    auto i = static_cast<std::size_t>(hash) & mask;
    while (staged_slots_[i] != 0) i = (i + 1) & mask;
    staged_.push_back(staged_id{std::string(id), stamp, hash, {}});
    staged_slots_[i] = static_cast<std::uint32_t>(staged_.size());
}

void id_log::write(write_txn& txn) {
    if (staged_.empty()) return;
    std::string value;
    auto position = next_position_;
    cursor c{txn, table_};  // appends through one cursor: no search from the root per id
    for (const auto& s : staged_) {
        value.clear();
        codec::put_u64_le(value, s.stamp);
        for (std::size_t w = 0; w < extra_words_; ++w) codec::put_u64_le(value, s.extra[w]);
        value.append(s.id);
        c.put(codec::u64_key(position++), value, MDB_APPEND);
    }
}

void id_log::committed() {
    for (const auto& s : staged_) {
        insert(s.hash, next_position_++);
    }
    rolled_back();
}

void id_log::rolled_back() {
    if (staged_.empty()) return;
    staged_.clear();
    std::fill(staged_slots_.begin(), staged_slots_.end(), 0u);
}

id_log::prune_step id_log::prune(write_txn& txn, std::uint64_t cutoff, std::size_t max_rows,
                                 std::chrono::steady_clock::time_point deadline) {
    prune_step step;
    cursor c{txn, table_};
    auto last = c.last();
    if (!last) return step;
    const auto last_position = codec::get_u64_be(last->first);
    for (auto e = c.first(); e; e = c.first()) {
        auto position = codec::get_u64_be(e->first);
        auto stamp = decode(position, e->second).stamp;
        if (position >= last_position || stamp >= cutoff) return step;
        if (step.removed == max_rows ||
            (step.removed % 256 == 255 && std::chrono::steady_clock::now() >= deadline)) {
            step.more = true;
            return step;
        }
        c.del();
        ++step.removed;
        step.newest_removed = std::max(step.newest_removed, stamp);
    }
    return step;
}

void id_log::pruned(const prune_step& step) noexcept {
    // The head moved past the removed entries; their slots are tombstones now.
    head_ += step.removed;
    count_ -= std::min(count_, step.removed);
}

std::optional<id_log::entry> id_log::oldest(const txn_base& txn) const {
    cursor c{txn, table_};
    auto first = c.first();
    if (!first) return std::nullopt;
    return decode(codec::get_u64_be(first->first), first->second);
}

}  // namespace idem
