#!/usr/bin/env python3
"""Commit-to-subscriber latency over Server-Sent Events: `idem serve` (durability full) takes
CloudEvents batches from a few posting threads while one GET /changes client reads; for every
change received, the time since its commit began (the entry's time_ns: apply, commit and fsync
included) and since the POST that carried it was answered (the sender's acknowledgement).
Prints p50/p99 of both, beside the in-process figure of bench/feed_bench.

usage: sse_bench.py PATH/TO/idem [--events N] [--posters P] [--batch B] [--dir DIR]
"""

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time


def percentile(values, q):
    if not values:
        return 0.0
    v = sorted(values)
    return v[int(q * (len(v) - 1))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("idem")
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--posters", type=int, default=4)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="idem-sse-bench-", dir=a.dir or os.getcwd())
    proc = subprocess.Popen([a.idem, "serve", "--db", os.path.join(work, "db"), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        port = int(json.loads(proc.stdout.readline())["listening"].rsplit(":", 1)[1])
        answered = {}  # order key + amount index -> when its POST was answered (ns)
        lock = threading.Lock()
        received = []  # (time_ns of the commit, key, version, when received)

        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(b"GET /changes HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")

        def read():
            buf = b""
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return
                now = time.time_ns()
                buf += chunk
                while b"\n\n" in buf:
                    block, buf = buf.split(b"\n\n", 1)
                    lines = block.split(b"\n")
                    if b"event: change" not in lines:
                        continue  # a ping, or the error event a stopping server sends
                    for line in lines:
                        if line.startswith(b"data:"):
                            c = json.loads(line[5:])
                            received.append((c["time_ns"], c["key"], c["version"], now))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(0.3)  # the stream is open before the first commit

        per = a.events // a.posters

        def post(p):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for start in range(0, per, a.batch):
                batch = []
                for i in range(start, min(per, start + a.batch)):
                    key = f"order-{p}-{i % 50}"
                    batch.append({"specversion": "1.0", "id": f"e-{p}-{i}", "source": "/bench",
                                  "type": "order.line_added", "subject": key,
                                  "data": {"order_id": key, "amount": 1}})
                conn.request("POST", "/events", json.dumps(batch),
                              {"Content-Type": "application/cloudevents-batch+json"})
                r = conn.getresponse()
                r.read()
                if r.status >= 300:
                    raise SystemExit(f"POST answered {r.status}")
                now = time.time_ns()
                with lock:
                    for e in batch:
                        answered.setdefault(e["subject"], []).append(now)

        start = time.monotonic()
        posters = [threading.Thread(target=post, args=(p,)) for p in range(a.posters)]
        for t in posters:
            t.start()
        for t in posters:
            t.join()
        elapsed = time.monotonic() - start
        time.sleep(1.0)  # the last commits reach the stream
        since_commit = [(now - t) / 1e6 for t, _, _, now in received]
        # A change of version v of a key: the v-th line of that key was answered at answered[key][v-1].
        since_answer = []
        for _, key, version, now in received:
            times = answered.get(key, [])
            if 0 < version <= len(times):
                since_answer.append((now - times[version - 1]) / 1e6)
        print(f"{a.events} events in POSTs of {a.batch} from {a.posters} threads: {a.events / elapsed:.0f} events/s, "
              f"{len(received)} changes received over SSE")
        print(f"commit start -> SSE client: p50 {percentile(since_commit, 0.5):.2f} ms, "
              f"p99 {percentile(since_commit, 0.99):.2f} ms")
        print(f"POST answered -> SSE client (same change): p50 {percentile(since_answer, 0.5):.2f} ms, "
              f"p99 {percentile(since_answer, 0.99):.2f} ms")
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
