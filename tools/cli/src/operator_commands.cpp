// The operator's commands over what the apply path set aside: `parked` lists streams waiting
// for events, `release` gives up on their gaps, `redrive` applies dead letters again after a
// fix, `event-clock` shows the consumer's event clock and sets it back after a jump on bad
// clocks, `audit` lists what operators did. release, redrive and event-clock --set-back-to
// write: they open the store as its one writer, like consume.

#include "commands.hpp"
#include "interrupt.hpp"
#include "json_writer.hpp"
#include "options.hpp"
#include "text.hpp"

#include <idem/storage/canonical.hpp>
#include <idem/storage/duration.hpp>
#include <idem/storage/envelope.hpp>

#include <cstdio>

namespace idem::cli::detail {

namespace {

const option note_option{"reason", "TEXT", "why: kept with the action in the store's audit", true};

void write_numbers(json_writer& w, const std::vector<std::uint64_t>& v) {
    w.begin_array();
    for (auto n : v) w.value(n);
    w.end_array();
}

void write_ranges(json_writer& w, const std::vector<sequence_range>& v) {
    w.begin_array();
    for (const auto& r : v) w.begin_object().field("from", r.from).field("to", r.to).end_object();
    w.end_array();
}

std::string ranges_text(const std::vector<sequence_range>& v) {
    std::string out;
    for (const auto& r : v) {
        out += (out.empty() ? "" : ", ") + std::to_string(r.from);
        if (r.to != r.from) out += "-" + std::to_string(r.to);
    }
    return out.empty() ? "none" : out;
}

int parked(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    auto snap = snapshot::open(db);
    std::string out;
    std::size_t events = 0;
    const auto streams = snap.consumer(t.consumer).parked_streams();
    for (const auto& s : streams) {
        json_writer w{out};
        w.begin_object().field("stream", s.subject).field("highest_applied", s.highest);
        w.field("waiting_for", s.highest + 1);
        write_ranges(w.key("missing"), s.missing);
        w.field("parked", s.sequences.size());
        write_numbers(w.key("sequences"), s.sequences);
        w.field("oldest_parked_ns", s.oldest_ns).field("oldest_parked", format_utc(s.oldest_ns));
        w.end_object();
        out += "\n";
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
    o.note = a.required("reason");
    if (o.note.empty()) throw usage_error("option '--reason': say why the stream's gaps are given up (kept in the audit)");
    auto s = t.open_writer(a, db);
    release_result r;
    try {
        r = s->release(subject, o);
    } catch (const std::system_error& e) {
        if (e.code() == errc::invalid_argument) throw usage_error(e.what());
        throw;
    }
    std::string out;
    json_writer w{out};
    w.begin_object().field("stream", r.subject).field("action", o.drop ? "drop" : "release");
    w.field("highest_before", r.highest_before).field("highest_after", r.highest_after);
    write_ranges(w.key("skipped"), r.skipped);
    write_numbers(w.key("released"), r.released);
    write_numbers(w.key("dropped"), r.dropped);
    w.field("commit", r.commit).end_object();
    out += "\n";
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
    if (a.get("event")) {
        envelope ev;
        std::tie(ev.source, ev.id) = event_option(a, "event");
        o.event_id = ev.event_id();
    }
    if (a.get("position")) o.position = a.positive("position", 0);
    if (!o.why && !o.event_id && !o.position && !a.flag("all")) {
        throw usage_error("give --reason R, --event SOURCE/ID, --position N or --all");
    }
    o.out_of_order = a.flag("out-of-order");
    o.note = a.get("note").value_or("");
    auto s = t.open_writer(a, db);
    auto r = s->redrive(o);
    if (r.items.empty()) {
        // An operator who names dead letters expects them to be there: a filter that matched
        // none is a mistake to report (a wrong position or event id), not a run that did nothing.
        std::string filters;
        if (o.why) filters += " --reason " + std::string(to_string(*o.why));
        if (a.get("event")) filters += " --event " + *a.get("event");
        if (o.position) filters += " --position " + std::to_string(*o.position);
        if (filters.empty()) filters = " --all";
        throw usage_error("no dead letter of " + db.string() + " matches" + filters + ": nothing was redriven");
    }
    std::string out;
    for (const auto& i : r.items) {
        json_writer w{out};
        w.begin_object().field("position", i.position).field("was", to_string(i.was));
        w.field("message_id", split_message_id(i.message_id).second);
        w.field("outcome", i.refused ? std::string_view("refused") : to_string(i.result.kind));
        if (i.result.why != reason::none && !i.refused) w.field("reason", to_string(i.result.why));
        w.field("detail", i.result.detail).end_object();
        out += "\n";
    }
    std::fprintf(stderr,
                 "%s redrive: applied %zu, already held %zu, dead-lettered again %zu, refused %zu (left as they were)%s\n",
                 t.name.c_str(), r.applied, r.duplicates, r.dead_lettered, r.refused,
                 r.commit != 0 ? (" in commit " + std::to_string(r.commit)).c_str() : "");
    print(out);
    return 0;
}

void write_time(json_writer& w, std::string_view name, std::uint64_t ns) {
    w.field(std::string(name) + "_ns", ns).field(name, format_utc(ns));
}

// event-clock: the consumer's event time, a pending jump and the projections' floors; with
// --set-back-to, the event time set back (the horizon follows it) and recorded in the audit.
int event_clock(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    std::optional<event_clock_result> set;
    if (auto to = a.get("set-back-to")) {
        const auto ns = parse_event_time(*to);
        if (!ns || *ns == 0) {
            throw usage_error("option '--set-back-to': '" + *to + "' is not an RFC 3339 time (2026-12-02T10:00:00Z)");
        }
        const auto note = a.get("reason").value_or("");
        if (note.empty()) throw usage_error("option '--set-back-to' needs --reason TEXT (kept in the audit)");
        auto s = t.open_writer(a, db);
        try {
            set = s->set_event_time_back(*ns, note);
        } catch (const std::system_error& e) {
            if (e.code() == errc::invalid_argument) throw usage_error(e.what());
            throw;
        }
    } else if (a.get("reason")) {
        throw usage_error("option '--reason' goes with --set-back-to");
    }
    require_store(db);
    auto snap = snapshot::open(db);
    const auto r = snap.consumer(t.consumer).retention();
    std::string out;
    json_writer w{out};
    w.begin_object();
    write_time(w, "event_time", r.event_time);
    write_time(w, "inbox_floor", r.inbox_floor);
    if (r.jump_votes != 0) {
        w.key("pending_jump").begin_object();
        write_time(w, "time", r.jump_time);
        w.field("votes", r.jump_votes).field("sources", r.jump_sources).end_object();
    } else {
        w.key("pending_jump").null();
    }
    // Below a projection's floor its effect keys were pruned: a late event there is never redriven.
    w.key("contributor_floors").begin_object();
    for (const auto& p : t.projections) {
        w.key(p->name()).begin_object();
        write_time(w, "floor", snap.projection(p->name()).contributor_floor());
        w.end_object();
    }
    w.end_object();
    if (set) {
        w.key("set_back").begin_object();
        write_time(w, "from", set->before);
        write_time(w, "to", set->after);
        if (set->dropped_votes != 0) {
            write_time(w, "dropped_jump", set->dropped_jump);
            w.field("dropped_votes", set->dropped_votes);
        }
        w.field("commit", set->commit).end_object();
        std::fprintf(stderr, "%s event-clock: set back from %s to %s in commit %llu; late events at or above the "
                             "floors can now be redriven (redrive --reason late_event)\n",
                     t.name.c_str(), format_utc(set->before).c_str(), format_utc(set->after).c_str(),
                     static_cast<unsigned long long>(set->commit));
    }
    w.end_object();
    print(out + "\n");
    return 0;
}

int audit(const tool_context& t, const arguments& a) {
    std::filesystem::path db = a.required("db");
    require_store(db);
    auto snap = snapshot::open(db);
    std::string out;
    for (const auto& x : snap.consumer(t.consumer).operator_actions()) {
        json_writer w{out};
        w.begin_object().field("position", x.position).field("time_ns", x.time_ns).field("time", format_utc(x.time_ns));
        w.field("commit", x.commit).field("action", x.action).field("stream", x.stream);
        write_ranges(w.key("skipped"), x.skipped);
        write_numbers(w.key(x.action == "redrive" ? "dead_letters" : "sequences"), x.sequences);
        w.field("reason", x.note).field("summary", x.summary).end_object();
        out += "\n";
    }
    print(out);
    return 0;
}

}  // namespace

std::vector<command> operator_commands(context_fn t) {
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
        "event-clock",
        "print the consumer's event clock as JSON (its event time, a pending jump, the projections' floors); with "
        "--set-back-to, set it back after a jump taken on bad clocks, recorded in the audit",
        {db_option,
         {"set-back-to", "TIME",
          "the RFC 3339 time to set the event clock back to (before it; the horizon follows, the floors stay)"},
         {"reason", "TEXT", "with --set-back-to: why (kept with the action in the store's audit)"},
         wait_option},
        [t](const arguments& a) { return event_clock(t(), a); }});
    out.push_back(command{
        "audit",
        "print the operator actions recorded in the store as JSON Lines (release, release_drop, redrive, "
        "event_clock)",
        {db_option},
        [t](const arguments& a) { return audit(t(), a); }});
    return out;
}

}  // namespace idem::cli::detail
