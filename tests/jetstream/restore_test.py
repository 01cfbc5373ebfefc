#!/usr/bin/env python3
"""Restoring `idem backup` copies of stores that a NATS JetStream stream feeds, or that `idem relay`
publishes from (docs/OPERATIONS.md, "Backups"; docs/JETSTREAM.md).

Durable consumer: backups are taken again and again while `consume --nats` writes store A, the
consumer killed with SIGKILL during copies; A is then finished, so the durable consumer's ack floor
lies past every backup's checkpoint. A backup resumed on the same durable consumer is refused,
naming the way out (the messages between its checkpoint and the floor would never come to it);
resumed under a consumer name of its own, it replays the stream and ends with the reference rows
(`idem rebuild` of the log, checked against gen's totals): nothing lost, nothing applied twice.
And a backup taken while messages of a killed run waited for their AckWait, resumed on the same
durable consumer while those messages still wait, whose floor is therefore below the backup's
checkpoint although the consumer acked messages above it: refused too (a backup that has
committed nothing since the copy, on a consumer that delivered past its checkpoint).

Relay: store A is fed from a log and relayed to stream CHANGES; a backup B of A, taken mid-way,
replaces A; B consumes the rest of the log. A backup has a store id of its own: relaying B to A's
stream is refused (nothing published there), and relayed to a stream of its own, a reader of that
stream ends with the reference rows.

    python3 restore_test.py path/to/idem [test names...]
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import unittest

import idem_cli
from consume_test import chunked_publisher, consume_case
from idem_cli import run, wait_for
from relay_test import relay_case


# The durable consumer's settings, the same on every run (a run that gives others is refused).
# A short AckWait: what a killed run held comes again soon.
DURABLE = ["--ack-wait", "2s", "--max-deliver", 50, "--fetch-batch", 64, "--max-batch", 25]


class durable_restore_test(consume_case):
    def checkpoint(self, db):
        """The store's checkpoint of nats:ORD/c1; 0 while it has none (or is still being created)."""
        p = run("stats", "--db", db, check=False)
        if p.returncode != 0:
            return 0
        points = json.loads(p.stdout).get("checkpoints") or []
        return next((c["position"] for c in points if c["source"] == "nats:ORD/c1"), 0)

    def wait_for_store(self, db):
        wait_for(lambda: os.path.exists(os.path.join(db, "data.mdb")), 60, f"{db} to be created")

    def test_backups_under_a_killed_consumer_are_refused_on_its_durable_and_replay_under_their_own(self):
        rng = random.Random(int(os.environ.get("IDEM_SEED", "38")))
        report, lines = self.gen("o.jsonl", 6000, aggregates=150)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        # The stream grows while the consumer runs, is killed and restarted.
        publisher = chunked_publisher(self, lines, 12, 0.25)
        publisher.start()
        wait_for(lambda: self.ns.stream_info("ORD"), 60, "the publisher to create the stream")
        a = self.path("A")

        backups = []
        for _ in range(3):
            p = self.start(a, "ORD", "c1", *DURABLE)
            self.wait_for_store(a)
            time.sleep(rng.uniform(0.3, 0.8))
            # One copy while it writes undisturbed, then one during which it is killed.
            backups.append(self.path(f"B{len(backups)}"))
            run("backup", "--db", a, "--out", backups[-1])
            backups.append(self.path(f"B{len(backups)}"))
            b = subprocess.Popen([idem_cli.IDEM, "backup", "--db", a, "--out", backups[-1]], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            time.sleep(rng.uniform(0, 0.02))
            p.send_signal(signal.SIGKILL)
            _, err = b.communicate(timeout=60)
            self.assertEqual(b.returncode, 0, err)
            p.wait(30)
            self.assertEqual(p.returncode, -signal.SIGKILL)
        publisher.join(120)
        self.assertFalse(publisher.is_alive())
        if publisher.error:
            raise publisher.error
        last = self.ns.stream_info("ORD")["last_seq"]
        # A finished: what the killed runs held comes again after its AckWait, and the floor is the end.
        self.consume(a, "ORD", "c1", *DURABLE)
        self.assertEqual(self.rows(a), ref)
        self.assert_drained()

        checkpoints = [self.checkpoint(b) for b in backups]
        print(f"backups at sequences {checkpoints} of {last}", file=sys.stderr)
        behind = [b for b, c in zip(backups, checkpoints) if c < last]
        self.assertTrue(any(0 < c < last for c in checkpoints), checkpoints)
        for i, b in enumerate(behind):
            before = self.rows(b)
            # On the durable consumer A used: its ack floor is past the backup's checkpoint, and the
            # messages in between would never be delivered again. Refused, nothing fetched.
            _, p = self.consume(b, "ORD", "c1", *DURABLE, check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn(f"consumer 'c1' of stream 'ORD' has acknowledged up to sequence {last}", p.stderr)
            self.assertIn("use another consumer name", p.stderr)
            self.assertEqual(self.rows(b), before)
            # The way out it names: a consumer of its own replays the stream; the inbox and effect
            # keys make what the backup holds already no-ops.
            r, _ = self.consume(b, "ORD", f"restore{i}", *DURABLE)
            self.assertEqual(self.rows(b), ref, b)
            self.assertGreater(r["outcomes"]["duplicate_message"], 0, r)  # what the backup held came again
            self.assert_drained("ORD", f"restore{i}")
            self.assertEqual(r["fetched"], last, r)
        # A backup as new as the end (if one is) resumes on the durable as it is, fetching nothing.
        for b, c in zip(backups, checkpoints):
            if c == last:
                r, _ = self.consume(b, "ORD", "c1", *DURABLE)
                self.assertEqual((r["fetched"], self.rows(b)), (0, ref))

    def test_a_backup_past_a_message_still_waiting_for_its_ack_wait_is_refused_on_the_durable(self):
        # After a kill, the messages the killed run held wait for their AckWait while the restarted
        # run goes on with newer ones, so a backup then has a checkpoint above messages it does not
        # hold, and the durable consumer's ack floor stays below them while it acknowledges
        # everything above. The floor check passes; what the other run acknowledged above the
        # backup's checkpoint would never come again. A backup that has committed nothing since it
        # was copied is refused on a consumer that delivered past its checkpoint.
        report, lines = self.gen("o.jsonl", 4000, aggregates=100)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        half = len(lines) // 2
        self.publish(self.write_lines("first.jsonl", lines[:half]))
        first_last = self.ns.stream_info("ORD")["last_seq"]
        a, b = self.path("A"), self.path("B")
        # MaxAckPending above what a run can hold: the next run is not held back by the killed one's.
        settings = ["--ack-wait", "8s", "--max-ack-pending", 10000, "--max-batch", 10, "--fetch-batch", 64]

        # A run killed while it holds messages: they wait 8 s to be delivered again.
        p = self.start(a, "ORD", "c1", *settings)
        wait_for(lambda: self.checkpoint(a) > 300, 60, "the first run to commit")
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        killed_at = time.monotonic()
        held = self.consumer_info()
        self.assertGreater(held["num_ack_pending"], 0, held)
        # The producer goes on; the next run takes the new messages at once, past the held ones. A
        # backup then, more acks above it, and a clean stop, all before the held ones come again.
        self.publish(self.write_lines("second.jsonl", lines[half:]))
        last = self.ns.stream_info("ORD")["last_seq"]
        p = self.start(a, "ORD", "c1", *settings)
        wait_for(lambda: self.checkpoint(a) > first_last + 200, 60, "the second run to pass the held messages")
        run("backup", "--db", a, "--out", b)
        at = self.checkpoint(b)
        wait_for(lambda: self.checkpoint(a) > at + 300, 60, "the second run to go on")
        rc, _, err = self.finish(p)
        self.assertEqual(rc, 0, err)
        state = self.consumer_info()
        self.assertLess(time.monotonic() - killed_at, 8, "the held messages came again before the restore")
        self.assertLess(state["ack_floor_stream_seq"], at, state)  # the floor is held below the backup
        print(f"backup at {at}; the durable's floor {state['ack_floor_stream_seq']}, {state['num_ack_pending']} "
              f"held, A acknowledged up to {self.checkpoint(a)} of {last}", file=sys.stderr)

        # The backup restored on the durable consumer: refused, nothing applied; also after operator
        # actions made commits of their own in the copy (a pause and a resume while nothing ran).
        run("pause", "--db", b, "--reason", "restoring")
        run("resume", "--db", b)
        before = self.rows(b)
        _, p = self.consume(b, "ORD", "c1", *settings, check=False, timeout=120)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("is a backup of store", p.stderr)
        self.assertIn(f"past its checkpoint {at}", p.stderr)
        self.assertIn("use another consumer name", p.stderr)
        self.assertEqual(self.rows(b), before)
        # The way out it names: a consumer of its own replays the stream; the reference rows.
        self.consume(b, "ORD", "restored", *settings, timeout=120)
        self.assertEqual(self.rows(b), ref)


class relay_restore_test(relay_case):
    """A store A fed from a log in commits of 20 lines, relayed; a backup B of it replaces it, and
    goes on with commits of 1000 lines; then relayed again. B has a store id of its own (a backup
    does), and its commits after the copied one are not A's although they are numbered like them:
    relaying it to A's stream is refused, whether the stream holds A's changes past the backup or
    not, and nothing is published there; relayed to a stream of its own, a reader of that stream
    ends with B's rows, which are the reference's."""

    def scenario(self, relay_before_backup):
        report = json.loads(run("gen", "--out", self.path("all.jsonl"), "--domain", "orders", "--events", 4000,
                                "--aggregates", 120, "--seed", 9).stdout)
        lines = self.lines("all.jsonl")
        ref = {k: json.loads(s) for k, _, s in self.reference(self.path("all.jsonl"), report["totals"])}
        log, a, b = self.path("up.jsonl"), self.path("A"), self.path("B")
        cuts = [len(lines) * 3 // 10, len(lines) * 6 // 10, len(lines)]

        written = [0]

        def append(upto):
            with open(log, "ab") as f:
                f.write(b"".join(l + b"\n" for l in lines[written[0]:upto]))
            written[0] = upto

        append(cuts[0])
        run("consume", "--db", a, "--log", log, "--batch", 20)
        relayed = None
        if relay_before_backup:
            relayed = json.loads(run(*self.relay_args(a)).stdout)
        backup = json.loads(run("backup", "--db", a, "--out", b).stdout)
        append(cuts[1])
        run("consume", "--db", a, "--log", log, "--batch", 20)
        if not relay_before_backup:
            relayed = json.loads(run(*self.relay_args(a)).stdout)  # the stream holds A's feed past the backup
        published = self.ns.stream_info("CHANGES")["last_seq"]

        # The restore: the relay stopped, A moved aside and B put in its place.
        shutil.move(a, self.path("A.old"))
        shutil.move(b, a)
        append(cuts[2])
        run("consume", "--db", a, "--log", log, "--batch", 1000)
        self.assertEqual(self.states(a, "order-totals"), ref)  # the restore lost and doubled nothing

        # Relayed to A's stream: refused, naming what the store is a copy of; nothing published.
        p = run(*self.relay_args(a), check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(f"is a backup of store {relayed['store_id']} taken at commit {backup['commit']}", p.stderr)
        self.assertIn("relay it to a stream or prefix of its own", p.stderr)
        self.assertEqual(self.ns.stream_info("CHANGES")["last_seq"], published)

        # The way out it names: a stream of its own, which a reader follows to B's rows.
        own = json.loads(run("relay", "--db", a, "--nats", self.ns.url, "--stream", "RESTORED", "--subject",
                             "restored", "--projection", "order-totals").stdout)
        self.assertNotEqual(own["store_id"], relayed["store_id"])
        self.consume(self.path("D"), "RESTORED", "down", "--gaps", "apply")
        self.assertEqual(self.states(self.path("D"), "order-totals-copy"), ref)

    def test_a_restored_store_ahead_of_the_stream_is_refused_there_and_exact_on_its_own(self):
        self.scenario(relay_before_backup=True)

    def test_a_restored_store_behind_the_stream_is_refused_there_and_exact_on_its_own(self):
        self.scenario(relay_before_backup=False)


if __name__ == "__main__":
    idem_cli.main("restore")
