#!/usr/bin/env python3
"""End-to-end tests of `idem publish` against a real nats-server: what the stream holds is read
back through the fixture (monitoring port, raw NATS protocol), never through idem, and compared
with a reference computed here from the log's bytes.

usage: publish_test.py PATH/TO/idem
"""

import json
import os
import subprocess
import sys
import threading
import time
import unittest

import idem_cli
import nats_server
from idem_cli import envelope_of, free_port, run


def percent(text, also=""):
    """Percent-encodes bytes outside 0x21-0x7E, '%' and also (the rule in jetstream_publish.hpp)."""
    out = []
    for b in text.encode():
        out.append(f"%{b:02X}" if b < 0x21 or b > 0x7E or chr(b) == "%" or chr(b) in also else chr(b))
    return "".join(out)


def msg_id(e):
    if isinstance(e.get("msgid"), str) and e["msgid"]:
        return percent(e["msgid"])
    return percent(f"{len(e['source'].encode())}:{e['source']}{e['id']}")


def subject_token(subject):
    """The token of an envelope subject: 'events' for none, '%65vents' for 'events' itself."""
    if subject == "":
        return "events"
    if subject == "events":
        return "%65vents"
    return percent(subject, ".*>")


def reference(lines, max_payload, with_ids=True):
    """Returns (the (subject token, msg id, body) the stream must store in order, malformed count,
    too large count) for publishing lines to a `P.>` subject."""
    stored, seen, malformed, too_large = [], set(), 0, 0
    for line in lines:
        e = envelope_of(line)
        mid = msg_id(e) if (e is not None and with_ids) else None
        if len(line) + (len(mid) + 30 if mid else 0) > max_payload:
            too_large += 1
            continue
        if e is None:
            malformed += 1
        token = subject_token(e.get("subject") or "") if e is not None else "events"
        if mid is None or mid not in seen:
            stored.append((token, mid, line))
        if mid is not None:
            seen.add(mid)
    return stored, malformed, too_large


class publish_case(unittest.TestCase):
    def setUp(self):
        self.ns = nats_server.nats_server()
        self.addCleanup(self.ns.close)

    def path(self, name):
        return os.path.join(self.ns.dir, name)

    def gen(self, name, **shares):
        args = ["gen", "--out", self.path(name), "--domain", "trading", "--events", shares.pop("events", 3000),
                "--aggregates", 100, "--seed", shares.pop("seed", 11)]
        for k, v in shares.items():
            args += ["--" + k, v]
        run(*args)
        with open(self.path(name), "rb") as f:
            return [l for l in f.read().split(b"\n") if l.strip()]

    def publish(self, log, stream="T", subject="trading.>", *extra, check=True):
        p = run("publish", "--skip-too-large",
                "--nats", self.ns.url, "--stream", stream, "--subject", subject, "--log", self.path(log),
                *extra, check=check)
        return (json.loads(p.stdout) if p.returncode == 0 else None), p

    def stored(self, stream):
        info = self.ns.stream_info(stream)
        return self.ns.messages(stream, range(info["first_seq"], info["last_seq"] + 1))


