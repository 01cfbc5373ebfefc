#!/usr/bin/env python3
"""End-to-end tests of log files that change under a consumer: rotation, copytruncate,
replacement, delete-and-recreate, a follower on an empty file, a torn last line. The real
`idem` binary on real files; rows are checked against the totals `idem gen` printed.

usage: log_files_test.py PATH/TO/idem
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

import cli_test
from cli_test import cli_case, read_bytes, run


class log_files_case(cli_case):
    def orders_log(self, name="all.jsonl", events=600, fmt="jsonl", seed=7):
        """An orders log and what `idem gen` says its rows must add up to."""
        expected = self.gen(name, domain="orders", events=events, aggregates=20, fmt=fmt, seed=seed)
        return read_bytes(self.path(name)).splitlines(keepends=True), expected["totals"]

    def sums(self, db):
        rows = cli_test.jsonl(self.dump(db, "order-totals"))
        return {"orders": len(rows), "lines": sum(r["state"]["lines"] for r in rows),
                "total": sum(r["state"]["total"] for r in rows)}

    def consume(self, db, log, *extra, check=True):
        return run("consume", "--db", db, "--log", log, *extra, check=check)

    def checkpoint(self, db):
        cps = self.stats(db)["checkpoints"]
        self.assertEqual(len(cps), 1, cps)
        return cps[0]

    def write(self, path, lines, mode="wb"):
        with open(path, mode) as f:
            f.writelines(lines)

    def follow(self, db, log, *extra):
        return subprocess.Popen([cli_test.IDEM, "consume", "--db", db, "--log", log, "--follow", "--batch", "50", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_for(self, what, condition, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if condition():
                return
            time.sleep(0.05)
        self.fail(f"timed out waiting for {what}")

    def caught_up(self, db, size):
        """Whether the follower's checkpoint reached size bytes (of whichever file it reads)."""
        if not os.path.exists(os.path.join(db, "data.mdb")):
            return False
        try:
            cps = self.stats(db)["checkpoints"]
        except AssertionError:
            return False
        return bool(cps) and cps[0]["position"] == size

    def stop(self, p):
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        return json.loads(out)

    def order_lines(self, tag, n, orders=7):
        """n order lines of a test's own, each `tag`-<i> (ids and amounts differ by tag)."""
        lines = []
        for i in range(n):
            order = f"o{i % orders}"
            data = {"order_id": order, "amount": {"minor": 100 + (i * 37 + len(tag) * 11) % 900, "currency": "EUR"}}
            lines.append((json.dumps({"specversion": "1.0", "id": f"{tag}-{i:05d}", "source": "/orders",
                                      "type": "order.line_added", "subject": order,
                                      "dataschema": "urn:idem:example:order.line_added:2", "data": data},
                                     separators=(",", ":")) + "\n").encode())
        return lines

    def reference(self, lines):
        """The order-totals rows the lines give, computed here: each distinct id once."""
        rows, seen = {}, set()
        for line in lines:
            e = json.loads(line)
            if e["id"] in seen:
                continue
            seen.add(e["id"])
            row = rows.setdefault(e["data"]["order_id"], {"total": 0, "lines": 0, "currency": "EUR"})
            row["total"] += e["data"]["amount"]["minor"]
            row["lines"] += 1
        return rows

    def rows(self, db):
        return {r["key"]: r["state"] for r in cli_test.jsonl(self.dump(db, "order-totals"))}

    def assert_changed_log_refused(self, db, log, state):
        p = self.consume(db, log, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn(log, p.stderr)
        self.assertIn("checkpoint at offset", p.stderr)
        self.assertIn("--restart-changed-log", p.stderr)
        self.assertEqual(self.checkpoint(db)["state"], state)


class rotation_test(log_files_case):
    def test_rotation_by_rename_between_consumes_finishes_the_old_file_then_reads_the_new_one(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:200])
        self.consume(db, log)
        self.assertEqual(self.checkpoint(db), {"source": "log:" + log, "position": os.path.getsize(log),
                                               "state": "ok", "lag_bytes": 0})
        self.write(log, lines[200:300], "ab")  # written to the old file before it was rotated: not yet read
        os.rename(log, log + ".1")
        self.write(log, lines[300:])
        cp = self.checkpoint(db)
        self.assertEqual(cp["state"], "rotated")
        self.assertEqual(cp["rotated_to"], log + ".1")
        self.assertEqual(cp["lag_bytes"], len(b"".join(lines[200:])))
        out = json.loads(self.consume(db, log).stdout)
        self.assertEqual(out["records"], len(lines) - 200)
        self.assertEqual(self.sums(db), totals)
        self.assertEqual(self.checkpoint(db), {"source": "log:" + log, "position": os.path.getsize(log),
                                               "state": "ok", "lag_bytes": 0})

    def test_two_rotations_between_consumes_stop_naming_the_file_that_would_be_skipped(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:200])
        self.consume(db, log)
        os.rename(log, log + ".1")
        self.write(log, lines[200:400])
        time.sleep(0.02)  # later modification times than the first file's
        os.rename(log + ".1", log + ".2")
        os.rename(log, log + ".1")
        self.write(self.path("live.jsonl.3.gz"), [b"\x1f\x8b compressed, not a rotation to read"])
        self.write(log, lines[400:])
        p = self.consume(db, log, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("rotated more than once", p.stderr)
        self.assertIn(log + ".1", p.stderr)
        self.assertNotIn(".gz", p.stderr)
        cp = self.checkpoint(db)
        self.assertEqual(cp["state"], "rotated")
        self.assertEqual(cp["lag_bytes"], len(b"".join(lines[200:])))  # both later files, none of the first
        self.assertLess(self.sums(db)["lines"], totals["lines"])  # nothing of the later files yet
        run("consume", "--db", db, "--log", log + ".1")  # what the message says to do
        self.consume(db, log, "--restart-changed-log")
        self.assertEqual(self.sums(db), totals)

    def test_a_log_copied_elsewhere_and_back_continues_where_it_was(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:250])
        self.consume(db, log)
        os.rename(log, self.path("elsewhere"))
        self.write(log, lines)  # a new file (another inode) whose first bytes are the ones consumed
        os.remove(self.path("elsewhere"))
        self.assertEqual(self.checkpoint(db)["state"], "ok")
        out = json.loads(self.consume(db, log).stdout)
        self.assertEqual(out["records"], len(lines) - 250)
        self.assertEqual(self.sums(db), totals)

    def test_rotation_during_follow_reads_the_old_file_to_its_end_then_the_new_one(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:200])
        p = self.follow(db, log, "--rotation-grace", "200ms")  # nothing reaches the old file after the rename
        try:
            self.wait_for("the first part", lambda: self.caught_up(db, os.path.getsize(log)))
            self.write(log, lines[200:260], "ab")  # the last lines before the rotation
            os.rename(log, log + ".1")
            for i in range(260, len(lines), 80):
                self.write(log, lines[i:i + 80], "ab")
                time.sleep(0.05)
            self.wait_for("the new file", lambda: self.caught_up(db, len(b"".join(lines[260:]))))
        finally:
            out = self.stop(p)
        self.assertEqual(out["records"], len(lines))
        self.assertEqual(self.sums(db), totals)
        self.assertEqual(self.checkpoint(db)["state"], "ok")

    def rotate_while_followed(self, restart):
        """logrotate's `create` mode under a follower: the log renamed, a new empty one created,
        the writer appending to the old file until it reopens the log, then to the new one."""
        first, window, later, new = (self.order_lines(tag, 120) for tag in ("first", "window", "later", "new"))
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, first)
        # Each line below reaches the old file well within the grace (a follower read and a stats call apart).
        grace = ("--rotation-grace", "4s")
        p = self.follow(db, log, *grace)
        try:
            self.wait_for("the first lines", lambda: self.caught_up(db, os.path.getsize(log)))
            writer = open(log, "ab")  # the writer's descriptor, kept across the rename
            os.rename(log, log + ".1")
            self.write(log, [])
            time.sleep(0.5)  # several polls: the follower has seen the path name the new file
            writer.write(b"".join(window[:60]))
            writer.flush()
            rotated = len(b"".join(first + window[:60]))
            self.wait_for("the lines appended to the rotated file", lambda: self.caught_up(db, rotated))
            if restart:
                self.stop(p)
                writer.write(b"".join(window[60:]))  # while no consumer runs
                writer.flush()
                cp = self.checkpoint(db)  # the truth: the rest of the old file is still to read
                self.assertEqual((cp["state"], cp["rotated_to"], cp["lag_bytes"]),
                                 ("rotated", log + ".1", len(b"".join(window[60:]))))
                p = self.follow(db, log, *grace)
                self.wait_for("the rotated file after the restart",
                              lambda: self.caught_up(db, os.path.getsize(log + ".1")))
                writer.write(b"".join(later))  # the resumed follower still reads the rotated file
            else:
                writer.write(b"".join(window[60:] + later))
            writer.close()  # the writer reopens the log
            self.write(log, new, "ab")
            self.wait_for("the new file", lambda: self.caught_up(db, len(b"".join(new))))
        finally:
            self.stop(p)
        self.assertEqual(self.rows(db), self.reference(first + window + later + new))
        self.assertEqual(self.checkpoint(db), {"source": "log:" + log, "position": os.path.getsize(log),
                                               "state": "ok", "lag_bytes": 0})

    def test_lines_appended_to_the_rotated_file_before_its_writer_reopens_the_log_are_read(self):
        self.rotate_while_followed(restart=False)

    def test_a_follower_restarted_while_the_rotated_file_still_grows_reads_the_rest_of_it(self):
        self.rotate_while_followed(restart=True)

    def test_a_rotation_grace_without_follow_is_refused(self):
        log = self.path("live.jsonl")
        self.write(log, self.order_lines("a", 3))
        p = self.consume(self.path("db"), log, "--rotation-grace", "2s", check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("option '--rotation-grace' applies to a followed log (--follow)", p.stderr)

    def test_delete_and_recreate_during_follow_reads_the_new_file_from_its_start(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:300])
        p = self.follow(db, log, "--rotation-grace", "200ms")
        try:
            self.wait_for("the first file", lambda: self.caught_up(db, os.path.getsize(log)))
            os.remove(log)
            time.sleep(0.3)  # the follower polls a path that names nothing for a while
            self.write(log, lines[300:])
            self.wait_for("the new file", lambda: self.caught_up(db, os.path.getsize(log)))
        finally:
            out = self.stop(p)
        self.assertEqual(out["records"], len(lines))
        self.assertEqual(self.sums(db), totals)


