#!/usr/bin/env python3
"""The stall watchdog with the real binary, and the alert rules checked against what it exposes.

- `idem consume --follow --stall-after 1s`: idle (never stalled) while it has nothing to do; a gap
  parked past the threshold is `stalled` in `idem stats`, naming the stream and the sequence it
  waits for, and `idle` again once the gap fills (the rows then equal a reference computed here);
  a consumer that stops reporting (SIGSTOP) is `stalled`; a stopped one is `stopped`.
- `idem serve --stall-after 1s`: GET /readyz is 200 while idle, 503 with the reason while a gap
  stays parked; /metrics says idem_stalled 1 and the gap's age.
- docs/alerts/idem.rules.yml: `promtool check rules`, and `promtool test rules` with a case per
  alert whose input series are values scraped from the serve run above (and, where a run cannot
  produce the condition safely, e.g. a disk 95% full, values derived from the scraped ones).

usage: health_test.py PATH/TO/idem PATH/TO/idem.rules.yml
"""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

IDEM = None
RULES = None


def run(*args, check=True, timeout=120):
    p = subprocess.run([IDEM, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"idem {' '.join(map(str, args))} exited {p.returncode}\nstderr: {p.stderr}")
    return p


def line(event_id, order, amount, seq=None):
    e = {"specversion": "1.0", "id": event_id, "source": "/shop", "type": "order.line_added", "subject": order,
         "time": "2026-12-02T10:00:00Z", "data": {"order_id": order, "amount": amount}}
    if seq is not None:
        e["sequence"] = str(seq)
    return e


def stats(db):
    return json.loads(run("stats", "--db", db).stdout)


def try_stats(db):
    """stats, or None while the store cannot be read yet (a consumer creating it)."""
    p = run("stats", "--db", db, check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def wait_for(what, probe, timeout=30):
    """Calls probe() until it returns something true; fails naming what and the last value."""
    until = time.monotonic() + timeout
    last = None
    while time.monotonic() < until:
        last = probe()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s (last: {last})")


def state_is(db, state):
    def probe():
        s = try_stats(db)
        return s if s and s["state"] == state else None
    return probe


def request(port, method, path, body=None):
    """One HTTP request to 127.0.0.1:port; (status, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request(method, path, body=body, headers={"Content-Type": "application/cloudevents+json"} if body else {})
        r = c.getresponse()
        return r.status, r.read().decode()
    finally:
        c.close()


def rule_annotations(text):
    """{alert: {annotation: template}} of a rules file whose annotations are one-line strings."""
    out = {}
    for chunk in re.split(r"^\s*- alert: ", text, flags=re.M)[1:]:
        name = chunk.split()[0]
        block = chunk.split("annotations:", 1)[1]
        out[name] = {k: json.loads(v) for k, v in re.findall(r'^\s+(summary|description): (".*")$', block, re.M)}
    return out


class log_case(unittest.TestCase):
    """A store db and a log orders.jsonl in a temporary directory."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-health-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.db = os.path.join(self.dir, "db")
        self.log = os.path.join(self.dir, "orders.jsonl")

    def append(self, *events):
        with open(self.log, "a") as f:
            for e in events:
                f.write(json.dumps(e, separators=(",", ":")) + "\n")


class follow_test(log_case):
    def test_idle_is_not_stalled_a_parked_gap_is_and_a_silent_consumer_is(self):
        self.append(line("a1", "o1", 5), line("a2", "o1", 7))
        p = subprocess.Popen([IDEM, "consume", "--db", self.db, "--log", self.log, "--follow", "--stall-after", "1s"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for("the consumer applies the log", lambda: os.path.exists(os.path.join(self.db, "idem.health"))
                     and (try_stats(self.db) or {}).get("outcomes", {}).get("applied") == 2)
            s = wait_for("idle once caught up", state_is(self.db, "idle"))
            self.assertEqual(s["reason"], "")
            self.assertEqual(s["health"]["lag_seconds"], 0)
            # Nothing to do for three thresholds: still idle.
            time.sleep(3)
            s = stats(self.db)
            self.assertEqual(s["state"], "idle", s)

            # o2's sequence 3 arrives before 1 and 2: parked, then stalled past the threshold.
            self.append(line("b3", "o2", 30, seq=3))
            s = wait_for("a parked gap is stalled", state_is(self.db, "stalled"))
            self.assertIn("stream o2 has had events parked behind a gap", s["reason"])
            self.assertIn("waiting for sequence 1", s["reason"])
            self.assertEqual(s["health"]["parked_streams"], 1)
            self.assertGreater(s["health"]["oldest_gap_seconds"], 1.0)

            # The gap fills: idle again, and the rows are the reference's.
            self.append(line("b1", "o2", 10, seq=1), line("b2", "o2", 20, seq=2))
            wait_for("idle once the gap fills", state_is(self.db, "idle"))
            rows = {r["key"]: r["state"] for r in map(json.loads, run("dump", "--db", self.db, "--projection",
                                                                       "order-totals").stdout.splitlines())}
            self.assertEqual({k: (v["total"], v["lines"]) for k, v in rows.items()}, {"o1": (12, 2), "o2": (60, 3)})

            # A consumer that no longer reports (stopped by a signal) is stalled too.
            p.send_signal(signal.SIGSTOP)
            try:
                s = wait_for("a silent consumer is stalled", state_is(self.db, "stalled"), timeout=30)
                self.assertIn(f"pid {p.pid}", s["reason"])
                self.assertIn("has not reported its health for", s["reason"])
            finally:
                p.send_signal(signal.SIGCONT)
            wait_for("it reports again", state_is(self.db, "idle"))
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
            err = p.stderr.read().decode()
            p.stderr.close()
        self.assertEqual(p.returncode, 0, err)
        s = stats(self.db)
        self.assertEqual(s["state"], "stopped")
        self.assertNotIn("health", s)
        self.assertFalse(os.path.exists(os.path.join(self.db, "idem.health")))


class pause_test(log_case):
    def follow(self):
        return subprocess.Popen([IDEM, "consume", "--db", self.db, "--log", self.log, "--follow"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self, p):
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        err = p.stderr.read().decode()
        p.stderr.close()
        self.assertEqual(p.returncode, 0, err)

    def applied(self):
        return stats(self.db)["outcomes"]["applied"]

    def audit(self):
        return [(a["action"], a["reason"]) for a in map(json.loads, run("audit", "--db", self.db).stdout.splitlines())]

    def test_a_paused_follower_reads_nothing_across_a_restart_until_resumed(self):
        self.append(line("a1", "o1", 5))
        p = self.follow()
        try:
            wait_for("the first event", lambda: os.path.exists(os.path.join(self.db, "idem.health")) and
                     (try_stats(self.db) or {}).get("outcomes", {}).get("applied") == 1)
            out = json.loads(run("pause", "--db", self.db, "--reason", "disk swap").stdout)
            self.assertEqual((out["paused"], out["reason"]), (True, "disk swap"))
            self.assertIn(f"pid {p.pid}", out["recorded_by"])
            self.append(line("a2", "o1", 7), line("a3", "o2", 1))
            time.sleep(1.5)
            s = stats(self.db)
            self.assertEqual((s["state"], s["outcomes"]["applied"]), ("paused", 1), s)
            self.assertEqual(s["reason"], "paused by an operator: disk swap")
            self.assertEqual(s["pause"]["reason"], "disk swap")
            self.assertEqual(self.audit(), [("pause", "disk swap")])
        finally:
            self.stop(p)  # stopped while paused: reads nothing more on its way out
        self.assertEqual(self.applied(), 1)
        self.assertEqual(stats(self.db)["state"], "stopped")

        p = self.follow()  # starts paused
        try:
            wait_for("the restarted follower reports", state_is(self.db, "paused"))
            time.sleep(1)
            self.assertEqual(self.applied(), 1)
            out = json.loads(run("resume", "--db", self.db, "--reason", "swapped").stdout)
            self.assertEqual(out["paused"], False)
            wait_for("the rest applied once resumed",
                     lambda: (try_stats(self.db) or {}).get("outcomes", {}).get("applied") == 3)
            self.assertEqual(stats(self.db)["pause"], None)
        finally:
            self.stop(p)
        rows = {r["key"]: (r["state"]["total"], r["state"]["lines"])
                for r in map(json.loads, run("dump", "--db", self.db, "--projection", "order-totals").stdout.splitlines())}
        self.assertEqual(rows, {"o1": (12, 2), "o2": (1, 1)})
        self.assertEqual(self.audit(), [("pause", "disk swap"), ("resume", "")])
        # Pauses change no row: a rebuild from the log is not refused for them, and keeps a pause.
        run("pause", "--db", self.db, "--reason", "rebuild")
        self.assertEqual(self.audit()[-1], ("pause", "rebuild"))
        run("rebuild", "--db", self.db, "--log", self.log)
        self.assertEqual(stats(self.db)["pause"]["reason"], "rebuild")
        run("resume", "--db", self.db)
        self.assertEqual(run("resume", "--db", self.db, check=False).returncode, 1)  # not paused

    def test_a_second_pause_with_another_reason_is_taken_and_said(self):
        self.append(line("a1", "o1", 5))
        p = self.follow()
        try:
            wait_for("the first event", lambda: os.path.exists(os.path.join(self.db, "idem.health")) and
                     (try_stats(self.db) or {}).get("outcomes", {}).get("applied") == 1)
            run("pause", "--db", self.db, "--reason", "first")
            out = json.loads(run("pause", "--db", self.db, "--reason", "second").stdout)
            self.assertEqual(out["reason"], "second")
            self.append(line("a2", "o1", 7))
            time.sleep(2)
            s = stats(self.db)
            self.assertEqual((s["state"], s["reason"]), ("paused", "paused by an operator: second"), s)
            self.assertGreater(s["health"]["lag_bytes"], 0)  # what waits, while paused
            self.assertEqual(s["outcomes"]["applied"], 1)
            # A second follower is refused and leaves the running one's health file alone.
            second = run("consume", "--db", self.db, "--log", self.log, "--follow", check=False)
            self.assertEqual(second.returncode, 2, second.stderr)
            time.sleep(0.5)
            self.assertEqual(stats(self.db)["state"], "paused")
            run("resume", "--db", self.db)
            wait_for("applied once resumed", lambda: (try_stats(self.db) or {}).get("outcomes", {}).get("applied") == 2)
        finally:
            self.stop(p)
        # A consume that would apply and end regardless of the pause is refused.
        run("pause", "--db", self.db, "--reason", "batch job")
        refused = run("consume", "--db", self.db, "--log", self.log, check=False)
        self.assertEqual(refused.returncode, 2, refused.stderr)
        self.assertIn("is paused (batch job", refused.stderr)

    def test_pause_and_resume_racing_with_no_consumer_leave_the_file_and_the_audit_agreeing(self):
        self.append(line("a1", "o1", 5))
        run("consume", "--db", self.db, "--log", self.log)
        run("pause", "--db", self.db, "--reason", "base")
        for i in range(6):
            procs = [subprocess.Popen([IDEM, "resume", "--db", self.db], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL),
                     subprocess.Popen([IDEM, "pause", "--db", self.db, "--reason", f"r{i}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
            for q in procs:
                q.wait(60)
            paused = stats(self.db)["pause"] is not None
            last = self.audit()[-1][0]
            self.assertEqual(paused, last == "pause", (i, paused, self.audit()[-3:]))

    def test_a_writer_that_does_not_pause_is_refused_and_no_pause_is_left(self):
        import fcntl
        self.append(line("a1", "o1", 5))
        run("consume", "--db", self.db, "--log", self.log)
        # A rebuild (which replaces the directory) holds the writer lock and keeps no health file.
        with open(os.path.join(self.db, "idem.lock"), "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.truncate(0)
            lock.write(f"{os.getpid()}\nidem rebuild --db {self.db} --log {self.log}\n")
            lock.flush()
            p = run("pause", "--db", self.db, "--reason", "x", check=False)
            self.assertEqual(p.returncode, 2, p.stderr)
            self.assertIn("which does not pause", p.stderr)
            self.assertIn("idem rebuild", p.stderr)
        self.assertIsNone(stats(self.db)["pause"])

    def test_serve_refuses_events_while_paused(self):
        p = subprocess.Popen([IDEM, "serve", "--db", self.db, "--listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            port = int(json.loads(p.stdout.readline())["listening"].rsplit(":", 1)[1])
            post = lambda e: request(port, "POST", "/events", json.dumps(e))
            self.assertEqual(post(line("s1", "o1", 5))[0], 200)
            run("pause", "--db", self.db, "--reason", "maintenance")
            status, body = post(line("s2", "o1", 7))
            self.assertEqual(status, 503, body)
            self.assertIn("paused by an operator: maintenance", body)
            status, body = request(port, "GET", "/readyz")
            self.assertEqual(status, 503)
            self.assertIn("paused", body)
            self.assertEqual(request(port, "GET", "/rows/order-totals/o1")[0], 200)
            run("resume", "--db", self.db)
            self.assertEqual(post(line("s2", "o1", 7))[0], 200)
            self.assertEqual([a[0] for a in self.audit()], ["pause", "resume"])
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
            p.stdout.close()
            p.stderr.close()


class serve_and_alerts_test(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-health-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.db = os.path.join(self.dir, "db")

    def request(self, port, method, path, body=None):
        return request(port, method, path, body)

    def scrape(self, port):
        """The samples of /metrics as {(name, frozenset(labels)): value}."""
        _, text = self.request(port, "GET", "/metrics")
        out = {}
        for m in re.finditer(r"^([a-z_]+)(\{[^}]*\})? (\S+)$", text, re.M):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
        return out

    def test_readyz_fails_with_the_reason_and_every_alert_fires_on_recorded_series(self):
        p = subprocess.Popen([IDEM, "serve", "--db", self.db, "--listen", "127.0.0.1:0", "--stall-after", "1s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            port = int(json.loads(p.stdout.readline())["listening"].rsplit(":", 1)[1])
            self.assertEqual(self.request(port, "POST", "/events", json.dumps(line("s1", "o1", 5)))[0], 200)
            self.assertEqual(self.request(port, "GET", "/readyz"), (200, "ready\n"))
            healthy = self.scrape(port)
            # A malformed event: dead-lettered and counted.
            self.assertEqual(self.request(port, "POST", "/events", '{"specversion":"1.0","id":"bad"}')[0], 400)
            # A gap: o9's sequence 2 before 1.
            self.assertEqual(self.request(port, "POST", "/events", json.dumps(line("g2", "o9", 1, seq=2)))[0], 200)
            status, body = wait_for("readyz fails", lambda: (lambda r: r if r[0] == 503 else None)(
                self.request(port, "GET", "/readyz")))
            self.assertTrue(body.startswith("stalled: stream o9 has had events parked behind a gap"), body)
            self.assertIn("waiting for sequence 1", body)
            stalled = self.scrape(port)
            # idem stats reads what serve wrote into DIR/idem.health (each second): the same verdict.
            s = wait_for("stats says stalled", state_is(self.db, "stalled"))
            self.assertIn("stream o9 has had events parked behind a gap", s["reason"])
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
            p.stdout.close()
            p.stderr.close()

        consumer = ("consumer", "idem")
        def value(samples, name, *labels):
            return samples[(name, frozenset((consumer,) + labels))]

        self.assertEqual(value(healthy, "idem_stalled"), 0)
        self.assertEqual(value(stalled, "idem_stalled"), 1)
        self.assertEqual(value(stalled, "idem_parked_streams"), 1)
        self.assertGreater(value(stalled, "idem_oldest_parked_gap_seconds"), 1)
        self.assertGreater(value(stalled, "idem_store_filesystem_size_bytes"), 0)
        self.assertGreater(value(stalled, "idem_commit_duration_seconds_count"), 0)
        # Doubles are printed whole: a Unix time to the second at least (not 1.79669e+09).
        self.assertLess(abs(value(stalled, "idem_last_commit_timestamp_seconds") - time.time()), 120)
        dead_before = value(healthy, "idem_deliveries_total", ("outcome", "dead_lettered"))
        dead_after = value(stalled, "idem_deliveries_total", ("outcome", "dead_lettered"))
        self.assertEqual((dead_before, dead_after), (0, 1))
        retention = value(stalled, "idem_inbox_retention_seconds")
        bound = value(stalled, "idem_redelivery_bound_seconds")
        self.assertGreater(retention, bound)
        size = value(stalled, "idem_store_filesystem_size_bytes")

        self.check_rules(value, healthy, stalled, dead_before, dead_after, retention, bound, size)

    def check_rules(self, value, healthy, stalled, dead_before, dead_after, retention, bound, size):
        promtool = shutil.which("promtool")
        if promtool is None:
            self.fail("promtool is not installed (Debian package prometheus; tools/setup installs it)")
        check = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stdout + check.stderr)

        labels = '{consumer="idem",instance="idem:9000",job="idem"}'
        alert_labels = {"consumer": "idem", "instance": "idem:9000", "job": "idem"}

        def series(name, values, extra=""):
            l = labels if not extra else labels[:-1] + "," + extra + "}"
            return {"series": name + l, "values": " ".join(repr(float(v)) for v in values)}

        with open(RULES) as f:
            rules_text = f.read()
        annotations = rule_annotations(rules_text)

        def fires(name, severity, at, series_list, extra_labels=None):
            exp = dict(alert_labels, severity=severity, **(extra_labels or {}))
            said = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: exp[m.group(1)], v)
                    for k, v in annotations[name].items()}
            return {"interval": "1m", "input_series": series_list,
                    "alert_rule_test": [{"eval_time": at, "alertname": name,
                                         "exp_alerts": [{"exp_labels": exp, "exp_annotations": said}]}]}

        def silent(name, at, series_list):
            return {"interval": "1m", "input_series": series_list,
                    "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": []}]}

        h_stalled, s_stalled = value(healthy, "idem_stalled"), value(stalled, "idem_stalled")
        h_paused = value(healthy, "idem_paused")
        avail = value(stalled, "idem_store_filesystem_avail_bytes")
        tests = [
            # Stalled: the recorded 0 then the recorded 1, held for 2 minutes.
            fires("IdemConsumerStalled", "page", "3m", [series("idem_stalled", [h_stalled, s_stalled, s_stalled, s_stalled])]),
            silent("IdemConsumerStalled", "3m", [series("idem_stalled", [h_stalled] * 4)]),
            silent("IdemConsumerStalled", "1m", [series("idem_stalled", [h_stalled, s_stalled])]),  # not for 1m yet
            # Lag: the recorded (caught-up) lag, then 10 minutes over the bound.
            fires("IdemLagHigh", "ticket", "10m",
                  [series("idem_lag_seconds", [value(healthy, "idem_lag_seconds")] + [600] * 10)]),
            silent("IdemLagHigh", "10m", [series("idem_lag_seconds", [value(healthy, "idem_lag_seconds")] * 11)]),
            # Dead letters: the recorded counter, before and after the malformed event.
            fires("IdemDeadLettersRising", "ticket", "2m",
                  [series("idem_deliveries_total", [dead_before, dead_after, dead_after], 'outcome="dead_lettered"')],
                  {"outcome": "dead_lettered"}),
            silent("IdemDeadLettersRising", "2m",
                   [series("idem_deliveries_total", [dead_before] * 3, 'outcome="dead_lettered"')]),
            # Retention: the recorded pair (4 days against about 3.2) is fine; a day is not.
            silent("IdemInboxRetentionBelowRedeliveryBound", "1m",
                   [series("idem_inbox_retention_seconds", [retention] * 2),
                    series("idem_redelivery_bound_seconds", [bound] * 2)]),
            fires("IdemInboxRetentionBelowRedeliveryBound", "page", "1m",
                  [series("idem_inbox_retention_seconds", [86400] * 2),
                   series("idem_redelivery_bound_seconds", [bound] * 2)]),
            # Disk: the recorded filesystem size with 5% of it free, held for 6 minutes.
            fires("IdemDiskFilling", "page", "6m",
                  [series("idem_store_filesystem_avail_bytes", [size * 0.05] * 7),
                   series("idem_store_filesystem_size_bytes", [size] * 7)]),
            # Filling at a rate that empties the recorded free space within two hours.
            fires("IdemDiskFullSoon", "ticket", "80m",
                  [series("idem_store_filesystem_avail_bytes", [avail * (1 - i / 120) for i in range(81)])]),
            silent("IdemDiskFullSoon", "80m", [series("idem_store_filesystem_avail_bytes", [avail] * 81)]),
            # Paused: the recorded 0, then paused for over two hours.
            fires("IdemPausedLong", "ticket", "130m", [series("idem_paused", [h_paused] + [1] * 130)]),
            silent("IdemPausedLong", "60m", [series("idem_paused", [h_paused] + [1] * 60)]),
        ]
        spec = {"rule_files": [os.path.abspath(RULES)], "evaluation_interval": "1m", "tests": tests}
        path = os.path.join(self.dir, "idem.rules.test.yml")
        with open(path, "w") as f:
            json.dump(spec, f, indent=1)  # JSON is YAML
        # Every alert of the file has a case that fires.
        names = set(re.findall(r"^\s*- alert: (\w+)", rules_text, re.M))
        fired = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a["exp_alerts"]}
        self.assertEqual(names, fired)
        r = subprocess.run([promtool, "test", "rules", path], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    IDEM = os.path.abspath(sys.argv.pop(1))
    RULES = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
