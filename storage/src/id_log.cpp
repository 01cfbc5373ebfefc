#include <idem/storage/id_log.hpp>

#include <idem/storage/codec.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <new>
#include <utility>

namespace idem {

namespace {

// Slots of the old table moved per insert while the index grows: a new table must receive
// all of them before it fills to its own limit (0.7). Doubling needs more than 1.5 per
// insert, shedding tombstones at the same size (half full) more than 5. Slower is gentler:
// while they move, lookups probe two tables and each insert places a few more entries.
constexpr std::size_t drain_when_doubling = 4;
constexpr std::size_t drain_at_same_size = 16;
// Inserts per page of the successor table populated in advance. It is prepared from half the
// fill limit (0.35 of the table) on; one page per 16 inserts finishes a doubled successor
// (table size / 128 pages) by 0.35 + 16/128 = 0.475 of the table.
constexpr std::size_t inserts_per_page = 16;
// Pages populated at a time: one system call for 16 pages costs ~1.2 us a page where a fault
// per page costs ~15 us on a virtual machine (measured), and 16 pages (~20 us) stay far
// below what a batch may wait.
constexpr std::size_t pages_per_populate = 16;
constexpr std::size_t page_bytes = 4096;
// Tables up to this size come from the heap (see slot_table).
constexpr std::size_t heap_table_bytes = std::size_t{128} << 10;

// The size of the table that takes over when one of size entries reaches its limit: the
// live entries without the tombstones, twice the size only if they would fill half of it.
std::size_t successor_size(std::size_t size, std::size_t live) { return (live + 1) * 2 > size ? 2 * size : size; }

}  // namespace

id_log::slot_table::slot_table(std::size_t size, bool huge_pages) : size_(size) {
    if (size * sizeof(slot) <= heap_table_bytes) {
        data_ = static_cast<slot*>(std::calloc(size, sizeof(slot)));
        if (data_ == nullptr) throw std::bad_alloc();
        heap_ = true;
        return;
    }
    // Straight from the kernel: zero pages that cost nothing until touched. (calloc may hand
    // back reused heap memory and clear all of it at once, and touching every page of a
    // 32 MiB table at once stalls the writer for tens of milliseconds.)
    void* p = ::mmap(nullptr, size * sizeof(slot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Advice only: where the kernel has no huge page at hand (or transparent huge pages are
    // off), the table gets small pages.
    if (huge_pages) ::madvise(p, size * sizeof(slot), MADV_HUGEPAGE);
    data_ = static_cast<slot*>(p);
}

std::size_t id_log::slot_table::pages() const noexcept { return (size_ * sizeof(slot) + page_bytes - 1) / page_bytes; }

void id_log::slot_table::populate(std::size_t first, std::size_t count) noexcept {
    if (heap_) return;  // calloc wrote it, or took it fresh from the kernel (a few pages)
    auto* start = reinterpret_cast<unsigned char*>(data_) + first * page_bytes;
    // Linux 5.14 on; an older kernel refuses the advice (EINVAL) and each page is written
    // instead (a write, so the page is the table's own: a read would map the shared zero page).
    if (::madvise(start, count * page_bytes, MADV_POPULATE_WRITE) == 0) return;
    for (std::size_t i = 0; i < count; ++i) *reinterpret_cast<volatile unsigned char*>(start + i * page_bytes) = 0;
}

id_log::slot_table::slot_table(slot_table&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      heap_(std::exchange(other.heap_, false)) {}

id_log::slot_table& id_log::slot_table::operator=(slot_table&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        heap_ = std::exchange(other.heap_, false);
    }
    return *this;
}

id_log::slot_table::~slot_table() { release(); }

void id_log::slot_table::release() noexcept {
    if (data_ == nullptr) return;
    if (heap_) {
        std::free(data_);
    } else {
        ::munmap(data_, size_ * sizeof(slot));
    }
}

id_log::id_log(environment& env, const std::string& table, std::size_t extra_words)
    : table_(env.table(table)), extra_words_(std::min(extra_words, max_extra)) {
    read_txn txn{env};
    rebuild(txn);
}

std::uint64_t id_log::hash_of(std::string_view id) noexcept {
    return std::hash<std::string_view>{}(id);
}

void id_log::insert(std::uint64_t hash, std::uint64_t position) {
    if (!draining_.empty()) drain(drain_rate_);
    prepare_next();
    if ((occupied_ + 1) * 10 > slots_.size() * 7) regrow();
    place(hash, position);
    ++count_;
}

void id_log::place(std::uint64_t hash, std::uint64_t position) {
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = static_cast<std::size_t>(hash) & mask;; i = (i + 1) & mask) {
        if (slots_[i].position == 0 || !live(slots_[i])) {
            if (slots_[i].position == 0) ++occupied_;
            slots_[i] = slot{hash, position + 1};
            return;
        }
    }
}

void id_log::prepare_next() {
    // Past half its fill limit, the table's successor is mapped and its pages populated one per
    // 16 inserts, 16 at a time: faulting in a fresh 32 MiB table costs ~8,000 page faults,
    // microseconds each on a virtual machine, and when entries land in it at random they all
    // come at once.
    if (!draining_.empty() || occupied_ * 20 <= slots_.size() * 7) return;
    if (next_.empty()) {
        // Expected live entries at the limit: every insert until then adds one.
        const auto at_limit = count_ + (slots_.size() * 7 / 10 - std::min(occupied_, slots_.size() * 7 / 10));
        next_ = slot_table(successor_size(slots_.size(), at_limit), huge_pages_);
        touched_ = 0;
        until_touch_ = 0;
    }
    if (touched_ < next_.pages() && until_touch_-- == 0) {
        const auto n = std::min(pages_per_populate, next_.pages() - touched_);
        next_.populate(touched_, n);
        touched_ += n;
        until_touch_ = inserts_per_page * n - 1;
    }
}

void id_log::regrow() {
    // A new table for the live entries, without the tombstones (see successor_size). The
    // entries move over the next inserts (drain).
    drain(draining_.size());  // a previous move not done yet (not expected) finishes first
    const auto size = successor_size(slots_.size(), count_);
    slot_table fresh = next_.size() == size ? std::move(next_) : slot_table(size, huge_pages_);
    next_ = slot_table{};
    drain_rate_ = size > slots_.size() ? drain_when_doubling : drain_at_same_size;
    draining_ = std::exchange(slots_, std::move(fresh));
    drained_ = 0;
    occupied_ = 0;
}

void id_log::drain(std::size_t slots) {
    const auto end = drained_ + std::min(slots, draining_.size() - drained_);
    for (; drained_ < end; ++drained_) {
        const auto& s = draining_[drained_];
        if (s.position != 0 && live(s)) place(s.hash, s.position - 1);
    }
    if (drained_ == draining_.size()) {
        draining_ = slot_table{};
        drained_ = 0;
    }
}

void id_log::rebuild(const txn_base& txn) {
    // Sized for the log as it is (at most half full), so reading it in moves nothing.
    MDB_stat st{};
    if (int rc = mdb_stat(txn.handle(), table_, &st); rc != 0) throw_lmdb(rc, "cannot read the size of an id log");
    std::size_t size = 1024;
    while (size < 2 * st.ms_entries) size *= 2;
    slots_ = slot_table(size, huge_pages_);
    slots_.populate(0, slots_.pages());  // filled at random below: every page is written anyway
    draining_ = slot_table{};
    drained_ = 0;
    next_ = slot_table{};
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

bool id_log::contains(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    return staged(id, hash) != nullptr || indexed(txn, id, hash).has_value();
}

std::optional<id_log::entry> id_log::find(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    if (const auto* s = staged(id, hash)) return entry{0, s->stamp, s->extra};
    return indexed(txn, id, hash);
}

void id_log::stage(std::string_view id, std::uint64_t stamp, std::uint64_t hash) { stage_hashed(id, stamp, hash); }

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
    // While the index grows, an entry is in the new table, the old one, or both.
    for (const auto* table : {&slots_, &draining_}) {
        const auto& t = *table;
        if (t.empty()) continue;
        std::size_t mask = t.size() - 1;
        for (std::size_t i = static_cast<std::size_t>(hash) & mask; t[i].position != 0; i = (i + 1) & mask) {
            if (t[i].hash != hash || !live(t[i])) continue;
            // Confirm against the log: equal hashes are not equal ids, and another writer may have pruned it.
            auto position = t[i].position - 1;
            auto value = txn.get(table_, codec::u64_key(position));
            if (value && value->size() >= 8 * (1 + extra_words_) && id_of(*value) == id) {
                return decode(position, *value);
            }
        }
    }
    return std::nullopt;
}

std::optional<id_log::entry> id_log::find_newest(const txn_base& txn, std::string_view id, std::uint64_t hash) const {
    if (!staged_.empty()) {
        // Staged entries are newer than any in the log; among them the one staged last.
        const staged_id* newest = nullptr;
        staged_slots_.probe(hash, [&](std::size_t k) {
            const auto& s = staged_[k];
            if (s.hash == hash && bytes_of(s) == id && (newest == nullptr || &s > newest)) newest = &s;
            return false;
        });
        if (newest != nullptr) return entry{0, newest->stamp, newest->extra};
    }
    std::optional<entry> best;
    for (const auto* table : {&slots_, &draining_}) {
        const auto& t = *table;
        if (t.empty()) continue;
        std::size_t mask = t.size() - 1;
        for (std::size_t i = static_cast<std::size_t>(hash) & mask; t[i].position != 0; i = (i + 1) & mask) {
            if (t[i].hash != hash || !live(t[i])) continue;
            auto position = t[i].position - 1;
            if (best && best->position >= position) continue;
            auto value = txn.get(table_, codec::u64_key(position));
            if (value && value->size() >= 8 * (1 + extra_words_) && id_of(*value) == id) best = decode(position, *value);
        }
    }
    return best;
}

const id_log::staged_id* id_log::staged(std::string_view id, std::uint64_t hash) const {
    if (staged_.empty()) return nullptr;
    const auto k =
        staged_slots_.probe(hash, [&](std::size_t i) { return staged_[i].hash == hash && bytes_of(staged_[i]) == id; });
    return k == detail::slot_index::npos ? nullptr : &staged_[k];
}

void id_log::stage(std::string_view id, std::uint64_t stamp) { stage_hashed(id, stamp, hash_of(id)); }

void id_log::stage_hashed(std::string_view id, std::uint64_t stamp, std::uint64_t hash) {
    staged_slots_.insert(staged_.size(), hash, [&](std::size_t k) { return staged_[k].hash; });
    staged_.push_back(staged_id{staged_bytes_.size(), id.size(), stamp, hash, {}});
    staged_bytes_.append(id);
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
        value.append(bytes_of(s));
        c.put(codec::u64_key(position++), value, MDB_APPEND);
    }
}

void id_log::committed() {
    // The slots land at random in a large table: fetch them a few entries ahead.
    constexpr std::size_t ahead = 8;
    for (std::size_t i = 0; i < staged_.size(); ++i) {
        if (i + ahead < staged_.size()) slots_.prefetch(staged_[i + ahead].hash);
        insert(staged_[i].hash, next_position_++);
    }
    rolled_back();
}

void id_log::rolled_back() {
    if (staged_.empty()) return;
    staged_.clear();
    staged_bytes_.clear();
    staged_slots_.reset();
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

}  // namespace idem
