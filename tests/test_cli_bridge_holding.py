"""``smartnsq bridge`` holding messages: a message the destination refuses for good stops the
run at once (not retried, left in the source channel, requeued once); messages held while
the destination is down are touched, so a short msg-timeout on the source does not redeliver
them, and each arrives once when the destination is back; the destination is dialled by the
producer's own pool (no extra connection per run).

Each against embedded stock clusters, the CLI run as a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster.nsqd import NsqdOptions
from tests.cli_support import (
    WAIT,
    ClusterThread,
    channel_stats,
    finish_process,
    lines,
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

__all__ = ["dest"]  # the fixture, imported for pytest

#: the source's in-flight timeout: short, so that an untouched held message times out
MSG_TIMEOUT = 1.0
#: the destination's largest message body
MAX_MSG = 1000


@pytest.fixture
def source() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock",
                       nsqd_options=NsqdOptions(msg_timeout=MSG_TIMEOUT, client_timeout=10.0))
    try:
        yield ct
    finally:
        ct.stop()


@pytest.fixture
def small_dest() -> Iterator[ClusterThread]:
    """A destination whose nsqd refuses bodies over :data:`MAX_MSG` bytes."""
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock",
                       nsqd_options=NsqdOptions(msg_timeout=2.0, client_timeout=10.0,
                                                max_msg_size=MAX_MSG))
    try:
        yield ct
    finally:
        ct.stop()


@pytest.mark.parametrize("bound", ["0", "10"])
async def test_a_message_refused_for_good_stops_the_run_and_stays_in_the_source(
        source: ClusterThread, small_dest: ClusterThread, bound: str) -> None:
    """A body larger than the destination's max message size, among small ones: exit 1 at
    once (not after --connect-timeout, nor never with 0), one error line naming the topic,
    the destination and its reason; the big message requeued once, nothing lost."""
    topic = "refused"
    make_topic(source, topic, SRC_CHANNEL)
    make_topic(small_dest, topic, DST_CHANNEL)
    big = "x" * (MAX_MSG + 1)
    sent = ["a", big, "b"]
    await publish(source, topic, sent)
    began = time.monotonic()
    code, _, err = await smartnsq("bridge", topic, "--from-nsqd", tcp(source), "--to-nsqd",
                                  tcp(small_dest), "--connect-timeout", bound, bound=SLACK)
    took = time.monotonic() - began
    text = err.decode()
    assert code == 1 and "Traceback" not in text, text
    (line,) = lines(text)
    assert line.startswith(f"smartnsq: error: the destination (nsqd {tcp(small_dest)}) "
                           f"refused message "), text
    assert f"({MAX_MSG + 1} bytes) for topic '{topic}' for good: E_BAD_MESSAGE" in line, text
    assert "too big" in line and "not retried" in line, text
    assert took < SLACK
    # the big one is back in the source, requeued once, never timed out
    ch = channel_stats(source, topic, SRC_CHANNEL)
    assert (ch["in_flight_count"], ch["deferred_count"], ch["timeout_count"]) == (0, 0, 0), ch
    left = await drain(source, topic, SRC_CHANNEL, ch["depth"])
    assert big in [d["body"] for d in left]
    assert [d["attempts"] for d in left if d["body"] == big] == [2]
    moved = await drain(small_dest, topic, DST_CHANNEL,
                        channel_stats(small_dest, topic, DST_CHANNEL)["depth"])
    # every message once: forwarded or still in the source
    assert sorted(d["body"] for d in left + moved) == sorted(sent)


async def test_held_messages_are_touched_and_arrive_once(
        source: ClusterThread, dest: ClusterThread) -> None:
    """The destination is down while two messages come in; for 3 x the source's msg-timeout
    they are held, touched: never timed out nor requeued on the source. Once the
    destination is back each arrives once, and ``-n 3`` ends the run normally."""
    topic = "held"
    make_topic(source, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    proc = await _start_bridge(source, dest, topic, "--connect-timeout", "0", "-n", "3")
    assert proc.stderr is not None
    try:
        await publish(source, topic, ["one"])
        await eventually("one forwarded",
                         lambda: channel_stats(dest, topic, DST_CHANNEL)["depth"] == 1)
        dest.run(dest.cluster.stop_node(0))
        await publish(source, topic, ["two", "three"])
        warning = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        assert warning.startswith(b"smartnsq: warning: destination: "), warning
        held_until = time.monotonic() + 3 * MSG_TIMEOUT
        while time.monotonic() < held_until:
            ch = channel_stats(source, topic, SRC_CHANNEL)
            assert (ch["in_flight_count"], ch["timeout_count"], ch["requeue_count"]) == \
                (2, 0, 0), ch
            await asyncio.sleep(0.1)
        dest.run(dest.cluster.start_node(0))
    finally:
        code, rest = await finish_process(proc)
    text = rest.decode()
    assert code == 0, text
    assert lines(text)[-1] == f"forwarded 3 message(s) from {topic} to {topic}", text
    ch = channel_stats(source, topic, SRC_CHANNEL)
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["timeout_count"],
            ch["requeue_count"]) == (0, 0, 0, 0, 0), ch
    got = await drain(dest, topic, DST_CHANNEL, 3)
    assert sorted(d["body"] for d in got) == ["one", "three", "two"]
    assert channel_stats(dest, topic, DST_CHANNEL)["depth"] == 0  # no second copy



class CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of one nsqd, counting the connections made; while
    :attr:`silent` it swallows what the client sends (an nsqd that stopped answering)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.accepted = 0
        #: per connection, in the order accepted: whether a PUB or MPUB went through it
        self.published: list[bool] = []
        #: connections that ended (either side closed)
        self.closed = 0
        self.silent = False
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _client(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        index = len(self.published)
        self.published.append(False)
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        pipes = [asyncio.ensure_future(self._pipe(reader, up_writer, self, index)),
                 asyncio.ensure_future(self._pipe(up_reader, writer, None))]
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        self.closed += 1
        for p in pipes:
            p.cancel()
        for w in (writer, up_writer):
            w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    muted: CountingProxy | None, index: int = 0) -> None:
        """Copy ``reader`` to ``writer``; ``muted``: the proxy, on the client's side (it may
        swallow, and it notes the publishes of connection ``index``)."""
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if muted is not None and b"PUB " in data:  # PUB and MPUB
                    muted.published[index] = True
                if muted is None or not muted.silent:
                    writer.write(data)
                    await writer.drain()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), 1.0)


def announce(ct: ClusterThread, port: int) -> None:
    """Make the destination's lookupd give ``port`` as its nsqd's TCP port (the proxy's)."""
    def move() -> None:
        (info,) = ct.cluster.meta.nodes.values()
        info.tcp_port = port
    ct.call(move)


@pytest.mark.parametrize("to", ["--to-nsqd", "--to-lookupd"])
async def test_the_destination_is_dialled_by_the_producer_only(
        source: ClusterThread, dest: ClusterThread, to: str) -> None:
    """The dial that checks the destination at start is the producer's own connection,
    kept for the publishes: while the bridge runs no connection to the destination was
    closed, and there are no more than the producer's pool holds (with ``--to-lookupd``
    the check made a connection of its own, closed at once, before)."""
    topic = "dials"
    make_topic(source, topic, SRC_CHANNEL)
    make_topic(dest, topic, DST_CHANNEL)
    await publish(source, topic, [json.dumps({"i": i}) for i in range(20)])
    proxy = CountingProxy(tcp(dest))
    address = await proxy.start()
    if to == "--to-lookupd":
        announce(dest, int(address.rsplit(":", 1)[1]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "bridge", topic, "--from-nsqd", tcp(source),
        to, dest.lookupd if to == "--to-lookupd" else address, "-n", "21",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await eventually("20 forwarded",
                         lambda: channel_stats(dest, topic, DST_CHANNEL)["depth"] == 20)
        # running, waiting for the 21st: every connection it made is still open
        assert proc.returncode is None
        assert proxy.closed == 0, (proxy.accepted, proxy.closed)
        # the first connection is the start-up check's dial: it carried publishes (a check of
        # its own would have closed it unused)
        assert proxy.published[0], proxy.published
        assert proxy.accepted <= ProducerConfig().connections_per_nsqd, proxy.published
        await publish(source, topic, ["last"])
    finally:
        code, err = await finish_process(proc)
        await proxy.stop()
    assert code == 0, err
    assert lines(err) == [f"forwarded 21 message(s) from {topic} to {topic}"]
    assert channel_stats(dest, topic, DST_CHANNEL)["depth"] == 21
