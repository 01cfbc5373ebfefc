// Which partition an aggregate key belongs to, and who holds each partition's lease: the
// lookups a publisher and `idem owners` make of a partitioned group, outside any instance.

#include <idem/sources/jetstream_partitions.hpp>

#include "connection.hpp"
#include "lease.hpp"
#include "publish_naming.hpp"

namespace idem::jetstream {

std::uint32_t partition_of_token(std::string_view token, std::uint32_t partitions) {
    std::uint32_t h = 2166136261u;  // FNV-1a, as Go's hash/fnv New32a
    for (char c : token) {
        h ^= static_cast<unsigned char>(c);
        h *= 16777619u;
    }
    return partitions == 0 ? 0 : h % partitions;
}

std::uint32_t partition_of(std::string_view aggregate_key, std::uint32_t partitions) {
    return partition_of_token(detail::subject_token(aggregate_key), partitions);
}

std::string lease_bucket(const std::string& consumer) { return "idem-leases-" + consumer; }

std::vector<lease_owner> read_owners(const std::vector<std::string>& servers, const std::string& consumer) {
    detail::connection c{servers, "idem owners"};
    detail::lease_bucket b{c, consumer};
    std::vector<lease_owner> out;
    for (std::uint32_t k = 0; k < 4096; ++k) {
        auto e = b.read(k);
        if (e.revision == 0 && !e.kept) {
            // Partitions are numbered densely: stop after a run of absent keys.
            bool more = false;
            for (std::uint32_t j = k + 1; j < k + 16 && !more; ++j) {
                auto later = b.read(j);
                more = later.revision != 0 || later.kept;
            }
            if (!more) break;
            continue;
        }
        out.push_back({k, e.instance, e.revision, e.checkpoint, e.kept, e.kept_by});
    }
    return out;
}

}  // namespace idem::jetstream
