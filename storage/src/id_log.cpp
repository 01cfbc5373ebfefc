#include <idem/storage/id_log.hpp>

#include <idem/storage/codec.hpp>

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
    if (staged_ids_.contains(id)) {
        return true;
    }
    auto hash = hash_of(id);
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

void id_log::stage(std::string_view id, std::uint64_t time_ns) {
    if (staged_.capacity() == staged_.size()) {
        // staged_ids_ holds views into staged_'s strings; moving short strings would
        // move their bytes (SSO), so re-point every view after growing.
        staged_.reserve(staged_.size() * 2 + 64);
        staged_ids_.clear();
        for (const auto& [staged_id, t] : staged_) staged_ids_.insert(staged_id);
    }
    staged_.emplace_back(std::string(id), time_ns);
    staged_ids_.insert(staged_.back().first);
}

void id_log::write(write_txn& txn) {
    std::string value;
    auto position = next_position_;
    for (const auto& [staged_id, time_ns] : staged_) {
        value.clear();
        codec::put_u64_le(value, time_ns);
        value.append(staged_id);
        txn.put(table_, codec::u64_key(position++), value, MDB_APPEND);
    }
}

void id_log::committed() {
    for (const auto& [staged_id, time_ns] : staged_) {
        insert(hash_of(staged_id), next_position_++);
    }
    rolled_back();
}

void id_log::rolled_back() {
    staged_ids_.clear();
    staged_.clear();
}

}  // namespace idem
