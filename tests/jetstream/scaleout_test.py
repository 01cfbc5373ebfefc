#!/usr/bin/env python3
"""Scale-out tests of `idem consume --partitions` on a real 3-node JetStream cluster
(tests/jetstream/nats_cluster.py): a stream with 3 replicas, partitioned by the servers' subject
mapping, consumed by several idem instances that hold partitions through leases. Instances are
killed with SIGKILL at random moments and restarted, started and stopped to force rebalances,
paused past their lease with SIGSTOP; a broker node is killed and restarted. At the end the union
of the instances' dumps must equal the reference (`idem rebuild` of the same log, itself checked
against the totals of `idem gen`'s independent model), with no key in two dumps. Also: a group
stopped in the middle of a rebalance, --until-caught-up in partitioned mode, and
`idem publish --subject-template` with keys that are not one NATS token. Every instance's stderr
(also of one killed by the test) and every other idem run is checked for a crash or a sanitizer's
report: the sanitizer builds run these tests too.

usage: scaleout_test.py PATH/TO/idem [Class[.test]]
Set IDEM_SOAK=1 for longer runs (more events, more kills); the default is the CI size.
IDEM_SEED=N changes the moments of the kills; IDEM_KEEP_DIR=1 keeps the cluster's directory.
"""

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest

import idem_cli
import nats_cluster
import nats_server
from idem_cli import crash_in, crashed, jsonl, run

SOAK = os.environ.get("IDEM_SOAK") == "1"
SEED = int(os.environ.get("IDEM_SEED", "5"))
PARTITIONS = 4
MAPPING = {"orders.*": "orders.{{partition(%d,1)}}.{{wildcard(1)}}" % PARTITIONS}


def fnv1a32(data):
    """FNV-1a 32 bit, written here from its definition (not from idem or nats-server)."""
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def token_of(key):
    """The subject token `idem publish` makes of an aggregate key (percent-encoding)."""
    if key == "":
        return "events"
    if key == "events":
        return "%65vents"
    out = []
    for b in key.encode():
        if b < 0x21 or b > 0x7E or chr(b) in ".*>%":
            out.append("%%%02X" % b)
        else:
            out.append(chr(b))
    return "".join(out)


def stacks(pid):
    """The threads' stacks of a hung process (gdb, when installed), for the failure message."""
    try:
        return subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"], capture_output=True,
                              timeout=120).stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no stacks: {e})"


def wait_for(condition, timeout, what):
    # A condition here runs an idem command or reads a cluster: polled less often than idem_cli's default.
    return idem_cli.wait_for(condition, timeout, what, interval=0.2)


