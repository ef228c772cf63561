"""Shared pieces of the throughput benchmarks: the embedded cluster in a subprocess, and
one JSON line per measurement so that peers can run in their own processes."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

BODY = b"x" * 100


@dataclass
class Result:
    client: str
    scenario: str
    messages: int
    wall: float
    cpu: float
    #: the kernel's share of ``cpu`` (system time: mostly socket reads and writes)
    sys: float = 0.0

    @property
    def rate(self) -> float:
        return self.messages / self.wall if self.wall else 0.0

    @property
    def cpu_us_per_msg(self) -> float:
        return self.cpu / self.messages * 1e6 if self.messages else 0.0

    def emit(self) -> None:
        print("RESULT " + json.dumps(asdict(self)), flush=True)

    @classmethod
    def parse(cls, line: str) -> Result:
        return cls(**json.loads(line.removeprefix("RESULT ")))


def cpu_seconds() -> float:
    """CPU time (user + system) of this process only."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def sys_seconds() -> float:
    """System (kernel) CPU time of this process only."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


class Meter:
    """Wall and CPU time of this process between start() and stop()."""

    def __init__(self) -> None:
        self.wall0 = self.cpu0 = self.sys0 = 0.0
        self.wall = self.cpu = self.sys = 0.0

    def start(self) -> None:
        self.wall0, self.cpu0, self.sys0 = time.perf_counter(), cpu_seconds(), sys_seconds()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = cpu_seconds() - self.cpu0
        self.sys = sys_seconds() - self.sys0


@contextmanager
def embedded_cluster(flavour: str = "stock", nodes: int = 1,
                     topics: tuple[str, ...] = ()) -> Iterator[dict[str, list[str]]]:
    """Run ``python -m smartnsq.devcluster`` in a subprocess (so the server's CPU is not the
    client's) and yield its addresses by kind."""
    cmd = [sys.executable, "-m", "smartnsq.devcluster", "--flavour", flavour,
           "--nodes", str(nodes)]
    for t in topics:
        cmd += ["--topic", t]
    if topics:
        cmd += ["--channel", "bench"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    addrs: dict[str, list[str]] = {}
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError("the embedded cluster exited before it was ready")
            if line.strip() == "ready":
                break
            kind, _, value = line.strip().partition(" ")
            addrs.setdefault(kind, []).append(value)
        else:
            raise RuntimeError("the embedded cluster did not start within 30 s")
        yield addrs
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_peer(script: str, *args: str, timeout: float = 300,
             env: dict[str, str] | None = None) -> list[Result]:
    """Run a peer script in its own process (``env``: its environment, default ours) and
    collect its RESULT lines."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run([sys.executable, os.path.join(here, script), *args],
                             capture_output=True, text=True, timeout=timeout, check=False,
                             env=env)
    except subprocess.TimeoutExpired:
        print(f"  ! {script} {' '.join(args[:1])} did not finish within {timeout:g} s",
              file=sys.stderr)
        return []
    results = [Result.parse(line) for line in out.stdout.splitlines()
               if line.startswith("RESULT ")]
    if out.returncode != 0 or not results:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        print(f"  ! {script} {' '.join(args[:1])} failed: {' | '.join(tail)}", file=sys.stderr)
    return results


def peer_main(publish: Callable[[str, str, int, str], Result],
              consume: Callable[[str, str, int], Result]) -> None:
    """Command line of a peer script: ``SCENARIO --nsqd ADDR --topic T --count N``."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("scenario")
    ap.add_argument("--nsqd", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--count", type=int, default=100_000)
    a = ap.parse_args()
    if a.scenario == "consume_fin":
        consume(a.nsqd, a.topic, a.count).emit()
    else:
        publish(a.nsqd, a.topic, a.count, a.scenario).emit()
