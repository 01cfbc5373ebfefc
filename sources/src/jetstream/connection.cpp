#include "connection.hpp"

#include <idem/sources/jetstream.hpp>

#include <idem/storage/error.hpp>

#include <thread>

namespace idem::jetstream::detail {

namespace {

// JetStream API error codes (nats-server errors.json) the setup tells apart from failures.
constexpr int js_stream_not_found = 10059;
constexpr int js_consumer_not_found = 10014;

void on_disconnected(natsConnection*, void* closure) {
    static_cast<connection_events*>(closure)->disconnects.fetch_add(1, std::memory_order_relaxed);
}
void on_reconnected(natsConnection*, void* closure) {
    static_cast<connection_events*>(closure)->reconnects.fetch_add(1, std::memory_order_relaxed);
}
void on_closed(natsConnection*, void* closure) {
    // release: the destructor's acquire load of `closed` orders this callback's last touch of
    // the events before their deletion.
    static_cast<connection_events*>(closure)->closed.store(true, std::memory_order_release);
}
void on_error(natsConnection*, natsSubscription*, natsStatus, void* closure) {
    static_cast<connection_events*>(closure)->async_errors.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::vector<std::string> split_servers(std::string_view list) {
    std::vector<std::string> out;
    std::size_t start = 0;
    for (;;) {
        auto comma = list.find(',', start);
        auto part = list.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
        while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
        while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
        if (part.empty()) {
            throw_error(errc::invalid_argument, "NATS server list '" + std::string(list) + "' has an empty entry");
        }
        out.emplace_back(part);
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    return out;
}

bool transient(natsStatus s, jsErrCode js) noexcept {
    switch (static_cast<int>(js)) {
        case 10005:  // no suitable peers for placement (peers not yet joined)
        case 10008:  // JetStream system temporarily unavailable
        case 10009:  // JetStream cluster can not handle request (no leader)
            return true;
        default:
            break;
    }
    switch (s) {
        case NATS_TIMEOUT:
        case NATS_NO_RESPONDERS:
        case NATS_NO_SERVER:
        case NATS_IO_ERROR:
        case NATS_CONNECTION_DISCONNECTED:
        case NATS_STALE_CONNECTION:
        case NATS_NOT_YET_CONNECTED:
            return true;
        default:
            return false;
    }
}

void throw_nats(natsStatus s, const std::string& what, jsErrCode js) {
    std::string text = what + ": " + natsStatus_GetText(s);
    const char* last = nats_GetLastError(nullptr);
    if (last != nullptr && *last != '\0' && std::string_view(last) != natsStatus_GetText(s)) {
        text += " (" + std::string(last) + ")";
    }
    if (static_cast<int>(js) != 0) text += " [JetStream error " + std::to_string(static_cast<int>(js)) + "]";
    if (transient(s, js)) throw broker_unreachable(make_error_code(errc::broker_failed), text);
    throw_error(errc::broker_failed, text);
}

connection::connection(const std::vector<std::string>& servers, const std::string& name,
                       std::chrono::milliseconds request_timeout)
    : events_(std::make_unique<connection_events>()) {
    for (const auto& s : servers) servers_text_ += (servers_text_.empty() ? "" : ",") + s;
    try {
        check_nats(natsOptions_Create(&opts_), "NATS options");
        std::vector<const char*> urls;
        for (const auto& s : servers) urls.push_back(s.c_str());
        check_nats(natsOptions_SetServers(opts_, urls.data(), static_cast<int>(urls.size())),
                   "NATS servers '" + servers_text_ + "'");
        check_nats(natsOptions_SetName(opts_, name.c_str()), "NATS client name");
        check_nats(natsOptions_SetMaxReconnect(opts_, -1), "NATS reconnect");
        check_nats(natsOptions_SetReconnectWait(opts_, 250), "NATS reconnect wait");
        check_nats(natsOptions_SetReconnectJitter(opts_, 100, 1000), "NATS reconnect jitter");
        check_nats(natsOptions_SetPingInterval(opts_, 5000), "NATS ping interval");
        check_nats(natsOptions_SetTimeout(opts_, 2000), "NATS connect timeout");
        check_nats(natsOptions_SetDisconnectedCB(opts_, on_disconnected, events_.get()), "NATS callbacks");
        check_nats(natsOptions_SetReconnectedCB(opts_, on_reconnected, events_.get()), "NATS callbacks");
        check_nats(natsOptions_SetClosedCB(opts_, on_closed, events_.get()), "NATS callbacks");
        check_nats(natsOptions_SetErrorHandler(opts_, on_error, events_.get()), "NATS callbacks");
        check_nats(natsConnection_Connect(&nc_, opts_), "cannot connect to NATS at '" + servers_text_ + "'");
        jsOptions jo;
        jsOptions_Init(&jo);
        jo.Wait = request_timeout.count();
        check_nats(natsConnection_JetStream(&js_, nc_, &jo), "JetStream context at '" + servers_text_ + "'");
    } catch (...) {
        if (nc_ != nullptr) natsConnection_Destroy(nc_);
        if (opts_ != nullptr) natsOptions_Destroy(opts_);
        throw;
    }
}

connection::~connection() {
    if (js_ != nullptr) jsCtx_Destroy(js_);
    if (nc_ != nullptr) {
        natsConnection_Close(nc_);
        // cnats runs the closed callback later, on its own thread, and it writes into events_:
        // wait for it before events_ goes.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!events_->closed.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        // A callback that never came may still come: its few bytes are left, never freed under it.
        if (!events_->closed.load(std::memory_order_acquire)) (void)events_.release();
        natsConnection_Destroy(nc_);
    }
    if (opts_ != nullptr) natsOptions_Destroy(opts_);
    nats_ReleaseThreadMemory();
}

void connection::flush(std::chrono::milliseconds timeout) {
    check_nats(natsConnection_FlushTimeout(nc_, timeout.count()), "flushing to NATS at '" + servers_text_ + "'");
}

void connection::release(std::initializer_list<natsSubscription*> subs) const noexcept {
    for (auto* sub : subs) {
        if (sub != nullptr) natsSubscription_Unsubscribe(sub);
    }
    if (natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED) (void)natsConnection_FlushTimeout(nc_, 5000);
    for (auto* sub : subs) {
        if (sub != nullptr) natsSubscription_Destroy(sub);
    }
}

stream_info_ptr stream_info(const connection& c, const std::string& stream) {
    jsStreamInfo* si = nullptr;
    jsErrCode jerr{};
    auto s = js_GetStreamInfo(&si, c.js(), stream.c_str(), nullptr, &jerr);
    if (s == NATS_NOT_FOUND || static_cast<int>(jerr) == js_stream_not_found) {
        return stream_info_ptr(nullptr, jsStreamInfo_Destroy);
    }
    check_nats(s, "stream '" + stream + "' at '" + c.servers() + "'", jerr);
    return stream_info_ptr(si, jsStreamInfo_Destroy);
}

consumer_info_ptr consumer_info(const connection& c, const std::string& stream, const std::string& consumer) {
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr{};
    auto s = js_GetConsumerInfo(&ci, c.js(), stream.c_str(), consumer.c_str(), nullptr, &jerr);
    if (s == NATS_NOT_FOUND || static_cast<int>(jerr) == js_consumer_not_found) {
        return consumer_info_ptr(nullptr, jsConsumerInfo_Destroy);
    }
    check_nats(s, "consumer '" + consumer + "' of stream '" + stream + "' at '" + c.servers() + "'", jerr);
    return consumer_info_ptr(ci, jsConsumerInfo_Destroy);
}

}  // namespace idem::jetstream::detail

namespace idem::jetstream {

bool close_nats_library(std::chrono::milliseconds timeout) noexcept {
    return nats_CloseAndWait(timeout.count()) == NATS_OK;
}

}  // namespace idem::jetstream
