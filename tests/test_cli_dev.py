"""``smartnsq dev``: the documented commands, run as a user runs them (a subprocess whose
printed addresses are then used), impossible topic shapes told in one line, and the same
click help with examples as the other commands."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from typing import Any

import pytest

from tests.cli_support import assert_one_line_error, invoke, killed_at_end, send_signal

#: bound on the cluster printing "ready", and on its stop after SIGINT
BOUND = 20.0


def lookup(lookupd: str, topic: str) -> Any:
    url = f"http://{lookupd}/lookup?topic={topic}&access=r&metainfo=true"
    req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


async def run_until_ready(*argv: str) -> tuple[asyncio.subprocess.Process, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    try:
        while not lines or lines[-1] != "ready":
            line = await asyncio.wait_for(proc.stdout.readline(), BOUND)
            if not line:
                err = await asyncio.wait_for(proc.stderr.read(), BOUND)
                raise AssertionError(f"ended before 'ready': {lines} {err.decode()}")
            lines.append(line.decode().strip())
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc, lines


async def stop_with_sigint(proc: asyncio.subprocess.Process) -> None:
    began = time.monotonic()
    send_signal(proc, signal.SIGINT)
    async with killed_at_end(proc):
        assert await asyncio.wait_for(proc.wait(), BOUND) == 0
    assert time.monotonic() - began < 10.0


@pytest.mark.parametrize("argv", [
    # the README's example, and --help's (smartnsq --help, smartnsq dev --help)
    ["-m", "smartnsq", "dev", "--flavour", "youzan", "--nodes", "3", "--topic", "demo:4"],
    ["-m", "smartnsq", "dev", "--flavour", "youzan", "--nodes", "3", "--topic", "orders:4"],
    ["-m", "smartnsq.devcluster", "--flavour", "youzan", "--nodes", "3", "--topic",
     "demo:4"],
], ids=["readme", "help", "python-m-devcluster"])
async def test_the_documented_examples_run(argv: list[str]) -> None:
    proc, lines = await run_until_ready(sys.executable, *argv)
    topic = argv[-1].split(":")[0]
    try:
        assert lines[0] == "flavour youzan" and f"topic {topic}" in lines
        (lookupd,) = [x.split()[1] for x in lines if x.startswith("lookupd_http ")]
        nsqd = {x.split()[1] for x in lines if x.startswith("nsqd_tcp ")}
        doc = lookup(lookupd, topic)
        doc = doc.get("data", doc)
        assert doc["meta"]["partition_num"] == 4
        parts = doc["partitions"]
        assert sorted(parts) == ["0", "1", "2", "3"]
        # each partition led by a node the command printed
        assert {f"{p['broadcast_address']}:{p['tcp_port']}" for p in parts.values()} <= nsqd
    finally:
        await stop_with_sigint(proc)
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    # the nodes it started beyond --nodes, and why, in one line
    assert err.count("\n") == 1 and "4 nsqd" in err and "--ordered" in err, err


async def test_ordered_topics_share_nodes() -> None:
    proc, lines = await run_until_ready(
        sys.executable, "-m", "smartnsq", "dev", "--nodes", "2", "--topic", "seq:6:2",
        "--ordered", "--channel", "c")
    try:
        assert sum(x.startswith("nsqd_tcp ") for x in lines) == 2
        (lookupd,) = [x.split()[1] for x in lines if x.startswith("lookupd_http ")]
        doc = lookup(lookupd, "seq")
        doc = doc.get("data", doc)
        assert doc["meta"]["ordered"] is True and doc["meta"]["replica"] == 2
        assert len(doc["partitions"]) == 6
    finally:
        await stop_with_sigint(proc)


@pytest.mark.parametrize(("args", "fragments"), [
    (["--topic", "big:300"], ["at most 254 partitions", "big:300"]),
    (["--topic", "wide:2:6"], ["at most 5 replicas", "wide:2:6"]),
    (["--topic", "huge:20:2"], ["needs 40 nsqd", "--ordered"]),
    (["--flavour", "stock", "--topic", "demo:4"], ["youzan only", "--flavour youzan"]),
    (["--flavour", "stock", "--ordered", "--topic", "demo"], ["youzan only"]),
    (["--topic", "t:x"], ["NAME[:PARTITIONS[:REPLICA]]"]),
    (["--topic", "t:1:2:3"], ["NAME[:PARTITIONS[:REPLICA]]"]),
    (["--nodes", "x"], ["--nodes"]),
])
def test_impossible_shapes_are_one_line(args: list[str], fragments: list[str]) -> None:
    assert_one_line_error(invoke(["dev", *args]), *fragments)


def test_dev_help_is_the_commands_help() -> None:
    r = invoke(["dev", "--help"])
    assert r.exit_code == 0
    assert "Examples:" in r.stdout and "smartnsq dev --flavour youzan --nodes 3" in r.stdout
    for option in ("--nodes", "--topic", "--ordered", "--channel", "--flavour"):
        assert option in r.stdout