class scaleout_case(unittest.TestCase):
    def setUp(self):
        self.cluster = nats_cluster.nats_cluster(mappings=MAPPING)
        self.addCleanup(self.cluster.close)
        self.err_paths = []
        self.addCleanup(self._check_stderr)  # after _reap, before the cluster's directory goes
        self.procs = {}
        self.addCleanup(self._reap)
        self.runs = 0

    def _check_stderr(self):
        """Every instance's stderr, also of those killed or never stopped by the test: a crash or a
        sanitizer's report in any of them fails the test."""
        for path in self.err_paths:
            with open(path, errors="replace") as f:
                text = f.read()
            if crash_in(text):
                raise crashed(f"{os.path.basename(path)}:\n{text[-6000:]}")

    def _reap(self):
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                except OSError:
                    pass
                p.kill()
                p.wait()

    def path(self, name):
        return os.path.join(self.cluster.dir, name)

    def gen(self, name, events, aggregates):
        report = json.loads(run("gen", "--out", self.path(name), "--domain", "orders", "--events", events,
                                "--aggregates", aggregates, "--seed", 11).stdout)
        return report

    def rows_of(self, db):
        return sorted((r["key"], r["version"], json.dumps(r["state"], sort_keys=True))
                      for r in jsonl(run("dump", "--db", db, "--projection", "order-totals").stdout))

    def reference(self, log, totals):
        db = self.path("ref")
        run("rebuild", "--db", db, "--log", log)
        rows = self.rows_of(db)
        states = [json.loads(s) for _, _, s in rows]
        self.assertEqual((len(rows), sum(s["lines"] for s in states), sum(s["total"] for s in states)),
                         (totals["orders"], totals["lines"], totals["total"]), "rebuild against gen's totals")
        return rows

    def publish(self, log):
        return json.loads(run("publish", "--skip-too-large",
                              "--nats", self.cluster.urls, "--stream", "ORD", "--subject", "orders.>",
                              "--log", log, "--replicas", 3).stdout)

    def start(self, name, *extra, ttl="2s", env=None):
        """Starts instance name (its own --db and ack log); a restart reuses both."""
        self.runs += 1
        out = open(self.path(f"{name}-{self.runs}.out"), "wb")
        err = open(self.path(f"{name}-{self.runs}.err"), "wb")
        p = subprocess.Popen([idem_cli.IDEM, "consume", "--db", self.path(name), "--nats", self.cluster.urls,
                              "--stream", "ORD", "--consumer", "grp", "--partitions", str(PARTITIONS),
                              "--instance", name, "--lease-ttl", ttl, "--ack-log", self.path(name + ".acks"),
                              *map(str, extra)],
                             stdout=out, stderr=err, env=None if env is None else {**os.environ, **env})
        out.close()
        err.close()
        p.err_path = self.path(f"{name}-{self.runs}.err")
        self.err_paths.append(p.err_path)
        self.procs[name] = p
        return p

    def stop(self, name, sig=signal.SIGTERM, signalled=False):
        p = self.procs[name]
        if p.poll() is None and not signalled:  # a second SIGTERM kills (the way out of a hang)
            p.send_signal(sig)
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"instance {name} did not stop within 120 s; its threads:\n{stacks(p.pid)}")
        if sig == signal.SIGTERM:
            with open(p.err_path, errors="replace") as f:
                self.assertEqual(p.returncode, 0, f"instance {name}: {f.read()}")

    def owners(self):
        """`idem owners`; {} before the first instance created the group's bucket, or while a
        just-created bucket's replicas do not answer yet (a timeout naming the bucket)."""
        p = run("owners", "--nats", self.cluster.urls, "--consumer", "grp", check=False)
        if p.returncode != 0:
            self.assertIn("bucket 'idem-leases-grp'", p.stderr)
            return {}
        return json.loads(p.stdout)

    def union(self, names):
        """The union of the instances' dumps; fails if a key is in two of them."""
        seen = {}
        rows = []
        for n in names:
            for r in self.rows_of(self.path(n)):
                self.assertNotIn(r[0], seen, f"key {r[0]} in the dumps of {seen.get(r[0])} and {n}")
                seen[r[0]] = n
                rows.append(r)
        return sorted(rows)

    def settled(self, names, ref):
        """Every partition owned by one of names, none holding more than its share, and the union
        of their dumps equal to ref: twice, a lease tick apart (a rebalance may be under way)."""
        share = -(-PARTITIONS // len(names))
        for _ in range(2):
            o = self.owners()
            holders = [v["instance"] for v in o.values() if v["instance"]]
            if len(holders) != PARTITIONS or any(holders.count(n) > share for n in names) or \
                    not set(holders) <= set(names) or self.union_or_none(names) != ref:
                return False
            time.sleep(0.6)
        return True

    def stop_all(self, names):
        """SIGTERM to every instance at once (so none takes over what another gives up on stop)."""
        for n in names:
            self.procs[n].send_signal(signal.SIGTERM)
        for n in names:
            self.stop(n, signalled=True)

    def union_or_none(self, names):
        """The union while the group runs: None while a handover is under way (or a dump fails)."""
        try:
            return self.union(names)
        except AssertionError:
            return None

    def assert_partitions_follow_the_mapping(self, names):
        """Every row sits in the partition FNV-1a(token) mod N says, computed here."""
        for n in names:
            with open(self.path(os.path.join(n, "owned"))) as f:
                owned = [l.strip() for l in f if l.strip()]
            for k in owned:
                for key, _, _ in self.rows_of(self.path(os.path.join(n, "p" + k))):
                    self.assertEqual(fnv1a32(token_of(key).encode()) % PARTITIONS, int(k), f"{key} in p{k} of {n}")

    def acks(self, name):
        try:
            with open(self.path(name + ".acks")) as f:
                return [json.loads(l) for l in f if l.strip()]
        except FileNotFoundError:
            return []


# CI size by default; IDEM_SOAK=1 runs more events and kills, IDEM_SEED=N other kill moments.
class partitioned_test(scaleout_case):
    def test_kills_rebalances_and_a_broker_kill_end_with_the_union_equal_to_the_reference(self):
        events = 20000 if SOAK else 4000
        report = self.gen("o.jsonl", events, 80)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        # The log in three parts, published while the group runs.
        with open(self.path("o.jsonl"), "rb") as f:
            lines = [l for l in f.read().split(b"\n") if l.strip()]
        parts = [lines[i::3] for i in range(3)]
        for i, part in enumerate(parts):
            with open(self.path(f"part{i}.jsonl"), "wb") as f:
                f.write(b"".join(l + b"\n" for l in part))
        self.publish(self.path("part0.jsonl"))
        info = self.cluster.stream_info("ORD")
        self.assertEqual(info["config"]["num_replicas"], 3)
        self.assertEqual(info["config"]["subjects"], ["orders.>"])

        names = ["a", "b", "c"]
        for n in names:
            self.start(n)
        wait_for(lambda: len([v for v in self.owners().values() if v["instance"]]) == PARTITIONS, 60,
                 "every partition owned")
        rng = random.Random(SEED)
        rounds = 12 if SOAK else 4
        for r in range(rounds):
            victim = rng.choice(names)
            time.sleep(rng.uniform(0.2, 1.5))
            self.stop(victim, signal.SIGKILL)
            if r == 1:
                self.publish(self.path("part1.jsonl"))
            if r == 2:
                node = rng.randrange(3)
                self.cluster.kill(node)
                time.sleep(1.0)
                # While the stream elects a new leader a publish can fail; the producer publishes
                # again (the same ids: the stream's window and idem's inbox make it harmless).
                for attempt in range(10):
                    p = run("publish", "--skip-too-large",
                            "--nats", self.cluster.urls, "--stream", "ORD", "--subject", "orders.>",
                            "--log", self.path("part2.jsonl"), check=False)
                    if p.returncode == 0:
                        break
                    time.sleep(1.0)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.cluster.restart(node)
            if r == 3:
                # A fourth instance joins and leaves again: the partitions move twice.
                self.start("d")
                time.sleep(3)
                self.stop("d")
            time.sleep(rng.uniform(0.5, 3.0))
            self.start(victim)
        # Everything owned, and the union of the dumps reaches the reference. d stopped holding
        # partitions that others took since: a stopped instance shows what it held at its stop.
        all_names = names
        wait_for(lambda: self.settled(all_names, ref), 180, "the group to settle with the reference rows")
        self.stop_all(names)
        self.assertEqual(self.union(all_names), ref)
        self.assert_partitions_follow_the_mapping(all_names)
        # Every partition's lease was given up on stop.
        self.assertEqual({v["instance"] for v in self.owners().values()}, {""})
        # The figures of the run, from the instances' ack logs (d's included).
        lines = [x for n in names + ["d"] for x in self.acks(n)]
        taken = sum(1 for x in lines if x.get("lease") == "taken")
        ended = collections.Counter(x["why"] for x in lines if x.get("lease") == "ended")
        acks = collections.Counter(x["outcome"] for x in lines if "seq" in x)
        print(f"kills and rebalances (seed {SEED}): {rounds} instances killed with SIGKILL and restarted, 1 broker "
              f"node killed and restarted, 1 instance joined and left; {taken} leases taken, "
              f"{sum(ended.values())} ended ({', '.join(f'{w} {c}' for w, c in sorted(ended.items()))}); "
              f"{sum(acks.values())} acks/naks ({', '.join(f'{o} {c}' for o, c in sorted(acks.items()))}) for "
              f"{self.cluster.stream_info('ORD')['state']['messages']} messages stored; "
              f"{len(ref)} rows equal to the reference, 0 lost, 0 doubled", file=sys.stderr, flush=True)

    def test_a_stale_owner_paused_past_its_lease_commits_nothing_after_the_takeover(self):
        report = self.gen("o.jsonl", 3000, 40)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        with open(self.path("o.jsonl"), "rb") as f:
            lines = [l for l in f.read().split(b"\n") if l.strip()]
        with open(self.path("first.jsonl"), "wb") as f:
            f.write(b"".join(l + b"\n" for l in lines[:1500]))
        with open(self.path("second.jsonl"), "wb") as f:
            f.write(b"".join(l + b"\n" for l in lines[1500:]))
        self.publish(self.path("first.jsonl"))
        self.start("a")
        self.start("b")
        def split():
            o = self.owners()
            mine = [k for k, v in o.items() if v["instance"] == "a"]
            return len(o) == PARTITIONS and 0 < len(mine) < PARTITIONS and \
                all(v["instance"] in ("a", "b") for v in o.values()) and mine
        stale = wait_for(split, 60, "a and b to share the partitions")
        last_before = self.cluster.stream_info("ORD")["state"]["last_seq"]
        wait_for(lambda: any(x.get("acked") for x in self.acks("a")), 60, "a to apply something")
        paused = time.time_ns()
        os.kill(self.procs["a"].pid, signal.SIGSTOP)
        wait_for(lambda: all(v["instance"] == "b" for v in self.owners().values()), 30, "b to take a's partitions")
        def taken_by_b():
            return {x["partition"] for x in self.acks("b") if x.get("lease") == "taken" and x["time_ns"] > paused}
        wait_for(lambda: {int(k) for k in stale} <= taken_by_b(), 30, "b to start a's partitions")
        self.publish(self.path("second.jsonl"))
        resumed = time.time_ns()
        os.kill(self.procs["a"].pid, signal.SIGCONT)
        # a wakes, finds its leases gone and drops them; it may take partitions again later, as
        # a new owner (a new lease, a new consumer, replaying from the stream).
        wait_for(lambda: len([x for x in self.acks("a") if x.get("lease") == "ended"]) >= len(stale), 30,
                 "a to learn that it lost its leases")
        log_a = self.acks("a")
        # Nothing published after a's pause (a could fetch it only after it woke) was committed by
        # a, unless under a lease a took after it woke.
        for x in log_a:
            if x.get("acked") and x["seq"] > last_before:
                retaken = [y for y in log_a if y.get("lease") == "taken" and y["partition"] == x["partition"]
                           and resumed < y["time_ns"] < x["time_ns"]]
                self.assertTrue(retaken, f"the stale owner committed {x} after it lost partition {x['partition']}")
        wait_for(lambda: self.settled(["a", "b"], ref), 120, "the group to settle with the reference rows")
        self.stop_all(["a", "b"])
        leases = sorted((x["time_ns"], n, x["partition"], x["lease"], x.get("why")) for n in ("a", "b")
                        for x in self.acks(n) if "lease" in x)
        self.assertEqual(self.union(["a", "b"]), ref, "\n".join(map(str, leases)))


class handover_stop_test(scaleout_case):
    def test_a_group_stopped_in_the_middle_of_a_rebalance_shows_every_partition_in_one_dump(self):
        # a holds every partition; b joins, and both are stopped at once while a gives
        # partitions up to b (at a moment the test does not choose: after b's first take, or
        # before it). Every partition must then be listed by exactly one of them, no key in
        # two dumps, and a's partitions complete (nothing was published after a caught up).
        report = self.gen("o.jsonl", 2000, 40)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        self.publish(self.path("o.jsonl"))
        # A longer lease than elsewhere: a lease that expires on a loaded machine (a tick late by
        # more than the TTL) is lost and its copy dropped, which is another case than this one.
        self.start("a", ttl="8s")
        wait_for(lambda: self.settled(["a"], ref), 120, "a to hold every partition with the reference rows")
        self.start("b", ttl="8s")
        # Stop as soon as b has taken something or a has given something up.
        wait_for(lambda: any(x.get("lease") == "taken" for x in self.acks("b")) or
                 any(x.get("why") == "rebalanced" for x in self.acks("a")), 60, "the rebalance to start")
        self.stop_all(["a", "b"])
        listed = {}
        for n in ("a", "b"):
            with open(self.path(os.path.join(n, "owned"))) as f:
                for k in [int(l) for l in f if l.strip()]:
                    self.assertNotIn(k, listed, f"partition {k} listed by {listed.get(k)} and {n}")
                    listed[k] = n
        self.assertEqual(sorted(listed), list(range(PARTITIONS)))
        rows = self.union(["a", "b"])  # fails on a key in two dumps
        of_a = [r for r in ref if listed[fnv1a32(token_of(r[0]).encode()) % PARTITIONS] == "a"]
        self.assertEqual([r for r in rows if listed[fnv1a32(token_of(r[0]).encode()) % PARTITIONS] == "a"], of_a)
        # Started again: each resumes what it can and the group ends with the reference rows.
        self.start("a", ttl="8s")
        self.start("b", ttl="8s")
        wait_for(lambda: self.settled(["a", "b"], ref), 120, "the group to settle with the reference rows")
        self.stop_all(["a", "b"])
        self.assertEqual(self.union(["a", "b"]), ref)


class caught_up_test(scaleout_case):
    def test_instances_stop_by_themselves_once_every_partition_reached_its_last_sequence(self):
        report = self.gen("o.jsonl", 6000 if SOAK else 3000, 60)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        self.publish(self.path("o.jsonl"))
        names = ["a", "b", "c"]
        for n in names:
            self.start(n, "--until-caught-up")
        # One instance killed while the group catches up, and started again with the flag.
        wait_for(lambda: any(x.get("acked") for x in self.acks("b")) or self.procs["b"].poll() is not None, 60,
                 "b to apply something")
        self.stop("b", signal.SIGKILL)
        self.start("b", "--until-caught-up")
        results = {}
        for n in names:
            p = self.procs[n]
            p.wait(240)
            with open(p.err_path, errors="replace") as f:
                self.assertEqual(p.returncode, 0, f"instance {n}: {f.read()}")
            with open(p.err_path[:-4] + ".out") as f:
                results[n] = json.loads(f.read())
            self.assertTrue(results[n]["caught_up"], results[n])
        # Nothing lost, nothing in two dumps: every partition in the dump of the last owner that
        # reached its last sequence.
        self.assertEqual(self.union(names), ref)
        self.assert_partitions_follow_the_mapping(names)
        owners = self.owners()
        self.assertEqual(len(owners), PARTITIONS, owners)
        last = self.cluster.stream_info("ORD")["state"]["last_seq"]
        for k, v in owners.items():
            self.assertEqual((v["instance"], v["kept"]), ("", True), f"partition {k}: {v}")
            self.assertLessEqual(v["checkpoint"], last)
        # An instance started after the group caught up has nothing left to do: it stops at once
        # and takes nothing (taking would replay a partition into a second copy), also once the
        # leases themselves have expired (the kept copies are recorded without a TTL).
        time.sleep(3)  # past the 2 s lease TTL
        self.start("d", "--until-caught-up")
        self.procs["d"].wait(120)
        with open(self.procs["d"].err_path[:-4] + ".out") as f:
            late = json.loads(f.read())
        self.assertEqual((self.procs["d"].returncode, late["caught_up"], late["taken"], late["owned_at_stop"]),
                         (0, True, 0, []))
        self.assertEqual(self.union(names + ["d"]), ref)
        # The same holds for the group's own instances started again with the flag: they take
        # nothing and their dumps still show the copies they kept.
        for n in names:
            self.start(n, "--until-caught-up")
        kept = []
        for n in names:
            self.procs[n].wait(120)
            self.assertEqual(self.procs[n].returncode, 0)
            # Its result lists the copies it kept, as its DIR/owned does.
            with open(self.procs[n].err_path[:-4] + ".out") as f:
                again = json.loads(f.read())
            with open(self.path(os.path.join(n, "owned"))) as f:
                listed = sorted(int(x) for x in f.read().split())
            self.assertEqual(sorted(again["owned_at_stop"]), listed, n)
            kept += listed
        self.assertEqual(sorted(kept), list(range(PARTITIONS)))
        self.assertEqual(self.union(names + ["d"]), ref)

    def test_an_instance_restarted_within_its_killed_runs_leases_takes_them_before_it_stops(self):
        # b alone reaches every partition's last sequence and is killed before it stops: its
        # leases still name it, with those checkpoints, until their TTL runs out. Started again
        # with the flag within that TTL, it must take them and list its copies, not stop at once
        # with every partition in no dump.
        report = self.gen("o.jsonl", 600, 20)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        self.publish(self.path("o.jsonl"))
        total = self.cluster.stream_info("ORD")["state"]["messages"]

        def leases_at_the_end():
            acked = {(x["partition"], x["seq"]) for x in self.acks("b") if x.get("acked")}
            if len(acked) < total:
                return False
            o = self.owners()
            return len(o) == PARTITIONS and all(
                v["instance"] == "b" and v["checkpoint"] >= max(s for p, s in acked if p == int(k))
                for k, v in o.items())

        self.start("b", ttl="8s")
        wait_for(leases_at_the_end, 120, "b's leases to show every partition's last sequence")
        self.stop("b", signal.SIGKILL)
        self.start("b", "--until-caught-up", ttl="8s")
        p = self.procs["b"]
        p.wait(120)
        with open(p.err_path, errors="replace") as f:
            self.assertEqual(p.returncode, 0, f.read())
        with open(p.err_path[:-4] + ".out") as f:
            result = json.loads(f.read())
        self.assertTrue(result["caught_up"], result)
        self.assertEqual(result["owned_at_stop"], list(range(PARTITIONS)), result)
        self.assertEqual(self.union(["b"]), ref)

    def test_a_partition_whose_last_owner_stopped_short_of_its_last_sequence_is_taken_and_replayed(self):
        # a consumes the first half and stops; the second half is published; b, started with the
        # flag, must take every partition that got new messages (a's kept checkpoints fall short)
        # and leave the others in a's copy.
        report = self.gen("o.jsonl", 3000, 40)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        with open(self.path("o.jsonl"), "rb") as f:
            lines = [l for l in f.read().split(b"\n") if l.strip()]
        with open(self.path("first.jsonl"), "wb") as f:
            f.write(b"".join(l + b"\n" for l in lines[:2000]))
        with open(self.path("second.jsonl"), "wb") as f:
            f.write(b"".join(l + b"\n" for l in lines[2000:]))
        self.publish(self.path("first.jsonl"))
        self.start("a", "--until-caught-up")
        self.procs["a"].wait(240)
        self.assertEqual(self.procs["a"].returncode, 0)
        self.publish(self.path("second.jsonl"))
        fresh = {fnv1a32(token_of(json.loads(l)["subject"]).encode()) % PARTITIONS for l in lines[2000:]}
        self.start("b", "--until-caught-up")
        self.procs["b"].wait(240)
        with open(self.procs["b"].err_path, errors="replace") as f:
            self.assertEqual(self.procs["b"].returncode, 0, f.read())
        with open(self.procs["b"].err_path[:-4] + ".out") as f:
            result = json.loads(f.read())
        self.assertTrue(result["caught_up"], result)
        self.assertEqual(set(result["owned_at_stop"]), fresh)
        in_fresh = [r for r in ref if fnv1a32(token_of(r[0]).encode()) % PARTITIONS in fresh]
        self.assertEqual(self.rows_of(self.path("b")), in_fresh)


class replay_test(scaleout_case):
    """A new owner without a copy rebuilds the partition from the stream in one bulk build
    (--replay-threshold 1 forces it at CI size), then its durable consumer follows from there."""

    def test_takeovers_by_replay_end_equal_to_the_reference_and_the_live_path_follows(self):
        report = self.gen("o.jsonl", 4000, 60)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        with open(self.path("o.jsonl"), "rb") as f:
            lines = [l for l in f.read().split(b"\n") if l.strip()]
        with open(self.path("first.jsonl"), "wb") as f:
            f.write(b"".join(l + b"\n" for l in lines[:3000]))
        with open(self.path("second.jsonl"), "wb") as f:
            f.write(b"".join(l + b"\n" for l in lines[3000:]))
        self.publish(self.path("first.jsonl"))
        self.start("a", "--replay-threshold", 1)
        wait_for(lambda: len([k for k, v in self.owners().items() if v["instance"] == "a"]) == PARTITIONS and
                 all(v["checkpoint"] > 0 for v in self.owners().values()), 60, "a to replay every partition")
        # Replayed: nothing of the first part went through the durable consumers.
        self.assertEqual([x for x in self.acks("a") if "acked" in x], [])
        # What comes next is followed live, from after the replayed checkpoint.
        second = self.publish(self.path("second.jsonl"))
        wait_for(lambda: self.settled(["a"], ref), 60, "a to follow the second part")
        live = list(range(second["first_sequence"], second["last_sequence"] + 1))
        wait_for(lambda: sorted({x["seq"] for x in self.acks("a") if x.get("acked")}) == live, 10,
                 "a's acks of exactly the second part")
        # b takes half by replay; then a is killed and b takes the rest by replay too.
        self.start("b", "--replay-threshold", 1)
        wait_for(lambda: self.settled(["a", "b"], ref), 60, "a and b to share the partitions")
        self.assertEqual([x for x in self.acks("b") if "acked" in x], [])
        self.stop("a", signal.SIGKILL)
        wait_for(lambda: self.settled(["b"], ref), 60, "b to take a's partitions")
        self.assertEqual([x for x in self.acks("b") if "acked" in x], [])
        self.stop_all(["b"])
        self.assertEqual(self.rows_of_all("b"), ref)
        self.assert_partitions_follow_the_mapping(["b"])

    def test_a_kill_during_a_replay_or_before_its_rename_leaves_nothing_in_place_and_a_restart_ends_exact(self):
        report = self.gen("o.jsonl", 4000, 60)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        self.publish(self.path("o.jsonl"))
        for point in ["during_replay:1", "during_swap:2"]:
            self.start("a", "--replay-threshold", 1, env={"IDEM_CRASH_AT": point})
            self.procs["a"].wait(60)
            self.assertEqual(self.procs["a"].returncode, -signal.SIGKILL, point)
            # Killed in a bulk build: its directory is beside the copy, never in its place.
            built = sorted(n for n in os.listdir(self.path("a")) if n.startswith("p"))
            self.assertTrue(any(n.endswith(".bulk") for n in built), (point, built))
            for n in built:
                if n.endswith(".bulk"):
                    self.assertNotIn(n[:-5], built, point)
        self.start("a", "--replay-threshold", 1)
        wait_for(lambda: self.settled(["a"], ref), 60, "a to replay again after the kills")
        self.stop_all(["a"])
        self.assertEqual(sorted(n for n in os.listdir(self.path("a")) if n.endswith(".bulk")), [])
        self.assertEqual(self.rows_of_all("a"), ref)

    def rows_of_all(self, name):
        return self.union([name])


def token_decoded(token):
    """The key a token stands for, decoded here from the rule (percent-decoding; 'events' is none)."""
    if token == "events":
        return ""
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%":
            out.append(int(token[i + 1:i + 3], 16))
            i += 3
        else:
            out += token[i].encode()
            i += 1
    return out.decode()


class subject_template_test(scaleout_case):
    KEYS = ["order-1", "a.b", "a..b.", "x y", "*", ">", "%41", "events", "caf\u00e9", " lead", "{subject}", "o.1.2"]

    def test_keys_that_are_not_one_token_round_trip_and_land_where_partition_of_says(self):
        rng = random.Random(SEED)
        events, totals = [], {}
        for i in range(600):
            key = rng.choice(self.KEYS)
            amount = rng.randrange(1, 1000)
            seq = totals.get(key, (0, 0))[0] + 1
            totals[key] = (seq, totals.get(key, (0, 0))[1] + amount)
            events.append({"specversion": "1.0", "id": f"e-{i}", "source": "/t", "type": "order.line_added",
                           "subject": key, "sequence": str(seq), "time": "2026-12-02T09:30:00Z",
                           "datacontenttype": "application/json", "data": {"order_id": key, "amount": amount}})
        # One record without a subject: the token 'events', which decodes to no subject.
        events.append({"specversion": "1.0", "id": "e-none", "source": "/t", "type": "order.line_added",
                       "time": "2026-12-02T09:30:00Z", "datacontenttype": "application/json",
                       "data": {"order_id": "no-subject", "amount": 5}})
        totals["no-subject"] = (1, 5)
        with open(self.path("t.jsonl"), "w") as f:
            for e in events:
                f.write(json.dumps(e) + "\n")
        r = json.loads(run("publish", "--skip-too-large",
                           "--nats", self.cluster.urls, "--stream", "ORD", "--subject", "orders.>",
                           "--subject-template", "orders.{subject}", "--log", self.path("t.jsonl"),
                           "--replicas", 3).stdout)
        self.assertEqual(r["stored"], len(events))
        # What the servers stored: orders.<k>.<token>, read back through the stream's API.
        with nats_server.raw_connection("127.0.0.1", self.cluster.client_ports[0]) as c:
            replies = c.request_many([("$JS.API.STREAM.MSG.GET.ORD", json.dumps({"seq": q}).encode(), None)
                                      for q in range(1, len(events) + 1)])
        where = {}
        for e, reply in zip(events, replies):
            prefix, k, token = reply["message"]["subject"].split(".", 2)
            self.assertEqual(prefix, "orders")
            self.assertEqual(token_decoded(token), e.get("subject", ""), token)  # reversible
            self.assertEqual(int(k), fnv1a32(token.encode()) % PARTITIONS, token)  # the servers' mapping
            where[e.get("subject", "")] = int(k)
        keys = [k for k in where if k]  # (an empty value is not an option's value; the C++ test covers "")
        # Consume with two instances until caught up; every key's row is where the servers put it.
        for n in ("a", "b"):
            self.start(n, "--until-caught-up")
        for n in ("a", "b"):
            self.procs[n].wait(240)
            with open(self.procs[n].err_path, errors="replace") as f:
                self.assertEqual(self.procs[n].returncode, 0, f.read())
        # The C++ API (partition_of, through `idem owners --key`) says the same partition for every key.
        located = jsonl(run("owners", "--nats", self.cluster.urls, "--consumer", "grp", "--partitions", PARTITIONS,
                            *[a for k in keys for a in ("--key", k)]).stdout)
        self.assertEqual({x["key"]: x["partition"] for x in located}, {k: where[k] for k in keys})
        self.assertEqual({x["key"]: x["token"] for x in located}, {k: token_of(k) for k in keys})
        rows = {key: (json.loads(state)["lines"], json.loads(state)["total"]) for key, _, state in self.union(["a", "b"])}
        self.assertEqual(rows, {k: (n, t) for k, (n, t) in totals.items()})
        for n in ("a", "b"):
            with open(self.path(os.path.join(n, "owned"))) as f:
                for k in [l.strip() for l in f if l.strip()]:
                    for key, _, _ in self.rows_of(self.path(os.path.join(n, "p" + k))):
                        if key != "no-subject":
                            self.assertEqual(where[key], int(k), key)

    def test_a_template_the_stream_subject_does_not_capture_or_without_subject_is_refused(self):
        self.gen("o.jsonl", 20, 2)
        for template, why in (("payments.{subject}", "does not capture"), ("orders.x", "no '{subject}'"),
                              ("orders.k-{subject}", "outside a whole"), ("orders.*", "wildcard")):
            p = run("publish", "--skip-too-large",
                    "--nats", self.cluster.urls, "--stream", "T", "--subject", "orders.>",
                    "--subject-template", template, "--log", self.path("o.jsonl"), check=False)
            self.assertNotEqual(p.returncode, 0, template)
            self.assertIn(f"subject template '{template}'", p.stderr)
            self.assertIn(why, p.stderr)


class replicated_test(scaleout_case):
    def test_every_replica_ends_equal_to_the_reference_through_a_kill(self):
        report = self.gen("o.jsonl", 2000, 30)
        ref = self.reference(self.path("o.jsonl"), report["totals"])
        self.publish(self.path("o.jsonl"))
        def replica(name, *extra):
            return [idem_cli.IDEM, "consume", "--db", self.path(name), "--nats", self.cluster.urls, "--stream", "ORD",
                    "--consumer", "rep", "--replica", name, *extra]
        victim = subprocess.Popen(replica("r1"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs["r1"] = victim
        time.sleep(1.0)
        victim.kill()
        victim.wait()
        for name in ("r1", "r2", "r3"):
            p = subprocess.run(replica(name, "--until-caught-up"), capture_output=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
            self.assertEqual(self.rows_of(self.path(name)), ref, f"replica {name}")


class forming_cluster_test(unittest.TestCase):
    def test_publish_right_after_the_nodes_start_waits_for_the_cluster_to_form(self):
        # Before the cluster has a meta leader and current peers, a stream with 3 replicas is
        # refused or times out; publish retries within its outage limit instead of exit 2.
        cluster = nats_cluster.nats_cluster(mappings=MAPPING, wait=False)
        self.addCleanup(cluster.close)
        log = os.path.join(cluster.dir, "o.jsonl")
        run("gen", "--out", log, "--domain", "orders", "--events", 300, "--aggregates", 10, "--seed", 3)
        lines = sum(1 for l in open(log, "rb") if l.strip())
        p = run("publish", "--nats", cluster.urls, "--stream", "ORD", "--subject", "orders.>", "--log", log,
                "--replicas", 3, check=False, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(json.loads(p.stdout)["published"], lines, p.stdout)
        cluster.wait_ready()
        self.assertEqual(cluster.stream_info("ORD")["state"]["messages"] +
                         json.loads(p.stdout)["duplicates"], lines)


class refusal_test(scaleout_case):
    def test_a_stream_that_is_not_prefix_wildcard_is_refused_naming_it(self):
        report = self.gen("o.jsonl", 50, 5)
        run("publish", "--skip-too-large",
            "--nats", self.cluster.urls, "--stream", "FLAT", "--subject", "flat.*", "--log",
            self.path("o.jsonl"))
        p = run("consume", "--db", self.path("x"), "--nats", self.cluster.urls, "--stream", "FLAT", "--consumer", "g",
                "--partitions", 2, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("'flat.*'", p.stderr)
        self.assertIn("<prefix>.>", p.stderr)

    def test_a_bad_instance_name_and_options_without_partitions_are_refused(self):
        p = run("consume", "--db", self.path("x"), "--nats", self.cluster.urls, "--stream", "S", "--consumer", "g",
                "--lease-ttl", "2s", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("--lease-ttl", p.stderr)
        self.gen("o.jsonl", 20, 2)
        self.publish(self.path("o.jsonl"))
        p = run("consume", "--db", self.path("x"), "--nats", self.cluster.urls, "--stream", "ORD", "--consumer", "g",
                "--partitions", 2, "--instance", "a.b", check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("'a.b'", p.stderr)


if __name__ == "__main__":
    idem_cli.main("jetstream-scaleout")
