#!/usr/bin/env python3
"""`idem backup` with the real binary: backups taken again and again while a consumer writes,
the consumer killed with SIGKILL during the copies; each backup, opened as the store of a new
consume of the same log, ends with the rows the generator computed for that log (nothing
lost, nothing applied twice). A damaged store and an existing destination are refused.

usage: backup_test.py PATH/TO/idem
"""

import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

IDEM = None


def run(*args, check=True, timeout=120):
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def damage_a_leaf_key(path, page_size=4096):
    """Overwrites the first key of a leaf page past the file's middle with 0xff bytes (LMDB 0.9
    page header: flags at 10, node offsets from 16; a node: sizes, flags, key size at 6, key at 8)."""
    data = bytearray(open(path, "rb").read())
    pages = len(data) // page_size
    for page in range(pages // 2, pages):
        at = page * page_size
        if struct.unpack_from("<H", data, at + 10)[0] != 0x02:
            continue
        node = at + struct.unpack_from("<H", data, at + 16)[0]
        size = struct.unpack_from("<H", data, node + 6)[0]
        data[node + 8:node + 8 + size] = b"\xff" * size
        with open(path, "wb") as f:
            f.write(data)
        return True
    return False


class backup_test(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-backup-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def gen(self, name, events):
        return json.loads(run("gen", "--out", self.path(name), "--domain", "trading", "--events", events,
                              "--aggregates", 300, "--seed", 5).stdout)

    def assert_rows_match(self, db, expected):
        """The positions' sums equal what the generator computed for its log (not idem's counters)."""
        rows = jsonl(run("dump", "--db", db, "--projection", "positions").stdout)
        totals = expected["totals"]
        self.assertEqual(len(rows), totals["positions"], db)
        self.assertEqual(sum(r["state"]["qty"] for r in rows), totals["qty"], db)
        self.assertEqual(sum(r["state"]["realized_pnl"] for r in rows), totals["realized_pnl"], db)
        self.assertEqual(sum(r["state"]["cost"] for r in rows), totals["cost"], db)

    def position(self, db):
        points = json.loads(run("stats", "--db", db).stdout)["checkpoints"]
        return points[0]["position"] if points else 0

    def test_backups_under_a_killed_consumer_resume_to_the_reference(self):
        expected = self.gen("fills.jsonl", 20000)
        log = self.path("fills.jsonl")
        db = self.path("db")
        rnd = random.Random(38)
        backups = []
        finished = False
        for _ in range(5):
            consumer = subprocess.Popen([IDEM, "consume", "--db", db, "--log", log, "--batch", "20"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            while not os.path.exists(os.path.join(db, "data.mdb")):
                self.assertLess(time.time(), deadline, "the consumer never created its store")
                time.sleep(0.01)
            time.sleep(rnd.uniform(0.05, 0.25))
            # One backup while it writes undisturbed, then one during which it is killed.
            backups.append(self.path(f"backup-{len(backups)}"))
            run("backup", "--db", db, "--out", backups[-1])
            backups.append(self.path(f"backup-{len(backups)}"))
            b = subprocess.Popen([IDEM, "backup", "--db", db, "--out", backups[-1]], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            time.sleep(rnd.uniform(0, 0.03))
            consumer.send_signal(signal.SIGKILL)
            _, err = b.communicate(timeout=60)
            self.assertEqual(b.returncode, 0, err)
            consumer.wait(timeout=60)
            if consumer.returncode == 0:
                finished = True
                break
            self.assertEqual(consumer.returncode, -signal.SIGKILL)
        if not finished:
            run("consume", "--db", db, "--log", log)
        self.assert_rows_match(db, expected)

        # Each backup is a store at its own commit: no partial directory is left beside it.
        self.assertEqual([n for n in os.listdir(self.dir) if ".partial-" in n], [])
        positions = [self.position(b) for b in backups]
        size = os.path.getsize(log)
        self.assertTrue(any(0 < p < size for p in positions), positions)
        for b in backups:
            self.assertNotIn("idem.lock", os.listdir(b))
            run("verify", "--db", b, "--store")
            # Opened as the store of a new consume of the same log: it resumes from its checkpoint.
            run("consume", "--db", b, "--log", log)
            self.assert_rows_match(b, expected)
        print(f"{len(backups)} backups at log positions {positions} of {size}", file=sys.stderr)

    def test_a_damaged_store_and_an_existing_destination_are_refused(self):
        expected = self.gen("fills.jsonl", 2000)
        db = self.path("db")
        run("consume", "--db", db, "--log", self.path("fills.jsonl"))
        run("backup", "--db", db, "--out", self.path("first"))
        self.assert_rows_match(self.path("first"), expected)

        # An existing destination holding anything is never replaced.
        p = run("backup", "--db", db, "--out", self.path("first"), check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(self.path("first") + ": exists and is not an empty directory", p.stderr)
        self.assert_rows_match(self.path("first"), expected)
        # An empty one is taken.
        os.mkdir(self.path("empty"))
        run("backup", "--db", db, "--out", self.path("empty"))
        self.assert_rows_match(self.path("empty"), expected)

        # A data file cut short is refused, naming it; nothing is left at the destination.
        cut = self.path("cut")
        os.mkdir(cut)
        with open(os.path.join(db, "data.mdb"), "rb") as f:
            data = f.read()
        with open(os.path.join(cut, "data.mdb"), "wb") as f:
            f.write(data[:len(data) // 2])
        p = run("backup", "--db", cut, "--out", self.path("from-cut"), check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(os.path.join(cut, "data.mdb"), p.stderr)
        self.assertIn("cut short", p.stderr)
        self.assertFalse(os.path.exists(self.path("from-cut")))
        self.assertEqual([n for n in os.listdir(self.dir) if ".partial-" in n], [])

        # A key damaged inside a leaf page (the meta pages sound): the copy's check refuses it.
        leaf = self.path("leaf")
        os.mkdir(leaf)
        shutil.copy(os.path.join(self.path("first"), "data.mdb"), leaf)
        self.assertTrue(damage_a_leaf_key(os.path.join(leaf, "data.mdb")))
        p = run("backup", "--db", leaf, "--out", self.path("from-leaf"), check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(os.path.join(leaf, "data.mdb") + ": its copy is damaged", p.stderr)
        self.assertFalse(os.path.exists(self.path("from-leaf")))
        self.assertEqual([n for n in os.listdir(self.dir) if ".partial-" in n], [])

        # A directory that is no store.
        p = run("backup", "--db", self.path("nothing"), "--out", self.path("x"), check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(os.path.join(self.path("nothing"), "data.mdb") + ": no such file", p.stderr)


if __name__ == "__main__":
    IDEM = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
