// The `idem` command line over the example domains: orders, trading positions, the game
// leaderboard and inventory, plus `idem gen`, which writes realistic logs of them, and a
// downstream copy of the order totals fed by `idem relay` from another store's change feed.
// A tool over your own projections is the same few lines with your projections.

#include <idem/cli/tool.hpp>
#include <idem/examples/domains.hpp>
#include <idem/examples/gen.hpp>
#include <idem/storage/event_log.hpp>

namespace {

idem::cli::command gen_command() {
    return {
        "gen",
        "write a realistic example log with redeliveries, republished, reordered and malformed events; "
        "print the exact outcome counts and totals it must give",
        {{"out", "FILE", "the log to write (replaced)", true},
         {"domain", "trading|game|orders", "which example domain (default trading)"},
         {"format", "jsonl|binary", "the log's format (default jsonl)"},
         {"events", "N", "distinct domain events (default 1000000)"},
         {"aggregates", "N", "positions / matches and players / orders (default 100000)"},
         {"redeliver", "SHARE", "share redelivered with the same message id (default 0.10)"},
         {"republish", "SHARE", "share republished under a new message id (default 0.02)"},
         {"reissue", "SHARE", "share re-sent under a new event id with the same effect key (default 0.01)"},
         {"reorder", "SHARE", "share of sequenced events delivered late (default 0.02)"},
         {"malformed", "SHARE", "share of defective lines, every kind in turn (default 0.001)"},
         {"seed", "N", "random seed (default 1)"},
         {"key-prefix", "P", "prepended to every aggregate key (orders, accounts, matches, players)"}},
        [](const idem::cli::arguments& a) {
            idem::examples::gen_options o;
            o.domain = a.get("domain").value_or("trading");
            if (o.domain != "trading" && o.domain != "game" && o.domain != "orders") {
                throw idem::cli::usage_error("option '--domain': '" + o.domain + "' is not trading, game or orders");
            }
            o.events = a.number("events", o.events);
            o.aggregates = a.positive("aggregates", o.aggregates);
            o.redeliver = a.real("redeliver", o.redeliver);
            o.republish = a.real("republish", o.republish);
            o.reissue = a.real("reissue", o.reissue);
            o.reorder = a.real("reorder", o.reorder);
            o.malformed = a.real("malformed", o.malformed);
            for (double share : {o.redeliver, o.republish, o.reissue, o.reorder, o.malformed}) {
                if (share < 0 || share > 1) throw idem::cli::usage_error("shares are between 0 and 1");
            }
            o.seed = a.number("seed", o.seed);
            o.key_prefix = a.get("key-prefix").value_or("");
            auto format = a.get("format").value_or("jsonl");
            if (format != "jsonl" && format != "binary") {
                throw idem::cli::usage_error("option '--format': '" + format + "' is neither jsonl nor binary");
            }
            idem::log_writer out{a.required("out"), format == "jsonl" ? idem::log_format::jsonl : idem::log_format::binary};
            auto result = idem::examples::generate(o, [&](std::string_view line) { out.write(line); });
            out.flush();
            idem::cli::output stdout_;
            stdout_.write(idem::examples::to_json(result));
            stdout_.write("\n");
            stdout_.flush();
            return 0;
        }};
}

}  // namespace

int main(int argc, char** argv) {
    idem::cli::tool tool{"idem"};
    // Every example projection records its changes: `idem changes`, GET /changes and `idem relay` follow them.
    tool.add(idem::examples::order_totals().changes())
        .upcast(idem::examples::order_line_upcaster())
        .add(idem::examples::positions().changes())
        .add(idem::examples::leaderboard().changes())
        .add(idem::examples::inventory().changes())
        .add(idem::examples::order_totals_copy().changes())  // fed by `idem relay` from another store
        .add_command(gen_command());
    return tool.run(argc, argv);
}
