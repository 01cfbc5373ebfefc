// Applies four deliveries (one of them redelivered) to a store in the given directory and
// checks the rows: exit 0 if both pages hold their count, 1 if not.

#include "visits_projection.hpp"

#include <idem/idem.hpp>

// The synchronous core is light: its umbrella pulls in neither Boost.Asio nor a source's library.
#if defined(BOOST_ASIO_DETAIL_CONFIG_HPP) || defined(NATS_H_) || defined(OPENSSL_E_OS2_H)
#error "<idem/idem.hpp> included Boost.Asio, cnats or OpenSSL: the core must not need them"
#endif

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

std::string visit(const std::string& id, const std::string& page) {
    idem::envelope e;
    e.id = id;
    e.source = "/site";
    e.type = page_visited::event_type;
    e.data = R"({"page":")" + page + R"(","visitor":"v-)" + id + R"("})";
    return e.to_json();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: visits DIR\n");
        return 1;
    }
    idem::store store{{.path = argv[1], .consumer = "visits-projector"}};
    store.add(visits());
    std::vector<idem::delivery> batch{{visit("1", "/home"), "m-1"},
                                      {visit("2", "/home"), "m-2"},
                                      {visit("2", "/home"), "m-2"},  // redelivered
                                      {visit("3", "/about"), "m-3"}};
    store.apply(batch);
    auto snap = store.read();
    auto home = snap.get<page_visits>("visits", "/home");
    auto about = snap.get<page_visits>("visits", "/about");
    const bool ok = home && home->state.count == 2 && about && about->state.count == 1;
    std::printf("/home=%lld /about=%lld: %s\n", home ? static_cast<long long>(home->state.count) : -1LL,
                about ? static_cast<long long>(about->state.count) : -1LL, ok ? "ok" : "wrong");
    return ok ? 0 : 1;
}
