#!/usr/bin/env python3
"""Crash tests: the `idem` binary and the in-process engine killed at every named crash
point (IDEM_CRASH_AT=<point>:<N>, storage/internal/idem/storage/crash_point.hpp) and at
random moments, the state on disk checked after every kill (tests/crash/README.md).

usage: crash_test.py PATH/TO/idem PATH/TO/engine_crash [--points-from crash_point.hpp]
                     [--long] [--minutes M] [--seed S] [--jobs J] [--work DIR] [--keep]

After each kill of `idem consume` the dumps must be byte-identical to a reference made by
consuming the log cut at the checkpoint reached into a fresh environment (cached by
offset), the counters must equal the reference's and add up to the records before the
checkpoint, and the rows must be well formed; the run is then restarted with the next
crash armed until the log is consumed completely, which must give what an uninterrupted
`idem rebuild` gives. A killed `idem rebuild` must leave its target old or new and
complete, and a rerun the new state. The engine (engine_crash) checks every
acknowledged record after each restart itself.
"""

import argparse
import bisect
import concurrent.futures
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

IDEM = None
ENGINE = None

OUTCOMES = ["applied", "duplicate_message", "duplicate_event", "parked", "dead_lettered", "ignored", "released"]

# The points as crash_point.hpp lists them when this was written; --points-from adds any
# the header lists later. A point no run reaches is reported as not hit, not as a failure.
POINTS = ["after_decode", "mid_batch", "before_commit", "after_commit", "during_prune", "during_map_resize",
          "during_swap", "after_swap", "after_lock", "during_create"]
# The points a consume across a log rotation is killed at (rotation_chain).
ROTATION_POINTS = ["after_rotated_log", "mid_batch", "after_commit"]
# These are on every batch's path: a run that never reaches one has lost its instrumentation.
CORE_POINTS = ["after_decode", "mid_batch", "before_commit", "after_commit"]

PROJECTIONS = {"trading": ["positions"], "game": ["leaderboard", "inventory"], "orders": ["order-totals"]}

# Sizes: events per log, aggregates, records per consume batch, the crash schedule N = 1..k,
# random kills per consume scenario, engine submitters.
CI = {"events": 500, "aggregates": 30, "batch": {"trading": 3, "game": 4, "orders": 3}, "k": 6,
      "random_kills": 15, "rebuild_k": 4, "engine_submitters": [2, 8]}
LONG = {"events": 2000, "aggregates": 80, "batch": {"trading": 5, "game": 7, "orders": 4}, "k": 10,
        "random_kills": 60, "rebuild_k": 10, "engine_submitters": [1, 4, 16]}


class divergence(Exception):
    """A state that must not be: the message names what differed and how to rerun it."""


