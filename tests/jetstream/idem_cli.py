"""What the JetStream end-to-end tests share about running the `idem` binary and reading what it
leaves: one command run to its end, its JSON Lines, the envelopes a log line holds, polling.

A test's main sets `idem_cli.IDEM` to the binary's absolute path before any test runs.
"""

import json
import socket
import subprocess
import time

IDEM = None

# What a process that corrupted memory or raced leaves on its stderr: a sanitizer's report (the
# sanitizer builds run these tests too) or glibc's abort message.
CRASH_MARKERS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer", "runtime error:",
                 "double free", "free(): ", "malloc(): ", "corrupted ")


class crashed(Exception):
    """An idem process died of a signal or reported memory corruption: never a tolerated failure
    (the waits retry on AssertionError only)."""


def crash_in(stderr):
    """The crash marker stderr holds, or None."""
    return next((m for m in CRASH_MARKERS if m in stderr), None)


def run(*args, check=True, timeout=300, env=None):
    """Runs `idem ARGS` to its end; stdout and stderr as text. A death by a signal or a crash
    marker raises crashed; with check, another non-zero exit raises AssertionError."""
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, timeout=timeout, env=env)
    p.stdout, p.stderr = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if p.returncode < 0 or crash_in(p.stderr):
        raise crashed(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def envelope_of(line):
    """Returns the envelope dict if line (bytes) is one idem accepts, as far as the generated logs'
    defects go (JSON, UTF-8, specversion 1.0, id/source/type non-empty strings), else None."""
    try:
        e = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(e, dict) or e.get("specversion") != "1.0":
        return None
    for k in ("id", "source", "type"):
        if not isinstance(e.get(k), str) or not e[k]:
            return None
    return e


def free_port():
    """A loopback port nothing listens on (for a server that is down on purpose)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout, what, interval=0.05):
    """Polls condition() until it returns something true, and returns that; fails naming what
    after timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = condition()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def main(suite):
    """Runs the calling module's test cases against the idem binary named by the first argument
    (skipped without a nats-server), prints the one summary line tools/test counts, and exits."""
    import os
    import sys
    import unittest

    import nats_server

    nats_server.skip_unless_available()
    global IDEM
    IDEM = os.path.abspath(sys.argv.pop(1))
    started = time.monotonic()
    result = unittest.main(module="__main__", exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[{suite}] test cases: {total} | {total - failed} passed | {failed} failed "
          f"in {time.monotonic() - started:.0f} s")
    sys.exit(1 if failed else 0)