class changed_log_test(log_files_case):
    def test_copytruncate_stops_with_exit_2_and_the_flag_restarts_the_log(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:400])
        self.consume(db, log)
        self.write(log + ".1", lines[:400])  # copytruncate: copied aside, then cut to nothing in place
        os.truncate(log, 0)
        self.write(log, lines[400:], "ab")  # shorter than the checkpoint's offset
        self.assertLess(os.path.getsize(log), self.checkpoint(db)["position"])
        self.assertEqual(self.checkpoint(db)["state"], "truncated")
        self.assertEqual(self.checkpoint(db)["lag_bytes"], os.path.getsize(log))
        self.assert_changed_log_refused(db, log, "truncated")
        p = self.consume(db, log, check=False)
        self.assertIn("truncated", p.stderr)
        self.consume(db, log, "--restart-changed-log")
        self.assertEqual(self.sums(db), totals)
        self.assertEqual(self.checkpoint(db)["state"], "ok")

    def test_copytruncate_noticed_while_following(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:400])
        p = self.follow(db, log)
        self.wait_for("the first part", lambda: self.caught_up(db, os.path.getsize(log)))
        os.truncate(log, 0)
        self.write(log, lines[400:], "ab")
        _, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 2, err)
        self.assertIn(log, err)
        self.assertIn("truncated", err)
        self.assertIn("--restart-changed-log", err)
        q = self.follow(db, log, "--restart-changed-log")
        try:
            self.wait_for("the rewritten log", lambda: self.caught_up(db, os.path.getsize(log)))
        finally:
            self.stop(q)
        self.assertEqual(self.sums(db), totals)

    def rewrite_while_followed(self, rewrite):
        """A followed log rewritten in place (the same inode) with other lines of the same
        lengths: read at the old offset they would be whole lines, applied unnoticed."""
        original, other = self.order_lines("aaaa", 300), self.order_lines("bbbb", 600)
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, original)
        self.write(self.path("other.jsonl"), other)
        inode = os.stat(log).st_ino
        p = self.follow(db, log)
        try:
            self.wait_for("the log", lambda: self.caught_up(db, os.path.getsize(log)))
            rewrite(self.path("other.jsonl"), log)
            _, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        self.assertEqual(os.stat(log).st_ino, inode)
        self.assertEqual(p.returncode, 2, err)
        self.assertIn(log + ": checkpoint at offset " + str(len(b"".join(original))), err)
        self.assertIn("--restart-changed-log", err)
        self.assertEqual(self.rows(db), self.reference(original))  # nothing of the other file
        return err

    def test_a_followed_log_rewritten_in_place_stops_with_exit_2(self):
        def overwrite(other, log):
            with open(log, "r+b") as f:
                f.write(read_bytes(other))
        err = self.rewrite_while_followed(overwrite)
        self.assertIn("the bytes before the offset are not the ones consumed (rewritten in place)", err)

    def test_a_followed_log_copied_over_stops_with_exit_2(self):
        err = self.rewrite_while_followed(shutil.copyfile)  # cp: cut to nothing, then written
        self.assertTrue("(rewritten in place)" in err or "(truncated, e.g. copytruncate)" in err, err)

    def test_replacement_by_a_shorter_file_stops_with_exit_2(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:400])
        self.consume(db, log)
        self.write(self.path("new"), lines[400:])
        os.rename(self.path("new"), log)  # the old file is gone: nothing to finish
        self.assertEqual(self.checkpoint(db)["state"], "replaced")
        self.assert_changed_log_refused(db, log, "replaced")
        self.consume(db, log, "--restart-changed-log")
        self.assertEqual(self.sums(db), totals)

    def test_replacement_by_a_same_length_different_file_stops_with_exit_2(self):
        lines, totals = self.orders_log()
        log, db = self.path("live.jsonl"), self.path("db")
        self.write(log, lines[:400])
        self.consume(db, log)
        before = self.sums(db)
        body = bytearray(read_bytes(log))
        body[-20] = ord("Z") if body[-20] != ord("Z") else ord("Y")  # the same length, other bytes
        for how in ("rewritten in place", "renamed over it"):
            with self.subTest(how):
                if how == "rewritten in place":
                    with open(log, "r+b") as f:
                        f.write(body)
                else:
                    with open(self.path("new"), "wb") as f:
                        f.write(body)
                    os.rename(self.path("new"), log)
                self.assertEqual(os.path.getsize(log), self.checkpoint(db)["position"])
                self.assertEqual(self.checkpoint(db)["state"], "replaced")
                self.assert_changed_log_refused(db, log, "replaced")
                self.assertEqual(self.sums(db), before)


