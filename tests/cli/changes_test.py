#!/usr/bin/env python3
"""`idem changes` with the real binary: a reader process follows the change feed while `consume`
writes (every change of every commit, in order, none twice, ending equal to the rows and to the
generator's totals), a rebuild in the middle of a follow (the documented reset entries, then the
rows after it), a feed pruned behind a reader (a clear error naming the oldest commit kept), and
SIGTERM stopping a follower cleanly.

usage: changes_test.py PATH/TO/idem
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

IDEM = None


def run(*args, check=True, timeout=300):
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def position(entry):
    commit, index = entry["position"].split(".")
    return int(commit), int(index)


class changes_test(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-changes-")
        self.followers = []

    def tearDown(self):
        for p in self.followers:
            if p.poll() is None:
                p.kill()
                p.wait()
            p.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def gen(self, name, events, seed=3):
        return json.loads(run("gen", "--out", self.path(name), "--domain", "trading", "--events", events,
                              "--aggregates", 200, "--seed", seed).stdout)

    def follow(self, db, out, *extra):
        f = open(out, "w")
        p = subprocess.Popen([IDEM, "changes", "--db", db, "--follow", "--poll-ms", "20", *extra], stdout=f,
                             stderr=subprocess.PIPE, text=True)
        f.close()
        self.followers.append(p)
        return p

    def wait_for_feed(self, out, db, timeout=60):
        """Waits until the follower printed the feed's last commit."""
        last = json.loads(run("stats", "--db", db).stdout)["change_feed"]["last_commit"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(out) as f:
                text = f.read()
            # Only whole lines: the follower may be in the middle of writing one.
            lines = [line for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]
            if lines and position(json.loads(lines[-1]))[0] >= last:
                return
            time.sleep(0.05)
        self.fail(f"the follower did not reach commit {last}")

    def stop(self, p):
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr.read())

    def append_in_chunks(self, source, target, db, chunks, *consume_args):
        """Appends source's lines to target in chunks, consuming after each (a writer that keeps writing)."""
        with open(source, "rb") as f:
            lines = f.readlines()
        size = (len(lines) + chunks - 1) // chunks
        for i in range(0, len(lines), size):
            with open(target, "ab") as out:
                out.writelines(lines[i:i + size])
            run("consume", "--log", target, "--db", db, "--batch", 97, "--durability", "none", *consume_args)

    def test_a_follower_sees_every_change_once_in_order_and_ends_equal_to_the_rows(self):
        expected = self.gen("all.jsonl", 20000)
        log, db = self.path("trading.jsonl"), self.path("db")
        with open(self.path("all.jsonl"), "rb") as f:
            lines = f.readlines()
        with open(log, "wb") as out:
            out.writelines(lines[:100])
        run("consume", "--log", log, "--db", db, "--durability", "none")
        everything = self.follow(db, self.path("all.out"), "--since", "0")
        positions_only = self.follow(db, self.path("positions.out"), "--projection", "positions", "--since", "0")
        with open(self.path("rest.jsonl"), "wb") as f:
            f.writelines(lines[100:])
        self.append_in_chunks(self.path("rest.jsonl"), log, db, 8)
        self.wait_for_feed(self.path("all.out"), db)
        self.wait_for_feed(self.path("positions.out"), db)
        self.stop(everything)
        self.stop(positions_only)

        with open(self.path("all.out")) as f:
            entries = jsonl(f.read())
        stats = json.loads(run("stats", "--db", db).stdout)
        # Every entry the feed holds, once, in position order.
        seen = [position(e) for e in entries]
        self.assertEqual(seen, sorted(set(seen)))
        self.assertEqual(len(entries), stats["change_feed"]["entries"])
        # Versions rise per key; the last entry of each row is the row.
        last = {}
        for e in entries:
            self.assertEqual(e["kind"], "row")
            key = (e["projection"], e["key"])
            if key in last:
                self.assertGreater(e["version"], last[key]["version"])
            last[key] = e
        rows = {r["key"]: r for r in jsonl(run("dump", "--db", db, "--projection", "positions").stdout)}
        followed = {k[1]: v for k, v in last.items() if k[0] == "positions"}
        self.assertEqual(set(followed), set(rows))
        for key, row in rows.items():
            self.assertEqual(followed[key]["version"], row["version"], key)
            self.assertEqual(followed[key]["state"], row["state"], key)
        # And the generator's totals, computed from the log alone.
        totals = expected["totals"]
        self.assertEqual(len(followed), totals["positions"])
        self.assertEqual(sum(e["state"]["qty"] for e in followed.values()), totals["qty"])
        self.assertEqual(sum(e["state"]["realized_pnl"] for e in followed.values()), totals["realized_pnl"])
        # The filtered follower saw exactly the positions' entries.
        with open(self.path("positions.out")) as f:
            filtered = jsonl(f.read())
        self.assertEqual(filtered, [e for e in entries if e["projection"] == "positions"])

    def test_a_rebuild_during_a_follow_gives_resets_then_the_rows_after_it(self):
        self.gen("all.jsonl", 6000)
        with open(self.path("all.jsonl"), "rb") as f:
            lines = f.readlines()
        log, db = self.path("trading.jsonl"), self.path("db")
        with open(log, "wb") as out:
            out.writelines(lines[:4000])
        run("consume", "--log", log, "--db", db, "--batch", 500, "--durability", "none")
        old = json.loads(run("stats", "--db", db).stdout)["commit"]
        p = self.follow(db, self.path("out"))  # from the oldest kept
        self.wait_for_feed(self.path("out"), db)
        run("rebuild", "--log", log, "--db", db)
        rebuilt = {r["key"]: r for r in jsonl(run("dump", "--db", db, "--projection", "positions").stdout)}
        with open(log, "ab") as out:
            out.writelines(lines[4000:])
        run("consume", "--log", log, "--db", db, "--batch", 500, "--durability", "none")
        self.wait_for_feed(self.path("out"), db)
        self.stop(p)
        with open(self.path("out")) as f:
            entries = jsonl(f.read())
        resets = [e for e in entries if e["kind"] == "reset"]
        # One reset per recording projection, in the commit right after the old store's last.
        self.assertEqual(sorted(e["projection"] for e in resets),
                         sorted(["order-totals", "positions", "leaderboard", "inventory", "order-totals-copy"]))
        self.assertEqual({position(e)[0] for e in resets}, {old + 1})
        # A follower that re-reads at the reset and applies what follows ends equal to the rows.
        after = entries[entries.index(resets[-1]) + 1:]
        self.assertTrue(after)
        state = dict(rebuilt)
        for e in after:
            if e["projection"] == "positions":
                self.assertGreater(e["version"], state.get(e["key"], {"version": 0})["version"])
                state[e["key"]] = {"key": e["key"], "version": e["version"], "state": e["state"]}
        rows = {r["key"]: r for r in jsonl(run("dump", "--db", db, "--projection", "positions").stdout)}
        self.assertEqual(state, rows)

    def test_a_reader_behind_the_retention_gets_the_oldest_commit_kept(self):
        self.gen("t.jsonl", 3000)
        db = self.path("db")
        run("consume", "--log", self.path("t.jsonl"), "--db", db, "--batch", 100, "--durability", "none",
            "--change-keep-commits", 5)
        feed = json.loads(run("stats", "--db", db).stdout)["change_feed"]
        self.assertGreater(feed["pruned_through"], 0)
        self.assertLessEqual(feed["last_commit"] - feed["first_commit"], 4)
        p = run("changes", "--db", db, "--since", 1, check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(f"oldest commit kept whole is {feed['pruned_through'] + 1}", p.stderr)
        self.assertEqual(p.stdout, "")
        # Without --since: from the oldest kept.
        entries = jsonl(run("changes", "--db", db).stdout)
        self.assertEqual(len(entries), feed["entries"])
        self.assertEqual(position(entries[0])[0], feed["first_commit"])
        # A bad position is a usage error naming it.
        p = run("changes", "--db", db, "--since", "x.1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--since 'x.1'", p.stderr)


if __name__ == "__main__":
    IDEM = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
