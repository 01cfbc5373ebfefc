#!/usr/bin/env python3
"""What the change feed costs a consumer: `idem consume` of one orders log (durability full, the
default) into a fresh store with the feed on (the tool's projections record their changes) and
off (--no-change-feed), alternating, in the same run. Prints the medians, the ratio of events/s
(target >= 0.85 of off) and the extra bytes written per event (target <= 300): blocks the
kernel wrote for the process (getrusage ru_oublock, 512-byte units) and the store's file size.

usage: feed_cost_bench.py PATH/TO/idem [--events N] [--rounds R] [--dir DIR]
The store is written under --dir (default: a directory beside this script's build, on disk:
tmpfs counts no blocks).
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time


def consume(idem, log, db, feed):
    shutil.rmtree(db, ignore_errors=True)
    args = [idem, "consume", "--log", log, "--db", db]
    if not feed:
        args.append("--no-change-feed")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    written = (after.ru_oublock - before.ru_oublock) * 512
    size = os.path.getsize(os.path.join(db, "data.mdb"))
    stats = json.loads(subprocess.run([idem, "stats", "--db", db], check=True, capture_output=True, text=True).stdout)
    return elapsed, written, size, stats["change_feed"]["entries"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("idem")
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--aggregates", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="idem-feed-bench-", dir=a.dir or os.getcwd())
    try:
        log = os.path.join(work, "orders.jsonl")
        gen = json.loads(subprocess.run([a.idem, "gen", "--domain", "orders", "--out", log, "--events", str(a.events),
                                         "--aggregates", str(a.aggregates)], check=True, capture_output=True,
                                        text=True).stdout)
        lines = sum(1 for _ in open(log, "rb"))
        runs = {True: [], False: []}
        for r in range(a.rounds):
            for feed in ((True, False) if r % 2 == 0 else (False, True)):
                elapsed, written, size, entries = consume(a.idem, log, os.path.join(work, "db"), feed)
                runs[feed].append((elapsed, written, size, entries))
                print(f"round {r + 1} feed {'on ' if feed else 'off'}: {elapsed:6.2f} s, {lines / elapsed:9.0f} lines/s, "
                      f"written {written / lines:7.1f} B/line, data.mdb {size / lines:7.1f} B/line, {entries} entries",
                      flush=True)
        med = {f: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v),
                   statistics.median(x[2] for x in v)) for f, v in runs.items()}
        on, off = med[True], med[False]
        print(f"\n{lines} log lines ({a.events} distinct order events, {gen.get('totals', {})}), durability full")
        print(f"| feed | median s | lines/s | written B/line | data.mdb B/line |")
        print(f"|---|---|---|---|---|")
        for name, m in (("off", off), ("on", on)):
            print(f"| {name} | {m[0]:.2f} | {lines / m[0]:.0f} | {m[1] / lines:.1f} | {m[2] / lines:.1f} |")
        print(f"\nthroughput on/off: {off[0] / on[0]:.3f} (target >= 0.85)")
        print(f"extra written per line: {(on[1] - off[1]) / lines:.1f} B (target <= 300); "
              f"extra file per line: {(on[2] - off[2]) / lines:.1f} B")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
