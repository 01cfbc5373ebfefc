"""A real nats-server for the JetStream tests, and ways to look at it that do not go through idem.

    import nats_server
    nats_server.skip_unless_available()          # exits 77 (meson: skipped) without nats-server
    with nats_server.nats_server() as ns:
        ns.create_stream("ORDERS", ["orders.>"])
        ack = ns.publish("orders.o-1", b'{"specversion":"1.0",...}', {"Nats-Msg-Id": "m-1"})
        ns.stream_info("ORDERS")["messages"]     # read from the monitoring port
        ns.kill(); ns.restart()                  # same client port, same store

Every server runs on loopback with random ports and its own temporary directory (store, log,
ports file), removed when the server is closed. The inspection helpers read the monitoring
endpoint (/jsz), and the publisher speaks the NATS text protocol over a plain socket, so a test
can feed bodies idem would never write and check the broker's state without trusting idem's
own NATS code. Python's standard library only.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

SKIP = 77  # meson's exit status for a skipped test


def skip_unless_available():
    """Exits with 77 (meson's skip code), saying why, when nats-server is not on PATH."""
    if shutil.which("nats-server") is None:
        print("skipped: nats-server is not on PATH (install nats-server to run the JetStream tests)")
        sys.exit(SKIP)


class nats_error(Exception):
    """The server refused a request (a -ERR, a JetStream API error, no responders) or did not answer."""


class nats_server:
    """One nats-server with JetStream, started at construction and cleaned up by close()."""

    def __init__(self, start_timeout=30.0):
        self.dir = tempfile.mkdtemp(prefix="idem-nats-")
        self.store = os.path.join(self.dir, "store")
        self.log = os.path.join(self.dir, "log")
        self.start_timeout = start_timeout
        self.proc = None
        self.port = None
        self.monitor_port = None
        try:
            self._start(["-p", "-1", "-m", "-1"])
        except BaseException:
            self.close()
            raise

    # --- lifecycle -------------------------------------------------------------------------

    def _start(self, port_args):
        cmd = ["nats-server", "-js", "-sd", self.store, "-a", "127.0.0.1", *port_args,
               "--ports_file_dir", self.dir, "-l", self.log]
        # stdio to /dev/null: a server holding the harness's pipe open makes the harness hang.
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        ports = self._read_ports_file()
        self.port = _port_of(ports["nats"][0])
        self.monitor_port = _port_of(ports["monitoring"][0])
        self._wait_healthy()

    def _read_ports_file(self):
        path = os.path.join(self.dir, f"nats-server_{self.proc.pid}.ports")
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            self._check_running()
            try:
                with open(path) as f:
                    return json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or half written
                time.sleep(0.02)
        raise RuntimeError(f"nats-server wrote no ports file {path} within {self.start_timeout}s\n{self.log_tail()}")

    def _wait_healthy(self):
        url = f"http://127.0.0.1:{self.monitor_port}/healthz"
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_running()
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    body = json.load(r)
                    if body.get("status") == "ok":
                        return
                    last = json.dumps(body)
            except urllib.error.HTTPError as e:  # 503 while JetStream recovers its streams
                last = e.read().decode(errors="replace")
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.05)
        raise RuntimeError(f"nats-server at {url} not healthy within {self.start_timeout}s: {last}\n{self.log_tail()}")

    def _check_running(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {self.proc.returncode}\n{self.log_tail()}")

    def stop(self, timeout=15.0):
        """Stops the server cleanly (SIGTERM) and waits for it; a server that hangs is killed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self):
        """Kills the server (SIGKILL): what it had not written to its store is lost, like a crash."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait()

    def restart(self):
        """Starts the server again (stopping it first if it runs) on the same ports and store."""
        self.stop()
        # The same client port, so connected clients reconnect; the same monitoring port, so a
        # test may keep its URLs.
        self._start(["-p", str(self.port), "-m", str(self.monitor_port)])

    def close(self):
        """Stops the server and removes its directory (store, log, ports file)."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def url(self):
        """The client URL, nats://127.0.0.1:PORT."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines=30):
        """Returns the last lines of the server's log (for failure messages)."""
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return "(no server log)"

    # --- inspection through the monitoring endpoint -----------------------------------------

    def varz(self):
        """Returns the /varz report (server limits such as max_payload, connections)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_port}/varz", timeout=10) as r:
            return json.load(r)

    def jsz(self):
        """Returns the /jsz report with every stream, consumer and config."""
        url = f"http://127.0.0.1:{self.monitor_port}/jsz?accounts=true&streams=true&consumers=true&config=true"
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)

    def _stream_detail(self, name):
        for account in self.jsz().get("account_details") or []:
            for s in account.get("stream_detail") or []:
                if s["name"] == name:
                    return s
        return None

    def stream_info(self, name):
        """Returns the stream's state and config ({messages, first_seq, last_seq, bytes,
        consumer_count, subjects, duplicate_window, num_replicas, created}), or None if it does not exist."""
        s = self._stream_detail(name)
        if s is None:
            return None
        state, config = s.get("state", {}), s.get("config", {})
        return {
            "messages": state.get("messages", 0),
            "bytes": state.get("bytes", 0),
            "first_seq": state.get("first_seq", 0),
            "last_seq": state.get("last_seq", 0),
            "consumer_count": state.get("consumer_count", 0),
            "subjects": config.get("subjects", []),
            "duplicate_window": config.get("duplicate_window"),
            "num_replicas": config.get("num_replicas"),
            "storage": config.get("storage"),
            "created": s.get("created"),
        }

    def consumer_info(self, stream, consumer):
        """Returns the consumer's state ({num_ack_pending, num_redelivered, num_pending,
        num_waiting, ack_floor_stream_seq, delivered_stream_seq, config}), or None if it does not exist."""
        s = self._stream_detail(stream)
        for c in (s or {}).get("consumer_detail") or []:
            if c["name"] == consumer:
                return {
                    "num_ack_pending": c.get("num_ack_pending", 0),
                    "num_redelivered": c.get("num_redelivered", 0),
                    "num_pending": c.get("num_pending", 0),
                    "num_waiting": c.get("num_waiting", 0),
                    "ack_floor_stream_seq": c.get("ack_floor", {}).get("stream_seq", 0),
                    "delivered_stream_seq": c.get("delivered", {}).get("stream_seq", 0),
                    "config": c.get("config", {}),
                }
        return None

    # --- a raw NATS client -----------------------------------------------------------------

    def connect(self, timeout=10.0):
        """Returns a new raw_connection to this server (close it, or use it in a with)."""
        return raw_connection("127.0.0.1", self.port, timeout)

    def publish(self, subject, body, headers=None):
        """Publishes one message and returns its PubAck ({stream, seq, duplicate}); raises nats_error
        when the stream refuses it or nothing captures the subject."""
        with self.connect() as c:
            return c.publish_many([(subject, body, headers)])[0]

    def publish_many(self, messages):
        """Publishes (subject, body, headers) tuples, pipelined; returns their PubAcks in order."""
        with self.connect() as c:
            return c.publish_many(messages)

    def messages(self, stream, seqs):
        """Returns the stored messages at sequences seqs, read through $JS.API.STREAM.MSG.GET, each
        {seq, subject, data: bytes, headers: dict}; None where a sequence holds no message."""
        with self.connect() as c:
            replies = c.request_many([(f"$JS.API.STREAM.MSG.GET.{stream}", json.dumps({"seq": q}).encode(), None)
                                      for q in seqs])
        out = []
        for reply in replies:
            m = reply.get("message")
            if m is None:
                out.append(None)
                continue
            out.append({"seq": m["seq"], "subject": m["subject"], "data": base64.b64decode(m.get("data", "")),
                        "headers": _parse_headers(base64.b64decode(m.get("hdrs", "")))})
        return out

    def create_stream(self, name, subjects, duplicates_ns=None, replicas=1):
        """Creates a file-storage stream capturing subjects; returns the server's stream info."""
        config = {"name": name, "subjects": list(subjects), "storage": "file", "retention": "limits",
                  "discard": "old", "num_replicas": replicas}
        if duplicates_ns is not None:
            config["duplicate_window"] = duplicates_ns
        with self.connect() as c:
            return c.api(f"$JS.API.STREAM.CREATE.{name}", config)

    def purge_stream(self, name):
        """Removes every message of the stream (its sequences go on from where they were)."""
        with self.connect() as c:
            return c.api(f"$JS.API.STREAM.PURGE.{name}", {})

    def delete_stream(self, name):
        """Deletes the stream and its consumers."""
        with self.connect() as c:
            return c.api(f"$JS.API.STREAM.DELETE.{name}", None)


