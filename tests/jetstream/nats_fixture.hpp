#pragma once

// A real nats-server for the in-process JetStream tests, and a publisher into a stream of its
// own: started per test on random loopback ports with its own store (the nats-server binary
// must be on PATH).

#include <nats/nats.h>

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace idem_test {

// A nats-server with JetStream on random loopback ports and its own store, stopped at the end.
class nats_server {
public:
    explicit nats_server(const std::filesystem::path& dir) : dir_(dir) {
        std::filesystem::create_directories(dir_ / "store");
        std::vector<std::string> args{"nats-server", "-js", "-sd", (dir_ / "store").string(), "-a", "127.0.0.1",
                                      "-p", "-1", "-m", "-1", "--ports_file_dir", dir_.string(),
                                      "-l", (dir_ / "server.log").string()};
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
        int rc = posix_spawnp(&pid_, "nats-server", &actions, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        REQUIRE_MESSAGE(rc == 0, "cannot start nats-server");
        const auto ports = dir_ / ("nats-server_" + std::to_string(pid_) + ".ports");
        for (int i = 0; i < 3000 && url_.empty(); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            std::ifstream in(ports);
            std::stringstream text;
            text << in.rdbuf();
            auto s = text.str();
            auto at = s.find("nats://");
            if (at != std::string::npos) url_ = s.substr(at, s.find('"', at) - at);
        }
        REQUIRE_MESSAGE(!url_.empty(), "nats-server wrote no ports file");
        // Ready when JetStream answers: connect and ask for the account info.
        for (int i = 0; i < 300; ++i) {
            natsConnection* nc = nullptr;
            if (natsConnection_ConnectTo(&nc, url_.c_str()) == NATS_OK) {
                jsCtx* js = nullptr;
                jsAccountInfo* ai = nullptr;
                bool ok = natsConnection_JetStream(&js, nc, nullptr) == NATS_OK &&
                          js_GetAccountInfo(&ai, js, nullptr, nullptr) == NATS_OK;
                if (ai != nullptr) jsAccountInfo_Destroy(ai);
                if (js != nullptr) jsCtx_Destroy(js);
                natsConnection_Destroy(nc);
                if (ok) return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        FAIL("nats-server did not become ready at " << url_);
    }
    ~nats_server() {
        ::kill(pid_, SIGTERM);
        int status = 0;
        ::waitpid(pid_, &status, 0);
    }
    nats_server(const nats_server&) = delete;
    nats_server& operator=(const nats_server&) = delete;

    const std::string& url() const { return url_; }

private:
    std::filesystem::path dir_;
    pid_t pid_ = 0;
    std::string url_;
};

// A publisher of test events into a stream it creates.
class publisher {
public:
    publisher(const std::string& url, const std::string& stream) : stream_(stream) {
        REQUIRE(natsConnection_ConnectTo(&nc_, url.c_str()) == NATS_OK);
        REQUIRE(natsConnection_JetStream(&js_, nc_, nullptr) == NATS_OK);
        create();
    }
    ~publisher() {
        jsCtx_Destroy(js_);
        natsConnection_Destroy(nc_);
    }
    publisher(const publisher&) = delete;
    publisher& operator=(const publisher&) = delete;

    void create() {
        jsStreamConfig sc;
        jsStreamConfig_Init(&sc);
        const std::string subject = stream_ + ".>";
        const char* subjects[] = {subject.c_str()};
        sc.Name = stream_.c_str();
        sc.Subjects = subjects;
        sc.SubjectsLen = 1;
        sc.Storage = js_FileStorage;
        jsStreamInfo* si = nullptr;
        jsErrCode jerr{};
        REQUIRE(js_AddStream(&si, js_, &sc, nullptr, &jerr) == NATS_OK);
        jsStreamInfo_Destroy(si);
    }
    void remove() { REQUIRE(js_DeleteStream(js_, stream_.c_str(), nullptr, nullptr) == NATS_OK); }

    // Publishes body with a Nats-Msg-Id to "<stream>.<subject>"; returns the stream sequence.
    std::uint64_t publish(const std::string& body, const std::string& msg_id, const std::string& subject = "events") {
        natsMsg* m = nullptr;
        REQUIRE(natsMsg_Create(&m, (stream_ + "." + subject).c_str(), nullptr, body.data(),
                               static_cast<int>(body.size())) == NATS_OK);
        REQUIRE(natsMsgHeader_Set(m, "Nats-Msg-Id", msg_id.c_str()) == NATS_OK);
        jsPubAck* ack = nullptr;
        jsErrCode jerr{};
        REQUIRE(js_PublishMsg(&ack, js_, m, nullptr, &jerr) == NATS_OK);
        auto seq = ack->Sequence;
        jsPubAck_Destroy(ack);
        natsMsg_Destroy(m);
        return seq;
    }

private:
    std::string stream_;
    natsConnection* nc_ = nullptr;
    jsCtx* js_ = nullptr;
};

}  // namespace idem_test
