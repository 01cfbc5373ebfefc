#pragma once

// The simulation's producer and broker: a deterministic stream of deliveries made from one
// seed. Events of several partitions (disjoint keys, streams and ids), some malformed, some
// with payloads that do not decode or handlers that throw; copies redelivered under the same
// message id soon or long after the first was acknowledged, republished under a new message
// id (with the attributes in another order), or re-sent as a new event with the same effect;
// everything reordered within windows. Two schedules made from the same seed are identical,
// which is how a whole replay from the start is made.

#include "model.hpp"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace idem_sim {

/// How a world's schedule is shaped.
struct schedule_shape {
    std::size_t partitions = 3;
    std::size_t orders = 500;    ///< order streams per partition
    std::size_t accounts = 500;  ///< accounts per partition
    std::size_t players = 500;   ///< player streams per partition
    std::size_t matches = 50;    ///< matches per partition
    std::size_t window = 32;     ///< deliveries are shuffled within windows of up to this many (1: in order)
};

class schedule {
public:
    schedule(std::uint64_t seed, const schedule_shape& shape)
        : rng_(seed), shape_(shape), orders_(shape.partitions * shape.orders),
          players_(shape.partitions * shape.players) {}

    /// Returns the next delivery.
    delivery next() {
        if (window_.empty()) refill();
        auto d = std::move(window_.front());
        window_.pop_front();
        ++handed_;
        return d;
    }
    /// Returns how many deliveries next() has returned.
    std::uint64_t handed() const { return handed_; }

private:
    std::uint64_t pick(std::uint64_t lo, std::uint64_t hi) { return std::uniform_int_distribution<std::uint64_t>{lo, hi}(rng_); }
    bool chance(double p) { return std::uniform_real_distribution<double>{0, 1}(rng_) < p; }

    void refill() {
        const auto w = shape_.window <= 1 ? 1 : pick(1, shape_.window);
        std::vector<delivery> batch;
        while (batch.size() < w) {
            if (auto it = delayed_.begin(); it != delayed_.end() && it->first <= produced_) {
                batch.push_back(std::move(it->second));
                delayed_.erase(it);
            } else {
                produce(batch);
            }
            ++produced_;
        }
        std::shuffle(batch.begin(), batch.end(), rng_);
        for (auto& d : batch) window_.push_back(std::move(d));
    }

    void later(delivery d, std::uint64_t lo, std::uint64_t hi) { delayed_.emplace(produced_ + pick(lo, hi), std::move(d)); }

    static void attr(std::string& out, const char* name, const std::string& value) {
        out += '"';
        out += name;
        out += "\":\"";
        out += value;
        out += '"';
    }

    // The envelope's JSON; variant: another attribute order, whitespace and an unknown attribute.
    std::string body(const event& e, bool variant) {
        std::vector<std::string> parts;
        auto add = [&](const char* name, const std::string& value) {
            std::string s;
            attr(s, name, value);
            parts.push_back(std::move(s));
        };
        add("specversion", "1.0");
        add("id", e.id);
        add("source", e.source);
        add("type", type_name(e.type));
        if (!e.subject.empty()) add("subject", e.subject);
        if (e.sequence) {
            if (pick(0, 1) == 0) {
                add("sequence", std::to_string(*e.sequence));
            } else {
                parts.push_back("\"sequence\":" + std::to_string(*e.sequence));
            }
        }
        if (!e.msgid.empty()) add("msgid", e.msgid);
        parts.push_back("\"data\":" + data(e));
        if (variant) {
            add("xtrace", "t" + std::to_string(pick(0, 1u << 30)));
            std::shuffle(parts.begin(), parts.end(), rng_);
        }
        std::string out = "{";
        for (std::size_t i = 0; i < parts.size(); ++i) {
            if (i > 0) out += variant ? ", " : ",";
            out += parts[i];
        }
        out += variant ? " }" : "}";
        return out;
    }

    static const char* type_name(event_type t) {
        switch (t) {
        case event_type::line: return "sim.line";
        case event_type::note: return "sim.note";
        case event_type::fill: return "sim.fill";
        case event_type::score: return "sim.score";
        case event_type::ping: return "sim.ping";
        }
        return "";
    }

    static std::string data(const event& e) {
        const auto value = e.bad_payload ? "\"not a number\"" : std::to_string(e.value);
        std::string out = "{";
        switch (e.type) {
        case event_type::line: attr(out, "order", e.key); out += ",\"amount\":" + value; break;
        case event_type::note: attr(out, "order", e.key); break;
        case event_type::fill:
            attr(out, "account", e.key);
            out += ',';
            attr(out, "exec", e.exec);
            out += ",\"qty\":" + value;
            break;
        case event_type::score:
            attr(out, "match", e.key);
            out += ',';
            attr(out, "player", e.subject);
            out += ",\"points\":" + value;
            break;
        case event_type::ping: break;
        }
        return out + "}";
    }

