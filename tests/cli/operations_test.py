#!/usr/bin/env python3
"""Operating a store with the real `idem` binary: one writer per store, a rebuild that
touches only its own files, damaged and full stores refused with a message. Rows are
compared with the totals `idem gen` prints (computed by the generator, not by idem).

usage: operations_test.py PATH/TO/idem
"""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

IDEM = None


def run(*args, check=True, timeout=300, **kw):
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def start(*args):
    return subprocess.Popen([IDEM, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def crc32c(data):
    """CRC32C (Castagnoli), as idem checksums a row record."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class operations_case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-ops-")
        self.mounts = []

    def tearDown(self):
        for m in reversed(self.mounts):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *names):
        return os.path.join(self.dir, *names)

    def gen(self, name, events=3000, aggregates=200, **shares):
        args = ["gen", "--out", name, "--domain", "trading", "--events", events, "--aggregates", aggregates,
                "--seed", shares.pop("seed", 11)]
        for k, v in shares.items():
            args += ["--" + k.replace("_", "-"), v]
        return json.loads(run(*args).stdout)

    def assert_rows_match(self, db, expected):
        """The positions' sums equal what the generator computed for its log."""
        rows = jsonl(run("dump", "--db", db, "--projection", "positions").stdout)
        totals = expected["totals"]
        self.assertEqual(len(rows), totals["positions"])
        self.assertEqual(sum(r["state"]["qty"] for r in rows), totals["qty"])
        self.assertEqual(sum(r["state"]["realized_pnl"] for r in rows), totals["realized_pnl"])
        self.assertEqual(sum(r["state"]["cost"] for r in rows), totals["cost"])

    def wait_for_lock_holder(self, db, proc, seconds=30):
        """Waits until proc holds db's writer lock (its pid is in db/idem.lock)."""
        deadline = time.time() + seconds
        lock = os.path.join(db, "idem.lock")
        while time.time() < deadline:
            if proc.poll() is not None:
                self.fail(f"the writer ended before taking the lock: {proc.stderr.read()}")
            try:
                with open(lock) as f:
                    if f.readline().strip() == str(proc.pid):
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.05)
        self.fail("the writer never took the store's lock")

    def tmpfs(self, name, size):
        """Mounts a tmpfs of size at a new directory; skips the test where mounting is not allowed."""
        where = self.path(name)
        os.makedirs(where)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", where], capture_output=True)
        if p.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here (needs root): {p.stderr.decode().strip()}")
        self.mounts.append(where)
        return where

    def fill(self, where, leave=0):
        """Fills the file system at where up to `leave` free bytes; returns the filler's path."""
        filler = os.path.join(where, "filler")
        st = os.statvfs(where)
        free = st.f_bavail * st.f_frsize
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, free - leave))
        return filler

    def wait_until_consumed(self, db, log, proc, seconds=60):
        """Waits until proc's checkpoint of log is at the log's end."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            self.assertIsNone(proc.poll(), "the follower ended early")
            p = run("stats", "--db", db, check=False)
            if p.returncode == 0:
                points = json.loads(p.stdout)["checkpoints"]
                if points and points[0]["position"] == os.path.getsize(log):
                    return
            time.sleep(0.1)
        self.fail("the follower never reached the end of its log")

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def assert_clean_exit(self, p, code):
        self.assertGreaterEqual(p.returncode, 0, f"killed by signal {-p.returncode}: {p.stderr}")
        self.assertEqual(p.returncode, code, p.stderr)


class one_writer_test(operations_case):
    def test_a_rebuild_and_a_second_consume_are_refused_while_a_consume_follows(self):
        expected = self.gen(self.path("fills.jsonl"))
        db = self.path("db")
        follower = start("consume", "--db", db, "--log", self.path("fills.jsonl"), "--follow")
        try:
            self.wait_for_lock_holder(db, follower)
            p = run("rebuild", "--db", db, "--log", self.path("fills.jsonl"), check=False)
            self.assert_clean_exit(p, 2)
            self.assertIn(f"is being written by pid {follower.pid}", p.stderr)
            self.assertIn("consume", p.stderr)
            self.assertEqual(sorted(os.listdir(self.dir)), ["db", "fills.jsonl"])  # nothing built beside it
            p = run("consume", "--db", db, "--log", self.path("fills.jsonl"), check=False)
            self.assert_clean_exit(p, 2)
            self.assertIn(f"pid {follower.pid}", p.stderr)
            p = run("prune", "--db", db, "--older-than", "1d", check=False)
            self.assert_clean_exit(p, 2)
            self.wait_until_consumed(db, self.path("fills.jsonl"), follower)
            self.assertEqual(run("stats", "--db", db).returncode, 0)  # readers never take the lock
        finally:
            follower.send_signal(signal.SIGTERM)
            follower.communicate(timeout=60)
        self.assertEqual(follower.returncode, 0)
        self.assert_rows_match(db, expected)

    def test_wait_shows_that_it_waits_honours_signals_and_then_writes(self):
        expected = self.gen(self.path("fills.jsonl"))
        db = self.path("db")
        follower = start("consume", "--db", db, "--log", self.path("fills.jsonl"), "--follow")
        try:
            self.wait_for_lock_holder(db, follower)
            waiter = start("consume", "--db", db, "--log", self.path("fills.jsonl"), "--wait")
            time.sleep(1.0)
            self.assertIsNone(waiter.poll(), "the waiting consume did not wait")
            waiter.send_signal(signal.SIGTERM)
            out, err = waiter.communicate(timeout=10)
            self.assertEqual(waiter.returncode, 2, err)
            self.assertIn(f"waiting for {db}: it is being written by pid {follower.pid}", err)
            self.assertIn("gave up waiting", err)

            waiter = start("consume", "--db", db, "--log", self.path("fills.jsonl"), "--wait")
            time.sleep(0.5)
            self.assertIsNone(waiter.poll())
        finally:
            follower.send_signal(signal.SIGTERM)
            follower.communicate(timeout=60)
        out, err = waiter.communicate(timeout=60)
        self.assertEqual(waiter.returncode, 0, err)
        self.assertEqual(json.loads(out)["records"], 0)  # the follower had consumed everything
        self.assert_rows_match(db, expected)

    def test_a_consume_that_waited_through_a_rebuild_writes_into_the_new_store(self):
        big = self.gen(self.path("big.jsonl"), events=150000, aggregates=2000, seed=3)
        db = self.path("db")
        more = self.path("more.jsonl")
        self.gen(more, events=200, aggregates=20, seed=4)
        rebuild = start("rebuild", "--db", db, "--log", self.path("big.jsonl"))
        self.wait_for_lock_holder(db, rebuild)
        waiter = start("consume", "--db", db, "--log", self.path("big.jsonl"), "--wait")
        out, err = rebuild.communicate(timeout=300)
        self.assertEqual(rebuild.returncode, 0, err)
        out, err = waiter.communicate(timeout=300)
        self.assertEqual(waiter.returncode, 0, err)
        # It resumed at the rebuild's checkpoint in the new store: nothing read again, nothing lost.
        self.assertEqual(json.loads(out)["records"], 0)
        self.assert_rows_match(db, big)
        self.assertEqual(sorted(os.listdir(self.dir)), ["big.jsonl", "db", "more.jsonl"])


class rebuild_owns_its_files_test(operations_case):
    def test_a_log_inside_the_store_directory_is_never_deleted(self):
        inner = self.path("inner")
        os.makedirs(inner)
        log = os.path.join(inner, "fills.jsonl")
        self.gen(log, events=500)
        before = self.read(log)
        p = run("rebuild", "--db", inner, "--log", log, check=False)
        self.assert_clean_exit(p, 2)
        self.assertIn("holds files that are not part of an idem store (fills.jsonl)", p.stderr)
        self.assertEqual(self.read(log), before)
        self.assertEqual(sorted(os.listdir(inner)), ["fills.jsonl"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["inner"])

    def test_leftovers_of_killed_rebuilds_and_verifies_are_removed_by_the_next_run(self):
        expected = self.gen(self.path("fills.jsonl"), events=60000, aggregates=1000)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("fills.jsonl"))
        # A rebuild and a verify killed half way.
        for args in (["rebuild", "--db", db], ["verify", "--db", db]):
            before = set(os.listdir(self.dir))
            p = subprocess.Popen([IDEM, *args, "--log", self.path("fills.jsonl")], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            deadline = time.time() + 60
            aside = None
            while time.time() < deadline and aside is None:
                aside = next((n for n in os.listdir(self.dir) if n.startswith("db.") and n not in before), None)
                time.sleep(0.01)
            self.assertIsNotNone(aside, f"{args[0]} made nothing beside the store")
            p.send_signal(signal.SIGKILL)
            p.wait()
        leftovers = sorted(n for n in os.listdir(self.dir) if n.startswith("db."))
        self.assertEqual(len(leftovers), 2, leftovers)
        run("rebuild", "--db", db, "--log", self.path("fills.jsonl"))
        self.assertTrue(json.loads(run("verify", "--db", db, "--log", self.path("fills.jsonl")).stdout)["match"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["db", "fills.jsonl"])
        self.assertEqual(sorted(os.listdir(db)), ["data.mdb", "idem.lock", "lock.mdb"])
        self.assert_rows_match(db, expected)

    def test_a_rebuild_through_a_symbolic_link_replaces_the_store_it_points_to(self):
        first = self.gen(self.path("first.jsonl"), events=500, seed=3)
        second = self.gen(self.path("second.jsonl"), events=700, seed=4)
        os.makedirs(self.path("volume"))
        store = self.path("volume", "store")
        run("rebuild", "--db", store, "--log", self.path("first.jsonl"))
        link = self.path("db")
        os.symlink(store, link)
        run("rebuild", "--db", link, "--log", self.path("second.jsonl"))
        self.assertTrue(os.path.islink(link))
        self.assertEqual(os.readlink(link), store)
        self.assert_rows_match(store, second)
        self.assert_rows_match(link, second)
        self.assertEqual(sorted(os.listdir(self.path("volume"))), ["store"])
        self.assertEqual(sorted(os.listdir(self.dir)), ["db", "first.jsonl", "second.jsonl", "volume"])
        # A relative link, and the store's directory given through a trailing slash.
        os.remove(link)
        os.symlink(os.path.join("volume", "store"), link)
        run("rebuild", "--db", link + "/", "--log", self.path("first.jsonl"))
        self.assertTrue(os.path.islink(link))
        self.assert_rows_match(store, first)
        # A link to nothing is refused, and nothing is made.
        os.remove(link)
        os.symlink(self.path("volume", "gone"), link)
        p = run("rebuild", "--db", link, "--log", self.path("first.jsonl"), check=False)
        self.assert_clean_exit(p, 2)
        self.assertIn(f"{link}: is a symbolic link to {self.path('volume', 'gone')}, which does not exist", p.stderr)
        self.assertTrue(os.path.islink(link))
        self.assertEqual(sorted(os.listdir(self.path("volume"))), ["store"])

    def test_a_rebuild_that_fails_leaves_nothing_beside_the_target(self):
        p = run("rebuild", "--db", self.path("db"), "--log", self.path("missing.jsonl"), check=False)
        self.assert_clean_exit(p, 2)
        self.assertEqual(os.listdir(self.dir), [])


class damaged_store_test(operations_case):
    def store(self):
        expected = self.gen(self.path("fills.jsonl"), events=20000, aggregates=500)
        db = self.path("db")
        run("consume", "--db", db, "--log", self.path("fills.jsonl"))
        return db, expected

    def test_a_cut_data_file_is_refused_by_every_command_and_never_recreated(self):
        db, _ = self.store()
        data = os.path.join(db, "data.mdb")
        full = os.path.getsize(data)
        for cut in (4096, 8192, 3 * 4096, full // 2, full - 4096):
            with self.subTest(cut=cut):
                shutil.copy(data, data + ".orig")
                os.truncate(data, cut)
                for args in (["consume", "--db", db, "--log", self.path("fills.jsonl")],
                             ["stats", "--db", db],
                             ["dump", "--db", db, "--projection", "positions"],
                             ["prune", "--db", db, "--older-than", "1d"]):
                    p = run(*args, check=False)
                    self.assert_clean_exit(p, 2)
                    self.assertIn(f"{data}: ", p.stderr)
                    self.assertIn("cut short", p.stderr)
                    self.assertEqual(os.path.getsize(data), cut, f"{args[0]} changed the damaged file")
                os.replace(data + ".orig", data)
        run("stats", "--db", db)  # the original still reads

    def test_an_empty_data_file_is_refused_not_taken_for_a_new_store(self):
        db, _ = self.store()
        os.truncate(os.path.join(db, "data.mdb"), 0)
        p = run("consume", "--db", db, "--log", self.path("fills.jsonl"), check=False)
        self.assert_clean_exit(p, 2)
        self.assertIn("the file is empty", p.stderr)
        self.assertEqual(os.path.getsize(os.path.join(db, "data.mdb")), 0)

    def test_a_damaged_meta_page_is_refused(self):
        db, _ = self.store()
        data = os.path.join(db, "data.mdb")
        with open(data, "r+b") as f:
            f.seek(4096 + 16)  # the second meta page's magic
            f.write(b"\xff\xff\xff\xff")
        for args in (["stats", "--db", db], ["consume", "--db", db, "--log", self.path("fills.jsonl")]):
            p = run(*args, check=False)
            self.assert_clean_exit(p, 2)
            self.assertIn("meta page 1 has no LMDB magic", p.stderr)

    def test_meta_pages_that_disagree_are_refused_not_looped_on_or_rolled_back(self):
        # A last page past 2^52 pages (its byte size overflows 64 bits) made every command spin; an
        # older meta's transaction id with a high bit flipped made it the newest and silently
        # dropped the last commit. Both are damage, named by every command and by verify --store.
        db, _ = self.store()
        data = os.path.join(db, "data.mdb")
        shutil.copy(data, data + ".orig")
        with open(data, "rb") as f:
            head = f.read(8192)
        txn = [struct.unpack_from("<Q", head, g * 4096 + 144)[0] for g in (0, 1)]
        newer, older = (0, 1) if txn[0] > txn[1] else (1, 0)
        last = struct.unpack_from("<Q", head, newer * 4096 + 136)[0]
        cases = {"last page": (newer * 4096 + 136, last + (1 << 56), "shorter than its last page"),
                 "older transaction": (older * 4096 + 144, txn[older] + (1 << 56), "its meta pages disagree")}
        for name, (offset, value, named) in cases.items():
            with self.subTest(name):
                shutil.copy(data + ".orig", data)
                with open(data, "r+b") as f:
                    f.seek(offset)
                    f.write(struct.pack("<Q", value))
                for args in (["stats", "--db", db], ["dump", "--db", db, "--projection", "positions"],
                             ["consume", "--db", db, "--log", self.path("fills.jsonl")]):
                    p = run(*args, check=False, timeout=60)
                    self.assert_clean_exit(p, 2)
                    self.assertIn(named, p.stderr)
                p = run("verify", "--store", "--db", db, check=False, timeout=60)
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertIn('"store":"damaged"', p.stdout)
        os.replace(data + ".orig", data)
        run("stats", "--db", db)

    def test_a_row_whose_stored_length_is_damaged_is_named_as_damage(self):
        # A string length in a row's state with a high byte flipped: the reader names the
        # projection and the cause (it said "std::bad_alloc", or cereal's bare message).
        run("gen", "--out", self.path("orders.jsonl"), "--domain", "orders", "--events", 2000, "--aggregates", 50)
        db = self.path("db")
        run("consume", "--db", db, "--log", self.path("orders.jsonl"))
        data = os.path.join(db, "data.mdb")
        with open(data, "r+b") as f:
            b = bytearray(f.read())
            # The currency string, after its u64 length (little-endian), in a row record:
            # [2][crc32c][state version u32][applied][highest sequence], then the state: cereal's
            # portable archive's byte-order byte, [total][lines][length]["EUR"].
            at = b.find(b"EUR")
            while at >= 0 and (b[at - 50] != 2 or b[at - 45:at - 41] != b"\x02\0\0\0"):
                at = b.find(b"EUR", at + 1)
            self.assertGreater(at, 50)
            b[at - 8] = 0xc8  # length 3 -> 200, past the record's end (a length of 2^56 + 3 said
            # "std::bad_alloc"; a sanitizer build aborts on that allocation, so the test stays small)
            # The row's checksum made to match: damage the checksum cannot see reaches the decoder.
            struct.pack_into("<I", b, at - 49, crc32c(bytes(b[at - 45:at + 3])))
            f.seek(0)
            f.write(b)
        p = run("dump", "--db", db, "--projection", "order-totals", check=False, timeout=60)
        self.assert_clean_exit(p, 2)
        self.assertIn("projection 'order-totals': a row's stored state", p.stderr)
        self.assertIn("does not decode", p.stderr)

    def test_a_store_being_created_by_a_killed_process_is_complete_or_absent(self):
        self.gen(self.path("fills.jsonl"), events=300)
        for i in range(30):
            db = self.path(f"db{i}")
            p = start("consume", "--db", db, "--log", self.path("fills.jsonl"))
            time.sleep(0.001 * i)
            p.send_signal(signal.SIGKILL)
            p.communicate()
            data = os.path.join(db, "data.mdb")
            if os.path.exists(data):
                self.assertGreaterEqual(os.path.getsize(data), 2 * 4096, f"a torn data.mdb after a kill at {i} ms")
            run("consume", "--db", db, "--log", self.path("fills.jsonl"))  # the next run goes on
            self.assertEqual([n for n in os.listdir(db) if n.startswith(".create-")], [])


class fault_outside_the_store_test(operations_case):
    def test_a_sigsegv_outside_the_store_map_is_not_blamed_on_the_store(self):
        # Only a fault inside the store's map says the store is damaged; any other SIGSEGV (here
        # one sent by kill, without a faulting address) ends the process by the signal, and the
        # store is left sound.
        expected = self.gen(self.path("fills.jsonl"))
        db = self.path("db")
        follower = start("consume", "--db", db, "--log", self.path("fills.jsonl"), "--follow")
        try:
            self.wait_until_consumed(db, self.path("fills.jsonl"), follower)
            os.kill(follower.pid, signal.SIGSEGV)
            _, err = follower.communicate(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.communicate()
        self.assertEqual(follower.returncode, -signal.SIGSEGV, err)
        self.assertNotIn("damaged", err)
        self.assert_rows_match(db, expected)
        self.assertEqual(run("verify", "--store", "--db", db).returncode, 0)


class full_disk_test(operations_case):
    def test_freed_space_lets_the_same_store_go_on(self):
        expected = self.gen(self.path("fills.jsonl"), events=20000, aggregates=500)
        disk = self.tmpfs("disk", "32m")
        db = os.path.join(disk, "db")
        half = self.path("half.jsonl")
        with open(self.path("fills.jsonl"), "rb") as f:
            lines = f.readlines()
        with open(half, "wb") as f:
            f.writelines(lines[: len(lines) // 2])
        run("consume", "--db", db, "--log", half)
        os.rename(half, self.path("fills-part.jsonl"))
        log = self.path("fills.jsonl")
        filler = self.fill(disk, leave=64 * 1024)
        p = run("consume", "--db", db, "--log", log, "--batch", "50", check=False)
        self.assert_clean_exit(p, 2)
        self.assertIn("No space left on device", p.stderr)
        os.remove(filler)
        run("consume", "--db", db, "--log", log, "--batch", "50")
        self.assert_rows_match(db, expected)

    def test_rebuild_verify_and_new_stores_on_a_full_disk_exit_2_and_leave_nothing(self):
        expected = self.gen(self.path("fills.jsonl"), events=3000, aggregates=200)
        disk = self.tmpfs("disk", "8m")
        filler = self.fill(disk, leave=16 * 1024)
        db = os.path.join(disk, "db")
        for args in (["rebuild", "--db", db, "--log", self.path("fills.jsonl")],
                     ["consume", "--db", db, "--log", self.path("fills.jsonl")]):
            p = run(*args, check=False)
            self.assert_clean_exit(p, 2)
            self.assertIn("No space left on device", p.stderr)
        leftover = sorted(n for n in os.listdir(disk) if n != "filler")
        self.assertIn(leftover, ([], ["db"]))
        if "data.mdb" in os.listdir(db):  # created whole, or not at all
            self.assertGreaterEqual(os.path.getsize(os.path.join(db, "data.mdb")), 2 * 4096)
        os.remove(filler)
        run("consume", "--db", db, "--log", self.path("fills.jsonl"))  # the same store, once there is room
        self.assert_rows_match(db, expected)
        shutil.rmtree(db)
        # verify builds aside on the store's disk.
        good = self.path("good")
        run("rebuild", "--db", good, "--log", self.path("fills.jsonl"))
        small = self.tmpfs("small", "8m")
        shutil.copytree(good, os.path.join(small, "db"))
        self.fill(small, leave=16 * 1024)
        p = run("verify", "--db", os.path.join(small, "db"), "--log", self.path("fills.jsonl"), check=False)
        self.assert_clean_exit(p, 2)
        self.assertIn("No space left on device", p.stderr)
        self.assertEqual(sorted(n for n in os.listdir(small) if n != "filler"), ["db"])

    def test_a_read_only_file_system_is_named_and_readers_still_read(self):
        expected = self.gen(self.path("fills.jsonl"), events=1000, aggregates=100)
        disk = self.tmpfs("disk", "32m")
        db = os.path.join(disk, "db")
        run("consume", "--db", db, "--log", self.path("fills.jsonl"))
        if subprocess.run(["mount", "-o", "remount,ro", disk], capture_output=True).returncode != 0:
            self.skipTest("cannot remount the tmpfs read-only")
        for args in (["consume", "--db", db, "--log", self.path("fills.jsonl")],
                     ["prune", "--db", db, "--older-than", "1d"],
                     ["rebuild", "--db", os.path.join(disk, "other"), "--log", self.path("fills.jsonl")]):
            p = run(*args, check=False)
            self.assert_clean_exit(p, 2)
            self.assertIn("Read-only file system", p.stderr)
        self.assert_rows_match(db, expected)


if __name__ == "__main__":
    IDEM = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