def _parse_headers(block):
    """Parses a "NATS/1.0\\r\\nKey: Value\\r\\n..." header block into a dict (last value wins)."""
    headers = {}
    for line in block.decode(errors="replace").split("\r\n")[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip()] = v.strip()
    return headers


def _port_of(url):
    return int(url.rsplit(":", 1)[1])


class raw_connection:
    """A NATS client in a hundred lines: CONNECT, SUB to a private inbox, PUB/HPUB with a reply
    subject, and the MSG/HMSG replies matched back by reply subject. Blocking, one thread."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        info = self._line()
        if not info.startswith(b"INFO "):
            raise nats_error(f"expected INFO from {host}:{port}, got {info[:200]!r}")
        connect = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                   "lang": "python-raw", "version": "0", "protocol": 1, "name": "idem-test-fixture"}
        self.inbox = "_INBOX." + uuid.uuid4().hex
        self.sock.sendall(f"CONNECT {json.dumps(connect)}\r\nSUB {self.inbox}.* 1\r\nPING\r\n".encode())
        while True:  # PONG answers our PING: CONNECT and SUB have been processed
            line = self._line()
            if line == b"PONG":
                break
            self._control(line)
        self.next_reply = 0

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise nats_error("the server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _bytes(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise nats_error("the server closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _control(self, line):
        if line == b"PING":
            self.sock.sendall(b"PONG\r\n")
        elif line.startswith(b"-ERR"):
            raise nats_error(line.decode(errors="replace"))
        elif line in (b"+OK", b"PONG") or line.startswith(b"INFO "):
            pass
        else:
            raise nats_error(f"unexpected protocol line {line[:200]!r}")

    def _reply(self):
        """Reads until the next message on our inbox; returns (reply subject, status, payload)."""
        while True:
            line = self._line()
            parts = line.split(b" ")
            if parts[0] == b"MSG":   # MSG <subject> <sid> [reply] <#bytes>
                return parts[1].decode(), None, self._bytes(int(parts[-1]))
            if parts[0] == b"HMSG":  # HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>
                data = self._bytes(int(parts[-1]))
                head, payload = data[:int(parts[-2])], data[int(parts[-2]):]
                status = head.split(b"\r\n", 1)[0].split(b" ")  # "NATS/1.0 503" for no responders
                return parts[1].decode(), (status[1].decode() if len(status) > 1 else None), payload
            self._control(line)

    def _frame(self, subject, reply, body, headers):
        if headers:
            head = "NATS/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
            head = head.encode()
            return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), reply.encode(), len(head),
                                                      len(head) + len(body), head, body)
        return b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply.encode(), len(body), body)

    def request_many(self, messages, window=1024):
        """Sends (subject, body, headers) requests, up to window at a time before reading their
        replies; returns the decoded JSON replies in order. Raises nats_error on no responders."""
        replies = []
        for start in range(0, len(messages), window):
            chunk = messages[start:start + window]
            pending = {}
            frames = []
            for i, (subject, body, headers) in enumerate(chunk):
                reply = f"{self.inbox}.{self.next_reply}"
                self.next_reply += 1
                pending[reply] = start + i
                frames.append(self._frame(subject, reply, body, headers))
            self.sock.sendall(b"".join(frames))
            got = {}
            while pending:
                reply, status, payload = self._reply()
                if reply not in pending:
                    continue  # a late answer to an earlier, abandoned request
                index = pending.pop(reply)
                if status == "503":
                    raise nats_error(f"no responders for '{messages[index][0]}' (no stream captures it)")
                got[index] = json.loads(payload) if payload else {}
            replies += [got[i] for i in sorted(got)]
        return replies

    def publish_many(self, messages):
        """Publishes to JetStream; returns each PubAck ({stream, seq, duplicate}); raises nats_error
        naming the subject if the stream refused one."""
        acks = self.request_many([(s, b if isinstance(b, bytes) else b.encode(), h) for s, b, h in messages])
        for (subject, _, _), ack in zip(messages, acks):
            if "error" in ack:
                raise nats_error(f"publish to '{subject}' refused: {ack['error']}")
            ack.setdefault("duplicate", False)
        return acks

    def api(self, subject, request):
        """Sends one JetStream API request; returns its reply, raising nats_error on an API error."""
        body = b"" if request is None else json.dumps(request).encode()
        reply = self.request_many([(subject, body, None)])[0]
        if "error" in reply:
            raise nats_error(f"{subject}: {reply['error'].get('description')} "
                             f"[JetStream error {reply['error'].get('err_code')}]")
        return reply