    // One malformed envelope (exactly one thing wrong with it) and the reason it must get.
    std::pair<std::string, why> malformed(std::size_t p, std::uint64_t n) {
        const auto id = "k" + std::to_string(p) + "-bad-" + std::to_string(n);
        const std::string rest = R"("source":"/k)" + std::to_string(p) + R"(/orders","type":"sim.line","data":{"order":"x","amount":1})";
        switch (pick(0, 7)) {
        case 0: return {R"({"specversion":"1.0","id":")" + id + R"(","source":"/x")", why::invalid_json};
        case 1: return {"{" + rest + "}", why::missing_id};
        case 2: return {R"({"id":")" + id + R"(","source":"","type":"sim.line"})", why::missing_source};
        case 3: return {R"({"id":")" + id + R"(","source":"/x","data":{}})", why::missing_type};
        case 4: return {R"({"id":42,)" + rest + "}", why::invalid_field};
        case 5: return {R"({"specversion":"0.3","id":")" + id + R"(",)" + rest + "}", why::unsupported_specversion};
        case 6:
            return {R"({"specversion":"1.0","id":")" + id + R"(","subject":"k0o1","sequence":"0",)" + rest + "}",
                    why::invalid_sequence};
        default: return {R"({"specversion":"1.0","id":")" + id + R"(","sequence":3,)" + rest + "}", why::invalid_sequence};
        }
    }

    void produce(std::vector<delivery>& out) {
        const auto p = static_cast<std::size_t>(pick(0, shape_.partitions - 1));
        const auto k = "k" + std::to_string(p);
        const auto n = ++events_;
        delivery d;
        d.partition = static_cast<std::uint8_t>(p);
        const auto roll = pick(0, 999);
        if (roll < 15) {
            auto [text, r] = malformed(p, n);
            d.body = std::move(text);
            d.malformed = r;
            if (pick(0, 1) == 0) d.transport = k + "t" + std::to_string(n);
            if (chance(0.2)) later(d, 1, 3000);
            out.push_back(std::move(d));
            return;
        }
        auto e = std::make_shared<event>();
        e->id = k + "-" + std::to_string(n);
        e->value = static_cast<std::int64_t>(pick(1, 100000));
        if (roll < 400) {
            const auto i = p * shape_.orders + pick(0, shape_.orders - 1);
            e->type = roll < 340 ? event_type::line : event_type::note;
            e->source = "/" + k + "/orders";
            e->key = k + "o" + std::to_string(i);
            e->subject = e->key;
            e->sequence = ++orders_[i];
        } else if (roll < 680) {
            e->type = event_type::fill;
            e->source = "/" + k + "/venue";
            e->key = k + "a" + std::to_string(p * shape_.accounts + pick(0, shape_.accounts - 1));
            e->exec = k + "x" + std::to_string(n);
            if (chance(0.003)) e->key.clear();    // no aggregate key: missing_key
            if (chance(0.003)) e->exec.clear();   // an empty effect key: missing_key
            e->subject = e->key;
        } else if (roll < 980) {
            const auto i = p * shape_.players + pick(0, shape_.players - 1);
            e->type = event_type::score;
            e->source = "/" + k + "/game";
            e->subject = k + "p" + std::to_string(i);
            e->key = k + "m" + std::to_string(pick(0, shape_.matches - 1));
            e->sequence = ++players_[i];
        } else {
            e->type = event_type::ping;
            e->source = "/" + k + "/ping";
        }
        e->bad_payload = e->type != event_type::ping && e->type != event_type::note && chance(0.004);
        switch (pick(0, 3)) {
        case 0:
        case 1: d.transport = k + "t" + std::to_string(n); break;
        case 2: e->msgid = k + "g" + std::to_string(n); break;
        default: break;
        }
        std::shared_ptr<const event> ev = e;
        d.ev = ev;
        d.body = body(*ev, false);
        if (chance(0.12)) {  // the broker redelivers it: soon, or long after it was acknowledged
            if (pick(0, 1) == 0) {
                later(d, 1, 32);
            } else {
                later(d, 100, 20000);
            }
        }
        if (chance(0.04)) {  // republished under a new message id, attributes in another order
            delivery again;
            again.ev = ev;
            again.partition = d.partition;
            again.transport = k + "r" + std::to_string(n);
            again.body = body(*ev, true);
            later(std::move(again), 1, 5000);
        }
        if (chance(0.02)) {  // the producer re-sends it as a new event: same effect key, same stream position
            auto copy = std::make_shared<event>(*ev);
            copy->id = k + "-" + std::to_string(n) + "-resent";
            copy->msgid.clear();
            delivery resent;
            resent.ev = copy;
            resent.partition = d.partition;
            resent.body = body(*copy, pick(0, 1) == 0);
            later(std::move(resent), 1, 2000);
        }
        out.push_back(std::move(d));
    }

    std::mt19937_64 rng_;
    schedule_shape shape_;
    std::vector<std::uint64_t> orders_;   // per order stream: the last sequence produced
    std::vector<std::uint64_t> players_;  // per player stream
    std::multimap<std::uint64_t, delivery> delayed_;  // copies due at a later position
    std::deque<delivery> window_;
    std::uint64_t produced_ = 0;
    std::uint64_t handed_ = 0;
    std::uint64_t events_ = 0;
};

}  // namespace idem_sim
