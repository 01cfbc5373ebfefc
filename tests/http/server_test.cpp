#include <idem/sources/http.hpp>

#include "../engine/engine_fixtures.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>

#include <doctest/doctest.h>

#include <map>
#include <thread>
#include <vector>

using namespace idem_test;
namespace asio = boost::asio;

namespace {

// One request over a fresh connection with a blocking client; returns the raw answer.
std::string round_trip(const asio::ip::tcp::endpoint& at, const std::string& request) {
    asio::io_context client;
    asio::ip::tcp::socket s{client};
    s.connect(at);
    asio::write(s, asio::buffer(request));
    std::string answer;
    boost::system::error_code ec;
    asio::read(s, asio::dynamic_buffer(answer), ec);  // until the server closes (Connection: close)
    return answer;
}

std::string post_request(const std::string& body) {
    return "POST /events HTTP/1.1\r\nHost: test\r\nContent-Type: application/cloudevents+json\r\nConnection: close\r\n"
           "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

TEST_SUITE("http server") {
    TEST_CASE("an embedder's server on its own executor answers after the commit and stops gracefully") {
        idem::test::temp_dir dir;
        asio::io_context io;
        io_threads threads{io, 2};  // the server keeps to its strand on a multi-threaded executor
        idem::engine e{io.get_executor(), engine_options(dir.path(), idem::durability::full)};
        e.add(totals_by_order());
        idem::http::server srv{io.get_executor(), e, {}};
        const auto at = srv.local_endpoint();
        REQUIRE(at.port() != 0);

        const auto first = round_trip(at, post_request(line("e-1", "o-1", 25).to_json()));
        CHECK(first.starts_with("HTTP/1.1 200"));
        CHECK(first.find("\"outcome\":\"applied\"") != std::string::npos);
        // The answer came after the commit: the row is there without waiting.
        auto rows = dump(e.read(), "order-totals");
        CHECK(rows["o-1"].total == 25);
        CHECK(e.durable_commit() >= 1);

        const auto again = round_trip(at, post_request(line("e-1", "o-1", 25).to_json()));
        CHECK(again.starts_with("HTTP/1.1 200"));
        CHECK(again.find("duplicate_message") != std::string::npos);
        CHECK(dump(e.read(), "order-totals")["o-1"].total == 25);

        CHECK(round_trip(at, "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 200"));
        CHECK(srv.stats().answers[0] == 3);

        srv.async_stop(asio::use_future).get();
        boost::system::error_code ec;
        asio::io_context client;
        asio::ip::tcp::socket late{client};
        late.connect(at, ec);
        CHECK(ec);  // the acceptor is closed
        e.async_stop(asio::use_future).get();
    }

    TEST_CASE("connections served in parallel on two threads each get their answer after the commit") {
        idem::test::temp_dir dir;
        asio::io_context io;
        io_threads threads{io, 2};
        idem::engine e{io.get_executor(), engine_options(dir.path(), idem::durability::full)};
        e.add(totals_by_order());
        idem::http::server srv{io.get_executor(), e, {}};
        const auto at = srv.local_endpoint();

        // Eight senders at once, each event once and its first one again (a retry).
        constexpr int senders = 8, events = 25;
        std::map<std::string, std::int64_t> reference;
        for (int t = 0; t < senders; ++t) {
            for (int k = 0; k < events; ++k) reference["o-" + std::to_string(k % 5)] += k + 1;
        }
        std::vector<std::vector<std::string>> answers(senders);
        std::vector<std::thread> clients;
        for (int t = 0; t < senders; ++t) {
            clients.emplace_back([&, t] {
                auto& mine = answers[static_cast<std::size_t>(t)];
                auto event = [&](int k) {
                    return line("s" + std::to_string(t) + "-" + std::to_string(k), "o-" + std::to_string(k % 5), k + 1);
                };
                for (int k = 0; k < events; ++k) mine.push_back(round_trip(at, post_request(event(k).to_json())));
                mine.push_back(round_trip(at, post_request(event(0).to_json())));
            });
        }
        for (auto& c : clients) c.join();

        for (const auto& mine : answers) {
            REQUIRE(mine.size() == events + 1);
            for (std::size_t k = 0; k < mine.size(); ++k) {
                CHECK(mine[k].starts_with("HTTP/1.1 200"));
                const bool retry = k == events;
                CHECK(mine[k].find(retry ? "duplicate_message" : "\"outcome\":\"applied\"") != std::string::npos);
            }
        }
        auto rows = dump(e.read(), "order-totals");
        for (const auto& [order, total] : reference) CHECK(rows[order].total == total);
        CHECK(srv.stats().answers[0] == senders * (events + 1));
        CHECK(srv.stats().in_flight == 0);

        srv.async_stop(asio::use_future).get();
        e.async_stop(asio::use_future).get();
    }

    TEST_CASE("a port already taken is refused naming the address") {
        idem::test::temp_dir dir;
        asio::io_context io;
        idem::engine e{io.get_executor(), engine_options(dir.path())};
        idem::http::server first{io.get_executor(), e, {}};
        idem::http::server_options o;
        o.listen = first.local_endpoint();
        try {
            idem::http::server second{io.get_executor(), e, o};
            FAIL("a second server bound the same port");
        } catch (const std::system_error& err) {
            CHECK(std::string(err.what()).find(std::to_string(o.listen.port())) != std::string::npos);
        }
    }
}
