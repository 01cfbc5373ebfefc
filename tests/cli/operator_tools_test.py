#!/usr/bin/env python3
"""Diagnostics and operator tools of the real `idem` binary: `why` however an event was
delivered, run summaries that separate this run from the store's totals, `verify` of a store
that lags its logs, bounded dead letters, option values, `deadletters --reason`, `parked`,
`release`, `redrive` and `audit`. Logs are written by hand here, and rows are compared with
references computed here.

usage: operator_tools_test.py PATH/TO/idem
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

IDEM = None


def run(*args, check=True, timeout=300):
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def line(event_id, order, amount, seq=None, msgid=None, subject=None, time_s=0, source="/shop"):
    e = {"specversion": "1.0", "id": event_id, "source": source, "type": "order.line_added",
         "subject": subject or order, "time": "2026-12-02T10:%02d:%02dZ" % (time_s // 60, time_s % 60),
         "data": {"order_id": order, "amount": amount}}
    if seq is not None:
        e["sequence"] = str(seq)
    if msgid is not None:
        e["msgid"] = msgid
    return json.dumps(e, separators=(",", ":"))


def fill(event_id, account, exec_id, qty, msgid=None, seq=None):
    e = {"specversion": "1.0", "id": event_id, "source": "/venue", "type": "order.filled", "subject": account,
         "time": "2026-12-02T10:00:00Z",
         "data": {"account": account, "instrument": "ES", "side": "buy", "qty": qty, "price": 100,
                  "exec_id": exec_id}}
    if msgid is not None:
        e["msgid"] = msgid
    if seq is not None:
        e["sequence"] = str(seq)
    return json.dumps(e, separators=(",", ":"))


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


class case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-optools-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, lines):
        with open(self.path(name), "w") as f:
            f.write("".join(l + "\n" for l in lines))
        return self.path(name)

    def why(self, db, *args):
        return json.loads(run("why", "--db", db, *args).stdout)

    def totals(self, db):
        # The rows without their currency: every order line of these logs is in EUR (version 1).
        rows = jsonl(run("dump", "--db", db, "--projection", "order-totals").stdout)
        self.assertEqual({r["state"]["currency"] for r in rows}, {"EUR"} if rows else set())
        return {r["key"]: {k: v for k, v in r["state"].items() if k != "currency"} for r in rows}


class why_test(case):
    def test_why_finds_an_event_delivered_with_a_transport_id_a_parked_one_and_an_effect_keyed_row(self):
        log = self.write("a.jsonl", [
            line("e1", "o1", 5, msgid="t-1"),                 # applied under a transport id
            line("e3", "o2", 7, seq=3, msgid="t-3"),          # parked: o2 waits for 1
            fill("f1", "acct", "X-1", 2, msgid="t-f1"),       # applied; positions keys effects by exec_id
            fill("f2", "acct", "X-1", 2, seq=5),              # the same execution, parked: its body is kept
        ])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        a = self.why(db, "--event", "/shop/e1", "--key", "o1")
        self.assertEqual(a["answer"], "applied")          # was never_seen
        self.assertEqual(a["message_id"], "t-1")
        self.assertEqual([r["holds_effect"] for r in a["rows"]], [True])

        p = self.why(db, "--event", "/shop/e3")
        self.assertEqual(p["answer"], "parked")           # was never_seen
        self.assertEqual(p["parked"], {"subject": "o2", "sequence": 3, "waiting_for": 1})
        self.assertIn("waits for sequence 1", p["detail"])
        # Its body is kept (parked), a version 1 order line: lifted as the apply path lifts it.
        k = self.why(db, "--event", "/shop/e3", "--key", "o2", "--projection", "order-totals")
        self.assertIs(k["rows"][0]["holds_effect"], False, k["rows"][0]["note"])
        self.assertIsNotNone(k["rows"][0]["effect_key"])

        f = self.why(db, "--event", "/venue/f2", "--key", "acct/ES", "--projection", "positions")
        self.assertEqual(f["answer"], "parked")
        self.assertEqual(f["rows"][0]["effect_key"], "X-1")
        self.assertIs(f["rows"][0]["holds_effect"], True)  # was "does not hold it" (looked for the event id)
        g = self.why(db, "--event", "/venue/f1", "--key", "acct/ES", "--projection", "positions")
        self.assertEqual(g["answer"], "applied")
        self.assertIsNone(g["rows"][0]["holds_effect"])    # the body is not kept: it says it cannot tell
        self.assertIn("cannot be computed", g["rows"][0]["note"])
        self.assertEqual(self.why(db, "--message", "t-1")["answer"], "applied")
        self.assertEqual(self.why(db, "--event", "/shop/nothing")["answer"], "never_seen")


class summary_test(case):
    def test_consume_summary_shows_this_runs_counts_beside_the_store_totals(self):
        first = [line("e%d" % i, "o%d" % (i % 3), i) for i in range(1, 11)]
        log = self.write("a.jsonl", first)
        db = self.path("db")
        one = run("consume", "--db", db, "--log", log)
        s1 = json.loads(one.stdout)
        self.assertEqual(s1["this_run"]["applied"], 10)
        self.assertEqual(s1["store_totals"]["applied"], 10)
        with open(log, "a") as f:
            f.write(line("e11", "o1", 11) + "\n" + line("e1", "o1", 1) + "\n")
        two = run("consume", "--db", db, "--log", log)
        s2 = json.loads(two.stdout)
        self.assertEqual(s2["records"], 2)
        self.assertEqual(s2["this_run"]["applied"], 1)
        self.assertEqual(s2["this_run"]["duplicate_message"], 1)
        self.assertEqual(s2["store_totals"]["applied"], 11)
        self.assertIn("this run: applied 1, duplicate message 1,", two.stderr)
        self.assertIn("store totals: applied 11, duplicate message 1,", two.stderr)
        three = run("consume", "--db", db, "--log", log)
        self.assertIn("this run: applied 0, duplicate message 0,", three.stderr)   # was "applied 11"
        r = json.loads(run("rebuild", "--db", self.path("rebuilt"), "--log", log).stdout)
        self.assertEqual(r["this_run"], r["store_totals"])


class verify_test(case):
    def test_verify_says_behind_after_a_partial_consume_and_matches_once_caught_up(self):
        lines = [line("e%d" % i, "o%d" % (i % 5), i, seq=i // 5 + 1, subject="o%d" % (i % 5)) for i in range(0, 50)]
        log = self.write("a.jsonl", lines[:30])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        with open(log, "a") as f:
            f.write("".join(l + "\n" for l in lines[30:]))
        p = run("verify", "--db", db, "--log", log, check=False)
        self.assertEqual(p.returncode, 3, p.stderr)        # was 1, "differs"
        out = json.loads(p.stdout)
        self.assertTrue(out["behind"])
        self.assertEqual(out["behind_by"], 20)
        self.assertIn("is behind its logs by 20 events", p.stderr)
        run("consume", "--db", db, "--log", log)
        self.assertEqual(run("verify", "--db", db, "--log", log).returncode, 0)

    def test_a_store_that_lags_and_differs_is_still_different(self):
        log = self.write("a.jsonl", [line("e%d" % i, "o1", i) for i in range(1, 21)])
        other = self.write("b.jsonl", [line("x%d" % i, "o1", 100 + i) for i in range(1, 5)])
        db = self.path("db")
        run("consume", "--db", db, "--log", other)
        run("consume", "--db", db, "--log", log, "--batch", "5")
        with open(log, "a") as f:
            f.write(line("e21", "o1", 21) + "\n")
        p = run("verify", "--db", db, "--log", log, check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("differs from its logs", p.stderr)

    def test_verify_during_a_consume_never_says_differs(self):
        lines = [line("e%d" % i, "o%d" % (i % 50), i) for i in range(20000)]
        log = self.write("a.jsonl", lines)
        db = self.path("db")
        consumer = subprocess.Popen([IDEM, "consume", "--db", db, "--log", log, "--batch", "50"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seen = set()
        try:
            while not os.path.exists(os.path.join(db, "data.mdb")):
                time.sleep(0.01)
            while consumer.poll() is None:
                p = run("verify", "--db", db, "--log", log, check=False)
                self.assertIn(p.returncode, (0, 3), p.stderr)
                seen.add(p.returncode)
        finally:
            consumer.wait(timeout=300)
        self.assertEqual(consumer.returncode, 0)
        self.assertIn(3, seen)   # it was caught behind at least once (was: "differs", exit 1)
        self.assertEqual(run("verify", "--db", db, "--log", log).returncode, 0)


class dead_letter_test(case):
    def test_a_2mb_line_keeps_a_bounded_prefix_with_its_size_and_digest(self):
        big = '{"specversion":"1.0","id":"big","source":"/shop","type":"order.line_added","subject":"o1",' \
              '"data":{"order_id":"o1","amount":1,"pad":"' + "x" * 2_000_000 + '"}}'
        log = self.write("a.jsonl", [line("e1", "o1", 5), big, "{not json"])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        letters = jsonl(run("deadletters", "--db", db).stdout)
        self.assertEqual([d["reason"] for d in letters], ["too_large", "invalid_json"])
        t = letters[0]
        self.assertTrue(t["truncated"])
        self.assertEqual(t["size"], len(big))
        self.assertEqual(t["kept"], 65536)
        self.assertEqual(t["body_prefix"], big[:65536])
        self.assertEqual(t["digest"], "fnv1a64:%016x" % fnv1a64(big.encode()))
        self.assertNotIn("envelope", t)
        self.assertNotIn("truncated", letters[1])
        self.assertEqual(letters[1]["body"], "{not json")
        self.assertLess(os.path.getsize(os.path.join(db, "data.mdb")), 1_000_000)   # was > 2 MB

    def test_deadletters_reason_filters_and_an_unknown_reason_is_a_usage_error(self):
        log = self.write("a.jsonl", ["{not json", line("e1", "o1", 5), '{"id":"x","source":"/s"}', "[]"])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        got = jsonl(run("deadletters", "--db", db, "--reason", "invalid_json").stdout)
        self.assertEqual([d["reason"] for d in got], ["invalid_json", "invalid_json"])
        self.assertEqual(jsonl(run("deadletters", "--db", db, "--reason", "missing_type").stdout)[0]["reason"],
                         "missing_type")
        self.assertEqual(run("deadletters", "--db", db, "--reason", "late_event").stdout, "")
        p = run("deadletters", "--db", db, "--reason", "bogus", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("option '--reason': 'bogus' is not a reason (invalid_json, missing_id", p.stderr)
        self.assertIn("released_dropped", p.stderr)


class option_test(case):
    def test_values_that_make_no_sense_are_usage_errors_naming_the_option(self):
        log = self.write("a.jsonl", [line("e1", "o1", 5)])
        db = self.path("db")
        built = self.path("built")
        run("consume", "--db", built, "--log", log)
        for args, option in [
            (["consume", "--db", db, "--log", log, "--batch", "0"], "--batch"),     # was accepted
            (["consume", "--db", db, "--log", log, "--batch", "-5"], "--batch"),
            (["rebuild", "--db", db, "--log", log, "--batch", "0"], "--batch"),
            (["verify", "--db", built, "--log", log, "--batch", "0"], "--batch"),
            (["prune", "--db", built, "--older-than", "1d", "--step", "0"], "--step"),
            (["gen", "--out", self.path("g.jsonl"), "--aggregates", "0"], "--aggregates"),
            (["redrive", "--db", built, "--position", "0"], "--position"),
        ]:
            p = run(*args, check=False)
            self.assertEqual(p.returncode, 1, (args, p.stderr))
            self.assertIn("option '%s'" % option, p.stderr.splitlines()[0], args)
        self.assertFalse(os.path.exists(db))


class parked_test(case):
    def gaps(self):
        return self.write("gaps.jsonl", [
            line("a1", "o1", 10, seq=1, time_s=1),
            line("a3", "o1", 30, seq=3, time_s=3, msgid="t-a3"),
            line("a4", "o1", 40, seq=4, time_s=4),
            line("a6", "o1", 60, seq=6, time_s=6),
            line("b2", "o2", 200, seq=2, time_s=7),
            line("b3", "o2", 300, seq=3, time_s=8),
            line("c1", "o3", 1, seq=1, time_s=9),
        ])

    def test_parked_lists_what_each_stream_waits_for(self):
        db = self.path("db")
        run("consume", "--db", db, "--log", self.gaps())
        streams = jsonl(run("parked", "--db", db).stdout)
        self.assertEqual([s["stream"] for s in streams], ["o1", "o2"])
        o1, o2 = streams
        self.assertEqual(o1["highest_applied"], 1)
        self.assertEqual(o1["waiting_for"], 2)
        self.assertEqual(o1["missing"], [{"from": 2, "to": 2}, {"from": 5, "to": 5}])
        self.assertEqual(o1["parked"], 3)
        self.assertEqual(o1["sequences"], [3, 4, 6])
        self.assertEqual(o1["oldest_parked"], "2026-12-02T10:00:03Z")
        self.assertEqual(o2["missing"], [{"from": 1, "to": 1}])
        self.assertEqual(o2["parked"], 2)

    def test_release_applies_past_the_gaps_or_drops_and_is_audited(self):
        db = self.path("db")
        run("consume", "--db", db, "--log", self.gaps())
        self.assertEqual(self.totals(db), {"o1": {"total": 10, "lines": 1}, "o3": {"total": 1, "lines": 1}})
        r = json.loads(run("release", "--db", db, "--stream", "o1", "--reason", "2 and 5 were lost").stdout)
        self.assertEqual(r["skipped"], [{"from": 2, "to": 2}, {"from": 5, "to": 5}])
        self.assertEqual(r["released"], [3, 4, 6])
        d = json.loads(run("release", "--db", db, "--stream", "o2", "--drop", "--reason", "o2 cancelled").stdout)
        self.assertEqual(d["dropped"], [2, 3])
        # The reference: o1 holds 1, 3, 4 and 6; o2 nothing; o3 untouched.
        expected = {"o1": {"total": 10 + 30 + 40 + 60, "lines": 4}, "o3": {"total": 1, "lines": 1}}
        self.assertEqual(self.totals(db), expected)
        self.assertEqual(run("parked", "--db", db).stdout, "")
        dropped = jsonl(run("deadletters", "--db", db, "--reason", "released_dropped").stdout)
        self.assertEqual([json.loads(json.dumps(x["envelope"]))["id"] for x in dropped], ["b2", "b3"])
        audit = jsonl(run("audit", "--db", db).stdout)
        self.assertEqual([(a["action"], a["stream"], a["reason"]) for a in audit],
                         [("release", "o1", "2 and 5 were lost"), ("release_drop", "o2", "o2 cancelled")])
        self.assertEqual(audit[0]["skipped"], [{"from": 2, "to": 2}, {"from": 5, "to": 5}])
        self.assertEqual(audit[0]["sequences"], [3, 4, 6])
        self.assertEqual(audit[1]["sequences"], [2, 3])
        # Later events of both streams apply in order again; the skipped one is a duplicate.
        later = self.write("later.jsonl", [line("a7", "o1", 70, seq=7), line("b4", "o2", 400, seq=4),
                                           line("a5", "o1", 50, seq=5)])
        s = json.loads(run("consume", "--db", db, "--log", later).stdout)
        self.assertEqual(s["this_run"]["applied"], 2)
        self.assertEqual(s["this_run"]["duplicate_event"], 1)
        p = run("release", "--db", db, "--stream", "o9", "--reason", "lost", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("stream 'o9' has nothing parked", p.stderr)

    def test_release_requires_a_reason(self):
        db = self.path("db")
        run("consume", "--db", db, "--log", self.gaps())
        before = self.totals(db)
        for extra in [[], ["--reason", ""]]:
            p = run("release", "--db", db, "--stream", "o1", *extra, check=False)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn("'--reason", p.stderr.splitlines()[0])
        self.assertEqual(self.totals(db), before)
        self.assertEqual(run("audit", "--db", db).stdout, "")
        self.assertEqual([s["stream"] for s in jsonl(run("parked", "--db", db).stdout)], ["o1", "o2"])

    def test_rebuild_refuses_to_undo_a_release_unless_told_and_verify_names_it(self):
        db = self.path("db")
        log = self.gaps()
        run("consume", "--db", db, "--log", log)
        run("release", "--db", db, "--stream", "o1", "--reason", "2 and 5 were lost")
        released = self.totals(db)
        p = run("verify", "--db", db, "--log", log, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("it holds 1 operator action, release, redrive or event-clock, whose effects no log holds", p.stderr)
        p = run("rebuild", "--db", db, "--log", log, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("holds 1 operator action (release of stream 'o1' in commit", p.stderr)
        self.assertIn("Rebuild with --discard-operator-actions", p.stderr)
        self.assertEqual(self.totals(db), released)  # untouched
        self.assertEqual(len(jsonl(run("audit", "--db", db).stdout)), 1)
        run("rebuild", "--db", db, "--log", log, "--discard-operator-actions")
        self.assertEqual(self.totals(db), {"o1": {"total": 10, "lines": 1}, "o3": {"total": 1, "lines": 1}})
        self.assertEqual(run("audit", "--db", db).stdout, "")
        run("rebuild", "--db", db, "--log", log)  # nothing to undo any more
        run("verify", "--db", db, "--log", log)

    def test_release_refuses_a_store_another_process_writes(self):
        db = self.path("db")
        run("consume", "--db", db, "--log", self.gaps())
        holder = subprocess.Popen([IDEM, "consume", "--db", db, "--log", self.gaps(), "--follow"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            p = run("release", "--db", db, "--stream", "o1", "--reason", "lost", check=False)
            self.assertEqual(p.returncode, 2)
            self.assertIn("is being written by pid %d" % holder.pid, p.stderr)
        finally:
            holder.terminate()
            holder.wait(timeout=60)


class event_clock_test(case):
    def test_a_jump_on_two_bad_clocks_is_set_back_and_the_late_events_redriven_equal_the_reference(self):
        def at(i):
            return "2026-12-02T10:%02d:%02dZ" % (i // 60, i % 60)

        def order_line(i, source="/shop", order=None, when=None, amount=None):
            return json.dumps({"specversion": "1.0", "id": "e-%d" % i, "source": source, "type": "order.line_added",
                               "subject": order or "o%d" % (i % 5), "time": when or at(i),
                               "data": {"order_id": order or "o%d" % (i % 5), "amount": amount or i + 1}})

        before = [order_line(i) for i in range(40)]
        # Two producers with the same bad clock: three events of two sources confirm the jump to
        # 2099 (the first two are future_event; the third moves the clock and is applied).
        bad = [order_line(100 + n, source, "o-bad", "2099-01-01T00:00:00Z", 7 + n)
               for n, source in enumerate(["/bad-a", "/bad-b", "/bad-a"])]
        after = [order_line(i) for i in range(40, 70)]  # current events, judged late against 2099
        later = [order_line(i) for i in range(70, 80)]  # after the clock is set back
        db = self.path("db")
        retention = ["--allowed-lateness", "1h"]
        run("consume", "--db", db, "--log", self.write("a.jsonl", before + bad + after), *retention)
        reasons = sorted(d["reason"] for d in jsonl(run("deadletters", "--db", db).stdout))
        self.assertEqual(reasons, ["future_event"] * 2 + ["late_event"] * 30)
        run("prune", "--db", db, *retention)  # the effect keys below the horizon of 2099 go
        shown = json.loads(run("event-clock", "--db", db).stdout)
        self.assertEqual(shown["event_time"], "2099-01-01T00:00:00Z")
        self.assertIsNone(shown["pending_jump"])
        floor = shown["contributor_floors"]["order-totals"]["floor"]
        self.assertEqual(floor, at(39), shown)  # pruned up to the last event before the jump
        # Only back, and with a reason for the audit.
        for args, why in ((["--set-back-to", "2099-06-01T00:00:00Z", "--reason", "x"], "it is only ever set back"),
                          (["--set-back-to", "yesterday", "--reason", "x"], "is not an RFC 3339 time"),
                          (["--set-back-to", at(39)], "needs --reason")):
            p = run("event-clock", "--db", db, *args, check=False)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertIn(why, p.stderr)
        p = run("event-clock", "--db", db, "--set-back-to", at(39), "--reason", "clocks of /bad-a and /bad-b")
        shown = json.loads(p.stdout)
        self.assertEqual((shown["event_time"], shown["set_back"]["from"], shown["set_back"]["to"]),
                         (at(39), "2099-01-01T00:00:00Z", at(39)))
        r = jsonl(run("redrive", "--db", db, "--reason", "late_event", "--note", "after the clock was set back").stdout)
        self.assertEqual([x["outcome"] for x in r], ["applied"] * 30)
        # Events after it are current again, not late.
        run("consume", "--db", db, "--log", self.write("b.jsonl", later), *retention)
        reasons = sorted(d["reason"] for d in jsonl(run("deadletters", "--db", db).stdout))
        self.assertEqual(reasons, ["future_event"] * 2)
        # The reference, computed here: every current event once, and the one 2099 event applied.
        expected = {}
        for i in range(80):
            row = expected.setdefault("o%d" % (i % 5), {"total": 0, "lines": 0})
            row["total"] += i + 1
            row["lines"] += 1
        expected["o-bad"] = {"total": 9, "lines": 1}
        self.assertEqual(self.totals(db), expected)
        audit = jsonl(run("audit", "--db", db).stdout)
        self.assertEqual([(a["action"], a["reason"]) for a in audit],
                         [("event_clock", "clocks of /bad-a and /bad-b"), ("redrive", "after the clock was set back")])
        self.assertIn("set the event clock back from 2099-01-01T00:00:00Z to " + at(39), audit[0]["summary"])


class redrive_test(case):
    def test_redrive_takes_filters_refuses_what_cannot_apply_and_keeps_what_fails_again(self):
        bad_side = fill("f9", "acct", "X-9", 1).replace('"side":"buy"', '"side":"hold"')
        big = line("big", "o1", 1).replace('"amount":1', '"amount":1,"pad":"' + "x" * 1_100_000 + '"')
        log = self.write("a.jsonl", [bad_side, big, line("e1", "o1", 5)])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        p = run("redrive", "--db", db, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("give --reason R, --event SOURCE/ID, --position N or --all", p.stderr)
        # The example handlers are fixed code: the bad fill fails again and stays, with a new position.
        r = jsonl(run("redrive", "--db", db, "--reason", "handler_failed", "--note", "retry").stdout)
        self.assertEqual([(x["was"], x["outcome"], x.get("reason")) for x in r],
                         [("handler_failed", "dead_lettered", "handler_failed")])
        letters = jsonl(run("deadletters", "--db", db).stdout)
        self.assertEqual(sorted(d["reason"] for d in letters), ["handler_failed", "too_large"])
        self.assertGreater(max(d["position"] for d in letters), 2)
        t = jsonl(run("redrive", "--db", db, "--all").stdout)
        self.assertEqual({x["was"]: x["outcome"] for x in t}, {"too_large": "refused", "handler_failed": "dead_lettered"})
        self.assertEqual(self.totals(db), {"o1": {"total": 5, "lines": 1}})
        audit = jsonl(run("audit", "--db", db).stdout)
        self.assertEqual([a["action"] for a in audit], ["redrive", "redrive"])
        self.assertEqual(audit[0]["reason"], "retry")

    def test_redrive_that_matches_nothing_fails_and_changes_nothing(self):
        bad_side = fill("f9", "acct", "X-9", 1).replace('"side":"buy"', '"side":"hold"')
        log = self.write("a.jsonl", [bad_side, line("e1", "o1", 5)])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        letters = jsonl(run("deadletters", "--db", db).stdout)
        for args, named in [(["--position", "999"], "--position 999"),
                            (["--event", "/p/none"], "--event /p/none"),
                            (["--reason", "late_event"], "--reason late_event")]:
            p = run("redrive", "--db", db, *args, check=False)
            self.assertEqual(p.returncode, 1, (args, p.stderr))
            self.assertIn("no dead letter of %s matches %s: nothing was redriven" % (db, named), p.stderr)
            self.assertEqual(p.stdout, "")
        self.assertEqual(jsonl(run("deadletters", "--db", db).stdout), letters)
        self.assertEqual(run("audit", "--db", db).stdout, "")


if __name__ == "__main__":
    IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[cli-operator-tools] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