def run(args, env=None, check=True, timeout=600):
    """Runs a program; returns the CompletedProcess (stdout/stderr as bytes)."""
    p = subprocess.run(list(map(str, args)), capture_output=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise divergence(f"{shlex.join(map(str, args))} exited {p.returncode}\n"
                         f"stderr: {p.stderr.decode(errors='replace')}")
    return p


def idem(*args, **kw):
    return run([IDEM, *args], **kw)


def command_text(args, crash=None):
    """The exact command line, with its crash point, for a rerun by hand."""
    prefix = f"IDEM_CRASH_AT={crash} " if crash else ""
    return prefix + shlex.join(map(str, args))


def armed(crash):
    env = dict(os.environ)
    env.pop("IDEM_CRASH_AT", None)
    if crash:
        env["IDEM_CRASH_AT"] = crash
    return env


def kill_at_random(args, delay):
    """Starts args with no crash point armed and SIGKILLs its process group after delay
    seconds (None: lets it finish); returns (exit status, stderr)."""
    p = subprocess.Popen(list(map(str, args)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=armed(None),
                         start_new_session=True)
    try:
        p.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
    err = p.communicate()[1]
    try:
        os.killpg(p.pid, signal.SIGKILL)  # a child it forked may outlive it
    except ProcessLookupError:
        pass
    return p.returncode, err


class random_delays:
    """Delays for kills from outside: uniform up to how long a whole run took (first a
    guess), until `kills` kills; iterate, call next() for each run, then killed() or
    finished(from_scratch)."""

    def __init__(self, rng, kills):
        self.rng, self.left, self.longest, self.last, self.runs = rng, kills, 0.2, 0.0, 0

    def __iter__(self):
        while self.left > 0:
            self.runs += 1
            if self.runs > 20 * (self.left + 5):
                raise divergence("runs keep finishing before a random kill")
            yield self

    def next(self):
        self.last = self.rng.uniform(0.0, self.longest)
        return self.last

    def killed(self):
        self.left -= 1

    def finished(self, from_scratch):
        if from_scratch:
            self.longest = max(0.02, 0.9 * self.last)


def points_from_header(path):
    """The point names listed in crash_point.hpp's comment ("//   name   what it is")."""
    names, listing = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if "The points" in line:
                listing = True
                continue
            if listing:
                m = re.match(r"//\s{2,}([a-z_]+)\s{2,}\S", line)
                if not m:
                    break
                names.append(m.group(1))
    return names


class tally:
    """Thread-safe counters of kills, restarts and divergences."""

    def __init__(self):
        self.lock = threading.Lock()
        self.kills = {}          # (mode, point) -> kills
        self.kills_by_n = {}     # (mode, point) -> {N: kills}
        self.completions = {}    # (mode, point) -> armed runs that ended normally (the point hit < N times)
        self.restarts = 0
        self.references = 0
        self.divergences = []
        self.knowns = {}         # kind -> [count, first example]

    def kill(self, mode, point, n=None):
        with self.lock:
            self.kills[(mode, point)] = self.kills.get((mode, point), 0) + 1
            if n is not None:
                by_n = self.kills_by_n.setdefault((mode, point), {})
                by_n[n] = by_n.get(n, 0) + 1
            self.restarts += 1

    def known(self, kind, example):
        """A deviation that is understood and reported, not failed (README.md, "Known deviations")."""
        with self.lock:
            entry = self.knowns.setdefault(kind, [0, example])
            entry[0] += 1

    def completed(self, mode, point):
        with self.lock:
            self.completions[(mode, point)] = self.completions.get((mode, point), 0) + 1

    def diverged(self, text):
        with self.lock:
            self.divergences.append(text)
        print("DIVERGENCE:\n" + text, file=sys.stderr, flush=True)

    def total(self):
        with self.lock:
            return sum(self.kills.values())


class crash_schedule:
    """N for successive runs of a chain: 1, 2, .., k, 1, ..; after 2k kills in a row that
    got nowhere (N too small to pass one commit and its acknowledgement), N rises by k, and
    falls back when the chain moves again. A chain stuck for good is a divergence."""

    def __init__(self, k):
        self.k, self.i, self.bump, self.last, self.same = k, 0, 0, None, 0

    def next(self):
        n = self.i % self.k + 1 + self.bump
        self.i += 1
        return n

    def step(self, position, what):
        if position == self.last:
            self.same += 1
            if self.same % (2 * self.k) == 0:
                self.bump += self.k
            if self.same >= 20 * self.k:
                raise divergence(f"{what}: {self.same + 1} kills in a row without progress (stuck at {position})")
        else:
            self.same, self.bump = 0, 0
        self.last = position


class log_file:
    """A generated log: its bytes, where its records end, and what `idem gen` promised."""

    def __init__(self, path, domain, seed, expected, batch):
        self.path, self.domain, self.seed, self.expected, self.batch = path, domain, seed, expected, batch
        with open(path, "rb") as f:
            self.content = f.read()
        self.ends, self.records = [], []  # end offset of every line; record count up to it
        n, start = 0, 0
        while start < len(self.content):
            nl = self.content.find(b"\n", start)
            end = len(self.content) if nl < 0 else nl + 1
            if self.content[start:end].rstrip(b"\r\n"):
                n += 1
            self.ends.append(end)
            self.records.append(n)
            start = end
        self.projections = PROJECTIONS[domain]

    def records_before(self, offset):
        """Records that end at or before offset."""
        i = bisect.bisect_right(self.ends, offset)
        return self.records[i - 1] if i else 0

    def at_record_end(self, offset):
        return offset == 0 or (offset <= len(self.content) and self.content[offset - 1:offset] == b"\n") or \
            offset == len(self.content)


def torn_creation(db):
    """Whether a kill while the environment was being created left a data.mdb shorter than
    LMDB's two meta pages. idem makes a new data file aside and renames it in once complete,
    so this must never be seen: an existing data.mdb that short is refused as damaged."""
    f = os.path.join(db, "data.mdb")
    return os.path.exists(f) and 0 < os.path.getsize(f) < 2 * os.sysconf("SC_PAGE_SIZE")


def empty_environment(db):
    """Whether idem's read commands refuse db as holding no tables: a kill after LMDB
    created the environment and before the first transaction created the projections'
    tables (README.md, "Known deviations"); the next writer creates them."""
    p = idem("stats", "--db", db, check=False)
    return p.returncode == 2 and b"unknown projection" in p.stderr, p.stderr.decode(errors="replace").strip()


def read_state(db, projections):
    """The stats and the dumps of an environment; None if the directory holds none."""
    f = os.path.join(db, "data.mdb")
    if not os.path.exists(f) or os.path.getsize(f) == 0:  # killed before LMDB wrote anything
        return None
    stats = json.loads(idem("stats", "--db", db).stdout)
    dumps = {p: idem("dump", "--db", db, "--projection", p).stdout for p in projections}
    return {"stats": stats, "dumps": dumps, "changes": idem("changes", "--db", db).stdout}


def feed_problems(state):
    """The change feed is committed with the rows: in position order, versions rising per row, and
    what a follower ends with (the last entry per row, after the last reset of its projection) is
    the row; with no reset, every row is in it."""
    problems = []
    entries = [json.loads(line) for line in state["changes"].decode().splitlines()]
    positions = [tuple(map(int, e["position"].split("."))) for e in entries]
    if positions != sorted(set(positions)):
        problems.append("change feed: positions not strictly increasing")
    followed, reset = {}, set()
    for e in entries:
        p = e["projection"]
        if e["kind"] == "reset":
            reset.add(p)
            followed = {k: v for k, v in followed.items() if k[0] != p}
            continue
        last = followed.get((p, e["key"]))
        if last is not None and e["version"] <= last["version"]:
            problems.append(f"change feed: {p}/{e['key']} version {e['version']} after {last['version']}")
        followed[(p, e["key"])] = e
    for p, text in state["dumps"].items():
        rows = {r["key"]: r for r in (json.loads(line) for line in text.decode().splitlines())}
        for (q, key), e in followed.items():
            if q != p:
                continue
            row = rows.get(key)
            if row is None or (row["version"], row["state"]) != (e["version"], e["state"]):
                problems.append(f"change feed: {p}/{key} ends at version {e['version']}, the row is "
                                f"{row and row['version']}")
                break
        if p not in reset and len([k for k in followed if k[0] == p]) != len(rows):
            problems.append(f"change feed: {p} has {len(rows)} rows, the feed changed "
                            f"{len([k for k in followed if k[0] == p])}")
    return problems


def checkpoint_of(state, log):
    if state is None:
        return 0
    source = "log:" + os.path.abspath(log.path)
    for c in state["stats"].get("checkpoints", []):
        if c["source"] == source:
            return c["position"]
    return 0


def counters(state, with_batches=True):
    """What two states that hold the same events must agree on."""
    if state is None:
        return None
    s = state["stats"]
    out = {"outcomes": {k: s["outcomes"].get(k, 0) for k in OUTCOMES}, "inbox_size": s["inbox_size"],
           "parked": s["parked"], "dead_letters": s["dead_letters"], "projections": s["projections"]}
    if with_batches:
        out["batches"] = s["batches"]
    r = s.get("retention")
    if isinstance(r, dict):
        for k in ("pruned_ids", "pruned_contributors", "late_events"):
            if k in r:
                out[k] = r[k]
    return out


def invariants(state, log, offset, pruning):
    """What must hold in any state with its checkpoint at offset, whatever the reference says."""
    problems = []
    if not log.at_record_end(offset):
        problems.append(f"the checkpoint {offset} is not at the end of a record")
    if state is None:
        return problems
    s = state["stats"]
    o = s["outcomes"]
    delivered = sum(o.get(k, 0) for k in OUTCOMES if k != "released")
    if delivered != log.records_before(offset):
        problems.append(f"outcomes add up to {delivered} deliveries, the log has {log.records_before(offset)} "
                        f"records before offset {offset}")
    if s["dead_letters"] != o.get("dead_lettered", 0):
        problems.append(f"{s['dead_letters']} dead letters stored, {o.get('dead_lettered', 0)} counted")
    if s["parked"] != o.get("parked", 0) - o.get("released", 0):
        problems.append(f"{s['parked']} parked, counters say {o.get('parked', 0) - o.get('released', 0)}")
    r = s.get("retention") if isinstance(s.get("retention"), dict) else {}
    if s["inbox_size"] + r.get("pruned_ids", 0) > delivered - o.get("duplicate_message", 0):
        problems.append(f"inbox holds {s['inbox_size']} ids (+{r.get('pruned_ids', 0)} pruned), more than the "
                        f"{delivered - o.get('duplicate_message', 0)} deliveries that were not duplicate messages")
    contributors = r.get("contributors", {})
    problems += feed_problems(state)
    for p, text in state["dumps"].items():
        rows = [json.loads(line) for line in text.decode().splitlines()]
        keys = [row["key"].encode() for row in rows]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            problems.append(f"{p}: dump keys are not strictly increasing (a key twice, or out of order)")
        if len(rows) != s["projections"].get(p):
            problems.append(f"{p}: {len(rows)} rows dumped, stats counts {s['projections'].get(p)}")
        if any(row["version"] < 1 for row in rows):
            problems.append(f"{p}: a row with version < 1")
        versions = sum(row["version"] for row in rows)
        if p in contributors and not pruning and contributors[p] != versions:
            problems.append(f"{p}: row versions add up to {versions}, the contributing sets hold {contributors[p]} keys")
    return problems


def differences(state, ref, with_batches=True):
    """How state differs from ref (dumps byte for byte, counters); empty if it does not."""
    out = []
    a, b = counters(state, with_batches), counters(ref, with_batches)
    if (a is None) != (b is None):
        return ["one of the two holds no environment"]
    if a is None:
        return out
    for k in b:
        if a.get(k) != b[k]:
            out.append(f"{k}: {a.get(k)} != reference {b[k]}")
    for p in ref["dumps"]:
        if state["dumps"][p] != ref["dumps"][p]:
            la, lb = state["dumps"][p].splitlines(), ref["dumps"][p].splitlines()
            first = next((i for i in range(min(len(la), len(lb))) if la[i] != lb[i]), min(len(la), len(lb)))
            got = la[first].decode(errors="replace") if first < len(la) else "(none)"
            want = lb[first].decode(errors="replace") if first < len(lb) else "(none)"
            out.append(f"{p} dump differs at row {first + 1} ({len(la)} rows vs {len(lb)}):\n"
                       f"      got       {got[:300]}\n      reference {want[:300]}")
    return out


class references:
    """Reference states of one consume scenario by checkpoint offset: the log cut at the
    offset, consumed into a fresh environment with no crash point armed."""

    def __init__(self, work, log, extra, counts):
        self.dir, self.log, self.extra, self.counts = work, log, extra, counts
        self.lock = threading.Lock()
        self.cache = {}  # offset -> (event, state)
        os.makedirs(work, exist_ok=True)

    def at(self, offset):
        with self.lock:
            entry = self.cache.get(offset)
            owner = entry is None
            if owner:
                entry = [threading.Event(), None]
                self.cache[offset] = entry
        if owner:
            try:
                entry[1] = self.compute(offset)
            finally:
                entry[0].set()
        entry[0].wait()
        if entry[1] is None:
            raise divergence(f"the reference at offset {offset} of {self.log.path} could not be made")
        return entry[1]

    def compute(self, offset):
        prefix = os.path.join(self.dir, f"prefix-{offset}.jsonl")
        db = os.path.join(self.dir, f"db-{offset}")
        with open(prefix, "wb") as f:
            f.write(self.log.content[:offset])
        shutil.rmtree(db, ignore_errors=True)
        idem("consume", "--db", db, "--log", prefix, "--batch", self.log.batch, "--durability", "none", *self.extra)
        state = read_state(db, self.log.projections)
        shutil.rmtree(db, ignore_errors=True)
        os.remove(prefix)
        self.counts.references += 1
        return state


class driver:
    def __init__(self, opts, size, points):
        self.opts, self.size, self.points = opts, size, points
        self.tally = tally()
        self.consume_options = idem("consume", "--help").stdout.decode()

    # --- logs --------------------------------------------------------------------------

    def make_logs(self, work, seed):
        logs = []
        for i, domain in enumerate(PROJECTIONS):
            path = os.path.join(work, f"{domain}.jsonl")
            s = seed * 10 + i
            expected = json.loads(idem("gen", "--out", path, "--domain", domain, "--events", self.size["events"],
                                       "--aggregates", self.size["aggregates"], "--seed", s, "--redeliver", "0.12",
                                       "--republish", "0.04", "--reissue", "0.02", "--reorder", "0.08",
                                       "--malformed", "0.01").stdout)
            logs.append(log_file(path, domain, s, expected, self.size["batch"][domain]))
        return logs

    # --- idem consume ------------------------------------------------------------------

    def consume_args(self, db, log, extra):
        # Small row journals: the killed runs swap and fold them many times, the references
        # (automatic size) never do, and both must give the same bytes.
        return [IDEM, "consume", "--db", db, "--log", log.path, "--batch", log.batch, "--journal-rows", 8, *extra]

    def check_consumed(self, db, log, refs, extra, what):
        """After a kill: the state equals the reference at its checkpoint and keeps the invariants."""
        state = read_state(db, log.projections)
        offset = checkpoint_of(state, log)
        problems = invariants(state, log, offset, bool(extra))
        if state is not None:  # else killed before the environment was made: nothing was committed
            problems += differences(state, refs.at(offset))
        if problems:
            raise divergence(f"{what}\n  checkpoint {offset} of {log.path} (seed {log.seed}), db {db}\n  - " +
                             "\n  - ".join(problems))
        return offset

    def check_complete(self, db, log, refs, full, extra, what):
        """After a run that ended normally: the whole log, as the uninterrupted runs give it."""
        state = read_state(db, log.projections)
        offset = checkpoint_of(state, log)
        problems = invariants(state, log, offset, bool(extra))
        if offset != len(log.content):
            problems.append(f"the run ended at checkpoint {offset}, the log has {len(log.content)} bytes")
        ref = refs.at(len(log.content))
        problems += differences(state, ref)
        problems += [f"vs rebuild: {d}" for d in differences(state, full, with_batches=False)]
        if not extra:
            want = {k: log.expected["outcomes"].get(k, 0) for k in OUTCOMES}
            got = {k: state["stats"]["outcomes"].get(k, 0) for k in OUTCOMES}
            if got != want:
                problems.append(f"outcomes {got} != what idem gen promised {want}")
        if problems:
            raise divergence(f"{what}\n  {log.path} (seed {log.seed}), db {db}\n  - " + "\n  - ".join(problems))

    def consume_chain(self, work, log, refs, full, extra, point):
        """Consumes the log with point armed at N = 1, 2, .., k, 1, .. until a run ends normally."""
        db = os.path.join(work, f"consume-{log.domain}-{point}{'-retention' if extra else ''}")
        shutil.rmtree(db, ignore_errors=True)
        mode = "consume" + ("+retention" if extra else "")
        args = self.consume_args(db, log, extra)
        schedule = crash_schedule(self.size["k"])
        while True:
            n = schedule.next()
            crash = f"{point}:{n}"
            p = run(args, env=armed(crash), check=False)
            what = f"after {command_text(args, crash)}"
            if p.returncode == -signal.SIGKILL:
                schedule.step(self.check_consumed(db, log, refs, extra, what), what)
                self.tally.kill(mode, point, n)
            elif p.returncode == 0:
                self.check_complete(db, log, refs, full, extra, what)
                self.tally.completed(mode, point)
                break
            else:
                raise divergence(f"{what}: exit status {p.returncode}\n{p.stderr.decode(errors='replace')}")
        shutil.rmtree(db, ignore_errors=True)

    def consume_random(self, work, log, refs, full, extra, rng):
        """Kills consume from outside at random moments; a run that finishes first is checked
        complete and the next one starts over, until random_kills kills."""
        db = os.path.join(work, f"random-{log.domain}{'-retention' if extra else ''}")
        mode = "consume" + ("+retention" if extra else "")
        args = self.consume_args(db, log, extra)
        delays = random_delays(rng, self.size["random_kills"])
        shutil.rmtree(db, ignore_errors=True)
        blank = True  # nothing committed yet: the killed run may have been creating the environment
        for delay in delays:
            rc, err = kill_at_random(args, delay.next())
            what = f"after {command_text(args)} killed from outside after {delay.last:.3f} s (seed {self.opts.seed})"
            if torn_creation(db):
                raise divergence(f"{what}: a data.mdb shorter than its two meta pages was left behind")
            if rc == -signal.SIGKILL:
                empty, text = empty_environment(db) if blank else (False, "")
                if empty:
                    self.tally.known("empty environment", f"{what}: {text}")
                else:
                    blank = self.check_consumed(db, log, refs, extra, what) == 0 and \
                        read_state(db, log.projections) is None
                self.tally.kill(mode, "random")
                delay.killed()
            elif rc == 0:
                self.check_complete(db, log, refs, full, extra, what)
                delay.finished(blank)
                shutil.rmtree(db, ignore_errors=True)
                blank = True
            else:
                raise divergence(f"{what}: exit status {rc}\n{err.decode(errors='replace')}")
        if os.path.exists(db):
            p = run(args, env=armed(None), check=False)
            what = f"after {command_text(args)}, the restart after the last random kill (seed {self.opts.seed})"
            if p.returncode != 0:
                raise divergence(f"{what}: exit status {p.returncode}\n{p.stderr.decode(errors='replace')}")
            self.check_complete(db, log, refs, full, extra, what)
        shutil.rmtree(db, ignore_errors=True)

    # --- idem consume across a rotation ------------------------------------------------

    def rotation_chain(self, work, log, full, point):
        """The log's first third consumed from live.jsonl; the second third appended to it, which
        is then renamed to live.jsonl.1; the rest written to a new live.jsonl. Consumes with point
        armed at N = 1, 2, .., k until a run ends normally; after a kill at after_rotated_log (the
        old file committed as finished) the old file is deleted, as a log rotation would. The end
        state must hold the whole log: the outcomes `idem gen` promised and the rebuild's rows."""
        base = os.path.join(work, f"rotation-{log.domain}-{point}")
        shutil.rmtree(base, ignore_errors=True)
        os.makedirs(base)
        db, live = os.path.join(base, "db"), os.path.join(base, "live.jsonl")
        first, second = log.ends[len(log.ends) // 3], log.ends[2 * len(log.ends) // 3]
        with open(live, "wb") as f:
            f.write(log.content[:first])
        args = [IDEM, "consume", "--db", db, "--log", live, "--batch", log.batch, "--journal-rows", 8]
        run(args, env=armed(None))
        with open(live, "ab") as f:
            f.write(log.content[first:second])
        os.rename(live, live + ".1")
        with open(live, "wb") as f:
            f.write(log.content[second:])
        schedule = crash_schedule(self.size["k"])
        mode = "rotation"
        while True:
            n = schedule.next()
            crash = f"{point}:{n}"
            p = run(args, env=armed(crash), check=False)
            what = f"after {command_text(args, crash)}"
            if p.returncode == -signal.SIGKILL:
                state = read_state(db, log.projections)
                position = next((c["position"] for c in state["stats"]["checkpoints"]), 0)
                schedule.step((position, os.path.exists(live + ".1")), what)
                if point == "after_rotated_log" and os.path.exists(live + ".1"):
                    os.remove(live + ".1")
                self.tally.kill(mode, point, n)
            elif p.returncode == 0:
                break
            else:
                raise divergence(f"{what}: exit status {p.returncode}\n{p.stderr.decode(errors='replace')}")
        state = read_state(db, log.projections)
        problems = differences(state, full, with_batches=False)
        want = {k: log.expected["outcomes"].get(k, 0) for k in OUTCOMES}
        got = {k: state["stats"]["outcomes"].get(k, 0) for k in OUTCOMES}
        if got != want:
            problems.append(f"outcomes {got} != what idem gen promised {want}")
        checkpoint = state["stats"]["checkpoints"][0]
        if checkpoint.get("state") != "ok" or checkpoint.get("lag_bytes") != 0:
            problems.append(f"the checkpoint after the last run is {checkpoint}")
        if problems:
            raise divergence(f"{mode} at {point}: {log.path} (seed {log.seed}), db {db}\n  - " +
                             "\n  - ".join(problems))
        self.tally.completed(mode, point)
        shutil.rmtree(base, ignore_errors=True)

    # --- idem rebuild ------------------------------------------------------------------

    def rebuild_crashes(self, work, log, full, extra, rng):
        """A killed rebuild leaves its target old or new, complete; a rerun gives the new one."""
        base = os.path.join(work, f"rebuild-{log.domain}{'-retention' if extra else ''}")
        old_log = base + "-old.jsonl"
        cut = log.ends[len(log.ends) // 3]
        with open(old_log, "wb") as f:
            f.write(log.content[:cut])
        old_db = base + "-old"
        shutil.rmtree(old_db, ignore_errors=True)
        idem("rebuild", "--db", old_db, "--log", old_log, "--batch", log.batch, *extra)
        old = read_state(old_db, log.projections)
        db = base + "-db"
        args = [IDEM, "rebuild", "--db", db, "--log", log.path, "--batch", log.batch, *extra]
        mode = "rebuild" + ("+retention" if extra else "")
        cases = [(p, n) for p in self.points for n in range(1, self.size["rebuild_k"] + 1)]
        cases += [("random", 0)] * self.size["random_kills"]
        done = set()
        for point, n in cases:
            if point in done:
                continue
            for suffix in ("", ".rebuild", ".rebuild.lock"):
                shutil.rmtree(db + suffix, ignore_errors=True)
            shutil.copytree(old_db, db)
            crash = f"{point}:{n}" if point != "random" else None
            if point == "random":
                delay = rng.uniform(0.0, 0.12)
                rc = kill_at_random(args, delay)[0]
                what = f"after {command_text(args)} killed from outside after {delay} s (seed {self.opts.seed})"
            else:
                rc = run(args, env=armed(crash), check=False).returncode
                what = f"after {command_text(args, crash)}"
            state = read_state(db, log.projections)
            if rc == -signal.SIGKILL:
                if differences(state, old, with_batches=False) and differences(state, full, with_batches=False):
                    raise divergence(f"{what}\n  {db} is neither the old state (rebuilt from {old_log}) nor "
                                     f"the new one:\n  - vs old: " +
                                     "\n    ".join(differences(state, old, with_batches=False)) + "\n  - vs new: " +
                                     "\n    ".join(differences(state, full, with_batches=False)))
                self.tally.kill(mode, point, n if crash else None)
                idem(*args[1:])
                state = read_state(db, log.projections)
                what += ", then rerun"
            elif rc == 0:
                if crash:
                    self.tally.completed(mode, point)
                    done.add(point)  # hit fewer than n times: larger n would not be hit either
            else:
                raise divergence(f"{what}: exit status {rc}")
            problems = differences(state, full, with_batches=False)
            if problems:
                raise divergence(f"{what}\n  {db} differs from the uninterrupted rebuild:\n  - " +
                                 "\n  - ".join(problems))
        for suffix in ("", ".rebuild", ".rebuild.lock", "-old"):
            shutil.rmtree(db + suffix if suffix != "-old" else old_db, ignore_errors=True)

    # --- the engine --------------------------------------------------------------------

    def engine_chain(self, work, log, full, point, submitters):
        """Redelivers the log through the engine with point armed at N = 1, 2, .., k, 1, .."""
        db = os.path.join(work, f"engine-{log.domain}-{point}-{submitters}")
        acks = db + ".acks"
        shutil.rmtree(db, ignore_errors=True)
        for f in (acks, acks + ".checked"):
            if os.path.exists(f):
                os.remove(f)
        args = [ENGINE, "--db", db, "--log", log.path, "--acks", acks, "--submitters", submitters]
        mode = "engine"
        schedule = crash_schedule(self.size["k"])
        while True:
            n = schedule.next()
            crash = f"{point}:{n}"
            p = run(args, env=armed(crash), check=False)
            what = f"after {command_text(args, crash)} (log seed {log.seed})"
            if p.returncode == -signal.SIGKILL:
                schedule.step(os.path.getsize(acks) if os.path.exists(acks) else 0, what)
                self.tally.kill(mode, point, n)
            elif p.returncode == 0:
                self.tally.completed(mode, point)
                break
            else:
                raise divergence(f"{what}: exit status {p.returncode}\n{p.stderr.decode(errors='replace')}")
        self.engine_final(db, acks, args, log, full, f"engine over {log.path} (seed {log.seed}) with {point} armed")

    def engine_random(self, work, log, full, submitters, rng):
        """Kills the engine from outside at random moments; a run that finishes first is
        checked complete and the next one starts over, until random_kills kills."""
        db = os.path.join(work, f"engine-{log.domain}-random-{submitters}")
        acks = db + ".acks"
        args = [ENGINE, "--db", db, "--log", log.path, "--acks", acks, "--submitters", submitters]
        delays = random_delays(rng, self.size["random_kills"])
        for delay in delays:
            fresh = not os.path.exists(db)
            rc, err = kill_at_random(args, delay.next())
            what = f"after {command_text(args)} killed from outside after {delay.last:.3f} s (log seed {log.seed})"
            if torn_creation(db):
                raise divergence(f"{what}: a data.mdb shorter than its two meta pages was left behind")
            if rc == -signal.SIGKILL:
                self.tally.kill("engine", "random")
                delay.killed()
            elif rc == 0:
                self.engine_final(db, acks, args, log, full, what)  # removes db and acks
                delay.finished(fresh)
            else:
                raise divergence(f"{what}: exit status {rc}\n{err.decode(errors='replace')}")
        if os.path.exists(db):
            rc, err = kill_at_random(args, None)
            if rc != 0:
                raise divergence(f"after {command_text(args)}: exit status {rc}\n{err.decode(errors='replace')}")
            self.engine_final(db, acks, args, log, full, f"engine over {log.path} (seed {log.seed}) killed at random")

    def engine_final(self, db, acks, args, log, full, what):
        """Every record acknowledged and found in the inbox; the rows as the rebuild's."""
        check = args + ["--check"]
        p = run(check, env=armed(None), check=False)
        if p.returncode != 0:
            raise divergence(f"after {command_text(check)}: exit status {p.returncode}\n"
                             f"{p.stderr.decode(errors='replace')}")
        state = read_state(db, log.projections)
        problems = []
        for proj in log.projections:
            if state["dumps"][proj] != full["dumps"][proj]:
                problems.append(f"{proj} dump differs from the rebuild's")
        s = state["stats"]
        if s["projections"] != full["stats"]["projections"]:
            problems.append(f"rows {s['projections']} != rebuild {full['stats']['projections']}")
        if s["inbox_size"] != log.records[-1]:
            problems.append(f"inbox holds {s['inbox_size']} ids, the log has {log.records[-1]} records")
        if s["parked"] != 0:
            problems.append(f"{s['parked']} events still parked")
        if problems:
            raise divergence(f"{what}, db {db}\n  - " + "\n  - ".join(problems))
        shutil.rmtree(db, ignore_errors=True)
        for f in (acks, acks + ".checked"):
            if os.path.exists(f):
                os.remove(f)

    # --- a round -----------------------------------------------------------------------

    def round(self, work, seed, pool):
        rng = random.Random(seed)
        logs = self.make_logs(work, seed)
        retention = shlex.split(self.opts.retention) if "--inbox-retention" in self.consume_options else []
        scenarios = [(log, []) for log in logs]
        if retention:  # pruning between batches as the run goes: during_prune
            scenarios.append((logs[seed % len(logs)], retention))
        tasks = []
        for log, extra in scenarios:
            tag = f"{log.domain}{'-retention' if extra else ''}"
            refs = references(os.path.join(work, "refs-" + tag), log, extra, self.tally)
            full_db = os.path.join(work, "full-" + tag)
            idem("rebuild", "--db", full_db, "--log", log.path, "--batch", log.batch, *extra)
            full = read_state(full_db, log.projections)
            kind = "retention" if extra else "consume"
            for point in self.points:
                tasks.append((kind, self.consume_chain, work, log, refs, full, extra, point))
            tasks.append((kind if extra else "random", self.consume_random, work, log, refs, full, extra,
                          random.Random(rng.random())))
            tasks.append((kind if extra else "rebuild", self.rebuild_crashes, work, log, full, extra,
                          random.Random(rng.random())))
            if not extra:
                for point in ROTATION_POINTS:
                    tasks.append(("rotation", self.rotation_chain, work, log, full, point))
                for submitters in self.size["engine_submitters"]:
                    for point in self.points:
                        tasks.append(("engine", self.engine_chain, work, log, full, point, submitters))
                    tasks.append(("engine", self.engine_random, work, log, full, submitters,
                                  random.Random(rng.random())))
        if self.opts.only:
            wanted = set(self.opts.only.split(","))
            tasks = [t for t in tasks if t[0] in wanted]
        tasks = [t[1:] for t in tasks]
        rng.shuffle(tasks)
        futures = [pool.submit(self.guarded, *t) for t in tasks]
        concurrent.futures.wait(futures)

    def guarded(self, fn, *args):
        try:
            fn(*args)
        except divergence as e:
            self.tally.diverged(f"{e}\n  rerun: {rerun_command(self.opts.seed)}")
        except Exception as e:  # noqa: BLE001 - a driver failure is reported like a divergence
            self.tally.diverged(f"{fn.__name__} failed: {e!r}")


def rerun_command(seed):
    """This run's command line with its seed, keeping the work directory."""
    args, skip = [sys.executable], False
    for a in sys.argv:
        if skip:
            skip = False
            continue
        if a in ("--seed", "--work"):
            skip = True
            continue
        if a.startswith(("--seed=", "--work=")) or a == "--keep":
            continue
        args.append(a)
    return shlex.join(args + ["--seed", str(seed), "--keep"])


def report(d, seconds):
    t = d.tally
    modes = sorted({m for m, _ in t.kills} | {m for m, _ in t.completions})
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\ncrash test: {t.total()} kills, {t.restarts} restarts, {t.references} references, "
          f"{len(t.divergences)} divergences, {seconds:.0f} s, {cpu.ru_utime + cpu.ru_stime:.0f} s CPU in the "
          f"processes run (seed {d.opts.seed})")
    for m in modes:
        print(f"  {m}:")
        for p in d.points + ["random"]:
            kills = t.kills.get((m, p), 0)
            if kills == 0 and (m, p) not in t.completions:
                continue
            by_n = t.kills_by_n.get((m, p), {})
            ns = " ".join(f"{n}:{c}" for n, c in sorted(by_n.items()))
            print(f"    {p:<18} {kills:>6} kills" + (f"   by N {ns}" if ns else "") +
                  ("   (not hit)" if kills == 0 else ""))
    for kind, (count, example) in t.knowns.items():
        print(f"  known deviation '{kind}': {count} times; first:\n    " + example.replace("\n", "\n    "))
    hit = {p for (m, p), n in t.kills.items() if n > 0}
    missing = [p for p in d.points if p not in hit]
    if missing:
        print(f"  points no run reached: {', '.join(missing)}")
    return missing


def main():
    global IDEM, ENGINE
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("idem")
    ap.add_argument("engine_crash")
    ap.add_argument("--points-from", help="crash_point.hpp: adds the points its comment lists")
    ap.add_argument("--long", action="store_true", help="a soak run: larger logs, N up to 12, rounds until --minutes")
    ap.add_argument("--minutes", type=float, default=30, help="how long --long runs (default 30)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default 1; with --long from the time)")
    ap.add_argument("--only", help="run only these kinds: consume, retention, random, rebuild, rotation, engine "
                                   "(comma-separated)")
    ap.add_argument("--jobs", type=int, default=max(2, os.cpu_count() or 2), help="runs at a time")
    ap.add_argument("--work", help="work directory (default: a new one in /dev/shm, else the temp directory)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--retention", default="--inbox-retention 300ms",
                    help="the retention scenario's options (default: --inbox-retention 300ms)")
    ap.add_argument("--events", type=int, help="distinct events per log (overrides the size)")
    ap.add_argument("--k", type=int, help="crash at N = 1..k (overrides the size)")
    opts = ap.parse_args()
    IDEM, ENGINE = os.path.abspath(opts.idem), os.path.abspath(opts.engine_crash)
    if opts.seed is None:
        opts.seed = int(time.time()) % 100000 if opts.long else 1
    points = list(POINTS)
    if opts.points_from:
        points += [p for p in points_from_header(opts.points_from) if p not in points]
    size = dict(LONG if opts.long else CI)
    if opts.events:
        size["events"] = opts.events
    if opts.k:
        size["k"] = opts.k
    base = opts.work or (tempfile.mkdtemp(prefix="idem-crash-", dir="/dev/shm")
                         if os.access("/dev/shm", os.W_OK) else tempfile.mkdtemp(prefix="idem-crash-"))
    os.makedirs(base, exist_ok=True)
    print(f"crash test: seed {opts.seed}, work {base}, points {', '.join(points)}", flush=True)
    d = driver(opts, size, points)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        r = 0
        while True:
            work = os.path.join(base, f"round-{r}")
            os.makedirs(work, exist_ok=True)
            d.round(work, opts.seed + r, pool)
            r += 1
            if not d.tally.divergences and not opts.keep:
                shutil.rmtree(work, ignore_errors=True)
            if d.tally.divergences or not opts.long or time.monotonic() - started > opts.minutes * 60:
                break
            print(f"  round {r}: {d.tally.total()} kills so far, {time.monotonic() - started:.0f} s", flush=True)
    missing = report(d, time.monotonic() - started)
    if not d.tally.divergences and not opts.keep:
        shutil.rmtree(base, ignore_errors=True)
    lost = [p for p in CORE_POINTS if p in missing] if not opts.only else []
    if lost:
        print(f"FAIL: {', '.join(lost)} never hit: the crash points are not on the apply path any more")
    if d.tally.divergences:
        print(f"FAIL: {len(d.tally.divergences)} divergences; work directory kept: {base}")
    return 1 if d.tally.divergences or lost else 0


if __name__ == "__main__":
    sys.exit(main())
