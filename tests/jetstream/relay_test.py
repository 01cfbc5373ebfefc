"""`idem relay` end to end: a store's change feed chained across processes into another store.

The chain: a log appended chunk by chunk; `idem consume --log --follow` writes store A from it;
`idem relay --follow` publishes A's order-totals changes to stream CHANGES; `idem consume --nats
--gaps apply` writes store B's order-totals-copy from them. Each of the three is killed with
SIGKILL at random moments, three times, and restarted while the log keeps growing. Once all is
caught up, B's rows must equal the reference (a rebuild of the whole log, checked against gen's
own totals), and the stream must hold each change of A's feed exactly once: the relay resumed
from the stream, and what it sent again was dropped by the Duplicates window. The keys carry
'.', ' ', '*' and '>' (gen's key prefix), so the subjects' escaping is checked on the way.

    python3 relay_test.py path/to/idem [test names...]
"""

import json
import os
import random
import signal
import subprocess
import threading
import time
import unittest
import urllib.parse

import idem_cli
from consume_test import consume_case
from idem_cli import jsonl, run, wait_for

PREFIX = "shop.1 *>"  # every order key starts with it: each byte needs escaping in a subject token
MAX_PENDING = 64      # the relay's window: what a restart may send again is bounded by twice that


def token(text):
    """A subject token as the relay makes it (jetstream_relay.hpp), computed here independently."""
    if text == "":
        return "events"
    if text == "events":
        return "%65vents"
    out = []
    for b in text.encode():
        out.append(f"%{b:02X}" if b < 0x21 or b > 0x7E or chr(b) in ".*>%" else chr(b))
    return "".join(out)


def untoken(tok):
    return urllib.parse.unquote(tok)


