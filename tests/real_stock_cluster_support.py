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

from tests.real_upgrades_support import (
    REALNSQ_DIR,
    START_TIMEOUT,
    RealNsqd,
    free_bases,
    port_busy,
)

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


def _wait_gone(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while port_busy(port) and time.monotonic() < deadline:
        time.sleep(0.05)


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
        free = free_bases(PORT_BASES, 12)
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
        _wait_gone(base + 11, START_TIMEOUT)
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


#: bases of one :class:`FaultCluster` each (BASE..BASE+19); this range is its own
FAULT_PORT_BASES = range(5900, 5990, 20)


@dataclass
class Proc:
    """One nsqd or nsqlookupd run from the binary itself (not start-stock.sh, which wipes the
    data on start): killed with any signal and started again on the same data path, on the
    same or on other ports."""

    binary: str
    state: Path
    tcp_port: int
    http_port: int
    flags: list[str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def tcp(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def start(self) -> None:
        args = [str(REALNSQ_DIR / "bin" / self.binary), f"--tcp-address={self.tcp}",
                f"--http-address={self.http}", "--broadcast-address=127.0.0.1", *self.flags]
        if self.binary == "nsqd":
            data = self.state / "data"
            data.mkdir(parents=True, exist_ok=True)
            args.append(f"--data-path={data}")
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / f"{self.binary}.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_ping(self.http, START_TIMEOUT)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` and wait until the process is gone (SIGTERM: nsqd 1.3.0 closes its
        clients and writes its queues and in-flight messages to disk first)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(START_TIMEOUT)
        _wait_gone(self.tcp_port, START_TIMEOUT)

    def restart(self, sig: int = signal.SIGTERM, ports: tuple[int, int] | None = None) -> None:
        """Stop with ``sig`` and start again, on ``ports`` (tcp, http) when given."""
        self.stop(sig)
        if ports is not None:
            self.tcp_port, self.http_port = ports
        self.start()


@dataclass
class FaultCluster:
    """``nodes`` nsqd 1.3.0, each registered with every one of ``lookupds`` nsqlookupd, all
    run as :class:`Proc` on one free base of :data:`FAULT_PORT_BASES`: lookupd i on BASE+2i,
    nsqd j on BASE+8+2j, and BASE+18..19 free for an nsqd moved to other ports."""

    base: int
    lookupds: list[Proc]
    nodes: list[Proc]

    @property
    def spare_ports(self) -> tuple[int, int]:
        return self.base + 18, self.base + 19

    @property
    def lookupd_http(self) -> list[str]:
        return [lk.http for lk in self.lookupds]

    @classmethod
    def start(cls, state_root: Path, nodes: int = 2, lookupds: int = 1,
              flags: tuple[str, ...] = ()) -> FaultCluster:
        free = free_bases(FAULT_PORT_BASES, 20)
        if not free:
            raise RuntimeError(f"no free port base in {FAULT_PORT_BASES} for real nsqd")
        base = free[0]
        lks = [Proc("nsqlookupd", state_root / f"lookupd-{i}", base + 2 * i, base + 2 * i + 1,
                    []) for i in range(lookupds)]
        reg = [f"--lookupd-tcp-address={lk.tcp}" for lk in lks]
        nsqds = [Proc("nsqd", state_root / f"nsqd-{j}", base + 8 + 2 * j, base + 9 + 2 * j,
                      [*reg, *flags]) for j in range(nodes)]
        cluster = cls(base, lks, nsqds)
        try:
            for p in [*lks, *nsqds]:
                p.start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        for p in [*self.nodes, *self.lookupds]:
            if p.proc is not None:
                p.proc.send_signal(signal.SIGTERM)
        for p in [*self.nodes, *self.lookupds]:
            p.stop(signal.SIGKILL)
