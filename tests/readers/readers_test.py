#!/usr/bin/env python3
"""Concurrent readers: one writer and four reader processes over one environment, killed at random.

`idem consume --follow` (the writer) tails a log that this script appends a generated log
to at a steady rate; four `reader_check` processes open the environment read-only and
check invariants on every snapshot (see reader_check.cpp). Readers are SIGKILLed at random
moments (hundreds of times) and restarted, each no lower than the commit and checkpoint
the others already saw; the writer is SIGKILLed at random moments and restarted (it
resumes from its checkpoint). Then:

- no reader ever reported a violation or an error (READERS_FULL among them), while one
  more reader that tears its reads on purpose (counters and tables from two snapshots)
  was caught, which shows the invariants can catch a torn read;
- the reader table stayed small: slots of killed readers were reclaimed (LMDB never
  reclaims them by itself; a reader table that only grew would reach its 512 slots);
- data.mdb never grew past a bound derived from the same log consumed without kills;
- the writer's counters equal what `idem gen` predicted, and every projection's dump
  equals an uninterrupted `idem rebuild` of the same log.

usage: readers_test.py IDEM READER_CHECK [--seconds S] [--long] [--seed N] [--domain D] [--keep]
       readers_test.py IDEM READER_CHECK --orphaned [--seed N] [--keep]

--long: a soak of 600 s (instead of 60 s) over a larger log.
--orphaned: readers killed inside a snapshot and not restarted: only the writer runs on,
  and it must reclaim their slots, or their snapshots pin the pages every later commit
  frees and the file grows with every commit. Exits 77 (skipped) with a message while the
  writer does not reclaim them (a known bug); 0 once it does.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
PROJECTIONS = ["order-totals", "positions", "leaderboard", "inventory"]
OUTCOMES = ["applied", "duplicate_message", "duplicate_event", "parked", "dead_lettered", "ignored", "released"]
MiB = 1 << 20


class failure(Exception):
    pass


def run(*args, timeout=600):
    p = subprocess.run([*map(str, args)], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise failure(f"{' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p.stdout


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class shared_view:
    """What the readers saw so far: a restarted reader must see no less."""

    def __init__(self):
        self.lock = threading.Lock()
        self.commit = 0
        self.checkpoint = 0
        self.records = 0

    def update(self, fields):
        with self.lock:
            c, p, r = int(fields["commit"]), int(fields["checkpoint"]), int(fields["records"])
            self.commit = max(self.commit, c)
            if p > self.checkpoint:
                self.checkpoint, self.records = p, r

    def floor(self):
        with self.lock:
            return self.commit, self.checkpoint, self.records


class reader:
    """One reader_check process; its stdout is parsed as it goes."""

    count = 0

    def __init__(self, t, pause_ms):
        reader.count += 1
        self.t = t
        self.number = reader.count
        self.stderr_path = os.path.join(t.dir, f"reader-{self.number}.err")
        commit, checkpoint, records = t.view.floor()
        args = [t.reader_check, "--db", t.db, "--log", t.log, "--pause-ms", pause_ms,
                "--min-commit", commit, "--seed", t.rng.getrandbits(62) + 1]
        if checkpoint:
            args += ["--min-checkpoint", checkpoint, "--records-before", records]
        with open(self.stderr_path, "wb") as err:
            self.p = subprocess.Popen([*map(str, args)], stdout=subprocess.PIPE, stderr=err, text=True)
        t.procs.append(self.p)
        self.last = {}
        self.thread = threading.Thread(target=self.follow, daemon=True)
        self.thread.start()

    def follow(self):
        for line in self.p.stdout:
            words = line.split()
            if not words:
                continue
            fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            fields["state"] = words[0]
            self.last = fields
            if words[0] in ("progress", "done"):
                self.t.view.update(fields)

    def wait_running(self, timeout=60):
        """Waits for its first progress line: it has opened the environment (reclaiming dead
        readers' slots) and handles SIGTERM."""
        deadline = time.monotonic() + timeout
        while not self.last and self.p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def finish(self, sig):
        """Stops it with sig (SIGKILL or SIGTERM) and returns how it ended."""
        if sig == signal.SIGTERM:
            self.wait_running()
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            raise failure(f"reader {self.number} (pid {self.p.pid}) did not stop on signal {sig}")
        self.thread.join(timeout=10)
        with open(self.stderr_path, errors="replace") as f:
            err = f.read()
        os.unlink(self.stderr_path)
        self.t.snapshots += int(self.last.get("snapshots", 0))
        self.t.opens += int(self.last.get("opens", 0))
        expected = -signal.SIGKILL if sig == signal.SIGKILL else 0
        if err.strip() or self.p.returncode not in (expected, 0):
            raise failure(f"reader {self.number} (pid {self.p.pid}) exited {self.p.returncode}: {err.strip()}")


class writer:
    """`idem consume --follow` over the live log."""

    def __init__(self, t):
        self.t = t
        self.out = open(os.path.join(t.dir, "writer.out"), "ab")
        self.err_path = os.path.join(t.dir, "writer.err")
        self.err = open(self.err_path, "wb")
        self.p = subprocess.Popen([t.idem, "consume", "--db", t.db, "--log", t.log, "--follow"],
                                  stdout=self.out, stderr=self.err)
        t.procs.append(self.p)

    def wait_running(self, timeout=60):
        """Waits until it holds the store's writer lock (its pid is in idem.lock): by then it
        handles SIGTERM, which it installs before opening the store."""
        lock = os.path.join(self.t.db, "idem.lock")
        deadline = time.monotonic() + timeout
        while self.p.poll() is None and time.monotonic() < deadline:
            try:
                with open(lock) as f:
                    if f.readline().strip() == str(self.p.pid):
                        return
            except FileNotFoundError:
                pass
            time.sleep(0.01)

    def finish(self, sig):
        if sig == signal.SIGTERM:
            self.wait_running()
        if self.p.poll() is None:
            self.p.send_signal(sig)
        self.p.wait(timeout=120)
        self.out.close()
        self.err.close()
        if sig == signal.SIGTERM and self.p.returncode != 0:
            with open(self.err_path, errors="replace") as f:
                raise failure(f"the writer exited {self.p.returncode}: {f.read()}")

    def check_alive(self):
        if self.p.poll() is not None:
            with open(self.err_path, errors="replace") as f:
                raise failure(f"the writer exited {self.p.returncode} by itself: {f.read()}")


class feeder:
    """Appends the generated log to the live log at a steady rate, sometimes half a line at a time."""

    def __init__(self, source, target, seconds, rng):
        with open(source, "rb") as f:
            self.lines = f.read().splitlines(keepends=True)
        self.out = open(target, "wb")
        self.seconds = seconds
        self.rng = rng
        self.next = 0
        self.pending = b""  # the second half of a line written in two steps
        self.started = time.monotonic()

    def done(self):
        return self.next == len(self.lines) and not self.pending

    def step(self):
        due = len(self.lines) if self.seconds <= 0 else \
            min(len(self.lines), int(len(self.lines) * (time.monotonic() - self.started) / self.seconds))
        if self.pending:
            self.out.write(self.pending)
            self.pending = b""
        if due > self.next:
            chunk = b"".join(self.lines[self.next:due])
            self.next = due
            if self.rng.random() < 0.3 and len(chunk) > 2:
                cut = len(chunk) - self.rng.randrange(1, min(len(chunk) - 1, 200))
                chunk, self.pending = chunk[:cut], chunk[cut:]
            self.out.write(chunk)
        self.out.flush()

    def close(self):
        self.out.close()


class readers_test:
    def __init__(self, a):
        self.idem = os.path.abspath(a.idem)
        self.reader_check = os.path.abspath(a.reader_check)
        self.rng = random.Random(a.seed)
        self.dir = tempfile.mkdtemp(prefix="idem-readers-")
        self.db = os.path.join(self.dir, "db")
        self.log = os.path.join(self.dir, "live.jsonl")
        self.all = os.path.join(self.dir, "all.jsonl")
        self.view = shared_view()
        self.snapshots = 0
        self.opens = 0
        self.procs = []  # every process started, killed if still running when the test ends
        self.a = a

    def kill_leftovers(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def wait_first_commit(self, w, feed=None):
        """Waits until the writer committed once, so readers open a complete environment."""
        deadline = time.monotonic() + 60
        while True:
            w.check_alive()
            if feed:
                feed.step()
            if file_size(os.path.join(self.db, "data.mdb")) > 0:
                p = subprocess.run([self.idem, "stats", "--db", self.db], capture_output=True, text=True)
                if p.returncode == 0 and json.loads(p.stdout)["commit"] > 0:
                    return
            if time.monotonic() > deadline:
                raise failure("the writer made no commit within 60 s")
            time.sleep(0.05)

    def path(self, name):
        return os.path.join(self.dir, name)

    def gen(self, events, aggregates):
        return json.loads(run(self.idem, "gen", "--out", self.all, "--domain", self.a.domain, "--events", events,
                              "--aggregates", aggregates, "--malformed", "0.001", "--seed", self.a.seed))

    def slots(self):
        return json.loads(run(self.reader_check, "--slots", self.db))

    def dumps(self, db):
        return {p: run(self.idem, "dump", "--db", db, "--projection", p) for p in PROJECTIONS}

    def baseline(self):
        """The same log consumed without kills, with four readers: the file size to compare against."""
        base = self.path("baseline")
        saved_db, saved_log = self.db, self.log
        self.db, self.log = base, self.path("baseline.jsonl")
        shutil.copyfile(self.all, self.log)
        w = writer(self)
        self.wait_first_commit(w)
        readers = [reader(self, 2) for _ in range(4)]
        biggest = 0
        while self.view.floor()[1] < file_size(self.log):
            w.check_alive()
            biggest = max(biggest, file_size(os.path.join(base, "data.mdb")))
            time.sleep(0.05)
        w.finish(signal.SIGTERM)
        for r in readers:
            r.finish(signal.SIGTERM)
        biggest = max(biggest, file_size(os.path.join(base, "data.mdb")))
        self.db, self.log = saved_db, saved_log
        self.view = shared_view()
        shutil.rmtree(base)
        os.unlink(self.path("baseline.jsonl"))
        return biggest

    # --- the main test ----------------------------------------------------------------------

    def stress(self):
        a = self.a
        seconds = a.seconds or (600 if a.long else 60)
        events, aggregates = (1_000_000, 5000) if a.long else (120_000, 2000)
        expected = self.gen(events, aggregates)
        print(f"log: {expected['lines']} lines, {file_size(self.all) / MiB:.1f} MiB ({a.domain}, seed {a.seed})",
              flush=True)
        base_size = self.baseline()
        print(f"baseline (no kills, four readers): data.mdb at most {base_size / MiB:.1f} MiB", flush=True)

        feed = feeder(self.all, self.log, seconds * 0.85, self.rng)
        feed.step()
        w = writer(self)
        self.wait_first_commit(w, feed)
        readers = [None] * 4
        deaths = [0.0] * 4
        reader_kills = writer_kills = massacres = 0
        max_slots = {"high_water": 0, "used": 0, "dead": 0, "dead_pinning": 0}
        max_size = 0
        started = time.monotonic()
        next_writer_kill = started + self.rng.uniform(1, 4)
        next_massacre = started + self.rng.uniform(5, 15)
        next_slots = started
        writer_down_until = None
        # A reader that tears its reads on purpose (counters from a later snapshot than the
        # tables): the invariants must catch it, or they could not catch a real torn read.
        tear, tear_caught = None, None
        tear_at = started + min(10, seconds / 4)
        while time.monotonic() - started < seconds:
            now = time.monotonic()
            if tear is None and tear_caught is None and now >= tear_at:
                tear_err = open(self.path("tear.err"), "w+")
                tear = subprocess.Popen([self.reader_check, "--db", self.db, "--log", self.log, "--tear",
                                         "--pause-ms", "10"], stdout=subprocess.DEVNULL, stderr=tear_err, text=True)
                self.procs.append(tear)
            if tear is not None and tear.poll() is not None:
                tear_err.seek(0)
                message = tear_err.read().strip()
                if tear.returncode != 1 or "VIOLATION" not in message:
                    raise failure(f"the reader tearing its reads on purpose exited {tear.returncode}: {message}")
                tear_caught = f"{now - tear_at:.1f} s: {message}"
                tear = None
            feed.step()
            if writer_down_until is not None:
                if now >= writer_down_until:
                    w = writer(self)
                    writer_down_until = None
                    next_writer_kill = now + self.rng.uniform(1, 4)
            elif now >= next_writer_kill:
                w.finish(signal.SIGKILL)
                writer_kills += 1
                writer_down_until = now + self.rng.uniform(0, 0.5)
            else:
                w.check_alive()
            if now >= next_massacre:
                for i, r in enumerate(readers):
                    if r:
                        r.finish(signal.SIGKILL)
                        readers[i] = None
                        reader_kills += 1
                massacres += 1
                next_massacre = now + self.rng.uniform(5, 15)
            for i in range(4):
                if readers[i] is None:
                    readers[i] = reader(self, 10)
                    deaths[i] = now + self.rng.uniform(0.05, 1.2)
                elif now >= deaths[i]:
                    readers[i].finish(signal.SIGKILL)
                    readers[i] = None
                    reader_kills += 1
            if now >= next_slots:
                s = self.slots()
                for k in max_slots:
                    max_slots[k] = max(max_slots[k], s[k])
                next_slots = now + 1
            max_size = max(max_size, file_size(os.path.join(self.db, "data.mdb")))
            time.sleep(0.02)

        # Let the writer (restarted if it is down) catch up with the whole log, then stop everything.
        for i in range(4):
            if readers[i] is None:
                readers[i] = reader(self, 10)
        while not feed.done():
            feed.step()
        feed.close()
        if writer_down_until is not None:
            w = writer(self)
        deadline = time.monotonic() + 120
        while self.view.floor()[1] < file_size(self.log):
            w.check_alive()
            if time.monotonic() > deadline:
                raise failure(f"the writer did not reach the log's end ({self.view.floor()[1]} of "
                              f"{file_size(self.log)} bytes) within 120 s")
            max_size = max(max_size, file_size(os.path.join(self.db, "data.mdb")))
            time.sleep(0.05)
        w.finish(signal.SIGTERM)
        for r in readers:
            r.finish(signal.SIGTERM)
        max_size = max(max_size, file_size(os.path.join(self.db, "data.mdb")))
        final_slots = self.slots()
        if tear_caught is None:
            raise failure("a reader tearing its reads on purpose (counters from a later snapshot than the "
                          "tables) was not caught: the invariants are too weak to catch a torn read")
        print(f"a torn read made on purpose was caught after {tear_caught}", flush=True)

        bound = 2 * base_size + 16 * MiB
        figures = {"kill_seconds": seconds, "seconds_with_catch_up": round(time.monotonic() - started, 1),
                   "reader_kills": reader_kills,
                   "all_readers_killed_at_once": massacres, "writer_kills": writer_kills,
                   "snapshots_checked": self.snapshots, "reader_opens": self.opens,
                   "last_commit": self.view.floor()[0], "max_reader_slots": max_slots,
                   "data_mdb_max_mib": round(max_size / MiB, 1), "baseline_max_mib": round(base_size / MiB, 1),
                   "bound_mib": round(bound / MiB, 1)}
        print(json.dumps(figures), flush=True)

        # The reader table: killed readers' slots were reclaimed (four live readers, the driver's
        # slot census and the writer's own snapshots need only a few).
        if max_slots["high_water"] > 32 or final_slots["dead_pinning"] > 0:
            raise failure(f"killed readers' slots were not reclaimed: {max_slots}, at the end {final_slots}")
        if max_size > bound:
            raise failure(f"data.mdb grew to {max_size / MiB:.1f} MiB, past {bound / MiB:.1f} MiB "
                          f"(twice the {base_size / MiB:.1f} MiB of the run without kills, plus 16 MiB)")
        if self.snapshots < 100 or reader_kills < 10:
            raise failure(f"too little happened to tell: {figures}")

        stats = json.loads(run(self.idem, "stats", "--db", self.db))
        for k in OUTCOMES:
            if stats["outcomes"].get(k, 0) != expected["outcomes"].get(k, 0):
                raise failure(f"outcome {k}: {stats['outcomes'].get(k, 0)}, the generator expects "
                              f"{expected['outcomes'].get(k, 0)}")
        ref = self.path("rebuilt")
        run(self.idem, "rebuild", "--db", ref, "--log", self.log)
        got, want = self.dumps(self.db), self.dumps(ref)
        for p in PROJECTIONS:
            if got[p] != want[p]:
                raise failure(f"projection {p} differs from an uninterrupted rebuild of the same log")
        print(f"ok: {reader_kills} reader kills, {writer_kills} writer kills, {self.snapshots} snapshots checked "
              f"without a violation; data.mdb at most {max_size / MiB:.1f} MiB (no kills: {base_size / MiB:.1f}); "
              f"the dumps equal a rebuild's", flush=True)
        return 0

    # --- readers that die inside a snapshot and are not replaced ----------------------------

    def orphaned(self):
        a = self.a
        expected = self.gen(60_000, 2000)
        period = 6.0  # seconds of each phase
        feed = feeder(self.all, self.log, 3 * period + 2, self.rng)
        feed.step()
        w = writer(self)
        self.wait_first_commit(w, feed)
        data = os.path.join(self.db, "data.mdb")

        def phase(seconds):
            start, end = file_size(data), time.monotonic() + seconds
            while time.monotonic() < end:
                feed.step()
                w.check_alive()
                time.sleep(0.02)
            return file_size(data) - start

        # Phase 1: four readers that live on (the file grows with the data only).
        readers = [reader(self, 0) for _ in range(4)]
        grown_alive = phase(period)
        # Kill all four inside a snapshot (they spend nearly all their time in one); try again
        # if none was caught holding one.
        pinning = 0
        for attempt in range(20):
            for r in readers:
                r.finish(signal.SIGKILL)
            pinning = self.slots()["dead_pinning"]
            if pinning:
                break
            readers = [reader(self, 0) for _ in range(4)]
            time.sleep(0.3)
        if not pinning:
            raise failure("no reader could be killed inside a snapshot")
        # Phase 2: only the writer runs; it should reclaim the dead readers' slots.
        grown_orphaned = phase(period)
        after = self.slots()
        # Phase 3: a new reader opens the environment, which reclaims them.
        readers = [reader(self, 0)]
        time.sleep(0.5)
        reclaimed = self.slots()
        grown_reclaimed = phase(period)
        while not feed.done():
            feed.step()
        feed.close()
        while self.view.floor()[1] < file_size(self.log):
            w.check_alive()
            time.sleep(0.05)
        w.finish(signal.SIGTERM)
        readers[0].finish(signal.SIGTERM)
        stats = json.loads(run(self.idem, "stats", "--db", self.db))
        for k in OUTCOMES:
            if stats["outcomes"].get(k, 0) != expected["outcomes"].get(k, 0):
                raise failure(f"outcome {k}: {stats['outcomes'].get(k, 0)}, the generator expects "
                              f"{expected['outcomes'].get(k, 0)}")
        figures = {"dead_slots_pinning_at_kill": pinning, "after_writer_alone": after,
                   "after_a_reader_opened": reclaimed,
                   "growth_mib_per_phase": {"readers_alive": round(grown_alive / MiB, 2),
                                            "dead_readers_pinning": round(grown_orphaned / MiB, 2),
                                            "after_reclaim": round(grown_reclaimed / MiB, 2)},
                   "phase_seconds": period}
        print(json.dumps(figures), flush=True)
        if reclaimed["dead_pinning"] != 0:
            raise failure(f"opening the environment did not reclaim the dead readers' slots: {reclaimed}")
        if after["dead_pinning"] == 0 and grown_orphaned > 2 * grown_alive + 4 * MiB:
            raise failure(f"the writer reclaimed the dead readers' slots, yet data.mdb grew "
                          f"{grown_orphaned / MiB:.2f} MiB in {period:.0f} s (readers alive: {grown_alive / MiB:.2f})")
        if after["dead_pinning"] != 0:
            print(f"KNOWN BUG (test skipped): readers SIGKILLed inside a snapshot keep their LMDB reader "
                  f"slots ({after['dead_pinning']} still pinning txn {after['oldest_dead_txnid']} while the "
                  f"writer is at txn {after['last_txnid']}, {period:.0f} s later): the writer never calls "
                  f"mdb_reader_check after it opened the environment, so until another process opens it, every "
                  f"page freed since is pinned and data.mdb grew {grown_orphaned / MiB:.2f} MiB in {period:.0f} s "
                  f"(readers alive: {grown_alive / MiB:.2f} MiB; after a reader's open reclaimed them: "
                  f"{grown_reclaimed / MiB:.2f} MiB).", flush=True)
            return SKIP
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("idem")
    ap.add_argument("reader_check")
    ap.add_argument("--seconds", type=float, default=0, help="how long readers and the writer are killed")
    ap.add_argument("--long", action="store_true", help="a 600 s soak over a larger log")
    ap.add_argument("--orphaned", action="store_true", help="readers killed inside a snapshot, not restarted")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("IDEM_READERS_SEED", "1")))
    ap.add_argument("--domain", default="trading", choices=["trading", "orders", "game"])
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    a = ap.parse_args()
    t = readers_test(a)
    status = 1
    try:
        status = t.orphaned() if a.orphaned else t.stress()
    except failure as e:
        print(f"FAILED: {e}", flush=True)
    finally:
        t.kill_leftovers()
        if a.keep or status not in (0, SKIP):
            print(f"kept {t.dir}", flush=True)
        else:
            shutil.rmtree(t.dir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
