#!/usr/bin/env python3
"""Relay benchmark: `idem relay` (a store's change feed to a JetStream stream) against bare
publishing of as many messages of the same size with `idem publish`, on one loopback nats-server,
in the same run. The store is built from a generated orders log (`idem consume --log`, small
batches so that rows change in many commits); its order-totals changes are relayed to a fresh
stream with --until-caught-up. Then a log of as many envelopes, each as long as the relay's mean
message, is published to another fresh stream. Each rate is the command's own (changes/s,
messages/s: from its start of publishing to its last ack, connection and set-up included), and
the ratio relay/bare is printed; rounds alternate the two, medians at the end. Not a test.

usage: relay_bench.py PATH/TO/idem [--events N] [--aggregates N] [--rounds R] [--max-pending N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "jetstream"))
import nats_server  # noqa: E402


def run(idem, *args):
    p = subprocess.run([idem, *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"idem {' '.join(map(str, args))} exited {p.returncode}: {p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("idem")
    ap.add_argument("--events", type=int, default=200000)
    ap.add_argument("--aggregates", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-pending", type=int, default=1024)
    a = ap.parse_args()
    idem = os.path.abspath(a.idem)
    work = tempfile.mkdtemp(prefix="idem-relay-bench-")
    log, db = os.path.join(work, "orders.jsonl"), os.path.join(work, "A")
    run(idem, "gen", "--out", log, "--domain", "orders", "--events", a.events, "--aggregates", a.aggregates)
    run(idem, "consume", "--db", db, "--log", log, "--batch", 2000)
    with nats_server.nats_server() as ns:
        ratios, relays, bares = [], [], []
        for r in range(a.rounds):
            stream = f"CHANGES{r}"
            rel = json.loads(run(idem, "relay", "--db", db, "--nats", ns.url, "--stream", stream, "--subject",
                                 f"changes{r}", "--projection", "order-totals", "--max-pending",
                                 a.max_pending).stdout)
            info = ns.stream_info(stream)
            size = max(1, info["bytes"] // max(1, info["messages"]))
            # As many envelopes, each about the relay's mean stored size (headers and subject included).
            bare_log = os.path.join(work, f"bare{r}.jsonl")
            pad = max(0, size - 160)
            with open(bare_log, "w") as f:
                for i in range(rel["changes"]):
                    f.write(json.dumps({"specversion": "1.0", "id": f"e-{r}-{i}", "source": "bench",
                                        "type": "bench.filler", "subject": f"k-{i % 5000}",
                                        "data": {"pad": "x" * pad}}) + "\n")
            pub = json.loads(run(idem, "publish", "--nats", ns.url, "--stream", f"BARE{r}", "--subject",
                                 f"bare{r}.>", "--log", bare_log, "--max-pending", a.max_pending).stdout)
            relay_rate = float(rel["changes_per_second"])
            bare_rate = float(pub["messages_per_second"])
            relays.append(relay_rate)
            bares.append(bare_rate)
            ratios.append(relay_rate / bare_rate)
            print(f"round {r + 1}: relay {rel['changes']:,} changes in {rel['seconds']} s = {relay_rate:,.0f} "
                  f"changes/s; bare publish {pub['published']:,} messages (~{size} bytes stored each) in "
                  f"{pub['seconds']} s = {bare_rate:,.0f} messages/s; ratio {relay_rate / bare_rate:.2f}",
                  flush=True)
        print(f"median: relay {statistics.median(relays):,.0f} changes/s, bare {statistics.median(bares):,.0f} "
              f"messages/s, ratio {statistics.median(ratios):.2f} (target >= 0.5)")


if __name__ == "__main__":
    main()
