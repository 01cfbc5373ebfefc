// The operator's commands over what the apply path set aside: `parked` lists streams waiting
// for events, `release` gives up on their gaps, `redrive` applies dead letters again after a
// fix, `audit` lists what operators did. release and redrive write: they open the store as
// its one writer, like consume.

#include "commands.hpp"

#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>

#include <cstdio>

namespace idem::cli::detail {

namespace {

const option db_option{"db", "DIR", "the LMDB environment directory", true, false};
const option wait_option{"wait", "",
                         "if another process writes the store, wait until it is done (Ctrl-C gives up) instead "
                         "of refusing at once"};
const option note_option{"reason", "TEXT", "why: kept with the action in the store's audit"};

void print(const std::string& json) {
    output out;
    out.write(json);
    out.flush();
}

std::string u64s(const std::vector<std::uint64_t>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : ",") + std::to_string(v[i]);
    return out + "]";
}

std::string ranges_json(const std::vector<sequence_range>& v) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) {
        out += (i == 0 ? "" : ",") + std::string("{\"from\":") + std::to_string(v[i].from) +
               ",\"to\":" + std::to_string(v[i].to) + "}";
    }
    return out + "]";
}

std::string ranges_text(const std::vector<sequence_range>& v) {
    std::string out;
    for (const auto& r : v) {
        out += (out.empty() ? "" : ", ") + std::to_string(r.from);
        if (r.to != r.from) out += "-" + std::to_string(r.to);
    }
    return out.empty() ? "none" : out;
}

/// The store at db opened as its writer, with the tool's projections.
std::unique_ptr<store> open_writer(const tool_context& t, const arguments& a, const std::filesystem::path& db) {
    require_store(db);
    auto o = t.store_for(db);
    o.wait_for_writer = t.writer_wait(a, db);
    auto s = std::make_unique<store>(o);
    t.setup(*s);
    return s;
}

reason reason_option(const arguments& a, std::string_view name) {
    auto v = a.get(name);
    auto r = reason_from_string(*v);
    if (!r) {
        std::string known;
        for (auto k : dead_letter_reasons()) known += (known.empty() ? "" : ", ") + std::string(to_string(k));
        throw usage_error("option '--" + std::string(name) + "': '" + *v + "' is not a reason (" + known + ")");
    }
    return *r;
}

int parked(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    auto snap = snapshot::open(db);
    std::string out;
    std::size_t events = 0;
    const auto streams = snap.parked_streams(t.consumer);
    for (const auto& s : streams) {
        out += "{\"stream\":";
        append_json_string(out, s.subject);
        out += ",\"highest_applied\":" + std::to_string(s.highest);
        out += ",\"waiting_for\":" + std::to_string(s.highest + 1);
        out += ",\"missing\":" + ranges_json(s.missing);
        out += ",\"parked\":" + std::to_string(s.sequences.size());
        out += ",\"sequences\":" + u64s(s.sequences);
        out += ",\"oldest_parked_ns\":" + std::to_string(s.oldest_ns) + ",\"oldest_parked\":";
        append_json_string(out, format_utc(s.oldest_ns));
        out += "}\n";
        events += s.sequences.size();
    }
    std::fprintf(stderr, "%s parked: %zu streams hold %zu parked events\n", t.name.c_str(), streams.size(), events);
    print(out);
    return 0;
}

int release(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    const auto subject = a.required("stream");
    release_options o;
    o.drop = a.flag("drop");
    o.note = a.get("reason").value_or("");
    auto s = open_writer(t, a, db);
    release_result r;
    try {
        r = s->release(subject, o);
    } catch (const std::system_error& e) {
        if (e.code() == errc::invalid_argument) throw usage_error(e.what());
        throw;
    }
    std::string out = "{\"stream\":";
    append_json_string(out, r.subject);
    out += std::string(",\"action\":\"") + (o.drop ? "drop" : "release") + "\"";
    out += ",\"highest_before\":" + std::to_string(r.highest_before);
    out += ",\"highest_after\":" + std::to_string(r.highest_after);
    out += ",\"skipped\":" + ranges_json(r.skipped);
    out += ",\"released\":" + u64s(r.released);
    out += ",\"dropped\":" + u64s(r.dropped);
    out += ",\"commit\":" + std::to_string(r.commit) + "}\n";
    if (o.drop) {
        std::fprintf(stderr, "%s release: dropped %zu parked events of '%s' to dead letters (released_dropped); "
                             "stream at %llu\n",
                     t.name.c_str(), r.dropped.size(), subject.c_str(),
                     static_cast<unsigned long long>(r.highest_after));
    } else {
        std::fprintf(stderr, "%s release: applied %zu parked events of '%s', skipping sequences %s; stream at %llu\n",
                     t.name.c_str(), r.released.size(), subject.c_str(), ranges_text(r.skipped).c_str(),
                     static_cast<unsigned long long>(r.highest_after));
    }
    print(out);
    return 0;
}

