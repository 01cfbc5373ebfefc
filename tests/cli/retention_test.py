#!/usr/bin/env python3
"""Retention through the `idem` command line: consume and rebuild with a bounded inbox and an
event-time horizon, `idem prune` (also killed mid-prune), and `idem why` for each outcome.

usage: retention_test.py PATH/TO/idem
"""

import json
import os
import shutil
import subprocess
import sys
import time
import unittest

import cli_test
from cli_test import cli_case, run


def event(eid, order, amount, time, seq=None, subject=None, msgid=None, typ="order.line_added"):
    e = {"specversion": "1.0", "id": eid, "source": "/shop", "type": typ, "subject": subject or order,
         "time": time, "data": {"order_id": order, "amount": amount}}
    if seq is not None:
        e["sequence"] = seq
    if msgid is not None:
        e["msgid"] = msgid
    return json.dumps(e)



def rows(answer):
    """The rows of a `why --key` answer without their effect key and note."""
    return [{k: r[k] for k in ("projection", "key", "holds_effect")} for r in answer["rows"]]

class retention_cli_test(cli_case):
    def write_log(self, name, lines):
        with open(self.path(name), "w") as f:
            f.write("\n".join(lines) + "\n")
        return self.path(name)

    def why(self, db, *args):
        return json.loads(run("why", "--db", db, *args).stdout)

    def test_why_answers_for_each_outcome(self):
        log = self.write_log("events.jsonl", [
            event("a", "o1", 5, "2026-12-02T09:00:00Z"),
            event("a", "o1", 5, "2026-12-02T09:00:00Z"),                      # redelivered: duplicate message
            event("a", "o1", 5, "2026-12-02T09:00:00Z", msgid="m-2"),         # re-sent under a new message id
            event("p", "o2", 1, "2026-12-02T09:01:00Z", seq=2, subject="s"),  # waits for sequence 1 of "s"
            '{"specversion":"1.0","id":"bad","source":"/shop","type":"order.line_added","subject":"o3",'
            '"time":"2026-12-02T09:02:00Z","data":{"order_id":"o3","amount":"lots"}}',
            event("g", "o4", 1, "2026-12-02T14:00:00Z"),
            event("late", "o4", 1, "2026-12-02T09:03:00Z"),                   # 5 hours behind, horizon 1h
            event("a", "o1", 500, "2026-12-02T09:00:00Z"),                    # same id, other content
        ])
        db = self.path("db")
        run("rebuild", "--db", db, "--log", log, "--allowed-lateness", "1h", "--batch", "1")

        a = self.why(db, "--event", "/shop/a", "--key", "o1")
        self.assertEqual(a["answer"], "applied")
        self.assertEqual(a["commit"], 1)
        self.assertIn("id_conflict", a["detail"])
        # Its effect key was pruned with the horizon (14:00 - 1h); without a horizon the row holds it.
        self.assertEqual(rows(a), [{"projection": "order-totals", "key": "o1", "holds_effect": False}])
        self.assertIn("were pruned", a["detail"])
        run("rebuild", "--db", self.path("kept"), "--log", log)
        kept = self.why(self.path("kept"), "--event", "/shop/a", "--key", "o1")
        self.assertEqual(rows(kept), [{"projection": "order-totals", "key": "o1", "holds_effect": True}])
        self.assertEqual(self.why(db, "--message", "m-2")["answer"], "duplicate_event")
        p = self.why(db, "--event", "/shop/p")
        self.assertEqual(p["answer"], "parked")
        self.assertIn("waits for sequence 1", p["detail"])
        bad = self.why(db, "--event", "/shop/bad")
        self.assertEqual(bad["answer"], "dead_lettered")
        self.assertIn("decode_failed", bad["detail"])
        late = self.why(db, "--event", "/shop/late")
        self.assertEqual(late["answer"], "late")
        self.assertIn("late_event", late["detail"])
        self.assertEqual(self.why(db, "--event", "/shop/nothing")["answer"], "never_seen")
        self.assertEqual(json.loads(run("get", "--db", db, "--projection", "order-totals", "--key", "o1").stdout)
                         ["state"]["total"], 5)

        stats = self.stats(db)
        self.assertEqual(stats["retention"]["late_events"], 1)
        self.assertEqual(stats["retention"]["id_conflicts"], 1)
        self.assertEqual(stats["retention"]["event_time"], "2026-12-02T14:00:00Z")
        reasons = [d["reason"] for d in cli_test.jsonl(run("deadletters", "--db", db).stdout)]
        self.assertEqual(sorted(reasons), ["decode_failed", "id_conflict", "late_event"])

        p = run("why", "--db", db, check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("--event SOURCE/ID or --message ID", p.stderr)

    def test_a_bounded_inbox_gives_the_same_rows_and_prune_shrinks_it(self):
        for domain, projection in (("trading", "positions"), ("orders", "order-totals")):
            with self.subTest(domain=domain):
                name = domain + ".jsonl"
                self.gen(name, domain=domain, events=6000, aggregates=200, redeliver=0.2)
                ref, bounded = self.path(domain + "-ref"), self.path(domain + "-bounded")
                run("rebuild", "--db", ref, "--log", self.path(name))
                run("consume", "--db", bounded, "--log", self.path(name), "--batch", 300,
                    "--durability", "none", "--inbox-retention", "300ms")
                self.assertEqual(self.dump(bounded, projection), self.dump(ref, projection))
                full, small = self.stats(ref), self.stats(bounded)
                self.assertEqual(small["outcomes"]["applied"], full["outcomes"]["applied"])
                self.assertGreater(small["retention"]["pruned_ids"], 0)
                self.assertLess(small["inbox_size"], full["inbox_size"] / 2)
                # On demand: everything older than 100ms of event time.
                out = json.loads(run("prune", "--db", ref, "--older-than", "100ms", "--step", 500).stdout)
                self.assertGreater(out["ids"], 0)
                self.assertGreater(out["steps"], 1)
                self.assertEqual(self.stats(ref)["inbox_size"], full["inbox_size"] - out["ids"])
                self.assertEqual(self.dump(ref, projection), self.dump(bounded, projection))

    def test_killed_during_a_prune_and_resumed_the_state_is_exact(self):
        self.gen("fills.jsonl", events=5000, aggregates=200, redeliver=0.2)
        ref = self.path("ref")
        # A rebuild is deterministic under retention: event time decides, not when pruning ran.
        run("rebuild", "--db", ref, "--log", self.path("fills.jsonl"), "--inbox-retention", "200ms",
            "--allowed-lateness", "1h")
        reference = self.dump(ref, "positions")
        kills = 0
        for n in range(1, 9):
            db = self.path(f"db{n}")
            args = [cli_test.IDEM, "consume", "--db", db, "--log", self.path("fills.jsonl"), "--batch", "250",
                    "--inbox-retention", "200ms", "--allowed-lateness", "1h"]
            env = dict(os.environ, IDEM_CRASH_AT=f"during_prune:{n}")
            p = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
            if p.returncode == -9:
                kills += 1
            else:
                self.assertEqual(p.returncode, 0, p.stderr)
            run("consume", "--db", db, "--log", self.path("fills.jsonl"), "--batch", 250,
                "--inbox-retention", "200ms", "--allowed-lateness", "1h")
            self.assertEqual(self.dump(db, "positions"), reference, f"killed at prune {n}")
        self.assertGreaterEqual(kills, 5)


def totals_of(domain, dump_text):
    """A domain's totals summed from its dumped rows, as `idem gen` prints them."""
    rows = cli_test.jsonl(dump_text)
    if domain == "trading":
        return {"positions": len(rows), "fills": sum(r["version"] for r in rows),
                "qty": sum(r["state"]["qty"] for r in rows), "cost": sum(r["state"]["cost"] for r in rows),
                "realized_pnl": sum(r["state"]["realized_pnl"] for r in rows)}
    return {"orders": len(rows), "lines": sum(r["state"]["lines"] for r in rows),
            "total": sum(r["state"]["total"] for r in rows)}


def gen_totals(result):
    t = result["totals"]
    return json.loads(t) if isinstance(t, str) else t


class identity_and_time_cli_test(cli_case):
    """Transport ids scoped to their log, an event-time horizon an outlier cannot move, and
    lateness outcomes that do not depend on batch sizes."""

    def write_log(self, name, lines):
        with open(self.path(name), "w") as f:
            f.write("\n".join(lines) + "\n")
        return self.path(name)

    def reasons(self, db):
        return [d["reason"] for d in cli_test.jsonl(run("deadletters", "--db", db).stdout)]

    def test_two_logs_numbering_their_messages_alike_keep_every_event(self):
        # Both domains' logs carry msgids; the inbox keys each log's by its file name.
        trading = self.gen("trading.jsonl", domain="trading", events=6000, aggregates=300)
        orders = self.gen("orders.jsonl", domain="orders", events=6000, aggregates=300)
        for how in ("consume", "rebuild"):
            with self.subTest(how=how):
                db = self.path("both-" + how)
                run(how, "--db", db, "--log", self.path("trading.jsonl"), "--log", self.path("orders.jsonl"),
                    "--durability" if how == "consume" else "--batch", "none" if how == "consume" else 10000)
                self.assertEqual(totals_of("trading", self.dump(db, "positions")), gen_totals(trading))
                self.assertEqual(totals_of("orders", self.dump(db, "order-totals")), gen_totals(orders))
                stats = self.stats(db)
                self.assertEqual(stats["parked"], 0)
                self.assertEqual(stats["retention"]["id_conflicts"], 0)
                self.assertNotIn("id_conflict", self.reasons(db))
        # Two logs of one domain, other seeds and orders: msgids "orders-m-1, ..." in both.
        a = self.gen("orders-a.jsonl", domain="orders", events=5000, aggregates=200, seed=7)
        b = self.gen("orders-b.jsonl", domain="orders", events=5000, aggregates=200, seed=8, **{"key-prefix": "b-"})
        for transport in (None, "one-broker"):
            with self.subTest(transport=transport):
                db = self.path("orders-%s" % transport)
                extra = ["--transport", transport] if transport else []
                run("consume", "--db", db, "--log", self.path("orders-a.jsonl"), "--log", self.path("orders-b.jsonl"),
                    "--durability", "none", *extra)
                got = totals_of("orders", self.dump(db, "order-totals"))
                ta, tb = gen_totals(a), gen_totals(b)
                self.assertEqual(got, {k: ta[k] + tb[k] for k in ta})
                stats = self.stats(db)
                self.assertEqual(stats["parked"], 0)
                self.assertEqual(stats["retention"]["id_conflicts"], 0)
                self.assertNotIn("id_conflict", self.reasons(db))
                collisions = cli_test.jsonl(run("deadletters", "--db", db, "--collisions").stdout)
                self.assertEqual(len(collisions), stats["retention"]["transport_collisions"])
                if transport:
                    # One transport carrying both: its reused ids are reported, each judged as a new message.
                    self.assertGreater(len(collisions), 100)
                    self.assertEqual(collisions[0]["reason"], "transport_collision")
                    self.assertEqual(collisions[0]["transport"], "one-broker")
                    self.assertTrue(collisions[0]["message_id"].startswith("orders-m-"))
                    self.assertIn("first used in commit", collisions[0]["detail"])
                    src, eid = collisions[0]["envelope"]["source"], collisions[0]["envelope"]["id"]
                    self.assertEqual(self.why(db, "--event", src + "/" + eid)["answer"], "transport_collision")
                    m = self.why(db, "--message", collisions[0]["message_id"], "--transport", "one-broker")
                    self.assertIn("transport collisions", m["detail"])
                else:
                    self.assertEqual(collisions, [])

    def why(self, db, *args):
        return json.loads(run("why", "--db", db, *args).stdout)

    def test_a_consume_after_a_rebuild_continues_its_inbox_across_rotations(self):
        r = self.gen("orders.jsonl", domain="orders", events=3000, aggregates=100, malformed=0)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("orders.jsonl"))
        before = self.stats(db)
        # The same log rotated: another path, the same origin, so the same transport.
        rotated = self.path("orders.jsonl.1")
        with open(self.path("orders.jsonl"), "rb") as f, open(rotated, "wb") as g:
            g.write(f.read())
        run("consume", "--db", db, "--log", rotated, "--durability", "none")
        after = self.stats(db)
        self.assertEqual(after["outcomes"]["duplicate_message"] - before["outcomes"]["duplicate_message"], r["lines"])
        for k in ("applied", "duplicate_event", "dead_lettered", "parked"):
            self.assertEqual(after["outcomes"][k], before["outcomes"][k], k)
        self.assertEqual(totals_of("orders", self.dump(db, "order-totals")), gen_totals(r))

    def outlier_logs(self):
        lines, times = [], []
        for i in range(1500):
            t = 1764662400 + i * 5  # 2025-12-02T08:00:00Z on, every 5 s
            times.append(t)
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
            lines.append(event("l-%d" % i, "o%d" % (i % 11), i + 1, stamp, msgid="m-%d" % i))
            if i % 4 == 0 and i >= 60:  # re-sent under a new message id 5 minutes later
                lines.append(event("l-%d" % (i - 60), "o%d" % ((i - 60) % 11), i - 59,
                                   time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t - 300)), msgid="r-%d" % i))
        plain = self.write_log("plain.jsonl", lines)
        lines.insert(700, event("from-2099", "o-future", 1000, "2099-01-01T00:00:00Z", msgid="m-2099"))
        return plain, self.write_log("outlier.jsonl", lines)

    def test_one_event_stamped_2099_does_not_move_the_horizon(self):
        plain, outlier = self.outlier_logs()
        ref = self.path("plain")
        run("rebuild", "--db", ref, "--log", plain, "--allowed-lateness", "1h", "--transport", "src")
        expected = self.dump(ref, "order-totals")
        self.assertEqual(self.stats(ref)["retention"]["late_events"], 0)
        runs = [("rebuild", None), ("consume", None)]
        if shutil.which("faketime"):
            runs += [("rebuild", "2031-06-01 00:00:00"), ("rebuild", "2024-01-01 00:00:00")]
        else:
            print("faketime not installed: the wall-clock variants are skipped (identity_test.cpp covers them)")
        for how, fake in runs:
            with self.subTest(how=how, clock=fake):
                db = self.path("%s-%s" % (how, fake))
                args = [cli_test.IDEM, how, "--db", db, "--log", outlier, "--allowed-lateness", "1h",
                        "--transport", "src", "--batch", "100"]
                if fake:
                    args = ["faketime", fake] + args
                # libfaketime is preloaded ahead of a sanitizer build's runtime; ASan only warns of it.
                env = dict(os.environ, ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
                p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(self.dump(db, "order-totals"), expected)
                stats = self.stats(db)
                self.assertEqual(stats["retention"]["late_events"], 0)
                self.assertEqual(stats["retention"]["future_events"], 1)
                self.assertEqual(self.reasons(db), ["future_event"])
                self.assertEqual(stats["retention"]["event_time"], self.stats(ref)["retention"]["event_time"])

    def test_max_future_skew_0_switches_the_check_off_with_or_without_a_unit(self):
        _, outlier = self.outlier_logs()
        for value in ("0", "0s"):
            with self.subTest(value=value):
                db = self.path("skew-" + value)
                run("rebuild", "--db", db, "--log", outlier, "--allowed-lateness", "1h", "--transport", "src",
                    "--max-future-skew", value)
                self.assertEqual(self.stats(db)["retention"]["future_events"], 0)
                self.assertIn('"key":"o-future"', self.dump(db, "order-totals"))
        p = subprocess.run([cli_test.IDEM, "rebuild", "--db", self.path("skew-bad"), "--log", outlier,
                            "--max-future-skew", "00"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 1)
        self.assertIn("option '--max-future-skew': '00' is not a duration", p.stderr)

    def test_lateness_outcomes_do_not_depend_on_batch_size(self):
        # Drop copies re-send fills under a new event id, stamped when re-sent (up to ~4 s later).
        r = self.gen("fills.jsonl", domain="trading", events=3000, aggregates=100, reissue=0.2, republish=0.05)
        log = self.path("fills.jsonl")
        for lateness in ("0s", "2s", "10s"):
            with self.subTest(lateness=lateness):
                results = []
                for how, batch in (("rebuild", 10000), ("consume", 1), ("consume", 20), ("consume", 1000)):
                    db = self.path("%s-%s-%d" % (lateness, how, batch))
                    args = [how, "--db", db, "--log", log, "--allowed-lateness", lateness, "--batch", batch]
                    if how == "consume":
                        args += ["--durability", "none"]
                    run(*args)
                    s = self.stats(db)
                    results.append((self.dump(db, "positions"), s["outcomes"], s["retention"]["late_events"]))
                for other in results[1:]:
                    self.assertEqual(other[0], results[0][0])
                    self.assertEqual(other[1], results[0][1])
                    self.assertEqual(other[2], results[0][2])
                if lateness == "10s":  # longer than any re-send: each fill counts once
                    self.assertEqual(totals_of("trading", results[0][0]), gen_totals(r))
        p = run("rebuild", "--db", self.path("refused"), "--log", log, "--allowed-lateness", "1s",
                "--resend-within", "5s", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("re-send delay of 5s", p.stderr)


if __name__ == "__main__":
    cli_test.IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[cli] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
