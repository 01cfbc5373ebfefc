#!/usr/bin/env python3
"""Checks the JetStream test fixture itself (nats_server.py) against a real nats-server, so a
failing idem test is never a failing fixture.

usage: fixture_test.py
"""

import sys
import unittest

import nats_server


def event(source, id, subject="o-1"):
    return (f'{{"specversion":"1.0","id":"{id}","source":"{source}","type":"t",'
            f'"subject":"{subject}","data":{{}}}}').encode()


class fixture_test(unittest.TestCase):
    def test_publish_dedup_inspect_and_survive_a_kill(self):
        with nats_server.nats_server() as ns:
            self.assertTrue(ns.url.startswith("nats://127.0.0.1:"))
            self.assertIsNone(ns.stream_info("ORDERS"))
            ns.create_stream("ORDERS", ["orders.>"], duplicates_ns=60 * 10**9)
            info = ns.stream_info("ORDERS")
            self.assertEqual((info["messages"], info["subjects"]), (0, ["orders.>"]))
            self.assertEqual(info["duplicate_window"], 60 * 10**9)

            first = ns.publish("orders.o-1", event("s", "1"), {"Nats-Msg-Id": "m-1"})
            self.assertEqual((first["stream"], first["seq"], first["duplicate"]), ("ORDERS", 1, False))
            again = ns.publish("orders.o-1", event("s", "1"), {"Nats-Msg-Id": "m-1"})
            self.assertEqual((again["seq"], again["duplicate"]), (1, True))  # the stream stored nothing
            plain = ns.publish("orders.o-2", b"not json at all")  # PUB, no headers: always stored
            self.assertEqual((plain["seq"], plain["duplicate"]), (2, False))

            acks = ns.publish_many([("orders.o-3", event("s", str(i)), {"Nats-Msg-Id": f"b-{i % 50}"})
                                    for i in range(200)])
            self.assertEqual([a["duplicate"] for a in acks], [False] * 50 + [True] * 150)
            self.assertEqual([a["seq"] for a in acks[:50]], list(range(3, 53)))

            info = ns.stream_info("ORDERS")
            self.assertEqual((info["messages"], info["first_seq"], info["last_seq"]), (52, 1, 52))
            one, two, none = ns.messages("ORDERS", [1, 2, 99])
            self.assertEqual((one["subject"], one["data"], one["headers"]), ("orders.o-1", event("s", "1"),
                                                                             {"Nats-Msg-Id": "m-1"}))
            self.assertEqual((two["data"], two["headers"]), (b"not json at all", {}))
            self.assertIsNone(none)

            with self.assertRaises(nats_server.nats_error) as refused:
                ns.publish("payments.p-1", b"{}")  # no stream captures it
            self.assertIn("no responders", str(refused.exception))

            ns.kill()
            self.assertFalse(ns.running)
            ns.restart()
            info = ns.stream_info("ORDERS")
            self.assertEqual((info["messages"], info["first_seq"], info["last_seq"]), (52, 1, 52))
            self.assertEqual(ns.publish("orders.o-4", b"{}")["seq"], 53)

            ns.purge_stream("ORDERS")
            info = ns.stream_info("ORDERS")
            self.assertEqual((info["messages"], info["first_seq"], info["last_seq"]), (0, 54, 53))
            ns.delete_stream("ORDERS")
            self.assertIsNone(ns.stream_info("ORDERS"))
            directory = ns.dir
        self.assertFalse(nats_server.os.path.exists(directory))  # the store went with the server

    def test_a_clean_restart_keeps_port_and_store(self):
        with nats_server.nats_server() as ns:
            port = ns.port
            ns.create_stream("S", ["s.*"])
            ns.publish("s.a", b"x")
            ns.stop()
            ns.restart()
            self.assertEqual(ns.port, port)
            self.assertEqual(ns.stream_info("S")["messages"], 1)

    def test_consumer_state_is_read_from_the_monitoring_port(self):
        with nats_server.nats_server() as ns:
            ns.create_stream("S", ["s.*"])
            ns.publish_many([("s.a", b"x", None)] * 3)
            self.assertIsNone(ns.consumer_info("S", "c"))
            with ns.connect() as c:
                c.api("$JS.API.CONSUMER.DURABLE.CREATE.S.c",
                      {"stream_name": "S", "config": {"durable_name": "c", "ack_policy": "explicit"}})
            info = ns.consumer_info("S", "c")
            self.assertEqual((info["num_pending"], info["num_ack_pending"], info["ack_floor_stream_seq"],
                              info["delivered_stream_seq"]), (3, 0, 0, 0))
            self.assertEqual(info["config"]["ack_policy"], "explicit")

    def test_api_errors_are_raised_with_their_description(self):
        with nats_server.nats_server() as ns:
            ns.create_stream("A", ["a.>"])
            with self.assertRaises(nats_server.nats_error) as overlap:
                ns.create_stream("B", ["a.x"])  # subjects overlap with A's
            self.assertIn("JetStream error", str(overlap.exception))


if __name__ == "__main__":
    nats_server.skip_unless_available()
    result = unittest.main(exit=False, verbosity=2).result
    total = result.testsRun
    failed = len(result.failures) + len(result.errors)
    print(f"[jetstream-fixture] test cases: {total} | {total - failed} passed | {failed} failed")
    sys.exit(1 if failed else 0)
