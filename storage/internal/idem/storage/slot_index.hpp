#pragma once

// Open addressing over entries kept elsewhere (a vector, a deque): each slot holds an entry's
// index + 1 (0: empty), found by linear probing from its hash; at most 70% full, doubled (at
// least 64 slots) by placing every entry again. The batch-local tables of the writer use it:
// the ids an id_log stages, and the rows and streams a batch touches. Not installed.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace idem::detail {

class slot_index {
public:
    /// Calls visit(index) for each entry on hash's probe chain until it returns true; returns
    /// that index, or npos.
    template <class Visit>
    std::size_t probe(std::uint64_t hash, Visit&& visit) const {
        if (slots_.empty()) return npos;
        const std::size_t mask = slots_.size() - 1;
        for (auto i = static_cast<std::size_t>(hash) & mask; slots_[i] != 0; i = (i + 1) & mask) {
            if (const std::size_t k = std::size_t{slots_[i]} - 1; visit(k)) return k;
        }
        return npos;
    }
    /// Places entry index (the count-th, hashing to hash); grows first when it would pass 70%,
    /// placing entries 0..index-1 again by hash_of(k).
    template <class HashOf>
    void insert(std::size_t index, std::uint64_t hash, HashOf&& hash_of) {
        if ((index + 1) * 10 > slots_.size() * 7) {
            slots_.assign(std::max<std::size_t>(64, slots_.size() * 2), 0);
            for (std::size_t k = 0; k < index; ++k) place(k, hash_of(k));
        }
        place(index, hash);
    }
    /// Returns the entry index in hash's first slot, or npos (for prefetching it).
    std::size_t first(std::uint64_t hash) const noexcept {
        if (slots_.empty()) return npos;
        const auto slot = slots_[static_cast<std::size_t>(hash) & (slots_.size() - 1)];
        return slot == 0 ? npos : std::size_t{slot} - 1;
    }
    /// Asks the CPU to bring hash's first slot into cache (first() then finds it there).
    void prefetch_slot(std::uint64_t hash) const noexcept {
        if (!slots_.empty()) __builtin_prefetch(&slots_[static_cast<std::size_t>(hash) & (slots_.size() - 1)]);
    }
    /// Empties every slot, keeping their memory.
    void reset() noexcept { std::fill(slots_.begin(), slots_.end(), 0u); }
    /// Empties the index and frees its slots.
    void clear() noexcept { slots_.clear(); }

    static constexpr std::size_t npos = static_cast<std::size_t>(-1);

private:
    void place(std::size_t index, std::uint64_t hash) {
        const std::size_t mask = slots_.size() - 1;
        auto i = static_cast<std::size_t>(hash) & mask;
        while (slots_[i] != 0) i = (i + 1) & mask;
        slots_[i] = static_cast<std::uint32_t>(index + 1);
    }

    std::vector<std::uint32_t> slots_;
};

}  // namespace idem::detail
