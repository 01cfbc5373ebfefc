#pragma once
// Internal to the projections library: a string-keyed hash table for the writer's hot paths.

#include <idem/storage/slot_index.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace idem::detail {

/// Strings to V with one hash per lookup and references that stay valid as it grows (also
/// when the table is moved): the entries live in a deque, a slot_index finds them. The hash
/// is the caller's, computed ahead: hash_of(key) or any other function of the key, the same
/// for every call with that key. Entries are only ever added; clear() empties the table.
template <class V>
class string_table {
public:
    struct entry {
        std::string key;
        std::uint64_t hash = 0;
        V value{};
    };

    /// Returns the hash try_emplace uses for key.
    static std::uint64_t hash_of(std::string_view key) noexcept { return std::hash<std::string_view>{}(key); }
    /// Returns the entry for key, inserting a default value if absent; and whether it was inserted.
    std::pair<entry*, bool> try_emplace(std::string_view key) { return try_emplace(key, hash_of(key)); }
    /// The same with key's hash computed ahead.
    std::pair<entry*, bool> try_emplace(std::string_view key, std::uint64_t hash) {
        if (const auto k = index_of(key, hash); k != slot_index::npos) return {&entries_[k], false};
        // The entry first, then its slot: a throw on the way leaves no slot without its entry.
        auto& e = entries_.emplace_back();
        try {
            e.key.assign(key);
            e.hash = hash;
            slots_.insert(entries_.size() - 1, hash, [&](std::size_t i) { return entries_[i].hash; });
        } catch (...) {
            entries_.pop_back();
            throw;
        }
        return {&e, true};
    }
    /// Returns the entry for key (hash_of(key) computed ahead), or null.
    entry* find(std::string_view key, std::uint64_t hash) {
        const auto k = index_of(key, hash);
        return k == slot_index::npos ? nullptr : &entries_[k];
    }
    const entry* find(std::string_view key, std::uint64_t hash) const {
        const auto k = index_of(key, hash);
        return k == slot_index::npos ? nullptr : &entries_[k];
    }
    /// Returns whether the table holds no entry.
    bool empty() const noexcept { return entries_.empty(); }
    void clear() {
        entries_.clear();
        slots_.clear();
    }
    /// Asks the CPU to bring hash's slot into cache (a stage ahead of prefetch()).
    void prefetch_slot(std::uint64_t hash) const noexcept { slots_.prefetch_slot(hash); }
    /// Asks the CPU to bring hash's slot, and the entry it holds now, into cache.
    void prefetch(std::uint64_t hash) const noexcept {
        if (const auto k = slots_.first(hash); k != slot_index::npos) __builtin_prefetch(&entries_[k]);
    }
    std::deque<entry>& entries() noexcept { return entries_; }

private:
    std::size_t index_of(std::string_view key, std::uint64_t hash) const {
        return slots_.probe(hash, [&](std::size_t i) { return entries_[i].hash == hash && entries_[i].key == key; });
    }

    std::deque<entry> entries_;
    slot_index slots_;
};

}  // namespace idem::detail
