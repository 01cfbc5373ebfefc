#include <idem/storage/log_position.hpp>

#include <idem/storage/codec.hpp>
#include <idem/storage/error.hpp>
#include <idem/storage/event_log.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <system_error>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace idem {

namespace {

constexpr std::string_view log_prefix = "log:";

}  // namespace

std::string log_source(const std::filesystem::path& log) {
    return std::string(log_prefix) + std::filesystem::absolute(log).lexically_normal().string();
}

std::optional<std::string_view> log_source_path(std::string_view source) noexcept {
    if (!source.starts_with(log_prefix)) return std::nullopt;
    return source.substr(log_prefix.size());
}

namespace {

constexpr std::uint8_t value_version = 1;
constexpr std::size_t value_size = 8 + 1 + 1 + 8 + 8 + 4 + 4;
constexpr std::uint8_t finished_flag = 1;

[[noreturn]] void throw_errno(int error, const std::string& what) {
    throw std::system_error(std::error_code(error, std::system_category()), what);
}

struct stat_result {
    file_identity id;
    std::uint64_t size = 0;
};

stat_result stat_fd(int fd, const std::filesystem::path& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw_errno(errno, path.string() + ": cannot stat");
    return {{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)},
            static_cast<std::uint64_t>(st.st_size)};
}

// Closes the descriptor it holds.
struct open_file {
    int fd = -1;
    explicit open_file(const std::filesystem::path& path) {
        do {
            fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        } while (fd < 0 && errno == EINTR);
    }
    ~open_file() {
        if (fd >= 0) ::close(fd);
    }
    open_file(const open_file&) = delete;
    open_file& operator=(const open_file&) = delete;
};

// CRC32C of the `length` bytes before `offset`; nullopt if the file holds fewer.
std::optional<std::uint32_t> digest_before(int fd, const std::filesystem::path& path, std::uint64_t offset,
                                           std::uint32_t length) {
    std::array<char, log_digest_span> bytes;
    std::size_t done = 0;
    const std::uint64_t from = offset - length;
    while (done < length) {
        auto got = ::pread(fd, bytes.data() + done, length - done, static_cast<off_t>(from + done));
        if (got < 0) {
            if (errno == EINTR) continue;
            throw_errno(errno, path.string() + ": read at offset " + std::to_string(from + done) + " failed");
        }
        if (got == 0) return std::nullopt;
        done += static_cast<std::size_t>(got);
    }
    return crc32c(std::string_view(bytes.data(), length));
}

std::string bytes_text(std::uint64_t n) { return std::to_string(n) + " bytes"; }

