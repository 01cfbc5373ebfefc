// The record of messages that reached MaxDeliver without a committed outcome: how a run tells
// of them when it stops (its error, and a file in the store's directory synced before the run
// returns), and how the next run refuses to start until the operator accepts them as handled.

#include "source_impl.hpp"

#include <idem/storage/error.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <fstream>
#include <iterator>

namespace idem::jetstream {

namespace {

// Appends text and a newline to path and syncs it: the record outlives a crash right after.
void append_synced(const std::filesystem::path& path, const std::string& text) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw std::system_error(errno, std::generic_category(), "writing " + path.string());
    const std::string line = text + "\n";
    std::size_t done = 0;
    int err = 0;
    while (done < line.size()) {
        auto n = ::write(fd, line.data() + done, line.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            err = errno;
            break;
        }
        done += static_cast<std::size_t>(n);
    }
    if (err == 0 && ::fsync(fd) != 0) err = errno;
    ::close(fd);
    if (err != 0) throw std::system_error(err, std::generic_category(), "writing " + path.string());
}

}  // namespace

std::filesystem::path exhausted_record(const std::filesystem::path& store, const std::string& checkpoint_source) {
    std::string name = "jetstream-exhausted.";
    for (char c : checkpoint_source) {
        const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        name += plain ? c : '_';
    }
    return store / name;
}

std::filesystem::path source::impl::take_exhausted_record(engine& e) {
    // A message an earlier run could not commit on its last delivery is not delivered again:
    // the run that saw it stopped and left a record, and no later run goes on as if nothing
    // happened until the operator says the messages were handled.
    auto record = exhausted_record(e.options().store.path, source_name);
    if (!std::filesystem::exists(record)) return record;
    std::ifstream in{record};
    std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    while (!text.empty() && text.back() == '\n') text.pop_back();
    if (text.empty()) text = "(the record is empty: it could not be written; the run that stopped named the messages)";
    for (auto& ch : text) ch = ch == '\n' ? ';' : ch;  // a line per message
    if (!o.accept_exhausted) {
        throw_error(errc::delivery_exhausted,
                    "an earlier run of consumer '" + o.consumer + "' of stream '" + o.stream +
                        "' stopped because messages reached MaxDeliver without a committed outcome (recorded in " +
                        record.string() + "): " + text +
                        "; publish them again (or decide to go without them), then start once with "
                        "--accept-exhausted");
    }
    // The record's lines begin "sequence N": those are handled now.
    for (std::size_t at = text.find("sequence "); at != std::string::npos; at = text.find(";sequence ", at + 1)) {
        if (text[at] == ';') ++at;
        std::uint64_t seq = 0;
        std::from_chars(text.data() + at + 9, text.data() + text.size(), seq);
        if (seq != 0) accepted.push_back(seq);
    }
    std::filesystem::remove(record);
    return record;
}

std::string source::impl::lost_summary() const {
    // Under m.
    std::string text = std::to_string(lost.size()) + " message" + (lost.size() == 1 ? "" : "s") + " of stream '" +
                       o.stream + "' reached MaxDeliver " + std::to_string(cc.max_deliver) +
                       " without a committed outcome, and the server will not deliver " +
                       (lost.size() == 1 ? "it" : "them") + " again: ";
    for (std::size_t i = 0; i < lost.size() && i < 5; ++i) text += (i ? "; " : "") + lost[i].second;
    if (lost.size() > 5) text += "; and " + std::to_string(lost.size() - 5) + " more";
    return text + ". Publish them again once the cause is fixed";
}

void source::impl::record_exhausted(const std::filesystem::path& path) {
    std::string text;
    {
        std::scoped_lock lock{m};
        if (lost.empty()) return;
        // Lost messages are told of even when another error stopped the run first.
        if (fatal == errc::delivery_exhausted) {
            fatal_text = lost_summary();
        } else {
            fatal_text += "; besides, " + lost_summary();
        }
        for (const auto& l : lost) text += (text.empty() ? "" : "\n") + l.second;
    }
    try {
        append_synced(path, text);
        std::scoped_lock lock{m};
        if (lost.size() > 5) fatal_text += " (each is listed in " + path.string() + ")";
    } catch (const std::system_error& err) {
        std::scoped_lock lock{m};
        // Then this message is all the operator gets: every sequence, as ranges.
        std::vector<std::uint64_t> seqs;
        for (const auto& l : lost) seqs.push_back(l.first);
        std::sort(seqs.begin(), seqs.end());
        std::string ranges;
        for (std::size_t i = 0; i < seqs.size();) {
            auto j = i;
            while (j + 1 < seqs.size() && seqs[j + 1] <= seqs[j] + 1) ++j;
            ranges += (ranges.empty() ? "" : ", ") + std::to_string(seqs[i]) +
                      (seqs[j] != seqs[i] ? "-" + std::to_string(seqs[j]) : std::string());
            i = j + 1;
        }
        fatal_text += " (and it could not be recorded: " + std::string(err.what()) + "; the sequences: " + ranges + ")";
    }
}

}  // namespace idem::jetstream
