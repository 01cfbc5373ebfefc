#!/usr/bin/env python3
"""Group benchmark of `idem consume --partitions` on a 3-node JetStream cluster on loopback
(tests/jetstream/nats_cluster.py): the same stream (3 replicas, N partitions by the servers'
mapping) consumed by a group of 1, 2 and 3 instances, each group under its own consumer name
from the start of the stream, with --until-caught-up. Printed side by side, round after round
(the groups interleaved, so that the machine's load falls on all of them alike): the events/s of
the whole group (messages stored / wall time from the first instance's start to the last one's exit,
lease taking, consumer set-up and rebalancing included), the messages each group's durable
consumers fetched in all (a partition handed over during a rebalance is replayed by its new
owner; one built by a bulk replay from the stream, having more messages than
--replay-threshold, fetched only what came after), and the ratio to the 1-instance group. Each round also measures the cluster's bare fetch+ack rate of the same stream
(bench/jetstream_bench --nats: one durable consumer that stores nothing), the limit a single
consumer meets on this cluster. Medians at the end. Not a test: nothing is asserted but that
every group ends with the rows of the reference (a wrong group is no benchmark).

usage: group_bench.py PATH/TO/idem [--events N] [--rounds R] [--partitions N] [--groups 1,2,3]
                      [--bare PATH/TO/jetstream_bench]  (default: bench/jetstream_bench of idem's build)
                      [--replay-threshold N]  (idem consume's; default 20000 as its own)
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "jetstream"))

import nats_cluster  # noqa: E402


def run(idem, *args):
    p = subprocess.run([idem, *map(str, args)], capture_output=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"idem {' '.join(map(str, args))} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    return p.stdout.decode()


def rows(idem, db):
    return sorted(l for l in run(idem, "dump", "--db", db, "--projection", "order-totals").splitlines() if l.strip())


def process_cpu(pid):
    """CPU seconds (user + system) a live process has used, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu():
    """CPU seconds of the children that have exited and been waited for."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def brokers_cpu(cluster):
    return sum(process_cpu(p.pid) for p in cluster.procs if p is not None)


def group(idem, cluster, size, name, partitions, replay_threshold):
    """Runs one group of size instances until caught up; returns (seconds, fetched, dbs, instance CPU
    seconds, broker CPU seconds)."""
    dbs = [os.path.join(cluster.dir, f"{name}-i{i}") for i in range(size)]
    cpu_before, brokers_before = children_cpu(), brokers_cpu(cluster)
    started = time.monotonic()
    procs = [subprocess.Popen([idem, "consume", "--db", db, "--nats", cluster.urls, "--stream", "ORD", "--consumer",
                               name, "--partitions", str(partitions), "--instance", f"i{i}", "--lease-ttl", "2s",
                               "--until-caught-up", "--replay-threshold", str(replay_threshold)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i, db in enumerate(dbs)]
    outs = [p.communicate(timeout=1800) for p in procs]
    seconds = time.monotonic() - started
    instances_cpu = children_cpu() - cpu_before
    broker_cpu = brokers_cpu(cluster) - brokers_before
    fetched = 0
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"group {name}: an instance exited {p.returncode}: {err.decode(errors='replace')}")
        fetched += json.loads(out)["fetched"]
    return seconds, fetched, dbs, instances_cpu, broker_cpu


def bare(bench, cluster):
    """The cluster's bare fetch+ack rate of stream ORD, in messages/s (one run)."""
    p = subprocess.run([bench, "--nats", cluster.urls, "--stream", "ORD"], capture_output=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"{bench} exited {p.returncode}: {p.stderr.decode(errors='replace')}")
    for line in p.stdout.decode().splitlines():
        if line.startswith("bare fetch+ack median:"):
            return float(line.split(":")[1].split()[0])
    raise SystemExit(f"{bench} printed no rate: {p.stdout.decode(errors='replace')}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("idem")
    ap.add_argument("--events", type=int, default=60000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--groups", default="1,2,3")
    ap.add_argument("--bare")
    # idem consume's default: a partition with more messages than this is built by a bulk replay
    # from the stream (not counted in "fetched"); a large value measures the live path alone.
    ap.add_argument("--replay-threshold", type=int, default=20000)
    a = ap.parse_args()
    idem = os.path.abspath(a.idem)
    bench = a.bare or os.path.join(os.path.dirname(idem), "..", "bench", "jetstream_bench")
    if not os.access(bench, os.X_OK):
        raise SystemExit(f"{bench}: not found (build bench/jetstream_bench, or name it with --bare)")
    sizes = [int(x) for x in a.groups.split(",")]
    mapping = {"orders.*": "orders.{{partition(%d,1)}}.{{wildcard(1)}}" % a.partitions}
    with nats_cluster.nats_cluster(mappings=mapping) as cluster:
        log = os.path.join(cluster.dir, "o.jsonl")
        run(idem, "gen", "--out", log, "--domain", "orders", "--events", a.events, "--aggregates",
            max(100, a.events // 50), "--seed", 7)
        published = json.loads(run(idem, "publish", "--skip-too-large",
                                   "--nats", cluster.urls, "--stream", "ORD", "--subject", "orders.>",
                                   "--log", log, "--replicas", 3))
        ref_db = os.path.join(cluster.dir, "ref")
        run(idem, "rebuild", "--db", ref_db, "--log", log)
        ref = rows(idem, ref_db)
        print(f"group_bench: {a.events} events ({published['stored']} stored, 3 replicas), {a.partitions} partitions, "
              f"3 nats-server nodes and the instances on {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
        print("round  " + "  ".join(f"{s} inst: messages/s  fetched" for s in sizes) + "  bare fetch+ack msgs/s")
        rates = {s: [] for s in sizes}
        bare_rates = []
        cpu_per_message = {s: [] for s in sizes}  # (instances, brokers) CPU microseconds per stored message
        for r in range(a.rounds):
            cells = []
            for s in sizes:
                seconds, fetched, dbs, inst_cpu, broker_cpu = group(idem, cluster, s, f"g{s}r{r}", a.partitions,
                                                                  a.replay_threshold)
                union = sorted(x for db in dbs for x in rows(idem, db))
                if union != ref:
                    raise SystemExit(f"group of {s} (round {r}): the union of the dumps differs from the reference")
                rate = published["stored"] / seconds
                rates[s].append(rate)
                cpu_per_message[s].append((inst_cpu / published["stored"] * 1e6, broker_cpu / published["stored"] * 1e6))
                cells.append(f"{rate:>19,.0f}  {fetched:>7}")
            bare_rates.append(bare(bench, cluster))
            cells.append(f"{bare_rates[-1]:>21,.0f}")
            print(f"{r:>5}  " + "  ".join(cells), flush=True)
        base = statistics.median(rates[sizes[0]])
        print("median " + "  ".join(f"{statistics.median(rates[s]):>19,.0f} x{statistics.median(rates[s]) / base:.2f}"
                                    for s in sizes) + f"  {statistics.median(bare_rates):>21,.0f}")
        print("each group against the bare rate: " +
              ", ".join(f"{s} inst x{statistics.median(rates[s]) / statistics.median(bare_rates):.2f}" for s in sizes))
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        # The projection to one machine per instance: the CPU a message costs the instances and the
        # brokers, measured here, is what bounds each side once it has cores of its own.
        print("CPU per stored message (median over the rounds): instances / 3 brokers, microseconds")
        for s in sizes:
            inst = statistics.median(c[0] for c in cpu_per_message[s])
            brokers = statistics.median(c[1] for c in cpu_per_message[s])
            print(f"  {s} instance(s): {inst:,.1f} / {brokers:,.1f}; one core per instance bounds the group at "
                  f"{s * 1e6 / inst:,.0f} msgs/s, and each broker node ({brokers / 3:,.1f} us per message on one "
                  f"core) at {3e6 / brokers:,.0f} msgs/s")


if __name__ == "__main__":
    main()
