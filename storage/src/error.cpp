#include <idem/storage/error.hpp>

#include <lmdb.h>

namespace idem {
namespace {

class idem_category final : public std::error_category {
public:
    const char* name() const noexcept override { return "idem"; }

    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
        case errc::storage_failed: return "storage operation failed";
        case errc::map_full: return "LMDB map is full";
        case errc::map_resized: return "LMDB map was resized by another process";
        case errc::key_too_long: return "key longer than the 511-byte LMDB limit";
        case errc::format_mismatch: return "storage format version mismatch";
        case errc::read_only: return "environment is read-only";
        case errc::environment_conflict: return "environment already open with other options";
        case errc::invalid_argument: return "invalid argument";
        case errc::unknown_projection: return "unknown projection";
        case errc::corrupt_record: return "corrupt record";
        case errc::state_version_mismatch: return "row written by a newer state version";
        case errc::panic: return "LMDB panic: environment must be reopened";
        case errc::corrupt_log: return "corrupt event log";
        case errc::torn_record: return "event log ends in an incomplete record";
        case errc::store_locked: return "the store is being written by another process";
        case errc::store_damaged: return "the store is damaged";
        case errc::log_changed: return "event log changed under its checkpoint";
        case errc::broker_failed: return "message broker request failed";
        case errc::stream_changed: return "stream changed under its checkpoint";
        case errc::delivery_exhausted: return "message reached its delivery limit without a committed outcome";
        case errc::lease_lost: return "the lease fencing this store's commits is no longer held";
        case errc::changes_pruned: return "the change feed no longer holds the commits asked for";
        }
        return "unknown idem error";
    }
};

class lmdb_error_category final : public std::error_category {
public:
    const char* name() const noexcept override { return "lmdb"; }

    std::string message(int value) const override { return mdb_strerror(value); }

    std::error_condition default_error_condition(int value) const noexcept override {
        switch (value) {
        case MDB_MAP_FULL: return make_error_code(errc::map_full).default_error_condition();
        case MDB_MAP_RESIZED: return make_error_code(errc::map_resized).default_error_condition();
        case MDB_BAD_VALSIZE: return make_error_code(errc::key_too_long).default_error_condition();
        case MDB_VERSION_MISMATCH:
        case MDB_INVALID: return make_error_code(errc::format_mismatch).default_error_condition();
        case MDB_CORRUPTED:
        case MDB_PAGE_NOTFOUND: return make_error_code(errc::corrupt_record).default_error_condition();
        case MDB_PANIC: return make_error_code(errc::panic).default_error_condition();
        default: break;
        }
        if (value > 0) {
            return std::generic_category().default_error_condition(value);
        }
        return make_error_code(errc::storage_failed).default_error_condition();
    }
};

}  // namespace

const std::error_category& category() noexcept {
    static const idem_category instance;
    return instance;
}

std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), category()}; }

const std::error_category& lmdb_category() noexcept {
    static const lmdb_error_category instance;
    return instance;
}

std::error_code lmdb_error(int rc) noexcept {
    switch (rc) {
    case MDB_MAP_FULL: return make_error_code(errc::map_full);
    case MDB_MAP_RESIZED: return make_error_code(errc::map_resized);
    case MDB_BAD_VALSIZE: return make_error_code(errc::key_too_long);
    case MDB_VERSION_MISMATCH:
    case MDB_INVALID: return make_error_code(errc::format_mismatch);
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND: return make_error_code(errc::corrupt_record);
    case MDB_PANIC: return make_error_code(errc::panic);
    default: break;
    }
    if (rc > 0) {
        return {rc, std::system_category()};  // an errno: EIO, ENOSPC, EACCES, ...
    }
    return {rc, lmdb_category()};
}

void throw_lmdb(int rc, const std::string& what) { throw std::system_error(lmdb_error(rc), what); }

void throw_error(errc e, const std::string& what) { throw std::system_error(make_error_code(e), what); }

}  // namespace idem