int redrive(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    redrive_options o;
    if (a.get("reason")) o.why = reason_option(a, "reason");
    if (auto e = a.get("event")) {
        auto slash = e->rfind('/');
        if (slash == std::string::npos || slash == 0 || slash + 1 == e->size()) {
            throw usage_error("option '--event': '" + *e + "' is not SOURCE/ID");
        }
        envelope ev;
        ev.source = e->substr(0, slash);
        ev.id = e->substr(slash + 1);
        o.event_id = ev.event_id();
    }
    if (a.get("position")) o.position = a.positive("position", 0);
    if (!o.why && !o.event_id && !o.position && !a.flag("all")) {
        throw usage_error("give --reason R, --event SOURCE/ID, --position N or --all");
    }
    o.out_of_order = a.flag("out-of-order");
    o.note = a.get("note").value_or("");
    auto s = open_writer(t, a, db);
    auto r = s->redrive(o);
    std::string out;
    for (const auto& i : r.items) {
        out += "{\"position\":" + std::to_string(i.position) + ",\"was\":";
        append_json_string(out, to_string(i.was));
        out += ",\"message_id\":";
        append_json_string(out, split_message_id(i.message_id).second);
        out += ",\"outcome\":";
        append_json_string(out, i.refused ? std::string_view("refused") : to_string(i.result.kind));
        if (i.result.why != reason::none && !i.refused) {
            out += ",\"reason\":";
            append_json_string(out, to_string(i.result.why));
        }
        out += ",\"detail\":";
        append_json_string(out, i.result.detail);
        out += "}\n";
    }
    std::fprintf(stderr,
                 "%s redrive: applied %zu, already held %zu, dead-lettered again %zu, refused %zu (left as they were)%s\n",
                 t.name.c_str(), r.applied, r.duplicates, r.dead_lettered, r.refused,
                 r.commit != 0 ? (" in commit " + std::to_string(r.commit)).c_str() : "");
    print(out);
    return 0;
}

int audit(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    auto snap = snapshot::open(db);
    std::string out;
    for (const auto& x : snap.operator_actions(t.consumer)) {
        out += "{\"position\":" + std::to_string(x.position) + ",\"time_ns\":" + std::to_string(x.time_ns) + ",\"time\":";
        append_json_string(out, format_utc(x.time_ns));
        out += ",\"commit\":" + std::to_string(x.commit) + ",\"action\":";
        append_json_string(out, x.action);
        out += ",\"stream\":";
        append_json_string(out, x.stream);
        out += ",\"skipped\":" + ranges_json(x.skipped);
        out += x.action == "redrive" ? ",\"dead_letters\":" : ",\"sequences\":";
        out += u64s(x.sequences) + ",\"reason\":";
        append_json_string(out, x.note);
        out += ",\"summary\":";
        append_json_string(out, x.summary);
        out += "}\n";
    }
    print(out);
    return 0;
}

}  // namespace

std::vector<command> operator_commands(std::function<tool_context()> t) {
    std::vector<command> out;
    out.push_back(command{
        "parked",
        "list the streams holding parked events: what each waits for, the missing sequences, how many are parked",
        {db_option},
        [t](const arguments& a) { return parked(t(), a); }});
    out.push_back(command{
        "release",
        "give up on a parked stream's gaps: apply its parked events skipping the missing sequences, or drop them "
        "to dead letters; recorded in the audit",
        {db_option,
         {"stream", "S", "the stream (subject) to release", true},
         {"drop", "", "dead-letter its parked events (released_dropped) instead of applying them"},
         note_option, wait_option},
        [t](const arguments& a) { return release(t(), a); }});
    out.push_back(command{
        "redrive",
        "apply dead letters again through the apply path (after a fix); what fails again stays a dead letter; "
        "recorded in the audit",
        {db_option,
         {"reason", "R", "only dead letters with this reason"},
         {"event", "SOURCE/ID", "only this event's dead letters"},
         {"position", "N", "only the dead letter at this position"},
         {"all", "", "every dead letter (when no filter is given)"},
         {"out-of-order", "",
          "also sequenced events: applied to every row that does not hold a later sequence of their stream"},
         {"note", "TEXT", "why: kept with the action in the store's audit"},
         wait_option},
        [t](const arguments& a) { return redrive(t(), a); }});
    out.push_back(command{
        "audit",
        "print the operator actions recorded in the store as JSON Lines (release, release_drop, redrive)",
        {db_option},
        [t](const arguments& a) { return audit(t(), a); }});
    return out;
}

}  // namespace idem::cli::detail
