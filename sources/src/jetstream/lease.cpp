// The lease bucket: compare-and-set on NATS KV revisions (see lease.hpp for the keys and values).

#include "lease.hpp"

#include <idem/sources/jetstream_partitions.hpp>
#include <idem/storage/error.hpp>

#include <chrono>
#include <charconv>
#include <string>

namespace idem::jetstream::detail {

namespace {

std::string lease_key(std::uint32_t k) { return "p." + std::to_string(k); }

std::string lease_value(const std::string& instance, std::uint64_t checkpoint) {
    return instance + " " + std::to_string(checkpoint);
}

bool conflict(natsStatus s) { return kv_conflict(s); }

void check_name(const std::string& what, const std::string& name) {
    if (name.empty()) throw_error(errc::invalid_argument, what + " is empty");
    for (char c : name) {
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        if (!ok) {
            throw_error(errc::invalid_argument, what + " '" + name + "' holds '" + std::string(1, c) +
                                                    "': only letters, digits, '-' and '_' are allowed");
        }
    }
}

}  // namespace

// The server answers a wrong last revision with an error, a lost connection times out.
bool kv_conflict(natsStatus s) {
    return s != NATS_TIMEOUT && s != NATS_NO_RESPONDERS && s != NATS_CONNECTION_CLOSED &&
           s != NATS_CONNECTION_DISCONNECTED && s != NATS_NO_SERVER && s != NATS_IO_ERROR;
}

// A cluster that has just started (or is electing a leader) may let the first requests time
// out; a creation whose answer was lost may have happened: look again before creating.
bool open_or_create_bucket(kvStore** kv, jsCtx* js, kvConfig& cfg) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
        if (js_KeyValue(kv, js, cfg.Bucket) == NATS_OK) return true;
        auto s = js_CreateKeyValue(kv, js, &cfg);
        if (s == NATS_OK) return false;
        if (s != NATS_TIMEOUT || std::chrono::steady_clock::now() > give_up) {
            throw_nats(s, "creating the bucket '" + std::string(cfg.Bucket) + "'");
        }
        *kv = nullptr;
    }
}

std::optional<std::chrono::nanoseconds> open_ttl_bucket(kvStore** kv, jsCtx* js, const std::string& name,
                                                        std::chrono::milliseconds ttl, int replicas) {
    kvConfig cfg;
    kvConfig_Init(&cfg);
    cfg.Bucket = name.c_str();
    cfg.History = 1;
    cfg.TTL = std::chrono::duration_cast<std::chrono::nanoseconds>(ttl).count();
    cfg.Replicas = replicas;
    cfg.StorageType = js_FileStorage;
    if (!open_or_create_bucket(kv, js, cfg)) return std::nullopt;
    kvStatus* st = nullptr;
    if (kvStore_Status(&st, *kv) != NATS_OK) return std::nullopt;
    const auto kept = std::chrono::nanoseconds(kvStatus_TTL(st));
    kvStatus_Destroy(st);
    return kept;
}

lease_bucket::lease_bucket(const connection& c, const std::string& consumer, std::chrono::milliseconds ttl,
                           int replicas)
    : js_(c.js()), name_(idem::jetstream::lease_bucket(consumer)), ttl_(ttl) {
    check_name("consumer name", consumer);
    if (auto kept = open_ttl_bucket(&kv_, c.js(), name_, ttl, replicas)) {
        ttl_ = std::chrono::duration_cast<std::chrono::milliseconds>(*kept);
    }
    (void)open_ttl_bucket(&kept_, c.js(), "idem-kept-" + consumer, std::chrono::milliseconds(0), replicas);
}

lease_bucket::lease_bucket(const connection& c, const std::string& consumer)
    : js_(c.js()), name_(idem::jetstream::lease_bucket(consumer)) {
    check_name("consumer name", consumer);
    check_nats(js_KeyValue(&kv_, c.js(), name_.c_str()),
               "opening the lease bucket '" + name_ + "' (no partitioned group of consumer '" + consumer + "'?)");
    if (js_KeyValue(&kept_, c.js(), ("idem-kept-" + consumer).c_str()) != NATS_OK) kept_ = nullptr;
}

lease_bucket::~lease_bucket() {
    if (kv_ != nullptr) kvStore_Destroy(kv_);
    if (kept_ != nullptr) kvStore_Destroy(kept_);
}

void lease_bucket::unkeep(std::uint32_t k) {
    if (kept_ != nullptr) (void)kvStore_Delete(kept_, lease_key(k).c_str());
}

lease_entry lease_bucket::read(std::uint32_t k) {
    kvEntry* e = nullptr;
    lease_entry out;
    auto s = kvStore_Get(&e, kv_, lease_key(k).c_str());
    if (s != NATS_NOT_FOUND) {
        check_nats(s, "reading lease " + lease_key(k) + " of bucket '" + name_ + "'");
        out.revision = kvEntry_Revision(e);
        std::string v(static_cast<const char*>(kvEntry_Value(e)), static_cast<std::size_t>(kvEntry_ValueLen(e)));
        kvEntry_Destroy(e);
        auto space = v.find(' ');
        if (v != "-" && space != std::string::npos) {
            out.instance = v.substr(0, space);
            std::from_chars(v.data() + space + 1, v.data() + v.size(), out.checkpoint);
            return out;
        }
    }
    // Free (given up, expired or never taken): a copy kept by a stopped owner?
    if (kept_ == nullptr) return out;
    e = nullptr;
    s = kvStore_Get(&e, kept_, lease_key(k).c_str());
    if (s == NATS_NOT_FOUND) return out;
    check_nats(s, "reading the kept copy of " + lease_key(k) + " of consumer bucket '" + name_ + "'");
    std::string v(static_cast<const char*>(kvEntry_Value(e)), static_cast<std::size_t>(kvEntry_ValueLen(e)));
    kvEntry_Destroy(e);
    auto space = v.find(' ');
    if (space == std::string::npos) return out;
    out.kept = true;
    out.kept_by = v.substr(0, space);
    std::from_chars(v.data() + space + 1, v.data() + v.size(), out.checkpoint);
    return out;
}

