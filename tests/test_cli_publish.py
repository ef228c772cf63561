"""``smartnsq publish`` on long records and slow inputs: records are cut in linear time, one
longer than ``--max-msg-size`` stops the command at once (naming the record and the limit),
lines from a pipe that stays open are published as they come, and SIGINT/SIGTERM stop it
promptly with the shell's exit code and the count published so far."""

from __future__ import annotations

import asyncio
import io
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smartnsq.cli.records import Record, RecordTooLong, read_records
from tests.cli_support import WAIT, ClusterThread, cluster_fixture, http_json, spawn_cli

CHANNEL = "c"


stock = cluster_fixture("stock", nodes=1)


def make_topic(ct: ClusterThread, name: str) -> None:
    ct.call(lambda: ct.cluster.create_topic(name, channels=[CHANNEL]))


def depth(ct: ClusterThread, topic: str) -> int:
    addr = ct.cluster.nsqd_http_addresses[0]
    doc = http_json(f"http://{addr}/stats?format=json&topic={topic}&channel={CHANNEL}")
    (t,) = doc["topics"]
    return int(t["channels"][0]["depth"])


def wait_depth(ct: ClusterThread, topic: str, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    while depth(ct, topic) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{topic}: depth {depth(ct, topic)} < {n}"
        time.sleep(0.05)


def stream(*pieces: bytes) -> io.BytesIO:
    return io.BytesIO(b"".join(pieces))


async def records(sources: list[tuple[str, Any]], delimiter: bytes = b"\n",
                  limit: int = 1 << 30) -> AsyncIterator[Record]:
    async for rec in read_records(sources, delimiter, limit=limit, stop=asyncio.Event()):
        yield rec


# -- reading ---------------------------------------------------------------------------------


async def test_a_long_record_is_read_in_linear_time() -> None:
    """Not a benchmark: 64 MiB in one record took ~30 s when every chunk re-split the
    whole buffer; cut in linear time it takes well under a second."""
    big = b"x" * (64 << 20)
    began = time.monotonic()
    got = [r async for r in records([("big", stream(big, b"\nend\n"))])]
    elapsed = time.monotonic() - began
    assert [len(r.body) for r in got] == [len(big), 3]
    assert elapsed < 10.0, f"{elapsed:.1f} s for 64 MiB"


async def test_a_record_past_the_limit_is_refused_without_reading_the_rest() -> None:
    read = 0

    class Endless(io.RawIOBase):
        """``ok``, then a record that never ends."""

        def readinto(self, b: Any) -> int:
            nonlocal read
            data = b"ok\n" if read == 0 else b"x" * len(b)
            b[:len(data)] = data
            read += len(data)
            return len(data)

        def readable(self) -> bool:
            return True

    got: list[bytes] = []
    with pytest.raises(RecordTooLong) as info:
        async for r in records([("<stdin>", io.BufferedReader(Endless()))], limit=1 << 20):
            got.append(r.body)
    assert got == [b"ok"]
    assert str(info.value) == ("<stdin> record 2 is longer than --max-msg-size "
                               "(1048576 bytes)")
    assert read < 8 << 20  # stopped soon after the limit, not at the end of the input


async def test_records_across_chunks_files_and_delimiters() -> None:
    big = b"x" * 70000
    got = [r async for r in records([("a", stream(b"one\r\ntwo\n\n" + big + b"\nthree")),
                                      ("b", stream(b"four\n"))])]
    assert [r.body for r in got] == [b"one", b"two", big, b"three", b"four"]
    assert [r.number for r in got] == [1, 2, 3, 4, 5]
    assert [r.source for r in got] == ["a", "a", "a", "a", "b"]
    assert got[-1].consumed == len(b"one\r\ntwo\n\n" + big + b"\nthree") + 1 + 5
    got = [r async for r in records([("c", stream(b"a||b||c|"))], b"||")]
    assert [r.body for r in got] == [b"a", b"b", b"c|"]
    # a record exactly at the limit passes (its \r before the \n does not count), one byte
    # more does not
    got = []
    with pytest.raises(RecordTooLong, match=r"^d record 2 is longer than --max-msg-size"):
        async for r in records([("d", stream(b"12345\r\n123456\n"))], limit=5):
            got.append(r)
    assert [r.body for r in got] == [b"12345"]


# -- the command -----------------------------------------------------------------------------


def test_an_oversize_record_stops_publish_with_one_line(stock: ClusterThread) -> None:
    make_topic(stock, "big")
    proc = spawn_cli(["publish", "big", "--nsqd", stock.cluster.nsqd_tcp_addresses[0],
                      "--max-msg-size", "1000"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        # a record that does not end (the pipe stays open): refused once past the limit
        proc.stdin.write(b"ok\n" + b"x" * 5000)
        proc.stdin.flush()
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    (line,) = err.decode().splitlines()
    assert line == ("smartnsq: error: <stdin> record 2 is longer than --max-msg-size (1000 "
                    "bytes) (after 1 message(s) were published)"), line
    assert depth(stock, "big") == 1


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_publish_from_an_open_pipe_stops_on_a_signal(stock: ClusterThread, sig: int,
                                                     code: int) -> None:
    topic = f"sig{code}"
    make_topic(stock, topic)
    proc = spawn_cli(["publish", topic, "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                     stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"one\ntwo\nthree\n")
        proc.stdin.flush()
        # published as they come, though the pipe stays open
        wait_depth(stock, topic, 3, proc)
        began = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=WAIT)
        elapsed = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert elapsed < 5.0, f"{elapsed:.1f} s after the signal"
    (line,) = err.decode().splitlines()
    assert line.startswith("published 3 message(s), 11 bytes, to " + topic), line
    assert line.endswith(f"(interrupted by {signal.Signals(sig).name})"), line
