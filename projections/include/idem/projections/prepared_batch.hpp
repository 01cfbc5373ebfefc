#pragma once

// Deliveries parsed and decoded ahead of the writer (store::prepare), applied by store::apply.

#include <cstddef>
#include <memory>
#include <vector>

namespace idem {

/// Deliveries parsed and decoded ahead of the writer by store::prepare(), for store::apply().
class prepared_batch {
public:
    prepared_batch();
    ~prepared_batch();
    prepared_batch(prepared_batch&&) noexcept;
    prepared_batch& operator=(prepared_batch&&) noexcept;

    /// Returns the number of deliveries.
    std::size_t size() const noexcept;
    /// Moves other's deliveries to the end of this batch (a writer gathering prepared submissions).
    void append(prepared_batch&& other);
    /// Moves delivery i of other to the end of this batch (a writer handing deliveries back,
    /// so that the thread which prepared them also frees them).
    void take(prepared_batch& other, std::size_t i);
    /// Empties the batch, keeping its memory.
    void clear() noexcept;
    /// Makes room for n deliveries, so that appending up to n moves each item once.
    void reserve(std::size_t n);

    struct item;  ///< opaque: one delivery, parsed, its payload decoded per projection

private:
    friend class store;
    // Each item on the heap: a writer gathering submissions and handing them back moves
    // pointers, not the items' dozens of strings.
    std::vector<std::unique_ptr<item>> items_;
};

}  // namespace idem
