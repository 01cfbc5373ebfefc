#!/usr/bin/env python3
"""End-to-end tests of the `idem` command line: the real binary on real files.

usage: cli_test.py PATH/TO/idem
"""

import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

IDEM = None

OUTCOMES = ["applied", "duplicate_message", "duplicate_event", "parked", "dead_lettered", "ignored", "released"]


def run(*args, check=True, timeout=300, **kw):
    """Runs idem with args; returns the CompletedProcess (stdout/stderr as text)."""
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def lmdb_table(data, name):
    """Returns (root page, depth, page size) of a named table in an LMDB data file (LMDB 0.9,
    64-bit page numbers: mdb.c's MDB_page, MDB_node, MDB_meta, MDB_db), read independently of idem."""
    u16 = lambda o: struct.unpack_from("<H", data, o)[0]
    u64 = lambda o: struct.unpack_from("<Q", data, o)[0]
    psize = struct.unpack_from("<I", data, 16 + 24)[0]
    meta = 0 if u64(16 + 128) >= u64(psize + 16 + 128) else 1
    page = u64(meta * psize + 16 + 24 + 48 + 40) * psize
    assert u16(page + 10) & 0x02, "the main table's root is not a leaf"
    for i in range((u16(page + 12) - 16) // 2):
        node = page + u16(page + 16 + 2 * i)
        ksize = u16(node + 6)
        if data[node + 8:node + 8 + ksize] == name.encode():
            record = node + 8 + ksize
            return u64(record + 40), u16(record + 6), psize
    raise KeyError(name)


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class cli_case(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-cli-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def gen(self, name, domain="trading", events=4000, aggregates=300, fmt="jsonl", **shares):
        args = ["gen", "--out", self.path(name), "--domain", domain, "--events", events,
                "--aggregates", aggregates, "--format", fmt, "--seed", shares.pop("seed", 7)]
        for k, v in shares.items():
            args += ["--" + k, v]
        return json.loads(run(*args).stdout)

    def kill_at_random(self, args, rng, lo, hi):
        """Starts idem with args and SIGKILLs it after a random lo..hi seconds."""
        p = subprocess.Popen([IDEM, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(lo, hi))
        p.send_signal(signal.SIGKILL)
        p.wait()

    def dump(self, db, projection):
        return run("dump", "--db", db, "--projection", projection).stdout

    def stats(self, db):
        return json.loads(run("stats", "--db", db).stdout)

    def assert_outcomes(self, stats_outcomes, expected):
        for k in OUTCOMES:
            self.assertEqual(stats_outcomes.get(k, 0), expected["outcomes"].get(k, 0), k)


class usage_test(cli_case):
    COMMANDS = ["rebuild", "consume", "get", "dump", "stats", "deadletters", "verify", "chaos", "convert", "gen"]

    def test_every_command_has_help(self):
        top = run("--help")
        for c in self.COMMANDS:
            self.assertIn(c, top.stdout)
            h = run(c, "--help")
            self.assertIn("usage: idem " + c, h.stdout)
            self.assertIn("--", h.stdout)

    def test_usage_errors_exit_1(self):
        self.assertEqual(run(check=False).returncode, 1)
        for args in (["frobnicate"], ["get", "--db"], ["get", "--db", self.dir], ["dump", "--db", self.dir, "--bogus", "x"],
                     ["rebuild", "--db", self.path("db")], ["gen", "--out", self.path("x"), "--events", "many"],
                     ["gen", "--out", self.path("x"), "--domain", "chess"], ["convert", "--in", "a", "--out", "b", "--to", "xml"],
                     ["get", "--db", self.dir, "--projection", "nope", "--key", "k"], ["stats", "positional"]):
            p = run(*args, check=False)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn("usage: idem", p.stderr, args)

    def test_io_errors_exit_2_and_name_the_file(self):
        missing = self.path("no-such.jsonl")
        p = run("rebuild", "--db", self.path("db"), "--log", missing, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(missing, p.stderr)
        self.assertFalse(os.path.exists(self.path("db")))
        p = run("stats", "--db", self.path("nowhere"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("nowhere", p.stderr)


class chaos_test(cli_case):
    def test_chaos_passes_the_example_projections_and_names_bad_input(self):
        for domain in ("orders", "trading", "game"):
            self.gen(domain + ".jsonl", domain=domain, events=15, aggregates=3, malformed=0)
            r = run("chaos", "--log", self.path(domain + ".jsonl"), "--schedules", 10, "--seed", 5)
            self.assertIn("10 schedule(s) over 15 event(s) matched the reference", r.stdout, domain)
        r = run("chaos", "--log", self.path("orders.jsonl"), "--schedules", 3, "--fork")
        self.assertIn("3 schedule(s)", r.stdout)
        for workers in (1, 3):
            r = run("chaos", "--log", self.path("game.jsonl"), "--schedules", 4, "--workers", workers)
            self.assertIn("4 schedule(s) over 15 event(s) matched the reference", r.stdout, workers)
        r = run("chaos", "--log", self.path("game.jsonl"), "--workers", 0, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--workers", r.stderr)
        bad = self.path("bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"specversion":"1.0","source":"/x","type":"order.line_added"}\n')
        r = run("chaos", "--log", bad, check=False)
        self.assertEqual(r.returncode, 1)
        self.assertIn("bad.jsonl: no envelope parses (1 do not; the first: envelope 1 (missing_id", r.stderr)
        r = run("chaos", "--log", self.path("absent.jsonl"), check=False)
        self.assertEqual(r.returncode, 2)
        self.assertIn("absent.jsonl", r.stderr)

    def test_chaos_takes_gens_default_output_with_its_malformed_lines_and_shows_progress(self):
        # gen's defaults: defective lines among the events, as real logs hold.
        self.gen("orders.jsonl", domain="orders", events=2500, aggregates=40, seed=3)
        with open(self.path("orders.jsonl")) as f:
            unparsable = 0
            for text in f:
                try:
                    e = json.loads(text)
                    unparsable += not all(isinstance(e.get(k), str) for k in ("id", "source", "type"))
                except ValueError:
                    unparsable += 1
        self.assertGreater(unparsable, 0)
        r = run("chaos", "--log", self.path("orders.jsonl"), "--schedules", 2)
        self.assertIn("2 schedule(s) over ", r.stdout)
        self.assertIn("matched the reference", r.stdout)
        self.assertIn(f"chaos: {unparsable} envelope(s) do not parse, the first is envelope ", r.stdout)
        self.assertIn("idem chaos: 2/2 schedules done", r.stderr)

    def test_chaos_stopped_by_sigterm_removes_its_temporary_stores(self):
        self.gen("orders.jsonl", domain="orders", events=1000, aggregates=40, malformed=0)
        tmp = self.path("tmp")
        os.makedirs(tmp)
        p = subprocess.Popen([IDEM, "chaos", "--log", self.path("orders.jsonl"), "--schedules", "100000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, TMPDIR=tmp))
        try:
            deadline = time.time() + 120
            while time.time() < deadline and p.poll() is None:
                if any("live" in dirs for _, dirs, _ in os.walk(tmp)):  # a schedule's store
                    break
                time.sleep(0.02)
            self.assertIsNone(p.poll(), "chaos ended before it was stopped")
            self.assertTrue(os.listdir(tmp), "chaos made no stores under TMPDIR")
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        self.assertEqual(p.returncode, 2, err)
        self.assertIn("idem chaos: stopped after ", err)
        self.assertIn("the temporary stores were removed", err)
        self.assertEqual(os.listdir(tmp), [])


class rebuild_test(cli_case):
    def test_rebuild_matches_the_generators_expectation_and_every_read_command(self):
        expected = self.gen("fills.jsonl", malformed=0.01)
        db = self.path("db")
        out = json.loads(run("rebuild", "--db", db, "--log", self.path("fills.jsonl")).stdout)
        self.assertEqual(out["records"], expected["lines"])
        self.assert_outcomes(out["outcomes"], expected)

        stats = self.stats(db)
        self.assert_outcomes(stats["outcomes"], expected)
        self.assertEqual(stats["dead_letters"], expected["outcomes"]["dead_lettered"])
        self.assertEqual(stats["parked"], 0)
        self.assertGreater(stats["inbox_size"], 0)
        self.assertEqual(stats["checkpoints"][0]["position"], os.path.getsize(self.path("fills.jsonl")))
        self.assertEqual(stats["checkpoints"][0]["lag_bytes"], 0)

        rows = jsonl(self.dump(db, "positions"))
        self.assertEqual(stats["projections"]["positions"], len(rows))
        keys = [r["key"] for r in rows]
        self.assertEqual(keys, sorted(keys, key=lambda k: k.encode()))
        for r in rows:
            self.assertEqual(set(r), {"key", "version", "state"})
            self.assertGreaterEqual(r["version"], 1)
            self.assertIn("realized_pnl", r["state"])
        totals = json.loads(expected["totals"]) if isinstance(expected["totals"], str) else expected["totals"]
        if "qty" in totals:
            self.assertEqual(sum(r["state"]["qty"] for r in rows), totals["qty"])
        if "realized_pnl" in totals:
            self.assertEqual(sum(r["state"]["realized_pnl"] for r in rows), totals["realized_pnl"])

        one = rows[len(rows) // 2]
        got = json.loads(run("get", "--db", db, "--projection", "positions", "--key", one["key"]).stdout)
        self.assertEqual(got, one)
        missing = run("get", "--db", db, "--projection", "positions", "--key", "no/such", check=False)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("no/such", missing.stderr)

        letters = jsonl(run("deadletters", "--db", db).stdout)
        self.assertEqual(len(letters), expected["outcomes"]["dead_lettered"])
        reasons = {}
        for d in letters:
            reasons[d["reason"]] = reasons.get(d["reason"], 0) + 1
            self.assertTrue(d["detail"])
            # A too_large envelope keeps only its first bytes, printed as body_prefix.
            self.assertTrue("envelope" in d or "body" in d or (d.get("truncated") and "body_prefix" in d))
        self.assertEqual(reasons, expected["dead_letter_reasons"])
        # Every dead letter says where it was read: path:line (byte offset), and that is where it is.
        content = read_bytes(self.path("fills.jsonl"))
        lines = content.split(b"\n")
        for d in letters:
            m = re.match(r"(.*):(\d+) \(byte offset (\d+)\): ", d["detail"])
            self.assertIsNotNone(m, d["detail"])
            self.assertEqual(m.group(1), os.path.abspath(self.path("fills.jsonl")))
            line, offset = int(m.group(2)), int(m.group(3))
            self.assertTrue(content[offset:].startswith(lines[line - 1]))
            self.assertEqual(content[:offset].count(b"\n"), line - 1)

        small = self.path("small-budget")
        run("rebuild", "--db", small, "--log", self.path("fills.jsonl"), "--memory", "0", "--batch", "700")
        self.assertEqual(self.dump(small, "positions"), self.dump(db, "positions"))

        v = run("verify", "--db", db, "--log", self.path("fills.jsonl"))
        self.assertTrue(json.loads(v.stdout)["match"])

    def test_progress_bar_on_a_terminal_and_one_summary_line_otherwise(self):
        import pty
        self.gen("a.jsonl", events=30000, aggregates=1000)
        master, slave = pty.openpty()
        p = subprocess.Popen([IDEM, "rebuild", "--db", self.path("tty"), "--log", self.path("a.jsonl"), "--batch", "1000"],
                             stdout=subprocess.DEVNULL, stderr=slave)
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        p.wait()
        os.close(master)
        self.assertEqual(p.returncode, 0)
        text = seen.decode(errors="replace")
        self.assertIn("\r", text)
        self.assertIn("events/s", text)
        self.assertIn("ETA", text)
        self.assertIn("100%", text)
        plain = run("rebuild", "--db", self.path("plain"), "--log", self.path("a.jsonl"), "--batch", "1000")
        self.assertNotIn("\r", plain.stderr)
        self.assertEqual(len(plain.stderr.strip().splitlines()), 1)
        self.assertIn("events/s", plain.stderr)

    def test_every_domain_rebuilds_to_its_expectation(self):
        for domain in ("orders", "game"):
            expected = self.gen(domain + ".jsonl", domain=domain, malformed=0.005)
            db = self.path(domain)
            out = json.loads(run("rebuild", "--db", db, "--log", self.path(domain + ".jsonl")).stdout)
            self.assert_outcomes(out["outcomes"], expected)
            self.assertEqual(json.loads(run("verify", "--db", db, "--log", self.path(domain + ".jsonl")).stdout)["match"], True)

    def test_rebuild_is_deterministic_and_replaces_the_old_state(self):
        self.gen("a.jsonl", seed=1)
        self.gen("b.jsonl", seed=2)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        first = self.dump(db, "positions")
        run("rebuild", "--db", db, "--log", self.path("b.jsonl"))
        other = self.dump(db, "positions")
        self.assertNotEqual(first, other)
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        self.assertEqual(self.dump(db, "positions"), first)
        self.assertFalse(os.path.exists(db + ".rebuild"))

    def test_rebuild_killed_at_random_points_leaves_old_or_new_and_rerun_gives_the_same_dump(self):
        self.gen("old.jsonl", seed=3, events=2000)
        self.gen("new.jsonl", seed=4, events=30000, aggregates=2000)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("old.jsonl"))
        old = self.dump(db, "positions")
        ref = self.path("ref")
        run("rebuild", "--db", ref, "--log", self.path("new.jsonl"), "--batch", "500")
        new = self.dump(ref, "positions")
        rng = random.Random(11)
        for _ in range(5):
            self.kill_at_random(["rebuild", "--db", db, "--log", self.path("new.jsonl"), "--batch", "500"], rng, 0.0, 0.6)
            self.assertIn(self.dump(db, "positions"), (old, new))
        run("rebuild", "--db", db, "--log", self.path("new.jsonl"), "--batch", "500")
        self.assertEqual(self.dump(db, "positions"), new)

    def test_verify_names_the_first_differing_row(self):
        self.gen("a.jsonl", seed=5, events=3000)
        self.gen("more.jsonl", seed=6, events=200)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        run("consume", "--db", db, "--log", self.path("more.jsonl"), "--durability", "none")
        p = run("verify", "--db", db, "--log", self.path("a.jsonl"), check=False)
        self.assertEqual(p.returncode, 1)
        out = json.loads(p.stdout)
        self.assertFalse(out["match"])
        self.assertIn("row '", out["first_difference"])
        self.assertIn("positions", p.stderr)
        self.assertFalse(any(n.startswith("db.verify") for n in os.listdir(self.dir)))


class safety_test(cli_case):
    def test_rebuild_refuses_a_directory_that_is_not_an_environment(self):
        self.gen("a.jsonl", events=500)
        precious = self.path("work")
        os.makedirs(precious)
        with open(os.path.join(precious, "notes.txt"), "w") as f:
            f.write("keep me")
        p = run("rebuild", "--db", precious, "--log", self.path("a.jsonl"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("holds files that are not part of an idem store (notes.txt)", p.stderr)
        self.assertTrue(os.path.exists(os.path.join(precious, "notes.txt")))

    def test_a_trailing_slash_names_the_same_environment(self):
        self.gen("a.jsonl", events=500)
        run("rebuild", "--db", self.path("db") + "/", "--log", self.path("a.jsonl"))
        self.assertTrue(os.path.exists(os.path.join(self.path("db"), "data.mdb")))
        self.assertTrue(json.loads(run("verify", "--db", self.path("db") + "/", "--log", self.path("a.jsonl")).stdout)["match"])
        self.assertEqual(sorted(os.listdir(self.path("db"))), ["data.mdb", "idem.lock", "lock.mdb"])

    def test_a_second_rebuild_of_the_same_target_is_refused_while_one_runs(self):
        import fcntl
        self.gen("a.jsonl", events=500)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        before = self.dump(db, "positions")
        with open(os.path.join(db, "idem.lock"), "w") as held:  # what a running rebuild holds
            fcntl.flock(held, fcntl.LOCK_EX)
            p = run("rebuild", "--db", db, "--log", self.path("a.jsonl"), check=False)
            self.assertEqual(p.returncode, 2)
            self.assertIn("is being written by", p.stderr)
            self.assertEqual(self.dump(db, "positions"), before)
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))  # free again

    def test_consume_leaves_an_unterminated_last_line_for_later(self):
        self.gen("a.jsonl", events=300)
        body = read_bytes(self.path("a.jsonl"))
        log = self.path("live.jsonl")
        with open(log, "wb") as f:
            f.write(body[:-1])  # the last line's newline has not been written yet
        out = json.loads(run("consume", "--db", self.path("db"), "--log", log).stdout)
        self.assertEqual(out["records"], len(body.splitlines()) - 1)
        self.assertEqual(len(out["torn"]), 1)
        with open(log, "ab") as f:
            f.write(b"\n")
        again = json.loads(run("consume", "--db", self.path("db"), "--log", log).stdout)
        self.assertEqual(again["records"], 1)
        self.assertEqual(again["torn"], [])
        run("rebuild", "--db", self.path("ref"), "--log", self.path("a.jsonl"))
        self.assertEqual(self.dump(self.path("db"), "positions"), self.dump(self.path("ref"), "positions"))

    def test_dead_letters_after_a_resume_give_the_byte_offset(self):
        self.gen("a.jsonl", events=3000, malformed=0.02)
        content = read_bytes(self.path("a.jsonl"))
        half = content.index(b"\n", len(content) // 2) + 1
        log = self.path("live.jsonl")
        with open(log, "wb") as f:
            f.write(content[:half])
        run("consume", "--db", self.path("db"), "--log", log)
        with open(log, "ab") as f:
            f.write(content[half:])
        run("consume", "--db", self.path("db"), "--log", log)
        letters = jsonl(run("deadletters", "--db", self.path("db")).stdout)
        resumed = [d for d in letters if " at byte offset " in d["detail"]]
        self.assertGreater(len(resumed), 0)
        for d in resumed:
            offset = int(re.search(r" at byte offset (\d+): ", d["detail"]).group(1))
            self.assertGreaterEqual(offset, half)
            self.assertTrue(offset == 0 or content[offset - 1:offset] == b"\n")

    def test_ctrl_c_stops_a_consume_at_a_batch_boundary(self):
        self.gen("a.jsonl", events=60000, aggregates=3000)
        db = self.path("db")
        p = subprocess.Popen([IDEM, "consume", "--db", db, "--log", self.path("a.jsonl"), "--batch", "100"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(db, "data.mdb")) and time.time() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, err)
        first = json.loads(out)
        self.assertLess(first["records"], len(read_bytes(self.path("a.jsonl")).splitlines()))
        run("consume", "--db", db, "--log", self.path("a.jsonl"))
        run("rebuild", "--db", self.path("ref"), "--log", self.path("a.jsonl"))
        self.assertEqual(self.dump(db, "positions"), self.dump(self.path("ref"), "positions"))
        self.assertEqual(self.stats(db)["outcomes"], self.stats(self.path("ref"))["outcomes"])


class consume_test(cli_case):
    def test_consume_equals_rebuild(self):
        expected = self.gen("fills.jsonl", malformed=0.01)
        run("rebuild", "--db", self.path("r"), "--log", self.path("fills.jsonl"))
        out = json.loads(run("consume", "--db", self.path("c"), "--log", self.path("fills.jsonl"), "--batch", "300").stdout)
        self.assert_outcomes(out["outcomes"], expected)
        for projection in ("positions", "order-totals"):
            self.assertEqual(self.dump(self.path("c"), projection), self.dump(self.path("r"), projection))
        again = json.loads(run("consume", "--db", self.path("c"), "--log", self.path("fills.jsonl")).stdout)
        self.assertEqual(again["records"], 0)  # resumed at the end: nothing read twice

    def test_consume_killed_at_any_moment_resumes_exactly(self):
        expected = self.gen("fills.jsonl", events=20000, aggregates=1000, malformed=0.002)
        db = self.path("db")
        rng = random.Random(5)
        for _ in range(6):
            self.kill_at_random(["consume", "--db", db, "--log", self.path("fills.jsonl"), "--batch", "200"], rng, 0.05, 0.5)
        run("consume", "--db", db, "--log", self.path("fills.jsonl"), "--batch", "200")
        self.assert_outcomes(self.stats(db)["outcomes"], expected)
        run("rebuild", "--db", self.path("ref"), "--log", self.path("fills.jsonl"))
        self.assertEqual(self.dump(db, "positions"), self.dump(self.path("ref"), "positions"))

    def test_follow_applies_appended_events_and_stops_cleanly(self):
        self.gen("all.jsonl", events=3000)
        lines = read_bytes(self.path("all.jsonl")).splitlines(keepends=True)
        log = self.path("live.jsonl")
        with open(log, "wb") as f:
            f.writelines(lines[:1000])
        db = self.path("db")
        p = subprocess.Popen([IDEM, "consume", "--db", db, "--log", log, "--follow"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with open(log, "ab") as f:
                for i in range(1000, len(lines), 250):
                    time.sleep(0.1)
                    chunk = b"".join(lines[i:i + 250])
                    half = len(chunk) // 2 + 3  # cut inside a line: the reader must wait for its end
                    f.write(chunk[:half])
                    f.flush()
                    time.sleep(0.05)
                    f.write(chunk[half:])
                    f.flush()
            deadline = time.time() + 30
            while time.time() < deadline:
                if os.path.exists(os.path.join(db, "data.mdb")):
                    cp = self.stats(db)["checkpoints"]
                    if cp and cp[0]["position"] == os.path.getsize(log):
                        break
                time.sleep(0.1)
        finally:
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual(json.loads(out)["records"], len(lines))
        run("rebuild", "--db", self.path("ref"), "--log", self.path("all.jsonl"))
        self.assertEqual(self.dump(db, "positions"), self.dump(self.path("ref"), "positions"))


class log_format_test(cli_case):
    def test_jsonl_binary_jsonl_is_byte_stable_and_rebuilds_the_same(self):
        self.gen("a.jsonl", malformed=0.01)
        b = json.loads(run("convert", "--in", self.path("a.jsonl"), "--out", self.path("a.bin"), "--to", "binary").stdout)
        run("convert", "--in", self.path("a.bin"), "--out", self.path("b.jsonl"), "--to", "jsonl")
        self.assertEqual(read_bytes(self.path("a.jsonl")), read_bytes(self.path("b.jsonl")))
        self.assertGreater(b["records"], 0)
        run("rebuild", "--db", self.path("j"), "--log", self.path("a.jsonl"))
        run("rebuild", "--db", self.path("b"), "--log", self.path("a.bin"), "--format", "binary")
        self.assertEqual(self.dump(self.path("j"), "positions"), self.dump(self.path("b"), "positions"))
        wrong = run("rebuild", "--db", self.path("w"), "--log", self.path("a.bin"), "--format", "jsonl", check=False)
        self.assertNotEqual(wrong.returncode, 0)

    def test_torn_binary_tail_is_reported_and_everything_before_it_applied(self):
        self.gen("a.bin", fmt="binary", events=1000)
        size = os.path.getsize(self.path("a.bin"))
        with open(self.path("a.bin"), "r+b") as f:
            f.truncate(size - 7)
        out = json.loads(run("rebuild", "--db", self.path("db"), "--log", self.path("a.bin")).stdout)
        self.assertEqual(len(out["torn"]), 1)
        self.assertGreater(out["torn"][0]["offset"], 0)
        run("convert", "--in", self.path("a.bin"), "--out", self.path("a.jsonl"), "--to", "jsonl")
        lines = read_bytes(self.path("a.jsonl")).splitlines()
        self.assertEqual(out["records"], len(lines))

    def test_corrupt_middle_record_fails_naming_the_offset_unless_skipped(self):
        self.gen("a.bin", fmt="binary", events=1000)
        with open(self.path("a.bin"), "r+b") as f:
            f.seek(os.path.getsize(self.path("a.bin")) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x40]))
        p = run("rebuild", "--db", self.path("db"), "--log", self.path("a.bin"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("a.bin", p.stderr)
        self.assertIn("offset", p.stderr)
        self.assertFalse(os.path.exists(self.path("db")))
        out = json.loads(run("rebuild", "--db", self.path("db"), "--log", self.path("a.bin"), "--skip-bad").stdout)
        self.assertEqual(out["skipped"], 1)



class bad_input_test(cli_case):
    """What the user sees for each class of bad input (docs/BAD_INPUT.md)."""

    def bad_line(self, i, typ="order.line_added", data='{"order_id":"o","amount":1}', extra=""):
        return f'{{"specversion":"1.0","id":"x{i}","source":"/s","type":"{typ}","subject":"o"{extra},"data":{data}}}'.encode()

    def test_every_bad_event_in_a_log_is_a_dead_letter_with_its_reason_and_where_it_was(self):
        lines = [
            (b'{"id":"x1","source":"/s",', "invalid_json", "the body is not a single JSON object"),
            (b'["id","x2"]', "invalid_json", "the body is not a single JSON object"),
            (b'{"source":"/s","type":"order.line_added"}', "missing_id", "attribute 'id' is missing or empty"),
            (b'{"id":"x4","type":"order.line_added"}', "missing_source", "attribute 'source' is missing or empty"),
            (b'{"id":"x5","source":"/s","type":""}', "missing_type", "attribute 'type' is missing or empty"),
            (b'{"id":"x6","source":"/s","type":"order.line_added","time":12}', "invalid_field",
             "attribute 'time' must be a string"),
            (b'{"id":"x7","id":"x7","source":"/s","type":"order.line_added"}', "invalid_field",
             "attribute 'id' appears twice"),
            (b'{"specversion":"0.3","id":"x8","source":"/s","type":"order.line_added"}', "unsupported_specversion",
             'specversion "0.3" is not supported (only "1.0")'),
            (self.bad_line(9, extra=',"sequence":"three"'), "invalid_sequence",
             "attribute 'sequence' must be a decimal integer, got \"three\""),
            (self.bad_line(10, data='{"order_id":"o","amount":"ten"}'), "decode_failed",
             "projection 'order-totals': data does not decode as order.line_added (version 1): "
             "field 'amount': expected an integer"),
            (self.bad_line(11, typ="order.cancelled"), "unknown_type", "no projection handles type 'order.cancelled'"),
            (self.bad_line(12, data='{"order_id":"' + "k" * 600 + '","amount":1}'), "key_too_long",
             "exceeds LMDB's 511-byte key limit"),
            (self.bad_line(13, data='{"order_id":"","amount":1}'), "missing_key", "an aggregate key is empty"),
            (self.bad_line(14, data='{"order_id":"o","amount":1,"pad":"' + "x" * (1 << 20) + '"}'), "too_large",
             "over the limit of 1048576"),
            (self.bad_line(15, typ="order.filled", data='{"account":"a","instrument":"X","side":"hold","qty":1,'
                                                        '"price":1,"exec_id":"E1"}'), "handler_failed",
             "handler threw: fill 'E1': side must be \"buy\" or \"sell\", got \"hold\""),
            (b'{"id":"x16\xff","source":"/s","type":"order.line_added"}', "invalid_utf8", "the body is not valid UTF-8"),
            (b'{"id":"x17","source":"/s","type":"order.line_added"}', "missing_specversion",
             "attribute 'specversion' is missing (CloudEvents 1.0 requires \"specversion\":\"1.0\")"),
            (self.bad_line(18, extra=',"time":"2026-12-02 10:00:00Z"'), "invalid_field",
             "attribute 'time' is not an RFC 3339 timestamp (like 2026-12-02T10:00:00Z): \"2026-12-02 10:00:00Z\""),
            (self.bad_line(19, extra=',"traceId":"t"'), "invalid_field",
             "extension attribute name 'traceId' is not made of lower-case letters a-z and digits 0-9"),
            (self.bad_line(20, data='{"order_id":"o","amount":1,"amount":9}'), "invalid_field",
             "attribute 'data' names member 'amount' twice (in data)"),
            (self.bad_line(21, extra=',"datacontenttype":"image/png","data_base64":"AAEC"', data='null')[:-len(b',"data":null}')] + b'}',
             "decode_failed", "it is binary (data_base64 of 3 bytes, datacontenttype 'image/png'), and a typed handler "
                              "takes JSON data only"),
        ]
        log = self.path("bad.jsonl")
        offsets = []
        with open(log, "wb") as f:
            f.write(self.bad_line(0) + b"\n")  # one good event
            for body, _, _ in lines:
                offsets.append(f.tell())
                f.write(body + b"\n")
        out = json.loads(run("rebuild", "--db", self.path("db"), "--log", log).stdout)  # bad input is not an error
        self.assertEqual(out["outcomes"]["applied"], 1)
        self.assertEqual(out["outcomes"]["dead_lettered"], len(lines))
        letters = jsonl(run("deadletters", "--db", self.path("db")).stdout)
        self.assertEqual([d["reason"] for d in letters], [why for _, why, _ in lines])
        for i, (d, (_, _, says)) in enumerate(zip(letters, lines)):
            self.assertTrue(d["detail"].startswith(f"{log}:{i + 2} (byte offset {offsets[i]}): "), d["detail"])
            self.assertIn(says, d["detail"])

    def test_a_byte_order_mark_before_the_first_line_is_skipped(self):
        log = self.path("bom.jsonl")
        with open(log, "wb") as f:
            f.write(b"\xef\xbb\xbf" + self.bad_line(1, extra=',"sequence":1') + b"\n")
            f.write(self.bad_line(2, extra=',"sequence":2') + b"\n")
        out = json.loads(run("rebuild", "--db", self.path("db"), "--log", log).stdout)
        self.assertEqual(out["outcomes"]["applied"], 2)
        self.assertEqual(out["outcomes"]["dead_lettered"], 0)
        self.assertEqual(out["outcomes"]["parked"], 0)

    def test_logs_that_cannot_be_read_exit_2_naming_the_file_and_the_cause(self):
        self.gen("a.jsonl", events=50)
        run("convert", "--in", self.path("a.jsonl"), "--out", self.path("a.bin"), "--to", "binary")
        good = read_bytes(self.path("a.bin"))
        cases = [
            (self.dir, [], ": read at offset 0 failed: Is a directory"),
            (self.path("a.bin"), ["--format", "jsonl"], ": is a binary log, not jsonl"),
            (self.path("a.jsonl"), ["--format", "binary"], ": is a jsonl log, not binary"),
            (self.path("v2.bin"), [], ": binary log format version 2; this build reads version 1"),
            (self.path("cut.bin"), [], ": binary log header cut short (11 of 16 bytes)"),
            (self.path("flags.bin"), [], ": unknown binary log flags 0x00000002"),
        ]
        with open(self.path("v2.bin"), "wb") as f:
            f.write(good[:8] + b"\x02" + good[9:])
        with open(self.path("cut.bin"), "wb") as f:
            f.write(good[:11])
        with open(self.path("flags.bin"), "wb") as f:
            f.write(good[:12] + b"\x02" + good[13:])
        for log, extra, says in cases:
            p = run("rebuild", "--db", self.path("db"), "--log", log, *extra, check=False)
            self.assertEqual(p.returncode, 2, log)
            self.assertIn(log + says, p.stderr)
            self.assertFalse(os.path.exists(self.path("db")))
        p = run("convert", "--in", self.path("a.jsonl"), "--out", self.path("a.jsonl"), "--to", "binary", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(self.path("a.jsonl") + ": cannot convert a log onto itself", p.stderr)

    def test_an_environment_that_is_not_lmdb_exits_2(self):
        db = self.path("db")
        os.makedirs(db)
        with open(os.path.join(db, "data.mdb"), "wb") as f:
            f.write(os.urandom(8192))
        p = run("stats", "--db", db, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"{db}/data.mdb: ", p.stderr)
        self.assertIn("not an LMDB file", p.stderr)
        # rebuild would swap it out and delete it: it refuses instead, and leaves it as it was.
        self.gen("a.jsonl", events=50)
        before = read_bytes(os.path.join(db, "data.mdb"))
        p = run("rebuild", "--db", db, "--log", self.path("a.jsonl"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("its data.mdb is not an LMDB file", p.stderr)
        self.assertEqual(read_bytes(os.path.join(db, "data.mdb")), before)

    def test_usage_errors_name_the_option_and_show_the_usage(self):
        log = self.path("a.jsonl")
        db = self.path("db")
        cases = [
            (["frobnicate"], "idem: unknown command 'frobnicate'"),
            (["stats", "positional"], "idem stats: unexpected argument 'positional' (options start with --)"),
            (["stats", "--db", db, "--bogus"], "idem stats: unknown option '--bogus'"),
            (["stats", "--db", db, "--db", db], "idem stats: option '--db' given twice"),
            (["stats", "--db"], "idem stats: option '--db' needs a value (DIR)"),
            (["rebuild", "--db", db], "idem rebuild: missing option '--log FILE'"),
            (["rebuild", "--db", db, "--log", log, "--format", "xml"],
             "idem rebuild: option '--format': 'xml' is neither jsonl nor binary"),
            (["rebuild", "--db", db, "--log", log, "--memory", "lots"],
             "idem rebuild: option '--memory': 'lots' is not a non-negative whole number"),
            (["rebuild", "--db", db, "--log", log, "--memory", str((1 << 40) + 1)],
             f"idem rebuild: option '--memory': {(1 << 40) + 1} MB is too large"),
            (["convert", "--in", log, "--out", db, "--to", "xml"],
             "idem convert: option '--to': 'xml' is neither jsonl nor binary"),
            (["consume", "--db", db, "--log", log, "--durability", "maybe"],
             "idem consume: option '--durability': 'maybe' is not full, periodic or none"),
            (["dump", "--db", db, "--projection", "nope"],
             "idem dump: no projection named 'nope' (this tool has: order-totals, positions, leaderboard, inventory, order-totals-copy)"),
            (["gen", "--out", log, "--redeliver", "2"], "idem gen: shares are between 0 and 1"),
            (["rebuild", "--db", db, "--log", log, "--allowed-lateness", "soon"],
             "idem rebuild: option '--allowed-lateness': 'soon' is not a duration (7d, 1h, 90m, 30s)"),
        ]
        for args, says in cases:
            p = run(*args, check=False)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn(says, p.stderr)
            self.assertIn("usage: idem", p.stderr)
            self.assertFalse(os.path.exists(db))

    def test_prune_and_why_say_what_they_need(self):
        self.gen("a.jsonl", events=50)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        for args, says in [
            (["prune", "--db", db], "idem prune: give --older-than, --allowed-lateness or both"),
            (["prune", "--db", db, "--older-than", "later"],
             "idem prune: option '--older-than': 'later' is not a duration (7d, 1h, 90m, 30s)"),
            (["why", "--db", db], "idem why: give --event SOURCE/ID or --message ID"),
            (["why", "--db", db, "--event", "no-slash"], "idem why: option '--event': 'no-slash' is not SOURCE/ID"),
            (["why", "--db", db, "--event", "/s/x", "--key", "k", "--projection", "nope"],
             "idem why: no projection named 'nope' (this tool has: order-totals, positions, leaderboard, inventory, order-totals-copy)"),
        ]:
            p = run(*args, check=False)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn(says, p.stderr)
            self.assertIn("usage: idem", p.stderr)

    def test_get_of_a_row_that_does_not_exist_exits_1_naming_it(self):
        self.gen("a.jsonl", events=50)
        run("rebuild", "--db", self.path("db"), "--log", self.path("a.jsonl"))
        p = run("get", "--db", self.path("db"), "--projection", "positions", "--key", "nobody", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(p.stderr, "idem get: projection 'positions' has no row 'nobody'\n")
        self.assertEqual(p.stdout, "")


class store_check_test(cli_case):
    """verify --store on sound and damaged environments; read commands on damaged ones."""

    def damaged_copy(self, db, name, damage):
        """Copies db's data.mdb into a new environment directory with damage(bytearray) applied."""
        out = self.path(name)
        os.makedirs(out)
        data = bytearray(read_bytes(os.path.join(db, "data.mdb")))
        data = damage(data)
        with open(os.path.join(out, "data.mdb"), "wb") as f:
            f.write(data)
        return out

    def assert_reported(self, db, args):
        """A read command on a damaged store exits 2 with a message, never by a signal."""
        p = run(*args, "--db", db, check=False)
        self.assertGreaterEqual(p.returncode, 0, f"{args} died by signal {-p.returncode}")
        self.assertEqual(p.returncode, 2, (args, p.stderr))
        self.assertTrue(p.stderr.startswith("idem"), p.stderr)
        return p

    def test_verify_store_passes_a_sound_store_and_names_the_damaged_page(self):
        self.gen("a.jsonl", events=4000, aggregates=300)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        p = run("verify", "--store", "--db", db)
        report = json.loads(p.stdout)
        self.assertEqual(report["store"], "ok")
        self.assertEqual(report["problems"], [])
        self.assertTrue(report["records"]["checked"])
        self.assertGreater(report["records"]["rows"], 0)
        self.assertIn("proj/positions", [t["name"] for t in report["tables"]])
        self.assertIn("the store is sound", p.stderr)

        root, depth, psize = lmdb_table(read_bytes(os.path.join(db, "data.mdb")), "proj/positions")
        self.assertGreaterEqual(depth, 2)

        def child_out_of_range(data):
            node = root * psize + struct.unpack_from("<H", data, root * psize + 16 + 2)[0]
            struct.pack_into("<HH", data, node, 0xffff, 0x7fff)  # node 1's child: far past the file
            return data

        bad = self.damaged_copy(db, "bad-child", child_out_of_range)
        p = run("verify", "--store", "--db", bad, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        report = json.loads(p.stdout)
        self.assertEqual(report["store"], "damaged")
        self.assertEqual(report["problems"][0]["page"], root)
        self.assertEqual(report["problems"][0]["table"], "proj/positions")
        self.assertIn("outside the file", report["problems"][0]["what"])
        self.assertIn(f"idem verify: {bad} is damaged", p.stderr)
        self.assertIn(f"page {root} (table proj/positions)", p.stderr)
        self.assertIn("restore it from a backup, or rebuild it from its logs", p.stderr)
        self.assert_reported(bad, ["stats"])
        self.assert_reported(bad, ["dump", "--projection", "positions"])

        def leaf_key_size(data):
            page = root * psize
            while struct.unpack_from("<H", data, page + 10)[0] & 0x01:  # down the first children to a leaf
                node = page + struct.unpack_from("<H", data, page + 16)[0]
                lo, hi = struct.unpack_from("<HH", data, node)
                page = (lo | hi << 16) * psize
            node = page + struct.unpack_from("<H", data, page + 16 + 2)[0]
            struct.pack_into("<H", data, node + 6, 0xfff0)
            self.leaf = page // psize
            return data

        bad = self.damaged_copy(db, "bad-leaf", leaf_key_size)
        p = run("verify", "--store", "--db", bad, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertEqual(json.loads(p.stdout)["problems"][0]["page"], self.leaf)
        for args in (["stats"], ["dump", "--projection", "positions"]):
            p = run(*args, "--db", bad, check=False)
            self.assertGreaterEqual(p.returncode, 0, f"{args} died by signal {-p.returncode}")

    def test_a_bit_flipped_in_a_row_value_is_named_by_verify_store(self):
        # A row's state that still decodes after the damage (lines 27 -> 2^58 + 27): only the
        # row's checksum can tell, and verify --store names the projection and the row.
        self.gen("o.jsonl", domain="orders", events=2000, aggregates=50)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("o.jsonl"))  # rows straight into the row table
        rows = jsonl(run("dump", "--db", db, "--projection", "order-totals").stdout)
        key = rows[len(rows) // 2]["key"]
        report = json.loads(run("verify", "--store", "--db", db).stdout)
        self.assertEqual(report["records"]["rows_without_checksum"], 0)
        data = bytearray(read_bytes(os.path.join(db, "data.mdb")))
        at = data.find(key.encode() + b"\0\0\x02")  # the leaf node: the row key, then its record (layout 2)
        self.assertGreater(at, 0)
        record = at + len(key) + 2
        # [layout][crc32c][state version][applied][highest seq], then the state: cereal's portable
        # archive starts with its byte-order byte, then total, lines, currency.
        lines = record + 1 + 4 + 4 + 8 + 8 + 1 + 8
        data[lines + 7] ^= 0x04
        bad = self.damaged_copy(db, "bad-row", lambda _: data)
        p = run("verify", "--store", "--db", bad, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        report = json.loads(p.stdout)
        self.assertEqual(report["store"], "damaged")
        self.assertEqual(report["problem_count"], 1)
        self.assertEqual(report["problems"][0]["table"], "proj/order-totals")
        self.assertIn(f"projection 'order-totals', row '{key}': row record of", report["problems"][0]["what"])
        self.assertIn("does not match its checksum", report["problems"][0]["what"])
        self.assertEqual(report["records"]["rows"], len(rows))  # the walk went on past it
        self.assertIn(f"idem verify: {bad} is damaged", p.stderr)
        # Readers refuse the row instead of returning the changed count.
        p = self.assert_reported(bad, ["get", "--projection", "order-totals", "--key", key])
        self.assertIn(f"projection 'order-totals', row '{key}'", p.stderr)

    def test_a_truncated_store_is_reported_not_crashed_on(self):
        self.gen("a.jsonl", events=4000, aggregates=300)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        cut = self.damaged_copy(db, "cut", lambda data: data[:len(data) // 2])
        p = run("verify", "--store", "--db", cut, check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("truncated", p.stderr)
        for args in (["stats"], ["dump", "--projection", "positions"]):
            p = self.assert_reported(cut, args)
            self.assertIn(cut, p.stderr)

    def test_a_store_written_through_the_live_path_and_pruned_checks_sound(self):
        # Many small commits, journal folds, deletions and reused free pages: none is damage.
        self.gen("a.jsonl", domain="game", events=6000, aggregates=200, seed=9)
        self.gen("b.jsonl", domain="trading", events=3000, aggregates=100, seed=4)
        db = self.path("db")
        run("consume", "--db", db, "--log", self.path("a.jsonl"), "--batch", "50", "--durability", "none",
            "--journal-rows", "300")
        run("prune", "--db", db, "--older-than", "1m", "--allowed-lateness", "1m")
        run("consume", "--db", db, "--log", self.path("b.jsonl"), "--batch", "20", "--durability", "none")
        report = json.loads(run("verify", "--store", "--db", db).stdout)
        self.assertEqual(report["store"], "ok")
        self.assertGreater(report["free_pages"], 0)

    def test_verify_store_takes_no_logs_and_verify_without_it_needs_them(self):
        self.gen("a.jsonl", events=50)
        db = self.path("db")
        run("rebuild", "--db", db, "--log", self.path("a.jsonl"))
        p = run("verify", "--store", "--db", db, "--log", self.path("a.jsonl"), check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("idem verify: option '--store' checks DIR alone: give no --log", p.stderr)
        for where in (db, self.path("nowhere")):
            p = run("verify", "--db", where, check=False)
            self.assertEqual(p.returncode, 1)
            self.assertIn("idem verify: missing option '--log FILE'", p.stderr)
        p = run("verify", "--store", "--db", self.path("nowhere"), check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn("no idem environment here", p.stderr)

if __name__ == "__main__":
    IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    # The same closing line as the C++ test executables, so one summary counts both.
    print(f"[cli] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
