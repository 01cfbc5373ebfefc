#!/usr/bin/env python3
"""The report of tools/bench: checks every run's state against the generator's reference,
takes medians, writes results.md, results.csv and the gnuplot script of comparison.png.

    report.py OUT     (OUT holds runs.txt, reference.txt, config.txt and/or scale.txt)

Exits 1 if a run ended in another state than the reference of its workload."""

import datetime
import os
import platform
import statistics
import subprocess
import sys

VARIANTS = [
    # name, family, description
    ("live-1", "idem", "idem engine, durability full, 1 submitter (1 fsync per message)"),
    ("live-16", "idem", "idem engine, durability full, group commit, 16 submitters"),
    ("live-256", "idem", "idem engine, durability full, group commit, 256 submitters"),
    ("live-256-retention", "idem", "idem engine as live-256, with a 2 s inbox retention window"),
    ("apply-1000", "idem", "idem store.apply, 1000 msgs/txn, durability full (batched as the peers)"),
    ("rebuild-binary", "idem", "idem offline rebuild from the binary log"),
    ("rebuild-jsonl", "idem", "idem offline rebuild from JSON Lines"),
    ("consume-binary", "idem", "idem consume --log of the binary log, durability full"),
    ("consume-jsonl", "idem", "idem consume --log of JSON Lines, durability full"),
    ("lmdb-1000", "lmdb", "raw LMDB textbook schema, 1000 msgs/txn, durable"),
    ("lmdb-bulk", "lmdb", "raw LMDB textbook schema, 100k msgs/txn unsynced, 1 sync (bulk-load floor)"),
    ("sqlite-normal-1", "sqlite", "SQLite WAL, synchronous=NORMAL, 1 msg/txn (no fsync per commit)"),
    ("sqlite-normal-1000", "sqlite", "SQLite WAL, synchronous=NORMAL, 1000 msgs/txn (no fsync per commit)"),
    ("sqlite-full-1", "sqlite", "SQLite WAL, synchronous=FULL, 1 msg/txn"),
    ("sqlite-full-1000", "sqlite", "SQLite WAL, synchronous=FULL, 1000 msgs/txn"),
    ("pg-1", "pg", "PostgreSQL 15, synchronous_commit on, 1 msg/txn"),
    ("pg-1000", "pg", "PostgreSQL 15, synchronous_commit on, 1000 msgs/txn (pipelined)"),
    ("memory", "memory", "hash maps in memory, no persistence"),
]
IDEM = "live-256"
STATE = ("rows", "sum_total", "sum_lines", "digest")


def parse(path, tag):
    rows = []
    if not os.path.exists(path):
        return rows
    for line in open(path):
        parts = line.split()
        if parts and parts[0] == tag:
            rows.append(dict(p.split("=", 1) for p in parts[1:]))
    return rows


def commas(v):
    return f"{v:,.0f}"


def machine():
    cpu = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal"):
            mem = int(line.split()[1]) / 1024 / 1024
    try:
        fs = subprocess.run(["findmnt", "-no", "FSTYPE,SOURCE", "-T", os.environ.get("TMPDIR", "/var/tmp")],
                            capture_output=True, text=True).stdout.strip()
    except OSError:
        fs = "?"
    distro = "?"
    if os.path.exists("/etc/os-release"):
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                distro = line.split("=", 1)[1].strip().strip('"')
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {distro}, Linux {platform.release()}, "
            f"stores on {fs or '?'}")


