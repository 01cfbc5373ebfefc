#include "event_ids.hpp"

#include <idem/projections/layout.hpp>

#include <idem/storage/codec.hpp>
#include <idem/storage/event_id.hpp>
#include <idem/storage/error.hpp>

namespace idem::detail {

namespace {

struct decoded {
    std::uint64_t stamp = 0;
    std::string_view message_id;
    std::string_view event_id;
};

std::optional<decoded> decode(std::string_view v) {
    if (v.size() < 12) return std::nullopt;
    decoded d;
    d.stamp = codec::get_u64_le(v);
    const auto n = codec::get_u32_le(v.substr(8));
    if (v.size() - 12 < n) return std::nullopt;
    d.message_id = v.substr(12, n);
    d.event_id = v.substr(12 + n);
    return d;
}

}  // namespace

event_id_log::event_id_log(environment& env, const std::string& consumer, MDB_dbi inbox)
    : table_(env.table(table_name(consumer))), inbox_(inbox) {}

std::string event_id_log::table_name(std::string_view consumer) { return layout::event_ids_table(consumer); }

void event_id_log::stage(std::string_view message_id, const envelope& ev, std::uint64_t stamp) {
    codec::put_u64_le(staged_, stamp);
    codec::put_u32_le(staged_, static_cast<std::uint32_t>(message_id.size()));
    staged_.append(message_id);
    append_event_id(staged_, ev.source, ev.id);
    ends_.push_back(staged_.size());
}

void event_id_log::write(write_txn& txn) {
    cursor c{txn, table_};
    // Entries stamped before the inbox's oldest id name ids the inbox pruned. Removing a few
    // more than this batch adds keeps the log's head within the inbox's.
    std::uint64_t oldest = 0;
    {
        cursor in{txn, inbox_};
        if (auto first = in.first(); first && first->second.size() >= 8) oldest = codec::get_u64_le(first->second);
    }
    std::size_t budget = ends_.size() + 64;
    for (auto e = c.first(); e && budget != 0; e = c.first(), --budget) {
        auto d = decode(e->second);
        if (d && d->stamp >= oldest) break;
        c.del();
    }
    if (ends_.empty()) return;
    auto last = c.last();
    std::uint64_t position = last ? codec::get_u64_be(last->first) + 1 : 1;
    const std::string_view all = staged_;
    std::size_t begin = 0;
    for (const auto end : ends_) {
        c.put(codec::u64_key(position++), all.substr(begin, end - begin), MDB_APPEND);
        begin = end;
    }
    clear();
}

std::vector<std::string> event_id_log::message_ids(const txn_base& txn, MDB_dbi table, std::string_view event_id) {
    std::vector<std::string> out;
    cursor c{txn, table};
    for (auto e = c.first(); e; e = c.next()) {
        if (auto d = decode(e->second); d && d->event_id == event_id) out.emplace_back(d->message_id);
    }
    return out;
}

std::optional<std::string> event_id_log::event_id(const txn_base& txn, MDB_dbi table, std::string_view message_id) {
    cursor c{txn, table};
    for (auto e = c.first(); e; e = c.next()) {
        if (auto d = decode(e->second); d && d->message_id == message_id) return std::string(d->event_id);
    }
    return std::nullopt;
}

}  // namespace idem::detail
