// compare_memory: the textbook idempotent consumer in hash maps, no persistence (see
// compare.hpp): the speed-of-memory line the stores are measured against.
//
//   memory   a set of processed message ids and a map of order totals

#include "compare.hpp"

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

using namespace idem_compare;
using idem_bench::clock_type;

run_result run_memory(const run_options& o) {
    run_result r;
    std::unordered_set<std::string> processed;
    std::unordered_map<std::string, idem_bench::totals> orders;
    message_reader in{o.log, o.limit};
    message m;
    const auto start = clock_type::now();
    while (in.next(m)) {
        ++r.messages;
        if (!processed.emplace(m.message_id).second) {
            ++r.duplicates;
            continue;
        }
        auto& t = orders[std::string(m.order_id)];
        t.total += m.amount;
        t.lines += 1;
        ++r.applied;
    }
    r.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    r.state = idem_bench::summarize({orders.begin(), orders.end()});
    return r;
}

}  // namespace

int main(int argc, char** argv) { return run_main(argc, argv, "compare_memory", {{"memory", run_memory}}); }