class publish_test(publish_case):
    def test_the_stream_stores_each_distinct_message_id_once_with_the_records_bytes(self):
        lines = self.gen("a.jsonl", malformed=0.01)
        expected, malformed, too_large = reference(lines, self.ns.varz()["max_payload"])
        r, p = self.publish("a.jsonl")
        self.assertGreater(malformed, 5)  # the log really has defects, duplicates and republished events
        self.assertEqual((r["records"], r["malformed"], r["too_large"]), (len(lines), malformed, too_large))
        self.assertEqual((r["stored"], r["first_sequence"], r["last_sequence"]), (len(expected), 1, len(expected)))
        self.assertEqual(r["duplicates"], len(lines) - too_large - len(expected))
        self.assertGreater(r["duplicates"], 100)
        self.assertTrue(r["stream_created"])
        self.assertIn("stored", p.stderr)

        info = self.ns.stream_info("T")
        self.assertEqual((info["messages"], info["subjects"], info["storage"]), (len(expected), ["trading.>"], "file"))
        self.assertEqual(info["duplicate_window"], 120 * 10**9)  # the server's default window
        got = [(m["subject"], m["headers"].get("Nats-Msg-Id"), m["data"]) for m in self.stored("T")]
        self.assertEqual(got, [("trading." + t, mid, body) for t, mid, body in expected])

    def test_publishing_the_same_log_twice_stores_only_its_malformed_records_again(self):
        lines = self.gen("a.jsonl", malformed=0.01)
        first, _ = self.publish("a.jsonl")
        second, p = self.publish("a.jsonl")
        # Malformed records carry no message id, so only they are stored a second time.
        self.assertEqual(second["stored"], first["malformed"])
        self.assertEqual(second["duplicates"], second["published"] - first["malformed"])
        self.assertEqual(second["first_sequence"], first["last_sequence"] + 1)
        self.assertFalse(second["stream_created"])
        self.assertEqual(self.ns.stream_info("T")["messages"], first["stored"] + first["malformed"])

        self.gen("clean.jsonl", malformed=0, seed=5)
        once, _ = self.publish("clean.jsonl", "C", "clean")
        again, _ = self.publish("clean.jsonl", "C", "clean")
        self.assertEqual((again["stored"], again["duplicates"]), (0, once["published"]))
        self.assertEqual(self.ns.stream_info("C")["messages"], once["stored"])

    def test_without_message_ids_every_record_is_stored(self):
        lines = self.gen("a.jsonl", malformed=0.01)
        expected, _, too_large = reference(lines, self.ns.varz()["max_payload"], with_ids=False)
        r, _ = self.publish("a.jsonl", "T", "trading.>", "--msg-id", "none")
        self.assertEqual((r["stored"], r["duplicates"]), (len(lines) - too_large, 0))
        self.assertEqual(len(expected), len(lines) - too_large)
        got = [(m["headers"], m["data"]) for m in self.stored("T")]
        self.assertEqual(got, [({}, body) for _, _, body in expected])

    def test_a_binary_log_publishes_the_same_messages(self):
        lines = self.gen("a.bin", malformed=0.01, format="binary")
        expected, _, _ = reference(lines_of_binary(self.path("a.bin")), self.ns.varz()["max_payload"])
        r, _ = self.publish("a.bin", "T", "trading.>", "--format", "binary")
        self.assertEqual(r["stored"], len(expected))
        self.assertEqual([m["data"] for m in self.stored("T")], [body for _, _, body in expected])
        self.assertTrue(lines)


def lines_of_binary(path):
    """Reads a binary idem log's bodies (header 16 bytes, flags at 12; records magic, length,
    crc, payload; with flag 1 the payload is a u32 body length, the body, its parsed attributes)."""
    with open(path, "rb") as f:
        data = f.read()
    attributed = int.from_bytes(data[12:16], "little") & 1
    out, at = [], 16
    while at + 12 <= len(data):
        n = int.from_bytes(data[at + 4:at + 8], "little")
        payload = data[at + 12:at + 12 + n]
        if attributed:
            payload = payload[4:4 + int.from_bytes(payload[:4], "little")]
        out.append(payload)
        at += 12 + n
    return out


class identity_test(publish_case):
    def write(self, name, events):
        with open(self.path(name), "w") as f:
            for e in events:
                f.write(json.dumps({"specversion": "1.0", "type": "t", "data": {}, **e}) + "\n")

    def test_two_sources_with_the_same_event_id_are_both_stored(self):
        self.write("a.jsonl", [{"source": "shop-a", "id": "1", "subject": "o-1"},
                               {"source": "shop-b", "id": "1", "subject": "o-1"},
                               {"source": "shop-a", "id": "1", "subject": "o-1"},      # a redelivery
                               {"source": "shop", "id": "-a1", "subject": "o-2"},      # same characters, other split
                               {"source": "urn:x y", "id": "7%", "subject": "a.b c"},  # spaces, '%', a dot
                               {"source": "s", "id": "2", "msgid": "m-2"},             # no subject
                               {"source": "s", "id": "3", "msgid": "m-2"}])            # same msgid: dropped
        r, _ = self.publish("a.jsonl", "O", "orders.>")
        self.assertEqual((r["stored"], r["duplicates"], r["malformed"]), (5, 2, 0))
        got = [(m["subject"], m["headers"]["Nats-Msg-Id"]) for m in self.stored("O")]
        self.assertEqual(got, [("orders.o-1", "6:shop-a1"), ("orders.o-1", "6:shop-b1"), ("orders.o-2", "4:shop-a1"),
                               ("orders.a%2Eb%20c", "7:urn:x%20y7%25"), ("orders.events", "m-2")])

    def test_a_literal_or_single_token_wildcard_subject(self):
        self.write("a.jsonl", [{"source": "s", "id": "1", "subject": "o-1"}, {"source": "s", "id": "2"}])
        self.publish("a.jsonl", "L", "payments.eu")
        self.assertEqual([m["subject"] for m in self.stored("L")], ["payments.eu", "payments.eu"])
        self.publish("a.jsonl", "W", "shop.*.created")
        self.assertEqual([m["subject"] for m in self.stored("W")], ["shop.o-1.created", "shop.events.created"])


