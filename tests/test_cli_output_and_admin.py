"""The command line's output and its admin calls' reach, against the embedded cluster:

* ``channel … --nsqd H --partition P`` on a stock nsqd is refused (stock nsqd ignores the
  partition and would act on the whole channel); on a youzan nsqd it acts on that partition;
* a closed stdout ends every command quietly (exit 0, nothing on stderr), whether the reader
  went away before the first write or after a few lines (``| head``);
* live ``stat`` on a pipe prints one table per refresh and ends when the pipe's reader does;
* ``publish --trace`` into a full disk counts what it published and says why it stopped;
* the clients' user agent carries the package's version.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import smartnsq
from smartnsq.config import USER_AGENT, ConnectionConfig
from smartnsq.nsqd_http import HEADERS
from tests.cli_support import (
    WAIT,
    ClusterThread,
    assert_one_line_error,
    cluster_fixture,
    http_json,
    invoke,
    lines,
    send_signal,
)

CHANNEL = "c"
SMARTNSQ = [sys.executable, "-m", "smartnsq"]
FULL = Path("/dev/full")


stock = cluster_fixture("stock", nodes=1)


yz = cluster_fixture("youzan", nodes=2)


def finish(proc: subprocess.Popen[bytes], what: Sequence[str]) -> tuple[bytes, bytes]:
    """The output of ``proc``; killed (and the test failed) when it outlives the bound."""
    try:
        return proc.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"still running after {WAIT} s: {' '.join(what)}") from None


def into_closed_pipe(args: Sequence[str]) -> tuple[int, bytes]:
    """``smartnsq ARGS`` writing into a pipe whose reader was closed before it started: its
    first write to stdout fails with EPIPE. (exit code, stderr)"""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.Popen([*SMARTNSQ, *args], stdin=subprocess.DEVNULL, stdout=w,
                                stderr=subprocess.PIPE)
    finally:
        os.close(w)
    _, err = finish(proc, args)
    assert proc.returncode is not None
    return proc.returncode, err


def into_file(args: Sequence[str], path: Path,
              input: bytes | None = None) -> tuple[int, bytes]:
    """``smartnsq ARGS > path``: (exit code, stderr)."""
    with path.open("wb") as out:
        proc = subprocess.Popen([*SMARTNSQ, *args], stdout=out, stderr=subprocess.PIPE,
                                stdin=subprocess.PIPE if input is not None else
                                subprocess.DEVNULL)
        _, err = proc.communicate(input, timeout=WAIT)
    assert proc.returncode is not None
    return proc.returncode, err


def pipeline(script: str) -> subprocess.CompletedProcess[bytes]:
    """A bash pipeline with pipefail (every command's exit code counts), bounded."""
    proc = subprocess.Popen(["bash", "-o", "pipefail", "-c", script], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = finish(proc, [script])
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def channel_stats(ct: ClusterThread, topic: str, node: int = 0) -> dict[str, dict[str, Any]]:
    """Channel name -> its /stats entry, per partition on youzan (the first one listed)."""
    http = ct.cluster.nsqd_http_addresses[node]
    stats = http_json(f"http://{http}/stats?format=json&topic={topic}")
    return {c["channel_name"]: c for t in stats["topics"] for c in t["channels"]}


def leader(ct: ClusterThread, topic: str, partition: int) -> int | None:
    """The index of the node leading ``topic``'s ``partition``."""
    return ct.call(lambda: ct.cluster.leader(topic, partition))


# -- A: --partition with --nsqd ---------------------------------------------------------------


@pytest.mark.parametrize("action", ["empty", "pause", "delete", "create", "unpause"])
def test_partition_on_a_stock_nsqd_is_refused_and_nothing_changes(stock: ClusterThread,
                                                                  action: str) -> None:
    topic = f"pe_{action}"
    stock.call(lambda: stock.cluster.create_topic(topic, channels=[CHANNEL]))
    nsqd_tcp, nsqd_http = stock.cluster.nsqd_tcp_addresses[0], stock.cluster.nsqd_http_addresses[0]
    r = invoke(["publish", topic, "--nsqd", nsqd_tcp], input="".join(f"{i}\n" for i in range(10)))
    assert r.exit_code == 0, r.output
    r = invoke(["channel", action, topic, CHANNEL, "--nsqd", nsqd_http, "--partition", "3"])
    assert_one_line_error(r, "--partition", f"nsqd {nsqd_http} is stock NSQ",
                          "not partitioned")
    assert r.stdout == ""  # no "OK" for a call that was not made
    ch = channel_stats(stock, topic)[CHANNEL]
    assert (ch["depth"], ch["paused"]) == (10, False)
    # without --partition the command acts on the whole channel, as it says
    r = invoke(["channel", "empty", topic, CHANNEL, "--nsqd", nsqd_http])
    assert r.exit_code == 0 and lines(r.stdout) == [f"channel empty: nsqd {nsqd_http}: OK"]
    assert channel_stats(stock, topic)[CHANNEL]["depth"] == 0


def test_partition_on_a_youzan_nsqd_acts_on_that_partition_only(yz: ClusterThread) -> None:
    yz.call(lambda: yz.cluster.create_topic("pyz", 2, 1, channels=[CHANNEL]))
    for p in (0, 1):
        r = invoke(["publish", "pyz", "--lookupd", yz.lookupd, "--partition", str(p)],
                   input="a\nb\n")
        assert r.exit_code == 0, r.output
    leaders = {p: leader(yz, "pyz", p) for p in (0, 1)}
    assert None not in leaders.values() and leaders[0] != leaders[1]
    node0 = leaders[0]
    assert node0 is not None
    http0 = yz.cluster.nsqd_http_addresses[node0]
    r = invoke(["channel", "empty", "pyz", CHANNEL, "--nsqd", http0, "--partition", "0"])
    assert r.exit_code == 0, r.output
    assert lines(r.stdout) == [f"channel empty: partition 0 @ nsqd {http0}: OK"]
    depths = {p: channel_stats(yz, "pyz", node)[CHANNEL]["depth"]
              for p, node in leaders.items() if node is not None}
    assert depths == {0: 0, 1: 2}


# -- B: a closed stdout -----------------------------------------------------------------------


def assert_quiet(code: int, err: bytes) -> None:
    """A quiet end: exit 0 and nothing on stderr (no error line, no traceback, no
    "Exception ignored" from the interpreter's last flush)."""
    assert (code, err.decode()) == (0, "")


@pytest.mark.parametrize("args", [
    ["lookup", "cl", "--json"],
    ["lookup", "cl"],
    ["stat", "--json"],
    ["stat", "--json", "--once"],
    ["stat", "--once", "--interval", "0.1"],
    ["stat"],
], ids=" ".join)
def test_a_closed_output_ends_a_query_quietly(yz: ClusterThread, args: list[str]) -> None:
    yz.call(lambda: yz.cluster.create_topic("cl", 1, 1, channels=[CHANNEL]))
    assert_quiet(*into_closed_pipe([*args, "--lookupd", yz.lookupd]))


@pytest.mark.parametrize("args", [["--help"], ["lookup", "--help"], ["--version"],
                                  ["channel", "pause", "--help"]], ids=" ".join)
def test_a_closed_output_ends_help_quietly(args: list[str]) -> None:
    assert_quiet(*into_closed_pipe(args))


def test_a_closed_output_ends_admin_calls_quietly_after_they_were_made(
        stock: ClusterThread) -> None:
    http = stock.cluster.nsqd_http_addresses[0]
    assert_quiet(*into_closed_pipe(["topic", "create", "made", "--nsqd", http]))
    assert_quiet(*into_closed_pipe(["channel", "create", "made", "ch", "--nsqd", http]))
    assert "ch" in channel_stats(stock, "made")


def test_a_failed_admin_call_still_fails_when_the_output_is_closed(
        stock: ClusterThread) -> None:
    http = stock.cluster.nsqd_http_addresses[0]
    code, err = into_closed_pipe(["channel", "empty", "nosuchtopic", "ch", "--nsqd", http])
    (line,) = err.decode().splitlines()
    assert code == 1 and line.startswith("smartnsq: error: channel empty failed on 1 of 1")


@pytest.mark.parametrize("script", [
    "{smartnsq} lookup cl --lookupd {lookupd} | head -n 1",
    "{smartnsq} stat --lookupd {lookupd} --once --interval 0.1 | head -n 2",
    "{smartnsq} stat --lookupd {lookupd} --json | head -n 1",
])
def test_head_takes_what_it_wants(yz: ClusterThread, script: str) -> None:
    yz.call(lambda: yz.cluster.create_topic("cl", 1, 1, channels=[CHANNEL]))
    r = pipeline(script.format(smartnsq=" ".join(SMARTNSQ), lookupd=yz.lookupd))
    assert (r.returncode, r.stderr.decode()) == (0, "")
    assert r.stdout


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["lookup", "cl", "--json"], ["lookup", "cl"],
                                  ["stat", "--once", "--json"]], ids=" ".join)