// The checkpoint's file found in dir by identity, if it is there.
std::optional<std::filesystem::path> find_in(const std::filesystem::path& dir, const file_identity& id) {
    std::error_code ec;
    std::filesystem::directory_iterator it{dir, ec};
    if (ec) return std::nullopt;
    for (const auto& entry : it) {
        struct stat st {};
        if (::stat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (static_cast<std::uint64_t>(st.st_dev) == id.device && static_cast<std::uint64_t>(st.st_ino) == id.inode) {
            return entry.path();
        }
    }
    return std::nullopt;
}

// Files beside a rotated log's old file that look like rotations of the log written after it
// (named "<log name>.*", modified later, beginning like an event log: not compressed), except
// the old file and the file at the path. Reading the path's file right after the old one
// would skip them.
std::vector<std::filesystem::path> later_rotations(const std::filesystem::path& path, const std::filesystem::path& old,
                                                   const std::optional<file_identity>& current) {
    struct stat old_st {};
    if (::stat(old.c_str(), &old_st) != 0) return {};
    const auto prefix = path.filename().string() + ".";
    std::vector<std::pair<std::filesystem::path, struct timespec>> found;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator{std::filesystem::absolute(path).parent_path(), ec}) {
        const auto name = entry.path().filename().string();
        struct stat st {};
        if (!name.starts_with(prefix) || ::stat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        const file_identity id{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
        const file_identity old_id{static_cast<std::uint64_t>(old_st.st_dev), static_cast<std::uint64_t>(old_st.st_ino)};
        if (id == old_id || id == current) continue;
        const bool later = st.st_mtim.tv_sec > old_st.st_mtim.tv_sec ||
                           (st.st_mtim.tv_sec == old_st.st_mtim.tv_sec && st.st_mtim.tv_nsec > old_st.st_mtim.tv_nsec);
        if (!later || st.st_size == 0) continue;
        open_file f{entry.path()};
        char first = 0;
        if (f.fd < 0 || ::pread(f.fd, &first, 1, 0) != 1) continue;
        if (first != '{' && first != 'I' && first != ' ' && first != '\t' && first != '\r' && first != '\n') continue;
        found.emplace_back(entry.path(), st.st_mtim);
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
        return a.second.tv_sec != b.second.tv_sec ? a.second.tv_sec < b.second.tv_sec
                                                  : a.second.tv_nsec < b.second.tv_nsec;
    });
    std::vector<std::filesystem::path> out;
    for (auto& f : found) out.push_back(std::move(f.first));
    return out;
}

// Checks the checkpoint's own file (open as fd): ok, truncated or replaced.
log_check check_same_file(int fd, const std::filesystem::path& path, const log_position& at) {
    log_check out;
    out.size = stat_fd(fd, path).size;
    const std::string where = path.string() + ": checkpoint at offset " + std::to_string(at.offset) + ", ";
    if (out.size < at.offset) {
        out.state = log_state::truncated;
        out.detail = where + "the file is now " + bytes_text(out.size) + " (truncated, e.g. copytruncate)";
    } else if (at.file && !digest_matches(fd, path, at)) {
        out.state = log_state::replaced;
        out.detail = where + "the file is " + bytes_text(out.size) +
                     " but the bytes before the offset are not the ones consumed (rewritten in place)";
    }
    return out;
}

log_check check_files(const std::filesystem::path& path, const log_position& at);

}  // namespace

std::string encode_log_position(const log_position& p) {
    std::string out;
    out.reserve(value_size);
    codec::put_u64_le(out, p.offset);
    out.push_back(static_cast<char>(value_version));
    out.push_back(static_cast<char>(p.finished ? finished_flag : 0));
    const auto id = p.file.value_or(file_identity{});
    codec::put_u64_le(out, id.device);
    codec::put_u64_le(out, id.inode);
    codec::put_u32_le(out, p.digest_length);
    codec::put_u32_le(out, p.digest);
    return out;
}

log_position decode_log_position(std::string_view value) {
    log_position p;
    if (value.size() == 8) {
        p.offset = codec::get_u64_le(value);
        return p;
    }
    if (value.size() != value_size || static_cast<std::uint8_t>(value[8]) != value_version) {
        throw_error(errc::corrupt_record, "log checkpoint of " + std::to_string(value.size()) +
                                              " bytes: not a log position this build reads");
    }
    p.offset = codec::get_u64_le(value);
    p.finished = (static_cast<std::uint8_t>(value[9]) & finished_flag) != 0;
    p.file = file_identity{codec::get_u64_le(value.substr(10)), codec::get_u64_le(value.substr(18))};
    p.digest_length = codec::get_u32_le(value.substr(26));
    p.digest = codec::get_u32_le(value.substr(30));
    if (p.digest_length > log_digest_span || p.digest_length > p.offset) {
        throw_error(errc::corrupt_record, "log checkpoint: digest of " + std::to_string(p.digest_length) +
                                              " bytes before offset " + std::to_string(p.offset));
    }
    return p;
}

file_identity identity_of(int fd, const std::filesystem::path& path) { return stat_fd(fd, path).id; }

