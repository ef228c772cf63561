"""A real stock cluster for tests/test_real_stock_cluster.py: three nsqd 1.3.0 registered
with one nsqlookupd, as operators run them.

Each node is a :class:`~tests.real_upgrades_support.RealNsqd` (start-stock.sh from the
realnsq folder, which also starts an nsqlookupd per node): node 0's nsqlookupd is the
cluster's, and nodes 1 and 2 register with it too (``--lookupd-tcp-address``). The nodes take
three free port bases in 5600–5690, which no other real-server user takes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.real_upgrades_support import REALNSQ_DIR, START_TIMEOUT, RealNsqd, _port_busy

#: bases of one node each (BASE..BASE+11); this module's own range
PORT_BASES = range(5600, 5690, 12)
NODES = 3


def _wait_ping(address: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}/ping", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


@dataclass
class StockCluster:
    nodes: list[RealNsqd]
    #: nsqlookupd processes :meth:`restart_lookupd` started (stopped with the nodes)
    restarted: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def tcp(self) -> list[str]:
        return [n.tcp for n in self.nodes]

    @property
    def http(self) -> list[str]:
        return [n.http for n in self.nodes]

    @property
    def lookupd_http(self) -> str:
        return f"127.0.0.1:{self.nodes[0].base + 11}"

    @property
    def _lookupd_pidfile(self) -> Path:
        return self.nodes[0].state / "pids" / "stock-nsqlookupd.pid"

    @classmethod
    def start(cls, state_root: Path) -> StockCluster:
        if not (REALNSQ_DIR / "start-stock.sh").exists():
            raise RuntimeError(f"no real NSQ servers at {REALNSQ_DIR} (set REALNSQ_DIR)")
        free = [b for b in PORT_BASES if not any(_port_busy(p) for p in range(b, b + 12))]
        if len(free) < NODES:
            raise RuntimeError(f"no {NODES} free port bases in {PORT_BASES} for real nsqd")
        cluster = cls([RealNsqd(b, state_root / f"node-{b}") for b in free[:NODES]])
        lookupd_tcp = f"--lookupd-tcp-address=127.0.0.1:{free[0] + 10}"
        try:
            for i, node in enumerate(cluster.nodes):
                node.start([lookupd_tcp] if i else [])
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def restart_lookupd(self) -> None:
        """SIGKILL the cluster's nsqlookupd and start a new one on the same ports: it knows
        no nsqd until each re-registers (nsqd 1.3.0 notices on its 15 s lookupd ping)."""
        pidfile = self._lookupd_pidfile
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        base = self.nodes[0].base
        deadline = time.monotonic() + START_TIMEOUT
        while _port_busy(base + 11) and time.monotonic() < deadline:
            time.sleep(0.05)
        log = open(self.nodes[0].state / "logs" / "stock-nsqlookupd.log", "ab")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(
                [str(REALNSQ_DIR / "bin" / "nsqlookupd"), f"--tcp-address=127.0.0.1:{base + 10}",
                 f"--http-address=127.0.0.1:{base + 11}", "--broadcast-address=127.0.0.1"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.restarted.append(proc)
        # stop-stock.sh stops the pid the file names
        pidfile.write_text(f"{proc.pid}\n")
        _wait_ping(self.lookupd_http, START_TIMEOUT)

    def stop(self) -> None:
        procs = [n.stopping() for n in self.nodes]
        for proc in procs:
            proc.wait(START_TIMEOUT)
        for lookupd in self.restarted:
            lookupd.wait(START_TIMEOUT)
