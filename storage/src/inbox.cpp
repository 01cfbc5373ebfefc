#include <idem/storage/inbox.hpp>

#include <idem/storage/codec.hpp>

#include <functional>

namespace idem {

inbox::inbox(environment& env, const std::string& consumer) : table_(env.table("inbox/" + consumer)) {
    slots_.resize(1024);
    read_txn txn{env};
    rebuild(txn);
}

std::uint64_t inbox::hash_of(std::string_view id) noexcept {
    return std::hash<std::string_view>{}(id);
}

void inbox::insert(std::uint64_t hash, std::uint64_t position) {
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

void inbox::rebuild(const txn_base& txn) {
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

void inbox::catch_up(const txn_base& txn) {
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

bool inbox::contains(const txn_base& txn, std::string_view message_id) const {
    if (staged_ids_.contains(message_id)) {
        return true;
    }
    auto hash = hash_of(message_id);
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask; slots_[i].position != 0; i = (i + 1) & mask) {
        if (slots_[i].hash != hash) continue;
        // Confirm against the log: equal hashes are not equal ids, and the entry may have been pruned.
        auto value = txn.get(table_, codec::u64_key(slots_[i].position - 1));
        if (value && value->size() >= 8 && value->substr(8) == message_id) {
            return true;
        }
    }
    return false;
}

void inbox::stage(std::string_view message_id, std::uint64_t time_ns) {
    if (staged_.capacity() == staged_.size()) {
        // staged_ids_ holds views into staged_'s strings; moving short strings would
        // move their bytes (SSO), so re-point every view after growing.
        staged_.reserve(staged_.size() * 2 + 64);
        staged_ids_.clear();
        for (const auto& [id, t] : staged_) staged_ids_.insert(id);
    }
    staged_.emplace_back(std::string(message_id), time_ns);
    staged_ids_.insert(staged_.back().first);
}

void inbox::write(write_txn& txn) {
    std::string value;
    auto position = next_position_;
    for (const auto& [id, time_ns] : staged_) {
        value.clear();
        codec::put_u64_le(value, time_ns);
        value.append(id);
        txn.put(table_, codec::u64_key(position++), value, MDB_APPEND);
    }
}

void inbox::committed() {
    for (const auto& [id, time_ns] : staged_) {
        insert(hash_of(id), next_position_++);
    }
    rolled_back();
}

void inbox::rolled_back() {
    staged_ids_.clear();
    staged_.clear();
}

}  // namespace idem
