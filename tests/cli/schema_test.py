#!/usr/bin/env python3
"""End-to-end tests of schema evolution with the real `idem` binary: an orders log written by
`idem gen` (version 1 order lines, no dataschema) and the same log with a share of its lines
rewritten as version 2 (`amount: {minor, currency}`, dataschema ...:2) give identical rows in
rebuild, consume and verify, equal to gen's totals; the same event at both versions under
different message ids applies once; a line that no upcaster or handler can read is a dead
letter naming its version.

usage: schema_test.py PATH/TO/idem
"""

import json
import os
import random
import sys
import unittest

import cli_test
from cli_test import cli_case, read_bytes, run

V2 = "urn:idem:example:order.line_added:2"


def as_v2(line, new_msgid=False):
    """A version 1 order line rewritten as version 2 (the same event: same source and id; with
    new_msgid, a transport message id of its own, as a republication gets)."""
    try:
        e = json.loads(line)
    except ValueError:
        return line  # a malformed line of the log: left as it is
    if not isinstance(e, dict) or e.get("type") != "order.line_added" or not isinstance(e.get("data"), dict) \
            or not isinstance(e["data"].get("amount"), int):
        return line  # a defect of the log (malformed, another type): left as it is
    e["dataschema"] = V2
    if new_msgid:
        e["msgid"] = "v2-" + str(e.get("msgid", e.get("id")))
    e["data"]["amount"] = {"minor": e["data"]["amount"], "currency": "EUR"}
    return json.dumps(e, separators=(",", ":")).encode() + b"\n"


class schema_case(cli_case):
    def orders(self, events=3000):
        totals = self.gen("v1.jsonl", domain="orders", events=events, aggregates=40)["totals"]
        return read_bytes(self.path("v1.jsonl")).splitlines(keepends=True), totals

    def write(self, name, lines):
        with open(self.path(name), "wb") as f:
            f.writelines(lines)
        return self.path(name)

    def rows(self, db):
        return cli_test.jsonl(self.dump(db, "order-totals"))

    def assert_totals(self, rows, totals):
        self.assertEqual({r["state"]["currency"] for r in rows}, {"EUR"})
        self.assertEqual((len(rows), sum(r["state"]["lines"] for r in rows), sum(r["state"]["total"] for r in rows)),
                         (totals["orders"], totals["lines"], totals["total"]))


class mixed_versions_test(schema_case):
    def test_a_log_mixing_versions_gives_the_rows_of_the_log_at_one_version(self):
        lines, totals = self.orders()
        rng = random.Random(11)
        mixed = self.write("mixed.jsonl", [as_v2(l) if rng.random() < 0.5 else l for l in lines])
        self.assertGreater(sum(b'"dataschema"' in l for l in read_bytes(mixed).splitlines()), len(lines) // 3)
        v2 = self.write("v2.jsonl", [as_v2(l) for l in lines])
        run("rebuild", "--db", self.path("r1"), "--log", self.path("v1.jsonl"))
        reference = self.rows(self.path("r1"))
        self.assert_totals(reference, totals)
        for name, log in (("mixed", mixed), ("v2", v2)):
            with self.subTest(name):
                run("rebuild", "--db", self.path(f"r-{name}"), "--log", log)
                self.assertEqual(self.rows(self.path(f"r-{name}")), reference)
                run("consume", "--db", self.path(f"c-{name}"), "--log", log)
                self.assertEqual(self.rows(self.path(f"c-{name}")), reference)
                # verify rebuilds aside and compares: a consume of the mixed log against itself.
                v = run("verify", "--db", self.path(f"c-{name}"), "--log", log, check=False)
                self.assertEqual(v.returncode, 0, v.stdout + v.stderr)

    def test_the_same_events_at_both_versions_under_new_message_ids_apply_once(self):
        lines, totals = self.orders(1500)
        both = self.write("both.jsonl", lines + [as_v2(l, new_msgid=True) for l in lines])  # every event twice: v1, then v2
        db = self.path("db")
        run("consume", "--db", db, "--log", both)
        self.assert_totals(self.rows(db), totals)

    def test_a_version_the_code_does_not_know_is_a_dead_letter_naming_it(self):
        e = {"specversion": "1.0", "id": "x1", "source": "/shop", "type": "order.line_added",
             "subject": "o1", "dataschema": "urn:idem:example:order.line_added:3",
             "data": {"order_id": "o1", "amount": {"minor": 5, "currency": "EUR"}}}
        ok = dict(e, id="x2", dataschema=V2)
        log = self.write("v3.jsonl", [json.dumps(e).encode() + b"\n", json.dumps(ok).encode() + b"\n"])
        db = self.path("db")
        run("consume", "--db", db, "--log", log)
        letters = cli_test.jsonl(run("deadletters", "--db", db).stdout)
        self.assertEqual([d["reason"] for d in letters], ["upcast_failed"])
        self.assertIn("'order.line_added' version 3 is newer than this code, which knows up to version 2",
                      letters[0]["detail"])
        self.assertEqual([r["state"]["total"] for r in self.rows(db)], [5])  # processing went on


if __name__ == "__main__":
    cli_test.IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[cli-schema] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