std::optional<file_identity> try_identity_of(const std::filesystem::path& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    return file_identity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

std::optional<log_position> try_position_in(int fd, const std::filesystem::path& path, std::uint64_t offset) {
    log_position p;
    p.offset = offset;
    p.file = identity_of(fd, path);
    p.digest_length = static_cast<std::uint32_t>(std::min<std::uint64_t>(offset, log_digest_span));
    auto digest = digest_before(fd, path, offset, p.digest_length);
    if (!digest) return std::nullopt;
    p.digest = *digest;
    return p;
}

log_position position_in(int fd, const std::filesystem::path& path, std::uint64_t offset) {
    auto p = try_position_in(fd, path, offset);
    if (!p) {
        throw_error(errc::invalid_argument,
                    path.string() + ": offset " + std::to_string(offset) + " is past the end of the file");
    }
    return *p;
}

bool digest_matches(int fd, const std::filesystem::path& path, const log_position& p) {
    if (p.digest_length > p.offset) return false;
    return digest_before(fd, path, p.offset, p.digest_length) == p.digest;
}

std::string_view to_string(log_state s) noexcept {
    switch (s) {
    case log_state::ok: return "ok";
    case log_state::rotated: return "rotated";
    case log_state::truncated: return "truncated";
    case log_state::replaced: return "replaced";
    case log_state::missing: return "missing";
    }
    return "unknown";
}

namespace {

// The state, the sizes and the detail (check_log_position adds the lag).
log_check check_files(const std::filesystem::path& path, const log_position& at) {
    open_file current{path};
    if (current.fd < 0 && errno != ENOENT) throw_errno(errno, path.string() + ": cannot open");
    std::optional<stat_result> now;
    if (current.fd >= 0) now = stat_fd(current.fd, path);
    if (!at.file) {
        // An offset-only checkpoint: the size is all there is to check.
        if (!now) return {.state = log_state::missing, .detail = path.string() + ": no such file"};
        return check_same_file(current.fd, path, at);
    }
    if (now && now->id == *at.file) return check_same_file(current.fd, path, at);

    log_check out;
    out.size = now ? now->size : 0;
    const auto dir = std::filesystem::absolute(path).parent_path();
    if (auto old = find_in(dir, *at.file)) {
        open_file previous{*old};
        if (previous.fd >= 0 && identity_of(previous.fd, *old) == *at.file) {
            auto same = check_same_file(previous.fd, *old, at);
            if (same.state != log_state::ok) {
                same.size = out.size;
                same.old_file = old;
                same.detail += " (rotated away from " + path.string() + ")";
                return same;
            }
            out.state = log_state::rotated;
            out.old_file = old;
            out.old_size = stat_fd(previous.fd, *old).size;
            out.later_rotations = later_rotations(path, *old, now ? std::optional{now->id} : std::nullopt);
            if (!out.later_rotations.empty()) {
                out.detail = path.string() + ": rotated more than once since the checkpoint (offset " +
                             std::to_string(at.offset) + " in " + old->string() + "); written after it:";
                for (const auto& later : out.later_rotations) out.detail += " " + later.string();
                out.detail += ", which reading the file now at the path next would skip";
            }
            return out;
        }
    }
    if (at.finished) {
        out.state = now ? log_state::rotated : log_state::missing;
        if (!now) out.detail = path.string() + ": no such file";
        return out;
    }
    if (!now) {
        out.state = log_state::missing;
        out.detail = path.string() + ": no such file, and the file of the checkpoint is not beside it";
        return out;
    }
    if (now->size >= at.offset && digest_matches(current.fd, path, at)) return out;  // the same content, copied
    out.state = log_state::replaced;
    out.detail = path.string() + ": checkpoint at offset " + std::to_string(at.offset) + " of another file (inode " +
                 std::to_string(at.file->inode) + "), which is no longer in " + dir.string() +
                 "; the file there now (" + bytes_text(now->size) +
                 ") does not hold the bytes consumed (rotated away, or replaced)";
    return out;
}

}  // namespace

log_check check_open_log(int fd, const std::filesystem::path& path, const log_position& at) {
    return check_same_file(fd, path, at);
}

log_check check_log_position(const std::filesystem::path& path, const log_position& at) {
    auto out = check_files(path, at);
    switch (out.state) {
    case log_state::ok: out.lag_bytes = out.size > at.offset ? out.size - at.offset : 0; break;
    case log_state::rotated:
        out.lag_bytes = out.size + (out.old_file && out.old_size > at.offset ? out.old_size - at.offset : 0);
        for (const auto& later : out.later_rotations) {
            std::error_code ec;
            const auto size = std::filesystem::file_size(later, ec);
            if (!ec) out.lag_bytes += size;
        }
        break;
    case log_state::truncated:
    case log_state::replaced: out.lag_bytes = out.size; break;
    case log_state::missing: break;
    }
    return out;
}

}  // namespace idem
