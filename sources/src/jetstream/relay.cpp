// `idem relay`: the change feed of a store published to a stream through the windowed publisher,
// starting where the stream says the last run stopped (jetstream_relay.hpp).

#include <idem/sources/jetstream_relay.hpp>

#include "publish_naming.hpp"
#include "publish_window.hpp"

#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <algorithm>
#include <ctime>
#include <thread>
#include <unordered_map>

namespace idem::jetstream {

namespace {

using clock = std::chrono::steady_clock;
using detail::check_nats;
using detail::msg_ptr;

// JetStream API error: no message at that sequence (deleted, or purged meanwhile).
constexpr int js_no_message_found = 10037;

// The header carrying an entry's position, so the relay reads it back without parsing the body.
constexpr const char* position_header = "Idem-Position";

// Returns an RFC 3339 UTC time with nanoseconds for ns since the Unix epoch.
std::string rfc3339(std::uint64_t ns) {
    const auto secs = static_cast<std::time_t>(ns / 1000000000u);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[48];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09uZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<unsigned>(ns % 1000000000u));
    return buf;
}

// Where the stream says the relay stopped: the store its messages came from, and the smallest
// position among its last messages (see the header: what may have been stored out of order).
struct stream_mark {
    std::string store_id;
    change_position position;
};

std::optional<stream_mark> read_mark(const detail::connection& c, const relay_options& o, std::uint64_t lookback) {
    auto si = detail::stream_info(c, o.stream);
    if (!si || si->State.Msgs == 0) return std::nullopt;
    const std::uint64_t last = si->State.LastSeq;
    const std::uint64_t first = std::max<std::uint64_t>(si->State.FirstSeq, last >= lookback ? last - lookback + 1 : 1);
    const std::string prefix = o.prefix + ".";
    std::optional<stream_mark> mark;
    for (std::uint64_t seq = last; seq >= first && seq > 0; --seq) {
        natsMsg* raw = nullptr;
        jsErrCode jerr{};
        auto s = js_GetMsg(&raw, c.js(), o.stream.c_str(), seq, nullptr, &jerr);
        if (s != NATS_OK && static_cast<int>(jerr) == js_no_message_found) continue;
        check_nats(s, "message " + std::to_string(seq) + " of stream '" + o.stream + "' at '" + c.servers() + "'",
                   jerr);
        msg_ptr msg{raw};
        const std::string_view subject = natsMsg_GetSubject(msg.get());
        if (subject.substr(0, prefix.size()) != prefix) continue;  // not the relay's
        const char* id = nullptr;
        const char* at = nullptr;
        if (natsMsgHeader_Get(msg.get(), "Nats-Msg-Id", &id) != NATS_OK ||
            natsMsgHeader_Get(msg.get(), position_header, &at) != NATS_OK) {
            throw_error(errc::invalid_argument, "stream '" + o.stream + "' message " + std::to_string(seq) +
                                                    " on '" + std::string(subject) + "' has no " + position_header +
                                                    " header: not published by idem relay (give the relay a "
                                                    "stream or prefix of its own)");
        }
        const std::string_view id_text = id;
        auto position = change_position::parse(at);
        if (!position || id_text.find('/') == std::string_view::npos) {
            throw_error(errc::invalid_argument, "stream '" + o.stream + "' message " + std::to_string(seq) +
                                                    ": malformed " + position_header + " '" + at +
                                                    "' or Nats-Msg-Id '" + std::string(id_text) + "'");
        }
        std::string store(id_text.substr(0, id_text.find('/')));
        if (mark && store != mark->store_id) {
            throw_error(errc::invalid_argument, "stream '" + o.stream + "' holds the changes of two stores (" +
                                                    store + " and " + mark->store_id + ") under '" + prefix + ">'");
        }
        if (!mark || *position < mark->position) mark = stream_mark{std::move(store), *position};
    }
    return mark;
}

class relayer {
public:
    relayer(const relay_options& o, relay_result& r)
        : o_(o),
          r_(r),
          conn_(detail::connect_publisher(o.servers, "idem relay", o.ack_timeout, o.retry_for)) {
        const std::string pattern = o.prefix + ".>";
        auto setup = detail::set_up_stream(*conn_, {o.stream, pattern, pattern, o.replicas, o.duplicates_window},
                                           o.retry_for);
        r_.stream_created = setup.created;
        r_.duplicates_window = setup.duplicates_window;
        window_ = std::make_unique<detail::publish_window>(
            *conn_, detail::window_options{o.max_pending, o.ack_timeout, o.retry_for},
            [this](const detail::message_tag& t) {
                return "the change at " + change_position{t.major, static_cast<std::uint32_t>(t.minor)}.to_string() +
                       " of '" + o_.db.string() + "'";
            });
        for (const auto* p : o.projections) {
            if (p) known_[p->name()] = p;
        }
        if (!setup.created) mark_ = read_mark(*conn_, o, 2 * o.max_pending);
        if (mark_) r_.resumed_after = mark_->position.to_string();
    }

