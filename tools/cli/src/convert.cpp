// `convert` copies an event log between JSON Lines and the binary format, record for record.

#include "commands.hpp"
#include "json_writer.hpp"
#include "options.hpp"

#include <idem/storage/event_log.hpp>

#include <cinttypes>
#include <cstdio>

namespace idem::cli::detail {

namespace {

int convert(const arguments& a) {
    auto to = a.required("to");
    if (to != "jsonl" && to != "binary") throw usage_error("option '--to': '" + to + "' is neither jsonl nor binary");
    auto r = convert_log(a.required("in"), a.required("out"), to == "jsonl" ? log_format::jsonl : log_format::binary,
                         a.flag("skip-bad"));
    std::string out;
    json_writer w{out};
    w.begin_object().field("records", r.records).field("skipped", r.skipped);
    if (r.torn_tail) {
        w.field("torn_tail", *r.torn_tail).field("torn_detail", r.torn_detail);
        std::fprintf(stderr, "convert: %s: incomplete last record at offset %" PRIu64 " not copied (%s)\n",
                     a.required("in").c_str(), *r.torn_tail, r.torn_detail.c_str());
    }
    w.end_object();
    out += "\n";
    print(out);
    return 0;
}

}  // namespace

command convert_command() {
    return command{"convert",
                   "convert an event log between JSON Lines and the binary format (lossless both ways). Binary "
                   "records also carry each envelope parsed, so a rebuild from them parses no JSON; --to binary "
                   "on a binary log of an earlier build adds that",
                   {{"in", "FILE", "the log to read", true},
                    {"out", "FILE", "the log to write (replaced)", true},
                    {"to", "jsonl|binary", "the output format", true},
                    skip_bad_option},
                   convert};
}

}  // namespace idem::cli::detail
