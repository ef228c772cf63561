"""Helpers for the CLI tests: an embedded cluster on a background thread (the commands run
their own event loop with ``asyncio.run``), running the real entry point in-process (click's
CliRunner) or as a ``python -m smartnsq`` subprocess (also from async tests), and checks for
one-line errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result

from smartnsq.cli.app import cli
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd import NsqdOptions

T = TypeVar("T")

#: bound on every wait in these tests
WAIT = 20.0


class ClusterThread:
    """A DevCluster running on its own event loop in a daemon thread."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("nsqd_options", NsqdOptions(msg_timeout=2.0, client_timeout=10.0))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cluster: DevCluster = self.run(self._start(kw))

    async def _start(self, kw: dict[str, Any]) -> DevCluster:
        cluster = DevCluster(**kw)
        await cluster.start()
        return cluster

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the cluster's loop (its state is not thread-safe)."""
        async def wrapper() -> T:
            return fn()
        return self.run(wrapper())

    def stop(self) -> None:
        self.run(self.cluster.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        self.loop.close()

    @property
    def lookupd(self) -> str:
        return self.cluster.lookupd_http_addresses[0]


def cluster_fixture(flavour: str, nodes: int) -> Callable[[], Iterator[ClusterThread]]:
    """A module-scoped fixture: an embedded cluster of ``nodes`` nsqd and one lookupd on its
    own thread, stopped after the module's tests."""

    @pytest.fixture(scope="module")
    def fixture() -> Iterator[ClusterThread]:
        ct = ClusterThread(nodes=nodes, lookupds=1, flavour=flavour)
        try:
            yield ct
        finally:
            ct.stop()

    return fixture


def invoke(args: Sequence[str], input: bytes | str | None = None) -> Result:
    """The real entry point, in-process."""
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def run_cli(args: Sequence[str], input: bytes | None = None,
            timeout: float = WAIT) -> subprocess.CompletedProcess[bytes]:
    """``python -m smartnsq ARGS`` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "smartnsq", *args], input=input,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)


def spawn_cli(args: Sequence[str], stdin: int | None = None) -> subprocess.Popen[bytes]:
    """``python -m smartnsq ARGS`` started in a subprocess (``stdin=subprocess.PIPE`` to feed
    it)."""
    return subprocess.Popen([sys.executable, "-m", "smartnsq", *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def sh(script: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run a bash pipeline as a user types it (pipefail: every command's exit counts); a
    pipeline still running after the bound is killed whole (its own process group) and fails
    the test."""
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", script],
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(input, timeout=WAIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"still running after {WAIT} s: {script}\n{err.decode()}") \
            from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


async def eventually(what: str, check: Callable[[], bool], bound: float = WAIT) -> None:
    """Until ``check()`` holds (state without an event of its own: a server's counters, a
    file); fails naming ``what`` after ``bound`` seconds."""
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {bound} s"
        await asyncio.sleep(0.05)


class killed_at_end:
    """``with killed_at_end(popen):`` or ``async with killed_at_end(process):`` around what a
    test does with a command's process: still running after the block (the block failed),
    it is killed and reaped, its pipes drained: a failed test leaves no command behind."""

    def __init__(self, proc: subprocess.Popen[bytes] | asyncio.subprocess.Process) -> None:
        self.proc = proc

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        assert isinstance(proc, subprocess.Popen)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()

    async def __aenter__(self) -> None:
        pass

    async def __aexit__(self, *exc: object) -> None:
        proc = self.proc
        assert isinstance(proc, asyncio.subprocess.Process)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def send_signal(proc: asyncio.subprocess.Process | subprocess.Popen[bytes], sig: int) -> None:
    """Signal a command's process as a user's kill or Ctrl-C does: with ``os.kill``, not
    ``send_signal``. ``Popen.send_signal`` polls first, and a poll that reaps the child
    under asyncio's child watcher makes the watcher report returncode 255 ("Unknown child
    process pid"). A process already seen to end is left alone."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):  # ended since, not reaped yet
            os.kill(proc.pid, sig)


async def smartnsq(*args: str, bound: float = WAIT) -> tuple[int, bytes, bytes]:
    """``python -m smartnsq ARGS`` as a user runs it, from an async test: (exit code, stdout,
    stderr); interrupted (SIGINT) when it outlives ``bound`` seconds, so a hang shows as a
    failed assertion with its output, not a stuck test."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), bound)
    except TimeoutError:
        send_signal(proc, signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), WAIT)
        err += f"\n[test: still running after {bound} s, interrupted]".encode()
    assert proc.returncode is not None
    return proc.returncode, out, err


async def finish_process(proc: asyncio.subprocess.Process) -> tuple[int, bytes]:
    """The rest of a CLI process's stderr and its exit code; killed if it outlives WAIT."""
    assert proc.stderr is not None
    async with killed_at_end(proc):
        rest = await asyncio.wait_for(proc.stderr.read(), WAIT)
        code = await asyncio.wait_for(proc.wait(), WAIT)
    return code, rest


def closed_port() -> str:
    """A local address nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def assert_one_line_error(result: Result, *fragments: str) -> str:
    """Non-zero exit, exactly one line on stderr naming the problem, no traceback."""
    assert result.exit_code != 0, result.output
    err = result.stderr
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("smartnsq: error: "), err
    assert "Traceback" not in err + result.stdout
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def http_json(url: str) -> Any:
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def channel_stats(ct: ClusterThread, topic: str, channel: str) -> dict[str, Any]:
    """The first nsqd's ``/stats`` of one channel (depth, in flight, requeued ...)."""
    doc = http_json(f"http://{ct.cluster.nsqd_http_addresses[0]}/stats?format=json"
                    f"&topic={topic}&channel={channel}")
    (t,) = doc["topics"]
    (ch,) = t["channels"]
    assert isinstance(ch, dict)
    return ch


def lines(out: bytes | str) -> list[str]:
    text = out.decode() if isinstance(out, bytes) else out
    return text.splitlines()
