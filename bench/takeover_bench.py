#!/usr/bin/env python3
"""Takeover benchmark of `idem consume --partitions`: how long a new owner without a copy takes
to catch up with a partition holding N messages, through the bulk replay (the partition read
through an ephemeral consumer without acks into one bulk build, one sync, renamed into place;
--replay-threshold 1) against the live path (the owner's durable consumer from the start, a
commit and an fsync per batch of at most MaxAckPending; --replay-threshold 0); and a new owner
seeded with a copy: its --db starts as an `idem backup` of a peer's partition store taken when
the stream held 90% of the partition (the peer, an instance under the same consumer name, caught
up with that 90% and stopped; the rest is published after), so that it resumes from the copy's
checkpoint and its durable consumer delivers only the tail (--replay-threshold 0; a copy is never
replayed). The backups are made before the rounds, one per round, and are not timed. A 3-node
nats-server cluster on loopback (tests/jetstream/nats_cluster.py), the stream mapped to one
partition (`orders.* -> orders.{{partition(1,1)}}.*`) with 3 replicas, `idem gen`'s orders log
published once. Each run is one instance with an empty --db under a consumer name of its own
(`--lease-ttl 1s --until-caught-up`): the wall time from its start to its exit, lease taking,
consumer set-up and the caught-up check (a lease tick, 250 ms) included, the same in both
modes. The modes are interleaved round after round, so that the machine's load falls on both
alike; medians at the end. Not a test: nothing is asserted but that every run ends with the
rows of the reference (`idem rebuild` of the log).

usage: takeover_bench.py PATH/TO/idem [--events N] [--rounds R] [--seed-share S]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "jetstream"))

import nats_cluster  # noqa: E402

MODES = {"replay": 1, "live": 0, "seeded": 0}  # --replay-threshold


def run(idem, *args):
    p = subprocess.run([idem, *map(str, args)], capture_output=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"idem {' '.join(map(str, args))} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p.stdout.decode()


def rows(idem, db):
    return sorted(l for l in run(idem, "dump", "--db", db, "--projection", "order-totals").splitlines() if l.strip())


def take_over(idem, cluster, name, threshold, seeded_db=None):
    """One new owner catching up with the partition; returns (seconds, fetched, db). A run that
    hangs (seen before the live-instance listing got its bound; the history of docs/BENCHMARKS.md) is killed
    after 120 s and run again under another name, and said so. A seeded owner (seeded_db holds
    the copy as p0) runs under the peer's consumer name, once: its copy is not made again."""
    for attempt in range(1 if seeded_db else 3):
        consumer = name if seeded_db else f"{name}-{attempt}"
        db = seeded_db or os.path.join(cluster.dir, consumer)
        started = time.monotonic()
        try:
            p = subprocess.run([idem, "consume", "--db", db, "--nats", cluster.urls, "--stream", "ORD", "--consumer",
                                consumer, "--partitions", "1", "--instance", "i0", "--lease-ttl", "1s",
                                "--until-caught-up", "--replay-threshold", str(threshold)],
                               capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            print(f"  ({name}: hung, killed after 120 s; run again)", flush=True)
            continue
        seconds = time.monotonic() - started
        if p.returncode != 0:
            raise SystemExit(f"{name} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
        return seconds, json.loads(p.stdout)["fetched"], db
    raise SystemExit(f"{name}: hung" + ("" if seeded_db else " three times"))


def seed(idem, cluster, name):
    """A peer instance under consumer name `name` catches up with what the stream holds now and
    stops; the new owner's --db gets an `idem backup` of the peer's partition store as its p0.
    Returns (the new owner's db, the copy's checkpoint)."""
    peer = os.path.join(cluster.dir, f"{name}-peer")
    run(idem, "consume", "--db", peer, "--nats", cluster.urls, "--stream", "ORD", "--consumer", name,
        "--partitions", 1, "--instance", "peer", "--lease-ttl", "1s", "--until-caught-up", "--replay-threshold", 0)
    db = os.path.join(cluster.dir, name)
    os.makedirs(db)
    run(idem, "backup", "--db", os.path.join(peer, "p0"), "--out", os.path.join(db, "p0"))
    points = json.loads(run(idem, "stats", "--db", os.path.join(db, "p0")))["checkpoints"]
    return db, max(c["position"] for c in points)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("idem")
    ap.add_argument("--events", type=int, default=200000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed-share", type=float, default=0.9, help="the share of the log the seeded copies hold")
    a = ap.parse_args()
    idem = os.path.abspath(a.idem)
    mapping = {"orders.*": "orders.{{partition(1,1)}}.{{wildcard(1)}}"}
    with nats_cluster.nats_cluster(mappings=mapping) as cluster:
        log = os.path.join(cluster.dir, "o.jsonl")
        run(idem, "gen", "--out", log, "--domain", "orders", "--events", a.events, "--aggregates",
            max(100, a.events // 50), "--seed", 7)
        # The log published in two parts: the seeds are copies of what a peer made of the first.
        with open(log, "rb") as f:
            lines = f.read().splitlines(keepends=True)
        cut = int(len(lines) * a.seed_share)
        parts = []
        for i, chunk in enumerate((lines[:cut], lines[cut:])):
            parts.append(os.path.join(cluster.dir, f"part{i}.jsonl"))
            with open(parts[-1], "wb") as f:
                f.writelines(chunk)
        stored = 0
        seeds = []
        for i, part in enumerate(parts):
            stored += json.loads(run(idem, "publish", "--skip-too-large", "--nats", cluster.urls, "--stream", "ORD",
                                     "--subject", "orders.>", "--log", part, "--replicas", 3))["stored"]
            if i == 0:
                seeds = [seed(idem, cluster, f"t{r}seeded") for r in range(a.rounds)]
        ref_db = os.path.join(cluster.dir, "ref")
        run(idem, "rebuild", "--db", ref_db, "--log", log)
        ref = rows(idem, ref_db)
        print(f"takeover_bench: a partition of {stored} messages (3 replicas), 3 nats-server nodes and "
              f"the instance on {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; seeded copies at sequence "
              f"{', '.join(str(c) for _, c in seeds)} ({a.seed_share:.0%} of the log)")
        print("round  " + "  ".join(f"{m:>6}: seconds  msgs/s  fetched" for m in MODES))
        seconds = {m: [] for m in MODES}
        for r in range(a.rounds):
            cells = []
            for m, threshold in MODES.items():
                s, fetched, db = take_over(idem, cluster, f"t{r}{m}", threshold,
                                           seeds[r][0] if m == "seeded" else None)
                if rows(idem, db) != ref:
                    raise SystemExit(f"{m} (round {r}): the rows differ from the reference")
                seconds[m].append(s)
                cells.append(f"{s:>15.2f}  {stored / s:>6,.0f}  {fetched:>7}")
            print(f"{r:>5}  " + "  ".join(cells), flush=True)
        med = {m: statistics.median(v) for m, v in seconds.items()}
        print("median " + "  ".join(f"{med[m]:>15.2f}  {stored / med[m]:>6,.0f}         " for m in MODES))
        print(f"live / replay: x{med['live'] / med['replay']:.2f}; live / seeded: x{med['live'] / med['seeded']:.2f}; "
              f"replay / seeded: x{med['replay'] / med['seeded']:.2f}; load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