class appender(threading.Thread):
    """Appends a log's lines to a file chunk by chunk, pausing between chunks."""

    def __init__(self, path, lines, chunks, pause):
        super().__init__(daemon=True)
        self.path, self.pause, self.error = path, pause, None
        size = max(1, (len(lines) + chunks - 1) // chunks)
        self.chunks = [lines[at:at + size] for at in range(0, len(lines), size)]

    def run(self):
        try:
            for c in self.chunks:
                with open(self.path, "ab") as f:
                    f.write(b"".join(l + b"\n" for l in c))
                time.sleep(self.pause)
        except BaseException as e:  # reported by the test after join()
            self.error = e


class relay_case(consume_case):
    def spawn(self, name, args):
        n = len(self.procs)
        out_path, err_path = self.path(f"{name}-{n}.out"), self.path(f"{name}-{n}.err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            p = subprocess.Popen([idem_cli.IDEM, *map(str, args)], stdout=out, stderr=err)
        p.out_path, p.err_path = out_path, err_path
        self.procs.append(p)
        return p

    def relay_args(self, db, *extra, max_pending=MAX_PENDING):
        return ["relay", "--db", db, "--nats", self.ns.url, "--stream", "CHANGES", "--subject", "changes",
                "--projection", "order-totals", "--max-pending", max_pending, *extra]

    def states(self, db, projection):
        return {r["key"]: r["state"] for r in jsonl(run("dump", "--db", db, "--projection", projection).stdout)}

    def feed_changes(self, db):
        """The row changes of A's feed for order-totals, read a step at a time (--since)."""
        out, since = [], []
        while True:
            step = jsonl(run("changes", "--db", db, "--limit", 5000, *since).stdout)
            if not step:
                return [c for c in out if c["kind"] == "row" and c["projection"] == "order-totals"]
            out += step
            since = ["--since", step[-1]["position"]]

    def stream_messages(self):
        last = self.ns.stream_info("CHANGES")["last_seq"]
        out = []
        for at in range(1, last + 1, 500):
            out += [m for m in self.ns.messages("CHANGES", range(at, min(last, at + 499) + 1)) if m]
        return out


class chain_test(relay_case):
    def test_kill_9_of_writer_relay_and_downstream_loses_and_doubles_nothing(self):
        rng = random.Random(int(os.environ.get("IDEM_SEED", "11")))
        report = json.loads(run("gen", "--out", self.path("all.jsonl"), "--domain", "orders", "--events", 12000,
                                "--aggregates", 400, "--seed", 5, "--key-prefix", PREFIX).stdout)
        lines = self.lines("all.jsonl")
        reference = self.reference(self.path("all.jsonl"), report["totals"])
        ref_states = {k: json.loads(s) for k, _, s in reference}

        log, a, b = self.path("up.jsonl"), self.path("A"), self.path("B")
        open(log, "wb").close()
        feeder = appender(log, lines, chunks=24, pause=0.4)
        feeder.start()
        upstream = lambda: self.spawn("up", ["consume", "--db", a, "--log", log, "--follow", "--batch", 300])
        relay = lambda: self.spawn("relay", self.relay_args(a, "--follow", "--poll-ms", 20))
        downstream = lambda: self.spawn("down", self.consume_args(b, "CHANGES", "down", "--gaps", "apply",
                                                                  "--max-batch", 200, "--ack-wait", "2s"))
        procs = {"up": upstream()}
        wait_for(lambda: run("changes", "--db", a, "--limit", 1, check=False).returncode == 0, 60, "store A")
        procs["relay"] = relay()
        wait_for(lambda: self.ns.stream_info("CHANGES"), 60, "the relay to create the stream")
        procs["down"] = downstream()
        starts = {"up": upstream, "relay": relay, "down": downstream}

        kills = [name for name in ("up", "relay", "down") for _ in range(3)]
        rng.shuffle(kills)
        for name in kills:
            time.sleep(rng.uniform(0.1, 0.9))
            p = procs[name]
            if p.poll() is not None:
                with open(p.err_path, errors="replace") as f:
                    self.fail(f"{name} exited {p.returncode} before its kill: {f.read()}")
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            time.sleep(rng.uniform(0, 0.3))
            procs[name] = starts[name]()
        feeder.join(120)
        self.assertIsNone(feeder.error)

        # Caught up, in chain order: the writer's run to the end of the log, the relay to the end of
        # the feed (SIGTERM while following: exit 0 with its summary), the downstream to the stream's end.
        rc, _, err = self.finish(procs["up"])
        self.assertEqual(rc, 0, err)
        run("consume", "--db", a, "--log", log)
        time.sleep(0.5)  # a few polls of the following relay, then a clean stop
        rc, summary, err = self.finish(procs["relay"])
        self.assertEqual(rc, 0, err)
        self.assertIn("relay: ", err)
        last = json.loads(run(*self.relay_args(a, "--until-caught-up")).stdout)
        self.assertNotEqual(last["resumed_after"], "")
        self.finish(procs["down"])
        self.consume(b, "CHANGES", "down", "--gaps", "apply")

        upstream_states = self.states(a, "order-totals")
        self.assertEqual(upstream_states, ref_states, "store A against the reference")
        downstream_states = self.states(b, "order-totals-copy")
        self.assertEqual(len(downstream_states), len(ref_states))
        self.assertEqual(downstream_states, ref_states, "store B against the reference")

        # The stream holds each change of the feed once: nothing lost, nothing stored twice.
        changes = self.feed_changes(a)
        messages = self.stream_messages()
        self.assertEqual(len(messages), self.ns.stream_info("CHANGES")["messages"])
        store_id = last["store_id"]
        stored = [json.loads(m["data"])["id"] for m in messages]
        self.assertEqual(len(stored), len(set(stored)), "a change stored twice")
        self.assertEqual(sorted(stored), sorted(f"{store_id}/order-totals/{c['key']}/{c['version']}" for c in changes),
                         "the stream's messages against the feed's changes")

        # A restart sent again at most what its look-back covers, not the whole feed.
        self.assertLessEqual(last["published"], 2 * MAX_PENDING, last)
        self.assertLess(last["published"], len(changes), last)

        # Each message: its subject the escaped key, an envelope a downstream idem reads.
        for m in messages[:200]:
            e = json.loads(m["data"])
            self.assertEqual(m["subject"], "changes.order-totals." + token(e["subject"]))
            self.assertEqual(untoken(m["subject"].split(".", 2)[2]), e["subject"])
            self.assertTrue(e["subject"].startswith(PREFIX))
            self.assertEqual(e["type"], "idem.change.order-totals")
            self.assertEqual(e["source"], f"idem://{store_id}/order-totals")
            self.assertEqual(e["id"], f"{store_id}/order-totals/{e['subject']}/{e['sequence']}")
            self.assertEqual(m["headers"]["Idem-Position"], e["idemposition"])


class refusal_test(relay_case):
    def test_another_stores_stream_and_bad_options_are_refused_naming_them(self):
        run("gen", "--out", self.path("a.jsonl"), "--domain", "orders", "--events", 300, "--aggregates", 20)
        for db in ("A", "C"):
            run("consume", "--db", self.path(db), "--log", self.path("a.jsonl"))
        first = json.loads(run(*self.relay_args(self.path("A"))).stdout)
        self.assertEqual(first["changes"], first["stored"])
        self.assertGreater(first["stored"], 0)
        p = run(*self.relay_args(self.path("C")), check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("holds the changes of store " + first["store_id"], p.stderr)
        p = run(*self.relay_args(self.path("A"))[:-4], "--projection", "nope", check=False)  # no --projection, --max-pending
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("no projection named 'nope'", p.stderr)
        p = run("relay", "--db", self.path("A"), "--nats", self.ns.url, "--stream", "X", "--subject", "a.*",
                check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("wildcard", p.stderr)
        again = json.loads(run(*self.relay_args(self.path("A"))).stdout)
        self.assertEqual((again["stored"], again["duplicates"]), (0, first["stored"] - 1), again)


class broker_kill_test(relay_case):
    def test_a_broker_killed_mid_relay_is_ridden_out_and_the_stream_holds_each_change_once(self):
        run("gen", "--out", self.path("a.jsonl"), "--domain", "orders", "--events", 20000, "--aggregates", 3000)
        a = self.path("A")
        run("consume", "--db", a, "--log", self.path("a.jsonl"), "--batch", 200)
        relay = self.spawn("relay", self.relay_args(a, "--follow", max_pending=16))  # slow: many windows
        wait_for(lambda: (self.ns.stream_info("CHANGES") or {}).get("messages", 0) > 500, 60, "the relay to start")
        self.ns.kill()
        time.sleep(1.0)
        self.ns.restart()
        changes = self.feed_changes(a)
        before = self.ns.stream_info("CHANGES")["messages"]
        self.assertLess(before, len(changes), "the broker was killed after the relay had finished")
        wait_for(lambda: self.ns.stream_info("CHANGES")["messages"] >= len(changes), 120, "the relay to catch up")
        rc, summary, err = self.finish(relay)
        self.assertEqual(rc, 0, err)
        stored = [json.loads(m["data"])["id"] for m in self.stream_messages()]
        self.assertEqual(len(stored), len(set(stored)), "a change stored twice")
        self.assertEqual(sorted(stored), sorted(f"{summary['store_id']}/order-totals/{c['key']}/{c['version']}"
                                                for c in changes))


class reset_test(relay_case):
    def test_a_rebuild_upstream_is_published_as_one_reset_event(self):
        run("gen", "--out", self.path("a.jsonl"), "--domain", "orders", "--events", 300, "--aggregates", 20)
        a = self.path("A")
        run("consume", "--db", a, "--log", self.path("a.jsonl"))
        first = json.loads(run(*self.relay_args(a)).stdout)
        run("rebuild", "--db", a, "--log", self.path("a.jsonl"))
        after = json.loads(run(*self.relay_args(a)).stdout)
        self.assertEqual((after["resets"], after["store_id"]), (1, first["store_id"]), after)
        messages = self.stream_messages()
        resets = [json.loads(m["data"]) for m in messages if m["subject"] == "changes.order-totals"]
        self.assertEqual(len(resets), 1, [m["subject"] for m in messages[-3:]])
        r = resets[0]
        self.assertEqual(r["type"], "idem.reset.order-totals")
        self.assertNotIn("sequence", r)
        self.assertEqual(r["data"], {"projection": "order-totals", "position": r["idemposition"]})
        self.assertEqual(r["id"], f"{first['store_id']}/order-totals/reset/{r['idemposition']}")


if __name__ == "__main__":
    idem_cli.main("relay")
