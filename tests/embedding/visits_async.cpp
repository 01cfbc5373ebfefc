// The asynchronous example of docs/ASYNC.md, whole: an engine on the user's io_context, a coroutine that
// applies four deliveries (one redelivered) with co_await and reads the rows back. Built with the
// compiler the user has (Debian 12: GCC 12) and run by tests/embedding/run: exit 0 if both pages
// hold their count, 1 if not.

#include "visits_projection.hpp"

#include <idem/engine.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdio>
#include <string>

namespace {

std::string visit(const std::string& id, const std::string& page) {
    return R"({"specversion":"1.0","id":")" + id + R"(","source":"/site","type":"page.visited","data":{"page":")" +
           page + R"(","visitor":"v-)" + id + R"("}})";
}

boost::asio::awaitable<void> visit_pages(idem::engine& engine, bool& ok) {
    const std::pair<std::string, std::string> sent[] = {
        {visit("1", "/home"), "m-1"}, {visit("2", "/home"), "m-2"}, {visit("2", "/home"), "m-2"}, {visit("3", "/about"), "m-3"}};
    int applied = 0;
    for (const auto& [body, message_id] : sent) {
        // Completes once the commit holding it is durable: the moment to acknowledge it.
        auto [ec, outcome] = co_await engine.async_apply(idem::delivery{body, message_id}, boost::asio::use_awaitable);
        if (ec) {
            std::fprintf(stderr, "async_apply: %s\n", ec.message().c_str());
            co_return;
        }
        applied += outcome.kind == idem::outcome_kind::applied;
    }
    auto snap = engine.read();
    auto home = snap.get<page_visits>("visits", "/home");
    auto about = snap.get<page_visits>("visits", "/about");
    ok = applied == 3 && home && home->state.count == 2 && about && about->state.count == 1;
    std::printf("visits-async: applied %d, /home=%lld /about=%lld: %s\n", applied,
                home ? static_cast<long long>(home->state.count) : -1LL,
                about ? static_cast<long long>(about->state.count) : -1LL, ok ? "ok" : "wrong");
    co_await engine.async_stop(boost::asio::use_awaitable);
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: visits-async DIR\n");
        return 1;
    }
    boost::asio::io_context io;
    idem::engine engine{io.get_executor(), {.store = {.path = argv[1], .consumer = "visits-projector"}}};
    engine.add(visits());
    bool ok = false;
    boost::asio::co_spawn(io, visit_pages(engine, ok), boost::asio::detached);
    io.run();
    return ok ? 0 : 1;
}
