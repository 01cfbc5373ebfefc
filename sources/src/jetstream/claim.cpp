// The claim of a durable consumer by one store (see claim.hpp): compare-and-set on a NATS KV
// revision, as the partitioned mode's leases.

#include "claim.hpp"

#include "lease.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/error.hpp>

#include <unistd.h>

#include <cstdio>
#include <thread>

namespace idem::jetstream::detail {

namespace {

constexpr const char* bucket_name = "idem-claims";

std::string key_part(const std::string& name) {
    std::string out;
    for (char c : name) {
        const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        if (plain) {
            out += c;
        } else {
            char hex[4];
            std::snprintf(hex, sizeof hex, "=%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
            out += hex;
        }
    }
    return out;
}

std::string host_name() {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    return host;
}

// "<host> <pid> <store>" -> "<host> <store>"
std::string identity_of(const std::string& holder) {
    const auto first = holder.find(' ');
    if (first == std::string::npos) return holder;
    const auto second = holder.find(' ', first + 1);
    if (second == std::string::npos) return holder;
    return holder.substr(0, first) + holder.substr(second);
}

// "store /x/db on host h (pid 12)"
std::string describe(const std::string& holder) {
    const auto first = holder.find(' ');
    const auto second = first == std::string::npos ? first : holder.find(' ', first + 1);
    if (second == std::string::npos) return "'" + holder + "'";
    return "the store " + holder.substr(second + 1) + " on host " + holder.substr(0, first) + " (pid " +
           holder.substr(first + 1, second - first - 1) + ")";
}

std::int64_t ticks(std::chrono::steady_clock::time_point t) { return t.time_since_epoch().count(); }

}  // namespace

consumer_claim::consumer_claim(const connection& c, const std::string& stream, const std::string& consumer,
                               const std::filesystem::path& store, std::chrono::milliseconds ttl, int replicas)
    : key_(key_part(stream) + "." + key_part(consumer)),
      name_("consumer '" + consumer + "' of stream '" + stream + "'"),
      ttl_(ttl) {
    std::error_code ec;
    auto path = std::filesystem::weakly_canonical(std::filesystem::absolute(store), ec);
    if (ec) path = store;
    const auto host = host_name();
    holder_ = host + " " + std::to_string(::getpid()) + " " + path.string();
    identity_ = host + " " + path.string();
    if (auto kept = open_ttl_bucket(&kv_, c.js(), bucket_name, ttl, replicas); kept && kept->count() > 0) {
        ttl_ = std::chrono::duration_cast<std::chrono::milliseconds>(*kept);
    }
    auto other = take(std::chrono::seconds(30));
    if (!other.empty()) {
        kvStore_Destroy(kv_);
        kv_ = nullptr;
        throw_error(errc::invalid_argument,
                    name_ + " is claimed by " + describe(other) +
                        ": one durable consumer feeds one store (two would split the stream between them, each "
                        "missing what the other got); give this store its own consumer name, or stop that "
                        "process: its claim is given up when it stops, or expires " + format_duration(ttl_) +
                        " after its last renewal if it was killed (key '" + key_ + "' of the KV bucket '" +
                        bucket_name + "')");
    }
}

consumer_claim::~consumer_claim() {
    if (kv_ != nullptr) kvStore_Destroy(kv_);
}

std::string consumer_claim::take(std::chrono::seconds patience) {
    const auto give_up = std::chrono::steady_clock::now() + patience;
    // A cluster that has just started, or lost a node, lets requests time out for a while.
    auto wait_or_throw = [&](natsStatus s, const std::string& what) {
        if (s != NATS_TIMEOUT || std::chrono::steady_clock::now() >= give_up) throw_nats(s, what);
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    };
    const auto reading = "reading the claim of " + name_ + " in the KV bucket '" + bucket_name + "'";
    for (int moved = 0; moved < 3;) {
        const auto sent = std::chrono::steady_clock::now();
        kvEntry* e = nullptr;
        auto s = kvStore_Get(&e, kv_, key_.c_str());
        std::uint64_t seen = 0;
        std::string value;
        if (s == NATS_OK) {
            seen = kvEntry_Revision(e);
            value.assign(static_cast<const char*>(kvEntry_Value(e)), static_cast<std::size_t>(kvEntry_ValueLen(e)));
            kvEntry_Destroy(e);
        } else if (s != NATS_NOT_FOUND) {
            wait_or_throw(s, reading);
            continue;
        }
        if (!value.empty() && value != "-" && identity_of(value) != identity_) return value;
        std::uint64_t rev = 0;
        s = seen == 0 ? kvStore_CreateString(&rev, kv_, key_.c_str(), holder_.c_str())
                      : kvStore_UpdateString(&rev, kv_, key_.c_str(), holder_.c_str(), seen);
        if (s == NATS_OK) {
            revision_ = rev;
            held_until_.store(ticks(sent + ttl_ - ttl_ / 5));
            return "";
        }
        if (kv_conflict(s)) {
            ++moved;  // taken, released or expired meanwhile: read it again
        } else {
            wait_or_throw(s, "taking the claim of " + name_ + " in the KV bucket '" + bucket_name + "'");
        }
    }
    kvEntry* e = nullptr;
    std::string value = "another store";
    if (kvStore_Get(&e, kv_, key_.c_str()) == NATS_OK) {
        value.assign(static_cast<const char*>(kvEntry_Value(e)), static_cast<std::size_t>(kvEntry_ValueLen(e)));
        kvEntry_Destroy(e);
    }
    return value;
}

std::string consumer_claim::renew() {
    const auto sent = std::chrono::steady_clock::now();
    std::uint64_t rev = 0;
    auto s = kvStore_UpdateString(&rev, kv_, key_.c_str(), holder_.c_str(), revision_);
    if (s == NATS_OK) {
        revision_ = rev;
        held_until_.store(ticks(sent + ttl_ - ttl_ / 5));
        return "";
    }
    if (!kv_conflict(s)) throw_nats(s, "renewing the claim of " + name_ + " in the KV bucket '" + bucket_name + "'");
    // Expired (no renewal reached the broker in time, or a lost answer): ours again if free.
    auto other = take(std::chrono::seconds(0));  // the next renewal tries again
    return other.empty() ? other : describe(other);
}

void consumer_claim::release() noexcept {
    std::uint64_t rev = 0;
    (void)kvStore_UpdateString(&rev, kv_, key_.c_str(), "-", revision_);
    held_until_.store(0);
}

}  // namespace idem::jetstream::detail
