#pragma once

// A store's claim on a durable consumer: one durable consumer feeds one store, and two stores
// consuming it at once would split the stream between them, each missing what the other got.
// The claim is key "<stream>.<consumer>" (characters other than letters, digits, '-' and '_'
// written "=XX") of the KV bucket "idem-claims", whose TTL is the claim's time; its value
// "<host> <pid> <store>" names the holder. It is taken by compare-and-set (created, or updated
// from free "-" or from an earlier run of the same store on the same host, which the store's
// writer lock says is over), renewed by compare-and-set on its revision, and given up at the
// end of a run by writing "-" the same way. A killed holder's claim expires with the TTL.

#include "connection.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

namespace idem::jetstream::detail {

class consumer_claim {
public:
    /// Takes the claim of stream's consumer for store, creating the bucket (TTL ttl, replicas)
    /// if it is missing. Throws errc::invalid_argument naming the holder when another store
    /// holds it, errc::broker_failed when the bucket cannot be reached.
    consumer_claim(const connection& c, const std::string& stream, const std::string& consumer,
                   const std::filesystem::path& store, std::chrono::milliseconds ttl, int replicas);
    ~consumer_claim();
    consumer_claim(const consumer_claim&) = delete;
    consumer_claim& operator=(const consumer_claim&) = delete;

    /// How often renew() is due: a quarter of the bucket's TTL.
    std::chrono::milliseconds period() const noexcept { return ttl_ / 4; }
    /// Until when (steady clock) the claim is certainly this store's: the last renewal's send
    /// time plus the TTL less a fifth (clock rates may differ), as a partition's fence. Read
    /// from any thread.
    std::chrono::steady_clock::time_point held_until() const noexcept {
        return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(held_until_.load()));
    }
    /// Renews the claim (or takes it again when it expired and no one took it). Returns "" when
    /// it is this store's, else the holder that took it over. Throws errc::broker_failed when
    /// the broker does not answer (held_until() then runs out by itself).
    std::string renew();
    /// Gives the claim up (free for any store at once); quiet on failure (it then expires).
    void release() noexcept;
    /// The holder text of this store: "<host> <pid> <store>".
    const std::string& holder() const noexcept { return holder_; }

private:
    // Takes the claim if it is free, expired or an earlier run of this store's; returns "" when
    // taken, else the holder's text. Requests that time out are tried again for patience.
    std::string take(std::chrono::seconds patience);
    kvStore* kv_ = nullptr;
    std::string key_;
    std::string name_;  // "consumer 'C' of stream 'S'", for messages
    std::string identity_;  // "<host> <store>": the same store on the same host
    std::string holder_;
    std::uint64_t revision_ = 0;
    std::chrono::milliseconds ttl_;
    std::atomic<std::int64_t> held_until_{0};
};

}  // namespace idem::jetstream::detail
