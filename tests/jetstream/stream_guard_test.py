#!/usr/bin/env python3
"""End-to-end tests of what guards a running `idem consume --nats` against a stream or a
consumer that changes under it, on one real nats-server shared by the module: a purge while
it runs, a second store on the same durable consumer, a `--until-caught-up` that cannot get
there, the summary after a stop on an error or a changed consumer. Rows are compared with `idem rebuild` of the bodies read back from the stream
through the fixture, never with idem's own counters.

usage: stream_guard_test.py PATH/TO/idem
"""

import json
import os
import re
import signal
import time

import consume_test
import idem_cli
import nats_server
from idem_cli import run, wait_for

SERVER = None


def setUpModule():
    global SERVER
    SERVER = nats_server.nats_server()


def tearDownModule():
    if SERVER is not None:
        SERVER.close()


class guard_case(consume_test.consume_case):
    """consume_case on the module's server; each test in a directory of its own."""

    def setUp(self):
        self.ns = SERVER
        self.procs = []
        self.addCleanup(self._reap)
        self.dir = os.path.join(self.ns.dir, self._testMethodName)
        os.makedirs(self.dir, exist_ok=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def bodies(self, stream, first, last):
        """The bodies the stream holds from first to last, in sequence order, with their sequences."""
        return [(m["seq"], m["data"]) for m in self.ns.messages(stream, range(first, last + 1)) if m]

    def result_of(self, p):
        """The JSON summary a finished `start`ed process printed (also on exit 2)."""
        with open(p.out_path) as f:
            return json.loads(f.read())


class purge_test(guard_case):
    def test_a_purge_while_consuming_stops_the_run_at_the_hole_and_a_restart_refuses(self):
        _, lines = self.gen("o.jsonl", 900, aggregates=20)
        a, b, c = lines[:300], lines[300:600], lines[600:]
        self.publish(self.write_lines("a.jsonl", a), "PUR", "pur.>")
        end_a = self.ns.stream_info("PUR")["last_seq"]
        # A small fetch batch: once the process is stopped, a fetch still waiting on the server
        # takes at most 16 of the next messages; the rest are purged before anyone got them.
        p = self.start(self.path("db"), "PUR", "c1", "--fetch-batch", 16)
        wait_for(lambda: (self.consumer_info("PUR", "c1") or {}).get("ack_floor_stream_seq") == end_a, 60,
                 "the first part to be acked")
        os.kill(p.pid, signal.SIGSTOP)
        self.publish(self.write_lines("b.jsonl", b), "PUR", "pur.>")
        end_b = self.ns.stream_info("PUR")["last_seq"]
        stored_ab = self.bodies("PUR", 1, end_b)
        self.assertGreater(end_b - end_a, 100)
        self.ns.purge_stream("PUR")
        self.publish(self.write_lines("c.jsonl", c), "PUR", "pur.>")
        info = self.ns.stream_info("PUR")
        stored_c = self.bodies("PUR", info["first_seq"], info["last_seq"])
        os.kill(p.pid, signal.SIGCONT)
        p.wait(30)
        code, _, err = self.finish(p)
        self.assertEqual(code, 2, err)
        self.assertIn("stream 'PUR' changed while consumer 'c1' consumed it", err)
        self.assertIn(f"starts at sequence {end_b + 1}", err)
        summary = self.result_of(p)  # the summary comes with the error
        self.assertIn("changed while", summary["error"])
        # Nothing past the hole is committed: the rows are the stream's bodies up to the checkpoint.
        checkpoint = self.stored_checkpoint(self.path("db"), "PUR", "c1")
        self.assertGreaterEqual(checkpoint, end_a)
        self.assertLessEqual(checkpoint, end_a + 16)
        applied = [body for seq, body in stored_ab if seq <= checkpoint]
        self.assertEqual(self.rows(self.path("db")), self.reference(self.write_lines("applied.jsonl", applied)))
        # A restart sees the hole too.
        _, again = self.consume(self.path("db"), "PUR", "c1", check=False)
        self.assertEqual(again.returncode, 2, again.stderr)
        self.assertIn("--accept-stream-reset", again.stderr)
        # Accepted: the stream as it is now follows.
        self.consume(self.path("db"), "PUR", "c1", "--accept-stream-reset")
        seen = applied + [body for _, body in stored_c]
        self.assertEqual(self.rows(self.path("db")), self.reference(self.write_lines("seen.jsonl", seen)))


class partitioned_purge_test(guard_case):
    def test_a_purge_under_a_partitioned_run_stops_it_with_exit_2_naming_the_partition_and_the_summary(self):
        # The stream captures 'gp.>'; messages go straight to gp.<k>.<key> (the partition a
        # server's mapping would give them does not matter here).
        parts = 2
        _, lines = self.gen("o.jsonl", 900, aggregates=20)
        envelopes = [(l, idem_cli.envelope_of(l)) for l in lines]
        lines = [(l, e) for l, e in envelopes if e and re.fullmatch(r"[\w-]+", str(e.get("subject")))]
        subject_of = {}

        def publish(chunk):
            messages = []
            for l, e in chunk:
                k = sum(e["subject"].encode()) % parts
                messages.append((f"gp.{k}.{e['subject']}", l, None))
            first = self.ns.stream_info("PGP")["last_seq"] + 1
            self.ns.publish_many(messages)
            for i, (subject, l, _) in enumerate(messages):
                subject_of[first + i] = (int(subject.split(".")[1]), l)

        a, b, c = lines[:300], lines[300:600], lines[600:]
        self.ns.create_stream("PGP", ["gp.>"])
        publish(a)
        end_a = self.ns.stream_info("PGP")["last_seq"]
        last_of = {k: max(q for q, (kk, _) in subject_of.items() if kk == k) for k in range(parts)}
        db = self.path("db")
        p = self.start(db, "PGP", "grp", "--partitions", parts, "--instance", "i1", "--fetch-batch", 16)

        def checkpoint(k):
            """Partition k's checkpoint as `idem stats` of its store shows it (None before it has one)."""
            stats = run("stats", "--db", os.path.join(db, f"p{k}"), check=False)
            if stats.returncode != 0:  # not made yet, or its projections not declared yet
                return None
            source = {c["source"]: c["position"] for c in json.loads(stats.stdout).get("checkpoints") or []}
            return source.get(f"nats:PGP/grp.p{k}")

        wait_for(lambda: all(checkpoint(k) == last_of[k] for k in range(parts)), 60, "the first part to be applied",
                 interval=0.2)
        os.kill(p.pid, signal.SIGSTOP)
        publish(b)
        end_b = self.ns.stream_info("PGP")["last_seq"]
        self.ns.purge_stream("PGP")
        publish(c)
        os.kill(p.pid, signal.SIGCONT)
        p.wait(60)
        code, _, err = self.finish(p)
        self.assertEqual(code, 2, err)
        self.assertRegex(err, r"partition \d of consumer 'grp': stream 'PGP' changed while consumer 'grp-p\d-r\d+' "
                              r"consumed it")
        self.assertIn(f"starts at sequence {end_b + 1}", err)
        summary = self.result_of(p)  # the summary comes with the error
        self.assertRegex(summary["error"], r"^partition \d of consumer 'grp': stream 'PGP' changed while")
        self.assertEqual(summary["owned_at_stop"], list(range(parts)))  # the copies stay, listed
        self.assertGreaterEqual(summary["fetched"], end_a)
        # Nothing past the hole is committed: each partition's rows are its bodies up to its checkpoint.
        applied = []
        for k in range(parts):
            at = checkpoint(k)
            self.assertGreaterEqual(at, last_of[k])
            self.assertLessEqual(at, end_b)
            applied += [l for q, (kk, l) in sorted(subject_of.items()) if kk == k and q <= at]
        union = sorted(self.rows(os.path.join(db, "p0")) + self.rows(os.path.join(db, "p1")))
        self.assertEqual(union, self.reference(self.write_lines("applied.jsonl", applied)))
        self.assertGreater(end_b, end_a)


class claim_test(guard_case):
    def test_two_stores_started_together_on_one_durable_one_runs_the_other_is_refused_naming_it(self):
        report, _ = self.gen("o.jsonl", 1000, aggregates=30)
        self.publish(self.path("o.jsonl"), "CLM", "clm.>")
        last = self.ns.stream_info("CLM")["last_seq"]
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        stores = [self.path("db-a"), self.path("db-b")]
        procs = [self.start(db, "CLM", "c1", "--max-ack-pending", 20, "--fetch-batch", 10) for db in stores]
        # The refused one exits at once; the other goes on until stopped.
        wait_for(lambda: any(p.poll() is not None for p in procs), 60, "one of the two to be refused", interval=0.1)
        loser = 0 if procs[0].poll() is not None else 1
        winner = 1 - loser
        code, _, err = self.finish(procs[loser])
        self.assertEqual(code, 2, err)
        self.assertIn("consumer 'c1' of stream 'CLM' is claimed by the store", err)
        self.assertIn(os.path.realpath(stores[winner]), err)
        self.assertIn("expires", err)
        wait_for(lambda: (self.consumer_info("CLM", "c1") or {}).get("ack_floor_stream_seq") == last, 120,
                 "the stream to be acked")
        self.assertIsNone(procs[winner].poll(), "the claim holder runs on")
        code, _, err = self.finish(procs[winner])
        self.assertEqual(code, 0, err)
        self.assertEqual(self.rows(stores[winner]), ref)
        # Its claim went with its stop: the same store resumes at once.
        r, _ = self.consume(stores[winner], "CLM", "c1")
        self.assertEqual(r["fetched"], 0)


class caught_up_test(guard_case):
    def test_until_caught_up_says_what_it_waits_for_and_stops_with_exit_2_at_its_bound(self):
        envelope = {"specversion": "1.0", "source": "t", "type": "order.placed", "subject": "o-1"}
        self.ns.create_stream("BND", ["bnd.>"])
        self.consume(self.path("db"), "BND", "c1", "--ack-wait", "20s")  # creates the consumer
        self.ns.publish_many([("bnd.o", json.dumps({**envelope, "id": f"e{i}"}).encode(), None) for i in range(3)])
        # Another client takes the first message and never acks it: the ack floor stays below
        # the stream's last sequence until its AckWait runs out.
        with self.ns.connect() as c:
            request = b'{"batch":1}'
            c.sock.sendall(b"PUB $JS.API.CONSUMER.MSG.NEXT.BND.c1 %s.pull %d\r\n%s\r\n" %
                           (c.inbox.encode(), len(request), request))
            subject, _, body = c._reply()  # the message comes under its own subject
            self.assertEqual((subject, json.loads(body)["id"]), ("bnd.o", "e0"))
        started = time.monotonic()
        r, p = self.consume(self.path("db"), "BND", "c1", "--caught-up-wait", "4s", check=False, timeout=60)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertLess(time.monotonic() - started, 15)
        self.assertIn("consume: waiting for consumer 'c1' of stream 'BND' to have acknowledged up to sequence 3",
                      p.stderr)
        self.assertIn("1 message waits for an ack", p.stderr)
        self.assertIn("--until-caught-up waited 4s", p.stderr)
        self.assertIn("waited 4s", json.loads(p.stdout)["error"])


class summary_test(guard_case):
    def test_the_summary_reports_the_redelivery_bound_of_the_consumer_as_it_is_at_the_end(self):
        self.publish(self.write_lines("a.jsonl", self.gen("o.jsonl", 100, aggregates=10)[1]), "SUM", "sum.>")
        last = self.ns.stream_info("SUM")["last_seq"]
        p = self.start(self.path("db"), "SUM", "c1", "--ack-wait", "20s")
        wait_for(lambda: (self.consumer_info("SUM", "c1") or {}).get("ack_floor_stream_seq") == last, 60,
                 "everything to be acked")
        config = {**self.consumer_info("SUM", "c1")["config"], "ack_wait": 25 * 10**9}
        with self.ns.connect() as c:
            c.api("$JS.API.CONSUMER.DURABLE.CREATE.SUM.c1", {"stream_name": "SUM", "config": config})
        self.assertEqual(self.consumer_info("SUM", "c1")["config"]["ack_wait"], 25 * 10**9)
        code, r, err = self.finish(p)
        self.assertEqual(code, 0, err)
        self.assertIn("AckWait 25s x MaxDeliver 5", r["redelivery_bound"])


if __name__ == "__main__":
    idem_cli.main("jetstream-guard")
