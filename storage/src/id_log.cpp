#include <idem/storage/id_log.hpp>

#include <idem/storage/codec.hpp>

#include <algorithm>
#include <functional>

namespace idem {

id_log::id_log(environment& env, const std::string& table) : table_(env.table(table)) {
    slots_.resize(1024);
    read_txn txn{env};
    rebuild(txn);
}

std::uint64_t id_log::hash_of(std::string_view id) noexcept {
    return std::hash<std::string_view>{}(id);
}

void id_log::insert(std::uint64_t hash, std::uint64_t position) {
    if ((count_ + 1) * 10 > slots_.size() * 7) {
        std::vector<slot> old(slots_.size() * 2);
        old.swap(slots_);
        count_ = 0;
        for (const auto& s : old) {
            if (s.position != 0) insert(s.hash, s.position - 1);
        }
    }
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask;; i = (i + 1) & mask) {
        if (slots_[i].position == 0) {
            slots_[i] = slot{hash, position + 1};
            ++count_;
            return;
        }
    }
}

void id_log::rebuild(const txn_base& txn) {
    std::fill(slots_.begin(), slots_.end(), slot{});
    count_ = 0;
    next_position_ = 1;
    cursor c{txn, table_};
    for (auto e = c.first(); e; e = c.next()) {
        auto position = codec::get_u64_be(e->first);
        insert(hash_of(e->second.substr(8)), position);
        next_position_ = position + 1;
    }
}

void id_log::catch_up(const txn_base& txn) {
    cursor c{txn, table_};
    auto last = c.last();
    if (!last) {
        if (next_position_ != 1) rebuild(txn);  // another writer emptied it
        return;
    }
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
        insert(hash_of(e->second.substr(8)), position);
        next_position_ = position + 1;
    }
}

bool id_log::contains(const txn_base& txn, std::string_view id) const {
    auto hash = hash_of(id);
    return staged(id, hash) || indexed(txn, id, hash);
}

bool id_log::stage_if_new(const txn_base& txn, std::string_view id, std::uint64_t time_ns) {
    return stage_if_new(txn, id, time_ns, hash_of(id));
}

bool id_log::contains(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    return staged(id, hash) || indexed(txn, id, hash);
}

void id_log::stage(std::string_view id, std::uint64_t time_ns, std::uint64_t hash) { stage_hashed(id, time_ns, hash); }

bool id_log::stage_if_new(const txn_base& txn, std::string_view id, std::uint64_t time_ns, std::uint64_t hash) {
    if (staged(id, hash) || indexed(txn, id, hash)) return false;
    stage_hashed(id, time_ns, hash);
    return true;
}

bool id_log::indexed(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask; slots_[i].position != 0; i = (i + 1) & mask) {
        if (slots_[i].hash != hash) continue;
        // Confirm against the log: equal hashes are not equal ids, and the entry may have been pruned.
        auto value = txn.get(table_, codec::u64_key(slots_[i].position - 1));
        if (value && value->size() >= 8 && value->substr(8) == id) {
            return true;
        }
    }
    return false;
}

bool id_log::staged(std::string_view id, std::uint64_t hash) const {
    if (staged_.empty()) return false;
    std::size_t mask = staged_slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask; staged_slots_[i] != 0; i = (i + 1) & mask) {
        const auto& s = staged_[staged_slots_[i] - 1];
        if (s.hash == hash && s.id == id) return true;
    }
    return false;
}

void id_log::stage(std::string_view id, std::uint64_t time_ns) { stage_hashed(id, time_ns, hash_of(id)); }

void id_log::stage_hashed(std::string_view id, std::uint64_t time_ns, std::uint64_t hash) {
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
    staged_.push_back(staged_id{std::string(id), time_ns, hash});
    staged_slots_[i] = static_cast<std::uint32_t>(staged_.size());
}

void id_log::write(write_txn& txn) {
    if (staged_.empty()) return;
    std::string value;
    auto position = next_position_;
    cursor c{txn, table_};  // appends through one cursor: no search from the root per id
    for (const auto& s : staged_) {
        value.clear();
        codec::put_u64_le(value, s.time_ns);
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

}  // namespace idem
