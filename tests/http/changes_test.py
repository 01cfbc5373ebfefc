#!/usr/bin/env python3
"""End-to-end tests of GET /changes on `idem serve`: the change feed as Server-Sent Events, read
by a client of plain sockets written here while other clients POST events. Every change arrives
once and in order, the last state per row matches the rows (GET /rows) and a reference computed
here; Last-Event-ID resumes; a client that stops reading is dropped without slowing the POSTs.

usage: changes_test.py PATH/TO/idem
"""

import json
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_test  # noqa: E402  (the server process, its requests and the temporary store)
from serve_test import event, serve_case  # noqa: E402

BATCH = "application/cloudevents-batch+json"


class sse_client:
    """A GET /changes read on a thread of its own: events parsed as they arrive."""

    def __init__(self, port, query="?since=0", last_id=None, rcvbuf=None, read=True):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        head = f"GET /changes{query} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
        if last_id:
            head += f"Last-Event-ID: {last_id}\r\n"
        self.sock.sendall((head + "\r\n").encode())
        self.lock = threading.RLock()
        self.events = []   # (id, event, data)
        self.comments = []
        self.status = None
        self.closed = False
        self.thread = None
        if read:
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def _run(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
                if self.status is None:
                    if b"\r\n\r\n" not in buf:
                        continue
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    self.status = int(head.split(b" ")[1])
                    if self.status != 200:
                        self.body = buf
                while b"\n\n" in buf:
                    block, buf = buf.split(b"\n\n", 1)
                    self._take(block.decode())
        except OSError:
            pass
        with self.lock:
            self.closed = True

    def _take(self, block):
        fields = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                with self.lock:
                    self.comments.append(line)
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        if fields:
            with self.lock:
                self.events.append((fields.get("id"), fields.get("event"), fields.get("data")))

    def changes(self):
        with self.lock:
            return [(i, json.loads(d)) for i, e, d in self.events if e == "change"]

    def wait(self, until, timeout=30):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if until(self):
                    return True
            time.sleep(0.02)
        return False

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        if self.thread:
            self.thread.join(10)


def commit_of(position):
    c, _, i = position.partition(".")
    return (int(c), int(i))


def post_lines(s, prefix, n, orders, ref, per_post=1):
    """POSTs n lines over `orders` orders, per_post to a request; adds each to ref; returns the last commit."""
    last = 0
    for start in range(0, n, per_post):
        batch = [event(f"{prefix}-{i}", f"o-{i % orders}", i % 97 + 1) for i in range(start, min(n, start + per_post))]
        body, kind = (batch[0], serve_test.CE) if per_post == 1 else (batch, BATCH)
        status, _, out = s.post(body, kind)
        assert status == 200, out
        for e, o in zip(batch, out["outcomes"]):
            assert o["outcome"] == "applied", o
            t = ref.setdefault(e["data"]["order_id"], [0, 0])
            t[0] += e["data"]["amount"]
            t[1] += 1
            last = max(last, o["commit"])
    return last


class changes_tests(serve_case):
    def check_in_order_once(self, changes):
        ids = [commit_of(i) for i, _ in changes]
        self.assertEqual(ids, sorted(set(ids)), "positions out of order or repeated")
        for i, c in changes:
            self.assertEqual(c["position"], i)

    def last_states(self, changes):
        return {c["key"]: c["state"] for _, c in changes if c["kind"] == "row" and c["projection"] == "order-totals"}

    def test_a_follower_sees_every_change_of_concurrent_posts_once_in_order(self):
        s = self.start()
        follower = sse_client(s.port, "?since=0&projection=order-totals")
        self.assertTrue(follower.wait(lambda f: f.status is not None), "no answer to GET /changes")
        self.assertEqual(follower.status, 200)
        refs = [{} for _ in range(4)]
        lasts = [0] * 4

        def sender(k):
            lasts[k] = post_lines(s, f"t{k}", 60, 9, refs[k])

        threads = [threading.Thread(target=sender, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        last = max(lasts)
        self.assertTrue(follower.wait(lambda f: f.events and commit_of(f.events[-1][0])[0] >= last),
                        "the follower did not reach the last commit")
        changes = follower.changes()
        follower.close()
        self.check_in_order_once(changes)
        states = self.last_states(changes)
        reference = {}
        for r in refs:
            for k, (total, lines) in r.items():
                t = reference.setdefault(k, [0, 0])
                t[0] += total
                t[1] += lines
        self.assertEqual({k: [v["total"], v["lines"]] for k, v in states.items()}, reference)
        for key, state in states.items():
            status, row = s.row(key)
            self.assertEqual(status, 200)
            self.assertEqual(row["state"], state)
        # A client from the oldest kept entry sees the same entries.
        again = sse_client(s.port, "?since=oldest")
        self.assertTrue(again.wait(lambda f: f.events and commit_of(f.events[-1][0])[0] >= last))
        self.assertEqual(again.changes(), changes)
        again.close()
        self.assertEqual(s.stop(), 0)

    def test_last_event_id_resumes_without_loss_or_repetition(self):
        s = self.start()
        ref = {}
        post_lines(s, "a", 30, 5, ref, per_post=3)
        first = sse_client(s.port, "?since=0")
        self.assertTrue(first.wait(lambda f: len(f.events) >= 12))
        first.close()
        got = first.changes()[:12]
        # Posts go on while the client is away; it comes back with the last id it saw (which wins over since).
        last = post_lines(s, "b", 30, 5, ref, per_post=3)
        second = sse_client(s.port, "?since=0", last_id=got[-1][0])
        self.assertTrue(second.wait(lambda f: f.events and commit_of(f.events[-1][0])[0] >= last))
        second.close()
        got += second.changes()
        self.check_in_order_once(got)
        whole = sse_client(s.port, "?since=0")
        self.assertTrue(whole.wait(lambda f: f.events and commit_of(f.events[-1][0])[0] >= last))
        whole.close()
        self.assertEqual(got, whole.changes())
        self.assertEqual({k: [v["total"], v["lines"]] for k, v in self.last_states(got).items()}, ref)
        # Without since the stream starts at the current commit: only what comes after.
        live = sse_client(s.port, "")
        self.assertTrue(live.wait(lambda f: f.comments))  # ": after C" once subscribed
        later = post_lines(s, "c", 2, 5, ref)
        self.assertTrue(live.wait(lambda f: f.events and commit_of(f.events[-1][0])[0] >= later))
        self.assertTrue(all(commit_of(i)[0] > last for i, _ in live.changes()))
        live.close()
        bad = s.request("GET", "/changes?since=x")
        self.assertEqual(bad[0], 400)
        self.assertIn(b"since 'x'", bad[2])
        self.assertEqual(s.request("GET", "/changes?projection=nope")[0], 400)
        self.assertEqual(s.stop(), 0)

    def test_a_pruned_position_ends_the_stream_with_an_error_event(self):
        s = self.start("--change-keep-commits", 3)
        post_lines(s, "p", 10, 3, {})
        c = sse_client(s.port, "?since=1")
        self.assertTrue(c.wait(lambda f: f.closed), "the stream was not closed")
        kinds = [e for _, e, _ in c.events]
        self.assertEqual(kinds, ["error"])
        self.assertIn("oldest commit kept whole is 8", c.events[0][2])
        c.close()
        self.assertEqual(s.stop(), 0)

    def test_a_client_that_stops_reading_is_dropped_and_does_not_slow_the_posts(self):
        s = self.start("--changes-buffer", 32768, "--changes-stall", "6s", "--durability", "none")
        post_lines(s, "h", 3000, 50, {}, per_post=100)  # a history larger than any socket buffer
        rounds = iter(range(1000))

        def rate():
            # The best of five short rounds: a loaded machine's pauses fall into some rounds, not all.
            best = 0
            for _ in range(5):
                n = 100
                start = time.monotonic()
                post_lines(s, f"r{next(rounds)}", n, 50, {})
                best = max(best, n / (time.monotonic() - start))
            return best

        alone = rate()
        stuck = sse_client(s.port, "?since=0", rcvbuf=4096, read=False)
        time.sleep(0.2)
        with_stuck = rate()
        print(f"\n  {alone:.0f} posts/s alone, {with_stuck:.0f} with a stuck reader", file=sys.stderr)
        self.assertGreaterEqual(with_stuck, 0.5 * alone, f"{with_stuck:.0f} posts/s with a stuck reader, {alone:.0f} without")
        # The stuck connection is closed: the count falls to the metrics request's own (a client's
        # closed connection may still be counted for a moment, so one sighting is enough), and
        # the stuck socket, read at last, ends.
        end = time.monotonic() + 20
        dropped = False
        while time.monotonic() < end and not dropped:
            dropped = s.metric("idem_http_connections") <= 1
            time.sleep(0.1)
        self.assertTrue(dropped, "the stuck stream was not closed")
        stuck.sock.settimeout(5)
        received = b""
        ended = False
        try:
            while True:
                chunk = stuck.sock.recv(65536)
                if not chunk:
                    ended = True
                    break
                received += chunk
        except ConnectionResetError:
            ended = True
        except socket.timeout:
            pass
        stuck.close()
        self.assertTrue(ended, "the stuck stream's socket was still open")
        self.assertTrue(received.startswith(b"HTTP/1.1 200"))
        # A reader that keeps up is served meanwhile, to the end.
        last = post_lines(s, "z", 1, 50, {})
        fine = sse_client(s.port, "?since=0")
        self.assertTrue(fine.wait(lambda f: f.events and commit_of(f.events[-1][0])[0] >= last))
        self.check_in_order_once(fine.changes())
        fine.close()
        self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    serve_test.IDEM = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