std::optional<std::uint64_t> lease_bucket::try_take(std::uint32_t k, const std::string& instance,
                                                    std::uint64_t checkpoint) {
    auto now = read(k);
    if (!now.instance.empty()) return std::nullopt;
    const auto key = lease_key(k);
    const auto value = lease_value(instance, checkpoint);
    std::uint64_t rev = 0;
    natsStatus s = now.revision == 0
                       ? kvStore_CreateString(&rev, kv_, key.c_str(), value.c_str())
                       : kvStore_UpdateString(&rev, kv_, key.c_str(), value.c_str(), now.revision);
    if (s == NATS_OK) {
        if (now.kept) unkeep(k);  // its new owner's copy is the one that counts now
        return rev;
    }
    if (conflict(s)) return std::nullopt;
    throw_nats(s, "taking lease " + key + " of bucket '" + name_ + "'");
}

std::optional<std::uint64_t> lease_bucket::renew(std::uint32_t k, const std::string& instance,
                                                 std::uint64_t checkpoint, std::uint64_t revision) {
    const auto key = lease_key(k);
    const auto value = lease_value(instance, checkpoint);
    std::uint64_t rev = 0;
    auto s = kvStore_UpdateString(&rev, kv_, key.c_str(), value.c_str(), revision);
    if (s == NATS_OK) return rev;
    if (!conflict(s)) throw_nats(s, "renewing lease " + key + " of bucket '" + name_ + "'");
    // A renewal whose answer was lost may have been stored: the lease then still names this
    // instance (only its holder writes its name), at a revision this instance did not see.
    auto now = read(k);
    if (now.instance != instance || now.revision == 0) return std::nullopt;
    s = kvStore_UpdateString(&rev, kv_, key.c_str(), value.c_str(), now.revision);
    if (s == NATS_OK) return rev;
    if (!conflict(s)) throw_nats(s, "renewing lease " + key + " of bucket '" + name_ + "'");
    return std::nullopt;
}

std::optional<std::uint64_t> lease_bucket::release(std::uint32_t k, std::uint64_t revision) {
    std::uint64_t rev = 0;
    if (kvStore_UpdateString(&rev, kv_, lease_key(k).c_str(), "-", revision) != NATS_OK) return std::nullopt;
    return rev;
}

std::optional<std::uint64_t> lease_bucket::release(std::uint32_t k, std::uint64_t revision,
                                                   const std::string& instance, std::uint64_t checkpoint) {
    std::uint64_t rev = 0;
    if (kept_ != nullptr) {
        // Recorded while the lease is still ours: no one takes it (and deletes the record) before.
        const auto value = lease_value(instance, checkpoint);
        if (kvStore_PutString(&rev, kept_, lease_key(k).c_str(), value.c_str()) != NATS_OK) return std::nullopt;
    }
    if (revision == 0) return 0;
    if (kvStore_UpdateString(&rev, kv_, lease_key(k).c_str(), "-", revision) != NATS_OK) {
        unkeep(k);
        return std::nullopt;
    }
    return rev;
}

void lease_bucket::heartbeat(const std::string& instance) {
    std::uint64_t rev = 0;
    check_nats(kvStore_PutString(&rev, kv_, ("i." + instance).c_str(), "alive"),
               "renewing instance " + instance + " in bucket '" + name_ + "'");
}

// Removed from the bucket's stream, not deleted: a delete leaves a marker under the key, which
// live_instances() would count until it expires.
void lease_bucket::leave(const std::string& instance) {
    const auto subject = "$KV." + name_ + ".i." + instance;
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Purge.Subject = subject.c_str();
    jsErrCode jerr{};
    (void)js_PurgeStream(js_, ("KV_" + name_).c_str(), &o, &jerr);
}

// The heartbeat keys present in the bucket's stream, from one stream info request. Not
// kvStore_Keys: its watcher waits, without a deadline, for as many messages as the server said
// were pending when it started, and a key that expires in between is never delivered; with
// no other write to the bucket (an instance alone in its group) the run's thread waited forever.
std::vector<std::string> lease_bucket::live_instances() {
    const auto prefix = "$KV." + name_ + ".i.";
    const auto filter = prefix + ">";
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Info.SubjectsFilter = filter.c_str();
    jsStreamInfo* si = nullptr;
    jsErrCode jerr{};
    check_nats(js_GetStreamInfo(&si, js_, ("KV_" + name_).c_str(), &o, &jerr),
               "listing the instances of bucket '" + name_ + "'", jerr);
    std::vector<std::string> out;
    if (si->State.Subjects != nullptr) {
        for (int i = 0; i < si->State.Subjects->Count; ++i) {
            const auto& subject = si->State.Subjects->List[i];
            std::string_view name = subject.Subject;
            if (subject.Msgs > 0 && name.starts_with(prefix)) out.emplace_back(name.substr(prefix.size()));
        }
    }
    jsStreamInfo_Destroy(si);
    return out;
}

}  // namespace idem::jetstream::detail