    void run() {
        std::optional<change_position> at;
        if (mark_) at = mark_->position;
        while (!stopping()) {
            std::vector<change> batch;
            {
                auto snap = snapshot::open(o_.db);  // afresh each step: a rebuild's new store is found
                const auto id = snap.store_id();
                if (r_.store_id.empty()) check_store(snap);
                if (id != r_.store_id) {
                    throw_error(errc::invalid_argument, o_.db.string() + ": now holds another store (id " + id +
                                                            ", was " + r_.store_id + ")");
                }
                if (!at) at = change_position{snap.change_feed().pruned_through, UINT32_MAX};  // the oldest kept
                batch = read(snap, *at);
            }
            for (const auto& c : batch) {
                if (stopping()) break;
                at = c.position;
                ++r_.entries;
                r_.last_position = c.position.to_string();
                if (o_.projection && c.projection != *o_.projection) continue;
                send(c);
                // Nothing is sent past a failure until it is stored: the stream's last messages
                // then bound what a kill may leave unstored (read_mark looks back that far).
                if (window_->has_failures()) window_->finish();
            }
            if (batch.size() < o_.read_limit) {
                if (!o_.follow) break;
                sleep_idle();
            }
        }
        window_->finish();
        const auto c = window_->counts();
        r_.stored = c.stored;
        r_.duplicates = c.duplicates;
        r_.published = c.stored + c.duplicates;
        r_.retries = c.retries;
        r_.first_sequence = c.first_sequence;
        r_.last_sequence = c.last_sequence;
    }

private:
    bool stopping() const { return o_.stop && o_.stop->load(); }

    void sleep_idle() const {
        const auto until = clock::now() + o_.poll;
        while (!stopping() && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }

    void check_store(const snapshot& snap) {
        const auto id = snap.store_id();
        if (id.empty()) throw_error(errc::invalid_argument, o_.db.string() + ": the store has no id (an older layout)");
        const auto copied = snap.copied_from();
        if (mark_ && copied && mark_->store_id == copied->store_id) {
            // A restored backup: its commits after the copied one are not the original's, which
            // the stream may hold under the same positions (or ahead of what it has).
            throw_error(errc::invalid_argument,
                        o_.db.string() + " is a backup of store " + copied->store_id + " taken at commit " +
                            std::to_string(copied->commit) + ", and stream '" + o_.stream +
                            "' holds that store's changes through " + mark_->position.to_string() +
                            ": this store's next commits are not those, so it is not relayed there; relay it to a "
                            "stream or prefix of its own and seed its readers anew (from a dump of this store)");
        }
        if (mark_ && mark_->store_id != id) {
            throw_error(errc::invalid_argument,
                        "stream '" + o_.stream + "' holds the changes of store " + mark_->store_id + ", not of " +
                            o_.db.string() + " (store " + id + "): give this store a stream or prefix of its own");
        }
        r_.store_id = id;
    }

    std::vector<change> read(const snapshot& snap, change_position at) const {
        try {
            return snap.changes_after(at, o_.read_limit);
        } catch (const std::system_error& e) {
            if (e.code() != errc::changes_pruned) throw;
            throw_error(errc::changes_pruned,
                        "stream '" + o_.stream + "' has the changes through " + at.to_string() + ", but " +
                            e.what() + ": the downstream must be seeded anew (from a dump of the store), then "
                            "relayed to a new stream");
        }
    }

    void send(const change& c) {
        const auto* p = projection_of(c.projection);
        const std::string source = "idem://" + r_.store_id + "/" + c.projection;
        id_.assign(r_.store_id).append("/").append(c.projection).append("/");
        subject_.assign(o_.prefix).append(".").append(detail::subject_token(c.projection));
        body_.assign(R"({"specversion":"1.0","id":)");
        if (c.kind == change_kind::row) {
            id_.append(c.key).append("/").append(std::to_string(c.version));
            subject_.append(".").append(detail::subject_token(c.key));
            append_json_string(body_, id_);
            body_ += R"(,"source":)";
            append_json_string(body_, source);
            body_ += R"(,"type":)";
            append_json_string(body_, "idem.change." + c.projection);
            body_ += R"(,"subject":)";
            append_json_string(body_, c.key);
            body_ += R"(,"sequence":)" + std::to_string(c.version);
        } else {
            id_.append("reset/").append(c.position.to_string());
            append_json_string(body_, id_);
            body_ += R"(,"source":)";
            append_json_string(body_, source);
            body_ += R"(,"type":)";
            append_json_string(body_, "idem.reset." + c.projection);
        }
        body_ += R"(,"time":")" + rfc3339(c.time_ns) + R"(","datacontenttype":"application/json","idemposition":")" +
                 c.position.to_string() + R"(","data":)";
        if (c.kind == change_kind::row) {
            p->write_json(*p->load(c.state, c.state_version), body_);
            ++r_.changes;
        } else {
            body_ += R"({"projection":)";
            append_json_string(body_, c.projection);
            body_ += R"(,"position":")" + c.position.to_string() + R"("})";
            ++r_.resets;
        }
        body_ += "}";
        publish(c);
    }

