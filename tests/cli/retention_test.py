#!/usr/bin/env python3
"""Retention through the `idem` command line: consume and rebuild with a bounded inbox and an
event-time horizon, `idem prune` (also killed mid-prune), and `idem why` for each outcome.

usage: retention_test.py PATH/TO/idem
"""

import json
import os
import subprocess
import sys
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


if __name__ == "__main__":
    cli_test.IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[cli] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
