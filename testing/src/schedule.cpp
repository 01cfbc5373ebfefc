#include "schedule.hpp"

#include <algorithm>
#include <map>

namespace idem::testing::detail {

namespace {

// splitmix64: the same numbers on every platform and standard library, so a seed names one
// schedule everywhere (std::uniform_int_distribution is implementation-defined).
class random {
public:
    explicit random(std::uint64_t seed) : state_(seed) {}
    std::uint64_t next() {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }
    /// Returns a number in [0, n), n > 0.
    std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
    /// Returns true with probability 1/n.
    bool one_in(std::size_t n) { return below(n) == 0; }

private:
    std::uint64_t state_;
};

// The order of first deliveries: streams interleaved at random; within a sequenced stream a
// later event may come first (it parks until the gap fills); an unsequenced stream keeps its
// order, since nothing could tell its rows the right one.
std::vector<std::size_t> first_order(random& r, const std::vector<event>& events) {
    std::map<std::string, std::vector<std::size_t>> streams;
    for (std::size_t i = 0; i < events.size(); ++i) {
        const auto& env = events[i].env;
        // Events without a subject are streams of their own.
        streams[env.subject.empty() ? "\x01" + std::to_string(i) : env.subject].push_back(i);
    }
    std::vector<std::vector<std::size_t>> queues;
    for (auto& [name, q] : streams) queues.push_back(std::move(q));
    std::vector<std::size_t> order;
    while (order.size() < events.size()) {
        std::vector<std::size_t> open;
        for (std::size_t q = 0; q < queues.size(); ++q) {
            if (!queues[q].empty()) open.push_back(q);
        }
        auto& q = queues[open[r.below(open.size())]];
        std::size_t pick = 0;
        if (q.size() > 1 && events[q.front()].env.sequence && r.one_in(4)) {
            pick = 1 + r.below(std::min<std::size_t>(3, q.size() - 1));
            if (!events[q[pick]].env.sequence) pick = 0;
        }
        order.push_back(q[pick]);
        q.erase(q.begin() + static_cast<std::ptrdiff_t>(pick));
    }
    return order;
}

const char* const killed_points[] = {"after_decode", "mid_batch", "before_commit", "after_commit"};

}  // namespace

std::vector<step> generate(std::uint64_t seed, const std::vector<event>& events, const generate_options& o) {
    random r{seed};
    std::vector<delivery_step> list;
    for (auto i : first_order(r, events)) list.push_back({i, copy_kind::original, 0});
    // Extra copies, each somewhere after its event's first delivery.
    std::vector<std::uint32_t> copies(events.size(), 0);
    const auto originals = list.size();
    for (std::size_t k = 0; k < originals; ++k) {
        const auto e = list[k].event;
        auto add = [&](copy_kind kind) {
            auto first = static_cast<std::size_t>(
                std::find_if(list.begin(), list.end(), [&](const delivery_step& d) { return d.event == e; }) -
                list.begin());
            auto at = first + 1 + r.below(list.size() - first);
            list.insert(list.begin() + static_cast<std::ptrdiff_t>(at), delivery_step{e, kind, ++copies[e]});
        };
        if (r.one_in(4)) add(copy_kind::same_message_id);
        if (r.one_in(5)) add(copy_kind::new_message_id);
        if (o.resends && r.one_in(6)) add(copy_kind::resent);
    }
    std::vector<step> steps;
    for (std::size_t k = 0; k < list.size();) {
        const auto n = std::min(list.size() - k, 1 + r.below(r.one_in(3) ? 4 : 2));
        step s;
        s.batch.assign(list.begin() + static_cast<std::ptrdiff_t>(k),
                       list.begin() + static_cast<std::ptrdiff_t>(k + n));
        k += n;
        switch (r.below(o.forked_crashes ? 12 : 10)) {
            case 0:
                s.crash = crash_kind::before_commit;
                break;
            case 1:
                s.crash = crash_kind::after_commit;
                break;
            case 10:
            case 11:
                s.crash = crash_kind::killed;
                {
                    // mid_batch is passed only by batches of two or more.
                    static constexpr std::size_t single[] = {0, 2, 3};
                    s.point = killed_points[s.batch.size() >= 2 ? r.below(4) : single[r.below(3)]];
                }
                break;
            default:
                break;
        }
        steps.push_back(std::move(s));
        if (r.one_in(6)) {
            step p;
            p.kind = step_kind::prune;
            if (o.forked_crashes && r.one_in(3)) {
                p.crash = crash_kind::killed;
                p.point = "during_prune";
            }
            steps.push_back(std::move(p));
        }
        if (r.one_in(10)) steps.push_back(step{step_kind::reopen, {}, crash_kind::none, {}});
    }
    return steps;
}

std::string body_of(const event& e, const delivery_step& d) {
    switch (d.kind) {
        case copy_kind::original:
        case copy_kind::same_message_id:
            return e.body;
        case copy_kind::new_message_id: {
            auto env = e.env;
            env.msgid = "chaos-" + env.id + "-m" + std::to_string(d.copy);
            return env.to_json();
        }
        case copy_kind::resent: {
            auto env = e.env;
            env.id += "~resent-" + std::to_string(d.copy);
            env.msgid = "chaos-" + env.id;
            return env.to_json();
        }
    }
    return e.body;
}

namespace {

std::string describe(const delivery_step& d, const std::vector<event>& events) {
    const auto& env = events[d.event].env;
    std::string out = "id " + env.id + " source " + env.source + " (envelope " +
                      std::to_string(events[d.event].number) + ": " + env.type;
    if (!env.subject.empty()) out += " " + env.subject;
    if (env.sequence) out += "#" + std::to_string(*env.sequence);
    out += ")";
    switch (d.kind) {
        case copy_kind::original:
            break;
        case copy_kind::same_message_id:
            out += " (again, same message id)";
            break;
        case copy_kind::new_message_id:
            out += " (again, new message id chaos-" + env.id + "-m" + std::to_string(d.copy) + ")";
            break;
        case copy_kind::resent:
            out += " (re-sent as new event id " + env.id + "~resent-" + std::to_string(d.copy) + ")";
            break;
    }
    return out;
}

}  // namespace

std::string describe(const step& s, const std::vector<event>& events) {
    switch (s.kind) {
        case step_kind::prune:
            return s.crash == crash_kind::killed
                       ? "prune the inbox in a child killed (SIGKILL) at during_prune; reopen; prune again"
                       : "prune the inbox (every id expired)";
        case step_kind::reopen:
            return "close and reopen the store";
        case step_kind::deliver:
            break;
    }
    std::string out = "deliver [";
    for (std::size_t i = 0; i < s.batch.size(); ++i) out += (i ? ", " : "") + describe(s.batch[i], events);
    out += "]";
    switch (s.crash) {
        case crash_kind::none:
            break;
        case crash_kind::before_commit:
            out += " then crash before the commit; reopen; redeliver";
            break;
        case crash_kind::after_commit:
            out += " then crash after the commit (not acknowledged); reopen; redeliver";
            break;
        case crash_kind::killed:
            out += " in a child killed (SIGKILL) at " + s.point + "; reopen; redeliver";
            break;
    }
    return out;
}

std::size_t deliveries(const std::vector<step>& steps) {
    std::size_t n = 0;
    for (const auto& s : steps) n += s.batch.size();
    return n;
}

}  // namespace idem::testing::detail