    void publish(const change& c) {
        const auto what = [&] { return "the change at " + c.position.to_string() + " of '" + o_.db.string() + "'"; };
        natsMsg* raw = nullptr;
        check_nats(natsMsg_Create(&raw, subject_.c_str(), nullptr, body_.data(), static_cast<int>(body_.size())),
                   "message for " + what());
        msg_ptr msg{raw};
        const auto msg_id = detail::percent_encode(id_, "");
        const auto position = c.position.to_string();
        check_nats(natsMsgHeader_Set(msg.get(), "Nats-Msg-Id", msg_id.c_str()), "Nats-Msg-Id of " + what());
        check_nats(natsMsgHeader_Set(msg.get(), position_header, position.c_str()),
                   std::string(position_header) + " of " + what());
        if (!window_->send(std::move(msg), {c.position.commit, c.position.index})) {
            // Never skipped: a change left out would leave the downstream wrong without a sign.
            throw_error(errc::invalid_argument, what() + " is " + std::to_string(body_.size()) +
                                                    " bytes, more than the server's max payload of " +
                                                    std::to_string(window_->max_payload()) + ": raise max_payload");
        }
    }

    const projection_base* projection_of(const std::string& name) {
        auto it = known_.find(name);
        if (it != known_.end()) return it->second;
        std::string names;
        for (const auto* p : o_.projections) names += (names.empty() ? "" : ", ") + p->name();
        throw_error(errc::invalid_argument, o_.db.string() + ": the change feed holds projection '" + name +
                                                "', which this relay cannot render (it knows: " + names +
                                                "); relay only the others with a projection filter");
    }

    const relay_options& o_;
    relay_result& r_;
    std::unique_ptr<detail::connection> conn_;
    std::unique_ptr<detail::publish_window> window_;  // after the connection: gone before it
    std::unordered_map<std::string, const projection_base*> known_;
    std::optional<stream_mark> mark_;
    std::string id_, subject_, body_;  // reused from change to change
};

}  // namespace

relay_result relay(const relay_options& options) {
    if (options.stream.empty()) throw_error(errc::invalid_argument, "no stream given");
    if (options.prefix.empty()) throw_error(errc::invalid_argument, "no subject prefix given");
    if (detail::publish_subject(options.prefix).wildcard()) {  // also checks its tokens
        throw_error(errc::invalid_argument, "subject prefix '" + options.prefix + "' has a wildcard");
    }
    if (options.replicas < 1 || options.replicas > 5) {
        throw_error(errc::invalid_argument, "replicas " + std::to_string(options.replicas) + " is not between 1 and 5");
    }
    if (options.max_pending == 0) throw_error(errc::invalid_argument, "max_pending is 0");
    if (options.read_limit == 0) throw_error(errc::invalid_argument, "read_limit is 0");
    (void)snapshot::open(options.db);  // the store readable before the stream is touched: a typo creates no stream
    const auto start = clock::now();
    relay_result r;
    relayer rl{options, r};
    rl.run();
    r.elapsed = clock::now() - start;
    return r;
}

}  // namespace idem::jetstream