class refusal_test(publish_case):
    def test_an_existing_stream_that_does_not_capture_the_subject_is_refused_and_left_alone(self):
        self.ns.create_stream("OTHER", ["payments.>"], duplicates_ns=30 * 10**9)
        with open(self.path("a.jsonl"), "w") as f:
            f.write('{"specversion":"1.0","id":"1","source":"s","type":"t"}\n')
        for subject in ("orders.>", "payments", "*.eu"):
            _, p = self.publish("a.jsonl", "OTHER", subject, check=False)
            self.assertEqual(p.returncode, 2, subject)
            self.assertIn(f"stream 'OTHER' at '{self.ns.url}' does not capture subject '{subject}' "
                          f"(its subjects: payments.>)", p.stderr)
        info = self.ns.stream_info("OTHER")
        self.assertEqual((info["subjects"], info["messages"], info["duplicate_window"]), (["payments.>"], 0, 30 * 10**9))

        # A narrower subject is captured; the existing stream keeps its own window and replicas.
        r, p = self.publish("a.jsonl", "OTHER", "payments.eu.*", "--duplicates-window", "5m")
        self.assertEqual((r["stored"], r["stream_created"], r["duplicates_window"]), (1, False, "30s"))
        self.assertIn("--duplicates-window 5m not applied", p.stderr)
        self.assertEqual(self.ns.stream_info("OTHER")["duplicate_window"], 30 * 10**9)
        self.assertEqual(self.stored("OTHER")[0]["subject"], "payments.eu.events")

    def test_a_new_stream_takes_the_window_given(self):
        with open(self.path("a.jsonl"), "w") as f:
            f.write('{"specversion":"1.0","id":"1","source":"s","type":"t"}\n')
        r, _ = self.publish("a.jsonl", "N", "n.>", "--duplicates-window", "10s")
        self.assertEqual((r["stream_created"], r["duplicates_window"]), (True, "10s"))
        self.assertEqual(self.ns.stream_info("N")["duplicate_window"], 10 * 10**9)

    def test_a_stream_the_server_cannot_create_is_an_error_naming_it(self):
        with open(self.path("a.jsonl"), "w") as f:
            f.write("{}\n")
        _, p = self.publish("a.jsonl", "R3", "r3", "--replicas", "3", check=False)  # one server, no cluster
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"cannot create stream 'R3' capturing 'r3' at '{self.ns.url}'", p.stderr)
        self.assertIn("JetStream error", p.stderr)
        self.assertIsNone(self.ns.stream_info("R3"))

    def test_bad_subjects_and_options_are_usage_or_input_errors(self):
        with open(self.path("a.jsonl"), "w") as f:
            f.write("{}\n")
        for subject, why in (("orders..x", "empty token"), ("orders.>.x", "'>' before its last token"),
                             ("orders.a*", "inside a token"), ("orders x", "whitespace")):
            _, p = self.publish("a.jsonl", "B", subject, check=False)
            self.assertEqual(p.returncode, 2, subject)
            self.assertIn(f"subject '{subject}'", p.stderr)
            self.assertIn(why, p.stderr)
        _, p = self.publish("a.jsonl", "B", "b", "--msg-id", "sometimes", check=False)
        self.assertEqual(p.returncode, 1)
        self.assertIn("'--msg-id': 'sometimes' is neither envelope nor none", p.stderr)
        self.assertIsNone(self.ns.stream_info("B"))

    def test_an_unreachable_server_is_an_error_naming_the_url(self):
        with open(self.path("a.jsonl"), "w") as f:
            f.write("{}\n")
        url = f"nats://127.0.0.1:{free_port()}"
        start = time.monotonic()
        # Waited for as a server that is starting would be, within the limit.
        p = run("publish", "--nats", url, "--stream", "S", "--subject", "s", "--log", self.path("a.jsonl"),
                "--broker-outage-limit", "2s", check=False, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertIn(f"cannot connect to NATS at '{url}'", p.stderr)
        self.assertIn("longer than the outage limit of 2s", p.stderr)
        self.assertLess(time.monotonic() - start, 30)

    def test_a_missing_log_is_an_error_naming_it(self):
        _, p = self.publish("missing.jsonl", check=False)
        self.assertEqual(p.returncode, 2)
        self.assertIn(self.path("missing.jsonl"), p.stderr)
        self.assertIsNone(self.ns.stream_info("T"))  # checked before the stream is created

    def test_a_record_over_the_servers_max_payload_is_named_and_the_publish_exits_2(self):
        envelope = {"specversion": "1.0", "source": "t", "type": "order.placed", "subject": "o-1"}
        small = [json.dumps({**envelope, "id": f"e{i}"}).encode() for i in range(5)]
        big = json.dumps({**envelope, "id": "big", "data": {"pad": "x" * (self.ns.varz()["max_payload"] + 10)}})
        log = self.path("a.jsonl")
        with open(log, "wb") as f:
            f.write(b"".join(l + b"\n" for l in small[:2] + [big.encode()] + small[2:]))
        p = run("publish", "--nats", self.ns.url, "--stream", "BIG", "--subject", "big.>", "--log", log, check=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("a.jsonl line 3", p.stderr)
        self.assertIn("1 records not published", p.stderr)
        self.assertEqual(json.loads(p.stdout)["too_large"], 1)
        info = self.ns.stream_info("BIG")
        self.assertEqual([m["data"] for m in self.ns.messages("BIG", range(info["first_seq"], info["last_seq"] + 1))],
                         small)
        # Left out on purpose: exit 0, still named.
        p = run("publish", "--nats", self.ns.url, "--stream", "BIG", "--subject", "big.>", "--log", log,
                "--skip-too-large")
        self.assertIn("a.jsonl line 3", p.stderr)
        self.assertEqual(self.ns.stream_info("BIG")["last_seq"], info["last_seq"])  # the window dropped the rest


class broker_restart_test(publish_case):
    def test_a_broker_killed_mid_publish_loses_and_doubles_nothing(self):
        lines = self.gen("a.jsonl", events=40000, malformed=0)
        expected, _, too_large = reference(lines, self.ns.varz()["max_payload"])
        proc = subprocess.Popen([idem_cli.IDEM, "publish", "--skip-too-large", "--nats", self.ns.url, "--stream", "T",
                                 "--subject", "trading.>", "--log", self.path("a.jsonl"), "--max-pending", "256"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def crash_and_restart():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the publisher is well under way
                info = self.ns.stream_info("T")
                if info and info["messages"] >= 2000:
                    break
                time.sleep(0.005)
            self.ns.kill()
            time.sleep(1.0)
            self.ns.restart()

        crasher = threading.Thread(target=crash_and_restart)
        crasher.start()
        out, err = proc.communicate(timeout=240)
        crasher.join()
        self.assertEqual(proc.returncode, 0, err.decode(errors="replace"))
        r = json.loads(out)
        print(f"\n  publish across a broker kill: {r}\n  {err.decode(errors='replace').strip()}", file=sys.stderr)
        info = self.ns.stream_info("T")
        if r["retries"] == 0:
            self.skipTest("the publisher finished before the broker was killed (a fast machine): nothing retried")
        # Retries went out under the same message ids: the window dropped what had been stored.
        self.assertEqual(info["messages"], len(expected))
        self.assertEqual(r["records"] - too_large, len(lines) - too_large)
        got = {m["headers"]["Nats-Msg-Id"] for m in self.stored("T")}
        self.assertEqual(got, {mid for _, mid, _ in expected})


if __name__ == "__main__":
    nats_server.skip_unless_available()
    idem_cli.IDEM = os.path.abspath(sys.argv.pop(1))
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[jetstream-publish] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
