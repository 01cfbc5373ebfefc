"""A TCP proxy on 127.0.0.1 between a client and a server, with faults a test turns on and off.

    import fault_proxy
    with fault_proxy.fault_proxy(ns.port) as proxy:   # listens on 127.0.0.1:<random>
        url = proxy.url                              # nats://127.0.0.1:<proxy port>
        proxy.reset_all()      # every connection through it is reset (RST to both ends)
        proxy.hold(4.0)        # nothing is forwarded for 4 s (both ways), then all of it is
        proxy.refuse(True)     # new connections are reset at once; refuse(False) lets them in again
        proxy.connections()    # how many it forwards now; proxy.accepted: how many it took in all

Faults only ever apply to loopback: the proxy listens on 127.0.0.1 and forwards to 127.0.0.1.
Python's standard library only.
"""

import socket
import struct
import threading
import time


class fault_proxy:
    def __init__(self, target_port, target_host="127.0.0.1"):
        self.target = (target_host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.url = f"nats://127.0.0.1:{self.port}"
        self.accepted = 0
        self._lock = threading.Lock()
        self._pairs = []  # (client socket, server socket)
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- faults ----------------------------------------------------------------------------

    def reset_all(self):
        """Resets every connection now: both ends see a connection reset."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                _reset(s)

    def hold(self, seconds):
        """Forwards nothing, either way, for seconds (blocking); what was sent meanwhile follows."""
        self._flowing.clear()
        try:
            time.sleep(seconds)
        finally:
            self._flowing.set()

    def refuse(self, on):
        """While on, each new connection is reset as soon as it is accepted."""
        self._refusing = on

    def connections(self):
        with self._lock:
            return len(self._pairs)

    def close(self):
        self._closed = True
        self._flowing.set()
        try:
            self.listener.close()
        except OSError:
            pass
        self.reset_all()

    # --- forwarding ------------------------------------------------------------------------

    def _accept_loop(self):
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._refusing or self._closed:
                _reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.accepted += 1
                self._pairs.append((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst, (client, server)), daemon=True).start()

    def _pump(self, src, dst, pair):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        # One side is gone: so is the other (unless reset_all took the pair, and resets it).
        with self._lock:
            if pair not in self._pairs:
                return
            self._pairs.remove(pair)
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


def _reset(s):
    """Closes s with an RST rather than a FIN; a thread blocked reading it wakes up."""
    for step in (lambda: s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
                 lambda: s.shutdown(socket.SHUT_RD), s.close):
        try:
            step()
        except OSError:
            pass