def test_a_full_disk_is_one_error_line(yz: ClusterThread, args: list[str]) -> None:
    yz.call(lambda: yz.cluster.create_topic("cl", 1, 1, channels=[CHANNEL]))
    code, err = into_file([*args, "--lookupd", yz.lookupd], FULL)
    assert (code, err.decode().splitlines()) == (
        1, ["smartnsq: error: cannot write the output: No space left on device"])


# -- C: live stat on a pipe -------------------------------------------------------------------


async def test_live_stat_on_a_pipe_prints_a_table_per_refresh(yz: ClusterThread) -> None:
    proc = await asyncio.create_subprocess_exec(
        *SMARTNSQ, "stat", "--lookupd", yz.lookupd, "--interval", "0.2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        titles = 0
        while titles < 3:
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
            assert line, "stat ended early"
            titles += b"smartnsq stat " in line
            assert b"\x1b[" not in line  # plain: no terminal escapes
    finally:
        send_signal(proc, signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert (proc.returncode, err.decode()) == (0, "")


def test_live_stat_ends_when_head_does(yz: ClusterThread) -> None:
    """The next refresh is 60 s away: stat notices at once that head has gone."""
    r = pipeline(f"{' '.join(SMARTNSQ)} stat --lookupd {yz.lookupd} --interval 60 | head -n 2")
    assert (r.returncode, r.stderr.decode()) == (0, "")
    assert len(lines(r.stdout)) == 2


# -- D: publish --trace into a full disk ------------------------------------------------------


@pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")
@pytest.mark.parametrize(("mode", "records", "published"), [
    ([], b"1\n2\n", 1),
    (["--batch", "2"], b"1\n2\n3\n", 2),
    (["--shard-key-field", "k"], b'{"k": 1}\n', 1),
], ids=["single", "batch", "sharded"])
def test_traced_publish_into_a_full_disk_counts_what_it_published(
        yz: ClusterThread, tmp_path: Path, mode: list[str], records: bytes,
        published: int) -> None:
    topic = f"tr_{len(mode)}_{published}"
    yz.call(lambda: yz.cluster.create_topic(topic, 1, 1, channels=[CHANNEL]))
    code, err = into_file(["publish", topic, "--lookupd", yz.lookupd, "--trace", *mode], FULL,
                          input=records)
    assert (code, err.decode().splitlines()) == (1, [
        "smartnsq: error: cannot write the receipts: No space left on device "
        f"(after {published} message(s) were published)"])
    stats = http_json(f"http://{yz.cluster.nsqd_http_addresses[leader(yz, topic, 0) or 0]}"
                      f"/stats?format=json&topic={topic}")
    assert sum(t["message_count"] for t in stats["topics"]) == published


# -- E: the user agent ------------------------------------------------------------------------


def test_config_user_agent_is_the_package_version() -> None:
    want = f"smartnsq/{smartnsq.__version__}"
    assert want == USER_AGENT
    assert ConnectionConfig().user_agent == want
    assert ConnectionConfig().identify_body()["user_agent"] == want
    assert HEADERS["User-Agent"] == want
