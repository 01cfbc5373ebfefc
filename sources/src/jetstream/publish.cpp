// `idem publish`: the stream set up (or checked), then every log record published through the
// windowed publisher (publish_window.hpp): asynchronously, a bounded number of acks outstanding,
// failed publishes sent again under the same Nats-Msg-Id until acked or retry_for has passed.

#include <idem/sources/jetstream_publish.hpp>

#include "publish_naming.hpp"
#include "publish_window.hpp"

#include <idem/storage/envelope.hpp>
#include <idem/storage/error.hpp>

#include <memory>

namespace idem::jetstream {

namespace {

using clock = std::chrono::steady_clock;
using detail::check_nats;
using detail::msg_ptr;

class publisher {
public:
    publisher(const publish_options& o, publish_result& r)
        : o_(o),
          r_(r),
          subject_(o.subject_template.empty() ? detail::publish_subject(o.subject)
                                              : detail::publish_subject(o.subject, o.subject_template)),
          conn_(detail::connect_publisher(o.servers, "idem publish", o.ack_timeout, o.retry_for)) {
        auto setup = detail::set_up_stream(
            *conn_, {o.stream, subject_.pattern(), subject_.sent(), o.replicas, o.duplicates_window}, o.retry_for);
        r_.stream_created = setup.created;
        r_.stream_subjects = std::move(setup.subjects);
        r_.duplicates_window = setup.duplicates_window;
        r_.replicas = setup.replicas;
        window_ = std::make_unique<detail::publish_window>(
            *conn_, detail::window_options{o.max_pending, o.ack_timeout, o.retry_for},
            [this](const detail::message_tag& t) { return where(t.major, t.minor); });
    }

    publisher(const publisher&) = delete;
    publisher& operator=(const publisher&) = delete;

    void read(std::size_t log) {
        log_reader_options ro;
        ro.skip_bad = o_.skip_bad;
        ro.format = o_.format;
        log_reader reader{o_.logs[log], ro};
        log_record rec;
        while (reader.next(rec)) {
            ++r_.records;
            send_record(rec, log);
            window_->resend_failed();
        }
        r_.skipped += reader.skipped();
        if (auto torn = reader.torn_tail()) {
            r_.torn_tails.push_back(o_.logs[log].string() + ": incomplete last record at offset " +
                                    std::to_string(*torn) + " not published (" + reader.torn_detail() + ")");
        }
    }

    // Waits until every message read has been acked, sending failed ones again meanwhile.
    void finish() {
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
    void send_record(const log_record& rec, std::size_t log) {
        parse_error err;
        const bool valid = parser_.parse(rec.body, ev_, err);
        const std::string id =
            (valid && o_.msg_id == msg_id_policy::envelope) ? detail::publish_msg_id(ev_) : std::string{};
        // The header costs "NATS/1.0\r\nNats-Msg-Id: <id>\r\n\r\n" on top of the body.
        const auto size = static_cast<std::int64_t>(rec.body.size() + (id.empty() ? 0 : id.size() + 30));
        if (size > window_->max_payload()) {
            too_large(log, rec.line, rec.body.size());
            return;
        }
        if (!valid) ++r_.malformed;  // published all the same: the consumer dead-letters it, with its reason
        const auto subject = subject_.for_event(valid ? std::string_view(ev_.subject) : std::string_view{});
        natsMsg* raw = nullptr;
        check_nats(natsMsg_Create(&raw, subject.c_str(), nullptr, rec.body.data(), static_cast<int>(rec.body.size())),
                   "message for " + where(log, rec.line));
        msg_ptr msg{raw};
        if (!id.empty()) {
            check_nats(natsMsgHeader_Set(msg.get(), "Nats-Msg-Id", id.c_str()),
                       "Nats-Msg-Id of " + where(log, rec.line));
        }
        if (!window_->send(std::move(msg), {log, rec.line})) too_large(log, rec.line, rec.body.size());
    }

    void too_large(std::size_t log, std::uint64_t line, std::size_t bytes) {
        ++r_.too_large;
        r_.too_large_records.push_back(where(log, line) + " (" + std::to_string(bytes) +
                                       " bytes; the server's max payload is " +
                                       std::to_string(window_->max_payload()) + ")");
    }

    std::string where(std::size_t log, std::uint64_t line) const {
        return o_.logs[log].string() + " line " + std::to_string(line);
    }

    const publish_options& o_;
    publish_result& r_;
    detail::publish_subject subject_;
    std::unique_ptr<detail::connection> conn_;
    std::unique_ptr<detail::publish_window> window_;  // after the connection: gone before it
    envelope_parser parser_;
    envelope ev_;  // reused: its strings keep their capacity from record to record
};

}  // namespace

publish_result publish(const publish_options& options) {
    if (options.stream.empty()) throw_error(errc::invalid_argument, "no stream given");
    if (options.logs.empty()) throw_error(errc::invalid_argument, "no log given");
    if (options.replicas < 1 || options.replicas > 5) {
        throw_error(errc::invalid_argument, "replicas " + std::to_string(options.replicas) + " is not between 1 and 5");
    }
    if (options.max_pending == 0) throw_error(errc::invalid_argument, "max_pending is 0");
    for (const auto& log : options.logs) {
        // Every log readable before the stream is touched: a typo creates no stream.
        log_reader_options ro;
        ro.format = options.format;
        log_reader check{log, ro};
    }
    const auto start = clock::now();
    publish_result r;
    publisher p{options, r};
    for (std::size_t i = 0; i < options.logs.size(); ++i) p.read(i);
    p.finish();
    r.elapsed = clock::now() - start;
    return r;
}

std::string subject_token(std::string_view subject) { return detail::subject_token(subject); }

std::optional<std::string> subject_of_token(std::string_view token) { return detail::subject_of_token(token); }

}  // namespace idem::jetstream
