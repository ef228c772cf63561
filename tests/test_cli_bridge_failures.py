"""``smartnsq bridge`` when the destination fails, and ``bridge -n``, against the embedded
stock cluster.

The invariant of each: every message published reaches the destination or stays in the
source channel, and every command returns or fails within its stated time. A destination
that cannot be reached is found before anything is read (warning at once, error after
``--connect-timeout``); one lost mid-run is warned about (the messages taken meanwhile are
held and touched, not redelivered) and, after ``--connect-timeout`` without an acknowledged
publish, ends the command with an error, the held messages requeued once. ``-n COUNT`` takes no more
than it forwards and sends back what it did not forward once: the next reader sees at most
one extra attempt.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from smartnsq import Producer
from tests.cli_support import (
    WAIT,
    ClusterThread,
    channel_stats,
    closed_port,
    cluster_fixture,
    finish_process,
    lines,
    run_cli,
    smartnsq,
)

SRC_CHANNEL = "nsq_to_nsq"
DST_CHANNEL = "c"
#: the --connect-timeout the failing runs are given
BOUND = 2.0
#: start-up of a ``python -m smartnsq`` process, a dial round and the consumer's backoff
SLACK = 8.0


stock = cluster_fixture("stock", nodes=1)


@pytest.fixture
def dest() -> Iterator[ClusterThread]:
    """A destination cluster of its own, to be stopped mid-run."""
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    try:
        yield ct
    finally:
        ct.stop()


def tcp(ct: ClusterThread) -> str:
    return ct.cluster.nsqd_tcp_addresses[0]


def make_topic(ct: ClusterThread, name: str, channel: str) -> None:
    ct.call(lambda: ct.cluster.create_topic(name, channels=[channel]))


async def publish(ct: ClusterThread, topic: str, bodies: list[str]) -> None:
    async with Producer(nsqd=[tcp(ct)]) as producer:
        await asyncio.wait_for(producer.publish_many(topic, [b.encode() for b in bodies]),
                               WAIT)


async def eventually(what: str, check: Callable[[], bool], bound: float = WAIT) -> None:
    deadline = time.monotonic() + bound
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {bound} s"
        await asyncio.sleep(0.05)


async def drain(ct: ClusterThread, topic: str, channel: str, n: int) -> list[dict[str, Any]]:
    """The next ``n`` messages of ``channel`` (as ``tail --format json``), finished."""
    code, out, err = await smartnsq("tail", topic, "--nsqd", tcp(ct), "--channel", channel,
                                    "-n", str(n), "--format", "json")
    assert code == 0, err
    return [json.loads(x) for x in lines(out)]


# -- a destination that cannot be reached ----------------------------------------------------


@pytest.mark.parametrize("wrong", ["closed-port", "http-port"])
async def test_an_unreachable_destination_fails_before_anything_is_read(
        stock: ClusterThread, wrong: str) -> None:
    """A closed port, and nsqd's HTTP port given for its TCP port: named on stderr at once,
    then exit 1 naming it after --connect-timeout; the source gave nothing away."""
    topic = f"unreach{wrong.split('-')[0]}"
    make_topic(stock, topic, SRC_CHANNEL)
    await publish(stock, topic, [f"m{i}" for i in range(5)])
    addr = closed_port() if wrong == "closed-port" else stock.cluster.nsqd_http_addresses[0]
    began = time.monotonic()
    code, _, err = await smartnsq("bridge", topic, "--from-nsqd", tcp(stock), "--to-nsqd", addr,
                                  "-n", "5", "--connect-timeout", str(BOUND),
                                  bound=BOUND + SLACK)
    took = time.monotonic() - began
    text = err.decode()
    assert code == 1 and "Traceback" not in text, text
    got = text.splitlines()
    assert got[0].startswith("smartnsq: warning: cannot reach the destination: "), text
    assert addr in got[0] and f"up to {BOUND:g} s (--connect-timeout)" in got[0], text
    assert got[-1].startswith("smartnsq: error: no destination nsqd accepted a connection "
                              f"within {BOUND:g} s"), text
    assert addr in got[-1], text
    assert ("HTTP port" if wrong == "http-port" else "Connect call failed") in got[-1], text
    assert BOUND <= took < BOUND + SLACK
    ch = channel_stats(stock, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["requeue_count"]) == \
        (5, 0, 0, 0)


# -- a destination lost mid-run --------------------------------------------------------------


async def _start_bridge(source: ClusterThread, dst: ClusterThread, topic: str,
                        *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "bridge", topic, "--from-nsqd", tcp(source),
        "--to-nsqd", tcp(dst), *extra, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)


async def _forward_one(source: ClusterThread, dst: ClusterThread, topic: str) -> None:
    """Publish "one" and wait until it is on the destination and finished on the source."""
    await publish(source, topic, ["one"])
    await eventually("one forwarded", lambda: channel_stats(dst, topic, DST_CHANNEL)["depth"] == 1)
    await eventually("one finished", lambda: (
        channel_stats(source, topic, SRC_CHANNEL)["in_flight_count"],
        channel_stats(source, topic, SRC_CHANNEL)["depth"]) == (0, 0))


async def test_a_destination_lost_mid_run_ends_with_an_error_and_keeps_the_rest(
        stock: ClusterThread, dest: ClusterThread) -> None:
    topic = "lostdest"
    make_topic(stock, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    proc = await _start_bridge(stock, dest, topic, "--connect-timeout", str(BOUND))
    assert proc.stderr is not None
    try:
        await _forward_one(stock, dest, topic)
        dest.run(dest.cluster.stop_node(0))
        lost = time.monotonic()
        await publish(stock, topic, ["two", "three"])
        warning = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert warning.startswith(b"smartnsq: warning: destination: "), warning
        assert tcp(dest).encode() in warning and b"message(s) on the source" in warning
    finally:
        code, rest = await finish_process(proc)
    assert time.monotonic() - lost < BOUND + SLACK
    text = rest.decode()
    assert code == 1 and "Traceback" not in text, text
    last = text.splitlines()[-1]
    assert last.startswith(f"smartnsq: error: the destination accepted no publish for "
                           f"{BOUND:g} s (--connect-timeout): "), text
    assert tcp(dest) in last and "after 1 message(s) were forwarded" in last, text
    assert "forwarded 1 message(s) from" not in text  # no success summary
    # nothing lost: "one" went over; the other two were held, then requeued once, at once
    ch = channel_stats(stock, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["requeue_count"],
            ch["timeout_count"]) == (2, 0, 0, 2, 0), ch
    left = await drain(stock, topic, SRC_CHANNEL, 2)
    assert sorted(d["body"] for d in left) == ["three", "two"]
    assert [d["attempts"] for d in left] == [2, 2]


async def test_a_destination_back_within_the_bound_is_carried_on_with(
        stock: ClusterThread, dest: ClusterThread) -> None:
    """Stopped mid-run and back before --connect-timeout runs out: a warning, no exit; then
    the remaining message is forwarded and the command ends normally."""
    topic = "backdest"
    make_topic(stock, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    proc = await _start_bridge(stock, dest, topic, "--connect-timeout", str(WAIT), "-n", "2")
    assert proc.stderr is not None
    try:
        await _forward_one(stock, dest, topic)
        dest.run(dest.cluster.stop_node(0))
        await publish(stock, topic, ["two"])
        warning = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert warning.startswith(b"smartnsq: warning: destination: "), warning
        assert f"up to {WAIT:g} s".encode() in warning and proc.returncode is None, warning
        dest.run(dest.cluster.start_node(0))
    finally:
        code, rest = await finish_process(proc)
    text = rest.decode()
    assert code == 0 and "error" not in text, text
    assert text.splitlines()[-1] == f"forwarded 2 message(s) from {topic} to {topic}", text
    assert sorted(d["body"] for d in await drain(dest, topic, DST_CHANNEL, 2)) == ["one", "two"]
    ch = channel_stats(stock, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (0, 0, 0)


# -- bridge -n -------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [10, 1])
async def test_count_requeues_what_it_did_not_forward_once(stock: ClusterThread,
                                                           count: int) -> None:
    """``seq 1 100 | publish; bridge -n COUNT``: COUNT forwarded, the rest in the source
    channel, each requeued at most once (the next reader sees attempts <= 2, and the
    channel's requeue count is exactly the extra attempts)."""
    src, dst = f"cnt{count}", f"cnt{count}out"
    make_topic(stock, src, SRC_CHANNEL)
    make_topic(stock, dst, DST_CHANNEL)
    sent = [str(i) for i in range(1, 101)]
    await publish(stock, src, sent)
    r = await asyncio.to_thread(run_cli, ["bridge", src, dst, "--from-nsqd", tcp(stock),
                                          "--to-nsqd", tcp(stock), "-n", str(count)])
    assert r.returncode == 0, r.stderr
    assert lines(r.stderr) == [f"forwarded {count} message(s) from {src} to {dst}"]
    ch = channel_stats(stock, src, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (100 - count, 0, 0)
    requeued = ch["requeue_count"]
    assert requeued <= count, ch  # at most one RDY's worth came in while it finished
    left = await drain(stock, src, SRC_CHANNEL, 100 - count)
    assert all(d["attempts"] <= 2 for d in left), [d["attempts"] for d in left]
    assert sum(d["attempts"] - 1 for d in left) == requeued
    moved = await drain(stock, dst, DST_CHANNEL, count)
    assert all(d["attempts"] == 1 for d in moved)
    # every message once: forwarded or still in the source
    assert sorted([d["body"] for d in left + moved], key=int) == sent
