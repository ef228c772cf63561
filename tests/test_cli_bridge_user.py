"""``smartnsq bridge`` used carelessly: the same topic as source and destination, and Ctrl-C
(or SIGTERM) while messages are held for a destination that is down. Each run ends within
its bound and every message published is in the source channel or at the destination.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time

import pytest

from smartnsq.cli.bridge_forward import STOP_GRACE
from tests.cli_support import (
    WAIT,
    ClusterThread,
    channel_stats,
    cluster_fixture,
    finish_process,
    lines,
    send_signal,
    smartnsq,
)
from tests.test_cli_bridge_failures import (
    DST_CHANNEL,
    SLACK,
    SRC_CHANNEL,
    _start_bridge,
    dest,
    drain,
    eventually,
    make_topic,
    publish,
    tcp,
)
from tests.test_cli_bridge_holding import CountingProxy

__all__ = ["dest"]  # the fixture, imported for pytest

#: a channel of the source topic the application reads
APP = "app"

stock = cluster_fixture("stock", nodes=1)



def _loopback_alias(address: str) -> str:
    return address.replace("127.0.0.1", "localhost")


@pytest.mark.parametrize("how", ["nsqd", "localhost", "lookupd-to-nsqd", "lookupd",
                                 "nsqd-to-lookupd"])
async def test_the_same_topic_as_source_and_destination_is_refused(
        stock: ClusterThread, how: str) -> None:
    """``bridge orders --from-nsqd A --to-nsqd A`` (DEST_TOPIC forgotten) would forward each
    message to itself for ever, copying it into every other channel: refused before anything
    is read, with one line saying why, however the same nsqd is named. Only found through
    the destination's lookup (``--from-nsqd`` to ``--to-lookupd``) it is told on the first
    message taken (after the subscription, whose refusal of an ordered topic says more):
    those taken go back once, none is copied."""
    topic = f"same{how.replace('-', '')}"
    make_topic(stock, topic, SRC_CHANNEL)
    make_topic(stock, topic, APP)
    await publish(stock, topic, ["a", "b"])
    nsqd, lookupd = tcp(stock), stock.lookupd
    args = {
        "nsqd": ["--from-nsqd", nsqd, "--to-nsqd", nsqd],
        "localhost": ["--from-nsqd", nsqd, "--to-nsqd", _loopback_alias(nsqd)],
        "lookupd-to-nsqd": ["--from-lookupd", lookupd, "--to-nsqd", nsqd],
        "lookupd": ["--from-lookupd", lookupd, "--to-lookupd", _loopback_alias(lookupd)],
        "nsqd-to-lookupd": ["--from-nsqd", _loopback_alias(nsqd), "--to-lookupd", lookupd],
    }[how]
    began = time.monotonic()
    code, _, err = await smartnsq("bridge", topic, *args, bound=SLACK)
    assert time.monotonic() - began < SLACK
    text = err.decode()
    (line,) = lines(text)
    assert code == (2 if how in ("nsqd", "localhost") else 1), text
    assert "source and destination are the same" in line and f"topic {topic}" in line, text
    assert "for ever" in line and "DEST_TOPIC" in line, text
    taken = 2 if how == "nsqd-to-lookupd" else 0
    ch = channel_stats(stock, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (2, 0, 0), ch
    assert ch["requeue_count"] <= taken, ch
    ch = channel_stats(stock, topic, APP)
    assert (ch["depth"], ch["message_count"]) == (2, 2), ch  # no copy came in


async def test_the_same_nsqd_with_another_topic_is_fine(stock: ClusterThread) -> None:
    make_topic(stock, "copyin", SRC_CHANNEL)
    make_topic(stock, "copyout", DST_CHANNEL)
    await publish(stock, "copyin", ["a", "b"])
    code, _, err = await smartnsq("bridge", "copyin", "copyout", "--from-nsqd", tcp(stock),
                                  "--to-nsqd", _loopback_alias(tcp(stock)), "-n", "2",
                                  bound=SLACK)
    assert code == 0 and lines(err) == ["forwarded 2 message(s) from copyin to copyout"], err
    assert sorted(d["body"] for d in await drain(stock, "copyout", DST_CHANNEL, 2)) == \
        ["a", "b"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signal_while_messages_are_held_ends_at_once_and_keeps_them(
        stock: ClusterThread, dest: ClusterThread, sig: signal.Signals) -> None:
    """Ctrl-C while the destination is down and three messages are held (--connect-timeout
    0: the bridge would wait for ever): it ends within seconds, not after the publish
    timeout, the three requeued once each and none timed out; no error line."""
    topic = f"sig{sig.name.lower()}"
    make_topic(stock, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    proc = await _start_bridge(stock, dest, topic, "--connect-timeout", "0")
    assert proc.stderr is not None
    try:
        # started: the destination was reached before the source is read
        await publish(stock, topic, ["zero"])
        await eventually("zero forwarded",
                         lambda: channel_stats(dest, topic, DST_CHANNEL)["depth"] == 1)
        dest.run(dest.cluster.stop_node(0))
        await publish(stock, topic, ["one", "two", "three"])
        warning = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert warning.startswith(b"smartnsq: warning: destination: "), warning
        await eventually("three held", lambda: channel_stats(
            stock, topic, SRC_CHANNEL)["in_flight_count"] == 3)
        send_signal(proc, sig)
        signalled = time.monotonic()
    finally:
        code, rest = await finish_process(proc)
    took = time.monotonic() - signalled
    text = rest.decode()
    assert took < 3.0, (took, text)
    assert "error" not in text and "Traceback" not in text, text
    # the exit code after a signal is the CLI's convention (smartnsq.cli.common), not
    # bridge's: what bridge owes is a graceful end with its summary
    assert code != 1, (code, text)
    assert lines(text)[-1] == f"forwarded 1 message(s) from {topic} to {topic}", text
    ch = channel_stats(stock, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["requeue_count"],
            ch["timeout_count"]) == (3, 0, 0, 3, 0), ch
    left = await drain(stock, topic, SRC_CHANNEL, 3)
    assert sorted(d["body"] for d in left) == ["one", "three", "two"]
    assert [d["attempts"] for d in left] == [2, 2, 2]



async def test_ctrl_c_while_the_destination_is_silent_ends_within_the_grace(
        stock: ClusterThread, dest: ClusterThread) -> None:
    """The destination nsqd stops answering (connected, silent) with a publish out; Ctrl-C:
    the publish gets :data:`STOP_GRACE` seconds, then is given up and its message goes back
    once, instead of the run waiting out the publish's retries (30 s)."""
    topic = "silentdest"
    make_topic(stock, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    proxy = CountingProxy(tcp(dest))
    address = await proxy.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "bridge", topic, "--from-nsqd", tcp(stock),
        "--to-nsqd", address, "--connect-timeout", "0", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        await publish(stock, topic, ["one"])
        await eventually("one forwarded",
                         lambda: channel_stats(dest, topic, DST_CHANNEL)["depth"] == 1)
        proxy.silent = True
        await publish(stock, topic, ["two"])
        await eventually("two taken", lambda: channel_stats(
            stock, topic, SRC_CHANNEL)["in_flight_count"] == 1)
        send_signal(proc, signal.SIGINT)
        signalled = time.monotonic()
    finally:
        code, rest = await finish_process(proc)
        await proxy.stop()
    took = time.monotonic() - signalled
    text = rest.decode()
    assert took < STOP_GRACE + 3.0, (took, text)
    assert "Traceback" not in text and code != 1, (code, text)
    assert lines(text)[-1] == f"forwarded 1 message(s) from {topic} to {topic}", text
    ch = channel_stats(stock, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["requeue_count"],
            ch["timeout_count"]) == (1, 0, 0, 1, 0), ch
    (left,) = await drain(stock, topic, SRC_CHANNEL, 1)
    assert (left["body"], left["attempts"]) == ("two", 2)
    # the silent nsqd never got "two" (the proxy swallowed it): one copy of each, in all
    assert [d["body"] for d in await drain(dest, topic, DST_CHANNEL, 1)] == ["one"]
