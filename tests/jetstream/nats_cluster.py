"""A real 3-node nats-server cluster with JetStream on loopback, for the scale-out tests.

    import nats_cluster
    with nats_cluster.nats_cluster(mappings={"orders.*": "orders.{{partition(4,1)}}.{{wildcard(1)}}"}) as c:
        c.urls                      # "nats://127.0.0.1:A,nats://127.0.0.1:B,nats://127.0.0.1:C"
        c.kill(1); c.restart(1)     # node 1: SIGKILL, then started again on its ports and store

The constructor returns once the cluster can take a stream (wait_ready); with wait=False, as soon
as the nodes are started, as a user's script that starts a cluster and publishes at once.

Each node has its own config file (generated here: server name, client, cluster and monitoring
ports picked free on loopback, routes to the other two, its own store directory) and its own
log. The subject mappings are the server-level `mappings` block, the same on every node.
Python's standard library only.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class nats_cluster:
    def __init__(self, size=3, mappings=None, start_timeout=60.0, wait=True):
        self.dir = tempfile.mkdtemp(prefix="idem-nats-cluster-")
        self.size = size
        self.start_timeout = start_timeout
        ports = _free_ports(3 * size)
        self.client_ports = ports[0:size]
        self.cluster_ports = ports[size:2 * size]
        self.monitor_ports = ports[2 * size:3 * size]
        self.procs = [None] * size
        self.configs = []
        for i in range(size):
            path = os.path.join(self.dir, f"n{i}.conf")
            with open(path, "w") as f:
                f.write(self._config(i, mappings or {}))
            self.configs.append(path)
        try:
            for i in range(size):
                self._start(i)
            if wait:  # without: the nodes are started and may still be forming the cluster
                self.wait_ready()
        except BaseException:
            self.close()
            raise

    def _config(self, i, mappings):
        routes = ",\n    ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i)
        maps = "\n".join(f'  "{k}": "{v}"' for k, v in mappings.items())
        store = os.path.join(self.dir, f"store{i}")
        log = os.path.join(self.dir, f"n{i}.log")
        return f"""server_name: n{i}
listen: 127.0.0.1:{self.client_ports[i]}
http: 127.0.0.1:{self.monitor_ports[i]}
log_file: "{log}"
jetstream {{
  store_dir: "{store}"
}}
cluster {{
  name: idem-test
  listen: 127.0.0.1:{self.cluster_ports[i]}
  routes: [
    {routes}
  ]
}}
mappings {{
{maps}
}}
"""

    def _start(self, i):
        self.procs[i] = subprocess.Popen(["nats-server", "-c", self.configs[i]], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         start_new_session=True)

    def _get(self, i, path):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_ports[i]}{path}", timeout=2) as r:
            return json.load(r)

    def wait_ready(self):
        """Waits until the cluster can take a stream: every running node is healthy and names the
        same meta leader, and the leader sees every other running node as a current peer (a
        stream with replicas asked for before that times out or finds no peers to place on)."""
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if self._ready():
                    return
            except urllib.error.HTTPError as e:
                last = e.read().decode(errors="replace")
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise RuntimeError(f"nats cluster not ready within {self.start_timeout}s: {last}\n{self.log_tail(0)}")

    def _ready(self):
        running = [i for i in range(self.size) if self.procs[i] is not None and self.procs[i].poll() is None]
        leaders, peers = set(), None
        for i in running:
            if self._get(i, "/healthz").get("status") != "ok":
                return False
            meta = self._get(i, "/jsz").get("meta_cluster") or {}
            if not meta.get("leader"):
                return False
            leaders.add(meta["leader"])
            if meta["leader"] == self._get(i, "/varz").get("server_name"):
                peers = meta.get("replicas") or []
        if len(leaders) != 1 or peers is None:
            return False
        current = [p for p in peers if p.get("current")]
        return len(current) >= len(running) - 1

    @property
    def urls(self):
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def kill(self, i):
        """SIGKILL of node i."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def restart(self, i):
        """Starts node i again on its config (ports, store) and waits for the cluster."""
        self.kill(i)
        self._start(i)
        self.wait_ready()

    def stream_info(self, name, node=0):
        """The stream's state as node's /jsz reports it (None if absent there)."""
        for i in [node] + [j for j in range(self.size) if j != node]:
            if self.procs[i] is None or self.procs[i].poll() is not None:
                continue
            jsz = self._get(i, "/jsz?streams=true&config=true")
            for acc in jsz.get("account_details", []):
                for s in acc.get("stream_detail", []):
                    if s["name"] == name and s.get("cluster", {}).get("leader") is not None:
                        return s
        return None

    def log_tail(self, i, lines=30):
        try:
            with open(os.path.join(self.dir, f"n{i}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def close(self):
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            if p is not None:
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if os.environ.get("IDEM_KEEP_DIR") != "1":  # kept to look into a failure
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