class log_format_arrival_test(log_files_case):
    def test_a_follower_on_an_empty_file_takes_the_binary_log_that_arrives(self):
        lines, totals = self.orders_log()
        run("convert", "--in", self.path("all.jsonl"), "--out", self.path("all.bin"), "--to", "binary")
        body = read_bytes(self.path("all.bin"))
        log, db = self.path("live.bin"), self.path("db")
        open(log, "wb").close()
        p = self.follow(db, log)
        try:
            time.sleep(0.3)
            with open(log, "ab") as f:
                for cut in (5, 11, 16, 4000, len(body)):  # the header arrives in pieces
                    f.write(body[f.tell():cut])
                    f.flush()
                    time.sleep(0.15)
            self.wait_for("the binary log", lambda: self.caught_up(db, len(body)))
        finally:
            out = self.stop(p)
        self.assertEqual(out["records"], len(lines))
        self.assertEqual(self.stats(db)["dead_letters"], 0 if b"not json" not in body else 1)
        self.assertEqual(self.sums(db), totals)

    def test_an_unterminated_last_line_gives_the_same_rows_and_report_through_rebuild_and_consume(self):
        lines, _ = self.orders_log()
        log = self.path("torn.jsonl")
        self.write(log, lines[:-1] + [lines[-1].rstrip(b"\n")])
        self.write(self.path("whole.jsonl"), lines[:-1])
        rebuilt = json.loads(run("rebuild", "--db", self.path("r"), "--log", log).stdout)
        consumed = json.loads(run("consume", "--db", self.path("c"), "--log", log).stdout)
        run("rebuild", "--db", self.path("ref"), "--log", self.path("whole.jsonl"))
        self.assertEqual(rebuilt["torn"], consumed["torn"])
        self.assertEqual(len(rebuilt["torn"]), 1)
        self.assertEqual(rebuilt["torn"][0]["offset"], len(b"".join(lines[:-1])))
        self.assertEqual(rebuilt["records"], consumed["records"])
        self.assertEqual(rebuilt["records"], len(lines) - 1)
        ref = self.dump(self.path("ref"), "order-totals")
        self.assertEqual(self.dump(self.path("r"), "order-totals"), ref)
        self.assertEqual(self.dump(self.path("c"), "order-totals"), ref)
        self.assertEqual(self.checkpoint(self.path("c"))["lag_bytes"], len(lines[-1]) - 1)


if __name__ == "__main__":
    cli_test.IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[cli-logs] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