def main(out):
    md = []
    csv = []
    errors = []
    refs = {r["limit"]: r for r in parse(f"{out}/reference.txt", "reference")}
    runs = parse(f"{out}/runs.txt", "result")
    scale = parse(f"{out}/scale.txt", "result")
    config = {}
    if os.path.exists(f"{out}/config.txt"):
        config = dict(p.split("=", 1) for p in open(f"{out}/config.txt").read().split())
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    md.append(f"Measured {now} on {machine()}.")
    md.append("")

    by = {}
    for r in runs:
        by.setdefault(r["variant"], []).append(r)
    for r in runs:
        if r["variant"] == "hot-row":
            continue
        ref = refs.get(r["limit"])
        if ref is None:
            errors.append(f"{r['variant']}: no reference for limit {r['limit']}")
            continue
        wrong = [k for k in STATE if r[k] != ref[k]]
        if r["messages"] != ref["messages"] or r["applied"] != ref["distinct"]:
            wrong.append("messages/applied")
        if wrong:
            errors.append(f"{r['variant']} (limit {r['limit']}): {', '.join(wrong)} differ: "
                          f"got {' '.join(k + '=' + r[k] for k in STATE)}, "
                          f"reference {' '.join(k + '=' + ref[k] for k in STATE)}")

    def rate(r):
        return int(r["messages"]) / float(r["seconds"])

    medians = {}
    for name, _, _ in VARIANTS:
        if name in by:
            rs = by[name]
            n = int(rs[0]["messages"])
            medians[name] = {
                "runs": len(rs),
                "messages": n,
                "rate": statistics.median(rate(r) for r in rs),
                "write": statistics.median(int(r["write_bytes"]) / n for r in rs),
                "wchar": statistics.median(int(r["wchar"]) / n for r in rs),
                "store": statistics.median(int(r["store_bytes"]) for r in rs),
                "rss": statistics.median(int(r["rss_kb"]) for r in rs),
                "cpu": (statistics.median(float(r["cpu_seconds"]) * 1e6 / n for r in rs)
                        if all("cpu_seconds" in r for r in rs) else None),
            }
    idem = medians.get(IDEM, {}).get("rate")

    if medians:
        full = refs.get("0", {})
        md.append(f"Workload: {commas(int(full.get('messages', 0)))} messages ({commas(int(full.get('distinct', 0)))} "
                  f"distinct + {commas(int(full.get('messages', 0)) - int(full.get('distinct', 0)))} redeliveries "
                  f"under the same UUID-like message id) over {commas(int(config.get('aggregates', 0)))} orders, "
                  f"integer amounts; median of {config.get('runs', '?')} runs, each variant in its own process. "
                  f"Rows marked * ran the first {commas(int(config.get('prefix', 0)))} messages (one fsync each).")
        md.append("")
        md.append("| variant | msgs/s | vs idem live-256 | write_bytes/msg | wchar/msg | store MiB | peak RSS MiB "
                  "| CPU µs/msg |")
        md.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        csv.append("variant,description,messages,runs,msgs_per_s,ratio_to_idem_live_256,write_bytes_per_msg,"
                   "wchar_per_msg,store_bytes,peak_rss_kb,cpu_us_per_msg")
        for name, _, desc in VARIANTS:
            if name not in medians:
                continue
            m = medians[name]
            ratio = m["rate"] / idem if idem else float("nan")
            star = " *" if by[name][0]["limit"] != "0" else ""
            store = f"{m['store'] / 2**20:.1f}" if m["store"] else "—"
            cpu = f"{m['cpu']:.1f}" if m["cpu"] is not None else "—"
            md.append(f"| {desc}{star} | {commas(m['rate'])} | {ratio:.3f}x | {commas(m['write'])} | "
                      f"{commas(m['wchar'])} | {store} | {m['rss'] / 1024:.0f} | {cpu} |")
            csv.append(f"{name},\"{desc}\",{m['messages']},{m['runs']},{m['rate']:.0f},{ratio:.4f},"
                       f"{m['write']:.0f},{m['wchar']:.0f},{m['store']:.0f},{m['rss']:.0f},"
                       + (f"{m['cpu']:.2f}" if m["cpu"] is not None else ""))
        md.append("")
        md.append("write_bytes and wchar are /proc/<pid>/io deltas over the timed loop (PostgreSQL: the "
                  "server's processes plus the client, including a CHECKPOINT after the loop; SQLite: "
                  "including a wal_checkpoint after the loop), divided by messages. write_bytes is what the "
                  "kernel charged for writeback (large page-cache folios inflate it); wchar the bytes handed "
                  "to write calls. PostgreSQL's peak RSS adds its backend's to the client's. CPU µs/msg is the "
                  "variant process's user + system time (all threads, setup included; PostgreSQL: the client only) "
                  "per message: steadier than msgs/s for CPU-bound variants on a shared machine.")
        md.append("")

        def best(family):
            names = [n for n, f, _ in VARIANTS if f == family and n in medians]
            return max(names, key=lambda n: medians[n]["rate"]) if names else None

        def target(label, num, den, want):
            if num not in medians or den not in medians:
                md.append(f"- {label}: not measured")
                return
            got = medians[num]["rate"] / medians[den]["rate"]
            verdict = "met" if got >= want else f"missed by {want / got:.1f}x"
            md.append(f"- {label}: {num} / {den} = {got:.2f}x (target >= {want}x): {verdict}")

        md.append("Targets (ratios of msgs/s in this run; against each peer its fastest variant):")
        md.append("")
        target("idem live durable vs raw-LMDB textbook durable", IDEM, "lmdb-1000", 6)
        target("idem live durable vs SQLite", IDEM, best("sqlite"), 10)
        target("idem live durable vs PostgreSQL", IDEM, best("pg"), 20)
        rebuilds = [n for n in ("rebuild-binary", "rebuild-jsonl") if n in medians]
        fastest = max(rebuilds, key=lambda n: medians[n]["rate"]) if rebuilds else "rebuild-binary"
        target("rebuild vs the raw-LMDB bulk-load floor", fastest, "lmdb-bulk", 2.7)
        consumes = [n for n in ("consume-binary", "consume-jsonl") if n in medians]
        fastest = max(consumes, key=lambda n: medians[n]["rate"]) if consumes else "consume-binary"
        target("consume --log durable vs raw-LMDB textbook durable", fastest, "lmdb-1000", 6)
        md.append("")
        why = []
        for name in ("live-16", IDEM, "lmdb-1000", "apply-1000", "consume-binary", "sqlite-full-1000", "pg-1000"):
            if name not in by:
                continue
            r = by[name][len(by[name]) // 2]
            commits = int(r["syncs"]) if "syncs" in r else max(1, -(-int(r["messages"]) // 1000))
            why.append(f"{name} {int(r['messages']) / commits:.0f} msgs and "
                       f"{float(r['seconds']) * 1e3 / commits:.1f} ms per durable commit")
        if why:
            md.append("Where the durable variants' time goes (commits = fsync'ed transactions): " + "; ".join(why) + ".")
            md.append("")

    hot = by.get("hot-row", [])
    md.append("Scaling figures:")
    md.append("")
    if hot:
        h = hot[-1]
        md.append(f"- apply cost of one event (its own transaction, no fsync) on a row with "
                  f"{commas(int(h['hot_contributors']))} contributors: {h['hot_us_per_event']} µs; on a row with 10: "
                  f"{h['cold_us_per_event']} µs ({h['hot_over_cold']}x)")
    if IDEM in by:
        md.append(f"- inbox size after the live run: {commas(int(by[IDEM][0]['inbox_ids']))} message ids "
                  f"(no retention window: every distinct id)")
    if "live-256-retention" in by:
        r = by["live-256-retention"][len(by["live-256-retention"]) // 2]
        md.append(f"- inbox size after the live run with a {r['retention_s']} s inbox retention window: "
                  f"{commas(int(r['inbox_ids']))} message ids (redeliveries past the window are caught by the "
                  f"rows' contributing sets; the state still matches)")
    else:
        md.append("- inbox size after a long run with a short retention window: not measured")

    if scale:
        md.append("")
        md.append("idem live-256 (durability full) as the log grows, one run each:")
        md.append("")
        md.append("| messages | msgs/s | write_bytes/msg | wchar/msg | store MiB | peak RSS MiB | inbox ids |")
        md.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        first = None
        for r in sorted(scale, key=lambda r: int(r["messages"])):
            n = int(r["messages"])
            first = first or rate(r)
            md.append(f"| {commas(n)} | {commas(rate(r))} | {commas(int(r['write_bytes']) / n)} | "
                      f"{commas(int(r['wchar']) / n)} | {int(r['store_bytes']) / 2**20:.0f} | "
                      f"{int(r['rss_kb']) / 1024:.0f} | {commas(int(r['inbox_ids']))} |")
        by_n = {int(r["messages"]): rate(r) for r in scale}
        if 1_000_000 in by_n and 10_000_000 in by_n:
            drop = 1 - by_n[10_000_000] / by_n[1_000_000]
            md.append("")
            md.append(f"- msgs/s at 10M within 20% of 1M: {by_n[10_000_000] / by_n[1_000_000]:.2f}x of the 1M "
                      f"rate ({'met' if drop <= 0.20 else 'missed'})")
        with open(f"{out}/scale.csv", "w") as f:
            f.write("messages,msgs_per_s,write_bytes_per_msg,wchar_per_msg,store_bytes,peak_rss_kb,inbox_ids\n")
            for r in sorted(scale, key=lambda r: int(r["messages"])):
                n = int(r["messages"])
                f.write(f"{n},{rate(r):.0f},{int(r['write_bytes']) / n:.0f},{int(r['wchar']) / n:.0f},"
                        f"{r['store_bytes']},{r['rss_kb']},{r['inbox_ids']}\n")

    if errors:
        md.append("")
        md.append("STATE MISMATCH:")
        md.extend(f"- {e}" for e in errors)
    elif runs:
        md.append("")
        md.append("Every run ended in the reference state of its workload (row count, sums, digest of "
                  "\"key=total,lines;\" in key order).")

    with open(f"{out}/results.md", "w") as f:
        f.write("\n".join(md) + "\n")
    if csv:
        with open(f"{out}/results.csv", "w") as f:
            f.write("\n".join(csv) + "\n")
    write_plot(out, medians, scale)
    print("\n".join(md))
    if errors:
        sys.exit(1)


def write_plot(out, medians, scale):
    names = [n for n, _, _ in VARIANTS if n in medians]
    with open(f"{out}/variants.dat", "w") as f:
        for i, n in enumerate(names):
            f.write(f"{i} \"{n}\" {medians[n]['rate']:.0f}\n")
    with open(f"{out}/scale.dat", "w") as f:
        for r in sorted(scale, key=lambda r: int(r["messages"])):
            f.write(f"{r['messages']} {int(r['messages']) / float(r['seconds']):.0f}\n")
    gp = [
        "set terminal pngcairo size 1200,520 font ',10'" if has_cairo() else "set terminal png size 1200,520",
        f"set output '{out}/comparison.png'",
        "set multiplot layout 1,2",
        "set title 'msgs/s per variant (same workload, same machine)'",
        "set logscale y",
        "set grid ytics",
        "set ylabel 'msgs/s'",
        "set style fill solid 0.6",
        "set boxwidth 0.7",
        "set xtics rotate by 45 right",
        "set yrange [10:*]",
        "unset key",
    ]
    if names:
        gp.append(f"plot '{out}/variants.dat' using 1:3:xtic(2) with boxes lc rgb '#4472c4'")
    else:
        # gnuplot needs explicit ranges to draw an empty panel
        gp += ["set label 2 'run tools/bench (the comparison)' at graph 0.25, graph 0.5", "plot [0:1] [10:100] 1/0 notitle",
               "unset label 2"]
    gp += [
        "set title 'idem live-256 (durability full): msgs/s as the log grows'",
        "set logscale x",
        "set xtics norotate",
        "set xlabel 'messages'",
        "set yrange [*:*]",
        "unset logscale y",
        "set yrange [0:*]",
        "set format x '%.0e'",
    ]
    if scale:
        sizes = [int(r["messages"]) for r in scale]
        gp.append(f"set xrange [{min(sizes) / 2}:{max(sizes) * 2}]")
        gp.append(f"plot '{out}/scale.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#c00000'")
    else:
        gp += ["set label 1 'run tools/bench --scale' at graph 0.3, graph 0.5", "plot [1e6:1e8] [0:1] 1/0"]
    gp.append("unset multiplot")
    with open(f"{out}/comparison.gp", "w") as f:
        f.write("\n".join(gp) + "\n")


def has_cairo():
    try:
        r = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
        return "pngcairo" in (r.stdout + r.stderr)
    except OSError:
        return False


if __name__ == "__main__":
    main(sys.argv[1])
