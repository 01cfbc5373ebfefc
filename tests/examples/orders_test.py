#!/usr/bin/env python3
"""The orders example program (examples/orders) as a user runs it: it makes its store in a new
or empty directory, runs again over the store it made, and never touches a directory that holds
anything else; `--help` prints its usage and creates nothing.

usage: orders_test.py PATH/TO/orders
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ORDERS = None


def run(*args, cwd):
    return subprocess.run([ORDERS, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def tree(top):
    """Every path under top with its content (files) or None (directories)."""
    out = {}
    for root, dirs, files in os.walk(top):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), top)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as h:
                out[os.path.relpath(os.path.join(root, f), top)] = h.read()
    return out


class orders_test(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-orders-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_it_makes_its_store_in_a_new_directory_and_runs_again_over_it(self):
        for _ in range(2):
            p = run("data", cwd=self.dir)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("100 orders, 0 wrong totals", p.stdout)
            # The second read model, built from the first one's change feed through a subscription.
            self.assertIn("10 customers from the order totals' changes, 0 wrong totals", p.stdout)
            self.assertIn("applied=10000 ", p.stdout)
        self.assertEqual(sorted(os.listdir(os.path.join(self.dir, "data"))), ["data.mdb", "idem.lock", "lock.mdb"])
        os.makedirs(os.path.join(self.dir, "empty"))
        self.assertEqual(run("empty", cwd=self.dir).returncode, 0)

    def test_a_directory_holding_anything_else_is_refused_and_untouched(self):
        mine = os.path.join(self.dir, "mine")
        os.makedirs(os.path.join(mine, "sub"))
        with open(os.path.join(mine, "notes.txt"), "w") as f:
            f.write("keep me\n")
        with open(os.path.join(mine, "sub", "data.mdb"), "w") as f:
            f.write("not a store\n")
        # A store of another program: a store's files only, but not this program's consumer.
        other = os.path.join(self.dir, "other")
        os.makedirs(other)
        with open(os.path.join(other, "data.mdb"), "wb") as f:
            f.write(b"\0" * 8192)
        # The example's store with something of the user's put beside it.
        mixed = os.path.join(self.dir, "mixed")
        self.assertEqual(run("mixed", cwd=self.dir).returncode, 0)
        with open(os.path.join(mixed, "fills.jsonl"), "w") as f:
            f.write("{}\n")
        a_file = os.path.join(self.dir, "a-file")
        with open(a_file, "w") as f:
            f.write("x\n")
        for target in (mine, other, mixed, a_file):
            before = tree(self.dir)
            p = run(target, cwd=self.dir)
            self.assertEqual(p.returncode, 2, (target, p.stdout, p.stderr))
            self.assertIn(f"orders: {target} exists and is not a store this program made; not touching it",
                          p.stderr)
            self.assertEqual(tree(self.dir), before, target)

    def test_help_and_unknown_options_create_nothing(self):
        p = run("--help", cwd=self.dir)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("usage: orders [DIR]", p.stdout)
        for args in (["--bogus"], ["-x"], ["a", "b"]):
            p = run(*args, cwd=self.dir)
            self.assertEqual(p.returncode, 2, args)
            self.assertIn("usage: orders [DIR]", p.stderr)
        self.assertEqual(os.listdir(self.dir), [])


if __name__ == "__main__":
    ORDERS = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[orders-example] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
