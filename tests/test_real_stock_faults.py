"""Consumers and producers through the faults operators see on real nsqd 1.3.0 / nsqlookupd
(tests/real_stock_cluster_support.py's :class:`FaultCluster`: two nsqd, each registered with
two nsqlookupd, run from the binaries so that a node can be SIGKILLed or SIGTERMed and started
again on its data, or on other ports).

The nsqd keep every acknowledged message on disk at once (``--mem-queue-size=0
--sync-every=1``: with the defaults a SIGKILL loses the memory queue, and even the disk queue's
last 2 s, whose positions are written only on its sync), and time messages out after 1 s (5 s
at most per connection). Most tests are real only: the double keeps nothing across a
restart. The module
starts its own servers on the first real test and stops them at the end; under ``make test``
the real tests are skipped and start nothing (the double's variants run).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest

from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd import NsqdOptions
from smartnsq.errors import BadBodyError
from smartnsq.message import Message
from smartnsq.producer import Producer
from tests.consumer_support import Collector, eventually, fast_config
from tests.real_servers import REAL_NSQD, unique
from tests.real_stock_cluster_support import FaultCluster, Proc

pytestmark = pytest.mark.real_nsqd

WAIT = 10.0
FLAGS = ("--mem-queue-size=0", "--sync-every=1", "--msg-timeout=1s", "--max-msg-timeout=5s")


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultCluster]:
    if not REAL_NSQD:
        pytest.skip("SMARTNSQ_REAL_NSQD is not set (real-server runs: `make test-real`)")
    cluster = FaultCluster.start(tmp_path_factory.mktemp("realnsq-faults"), nodes=2,
                                 lookupds=2, flags=FLAGS)
    try:
        yield cluster
    finally:
        cluster.stop()


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(nsqd=[address]) as p:
        for body in bodies:
            await p.publish(topic, body, timeout=WAIT)


def copied(node: Proc, topic: str, depth: int) -> bool:
    """nsqd moved every message of ``topic`` to its channel (``depth`` there): a SIGKILL
    while nsqd 1.3.0 copies one loses that one, even on disk (the topic's read position
    is written before the channel has it)."""
    with urllib.request.urlopen(f"http://{node.http}/stats?format=json&topic={topic}",
                                timeout=WAIT) as r:
        (stats,) = json.loads(r.read())["topics"]
    return bool(stats["depth"] == 0 and stats["channels"][0]["depth"] == depth)


def handler_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR or r.exc_info is not None]


@pytest.mark.parametrize("via", ["lookupd", "nsqd"])
async def test_sigkill_keeps_every_acknowledged_message(
        real: FaultCluster, via: str, caplog: pytest.LogCaptureFixture) -> None:
    """nsqd SIGKILLed while the handler holds messages: their FIN fails cleanly (finish()
    False, nothing raised into the handler) and every other acknowledged message arrives
    once the node is back on its data (nsqd 1.3.0 loses the in-flight ones themselves:
    they had left its disk queue; and one being copied from the topic to the channel)."""
    caplog.set_level(logging.INFO, logger="smartnsq")
    node = real.nodes[0]
    topic = unique("kill")
    sent = [f"k{i}".encode() for i in range(40)]
    await publish(node.tcp, topic, sent)
    release = asyncio.Event()
    held: list[bytes] = []
    answers: list[bool] = []
    raised: list[BaseException] = []
    got = Collector()

    async def handle(msg: Message) -> None:
        if not release.is_set():
            held.append(msg.body)
            await release.wait()
            try:
                answers.append(msg.finish())
            except BaseException as exc:
                raised.append(exc)
                raise
            return
        await got(msg)

    where = {"lookupd": real.lookupd_http} if via == "lookupd" else {"nsqd": [node.tcp]}
    async with Consumer(topic, "ch", handle, config=fast_config(max_in_flight=4),
                        **where) as c:  # type: ignore[arg-type]
        await eventually(lambda: len(held) == 4, WAIT)
        await eventually(lambda: copied(node, topic, len(sent) - 4), WAIT)
        await asyncio.to_thread(node.stop, signal.SIGKILL)
        await eventually(lambda: not any(s.connected for s in c.stats().subscriptions), WAIT)
        release.set()
        await eventually(lambda: len(answers) == 4, WAIT)
        await asyncio.to_thread(node.start)
        rest = set(sent) - set(held)
        await got.wait_for(lambda: rest <= got.distinct, WAIT)
    assert answers == [False] * 4
    assert not raised
    assert not handler_errors(caplog)


async def test_sigterm_with_consumers_and_producers_connected(
        real: FaultCluster, caplog: pytest.LogCaptureFixture) -> None:
    """A graceful nsqd shutdown while a producer (nsqd=[a, b]) publishes and a consumer
    (through lookupd) holds messages from it: the producer fails over to b, the held
    messages come back after the restart (nsqd writes in-flight messages to disk on
    SIGTERM), and every acknowledged message arrives."""
    caplog.set_level(logging.INFO, logger="smartnsq")
    a, b = real.nodes
    topic = unique("term")
    for node in (a, b):
        await publish(node.tcp, topic, [f"seed@{node.tcp}".encode()])
    acked: list[bytes] = []
    failed: list[BaseException] = []
    stop = asyncio.Event()

    async def produce(p: Producer) -> None:
        for i in range(2000):
            if stop.is_set():
                return
            body = f"p{i}".encode()
            try:
                await p.publish(topic, body, timeout=WAIT)
            except Exception as exc:  # counted: the producer must not lose any
                failed.append(exc)
            else:
                acked.append(body)
            await asyncio.sleep(0.005)

    release = asyncio.Event()
    held: list[bytes] = []
    got = Collector()

    async def handle(msg: Message) -> None:
        if msg.nsqd_address == a.tcp and not release.is_set() and len(held) < 3:
            held.append(msg.body)
            await release.wait()
            return
        await got(msg)

    async with Producer(nsqd=[a.tcp, b.tcp]) as p, \
            Consumer(topic, "ch", handle, lookupd=real.lookupd_http,
                     config=fast_config(max_in_flight=10)) as c:
        task = asyncio.create_task(produce(p))
        try:
            await eventually(lambda: len(held) == 3, WAIT)
            n = len(acked)
            await asyncio.to_thread(a.stop, signal.SIGTERM)
            await eventually(lambda: len(acked) > n + 20, WAIT)
            release.set()
            await asyncio.to_thread(a.start)
            await eventually(lambda: len(acked) > n + 40, WAIT)
        finally:
            stop.set()
            await task
        await got.wait_for(lambda: set(acked) | set(held) <= got.distinct, WAIT)
        assert [s.connected for s in c.stats().subscriptions] == [True, True]
    assert not failed
    assert not handler_errors(caplog)


async def redelivered(address: str, topic: str, channel: str) -> None:
    """Wait until a message on ``channel`` times out on nsqd and comes again."""
    again = asyncio.Event()

    async def hold(msg: Message) -> None:
        if msg.attempts == 1:
            msg.disable_auto_response()
        else:
            again.set()

    async with Consumer(topic, channel, hold, nsqd=[address], config=fast_config()):
        async with asyncio.timeout(WAIT):
            await again.wait()


@pytest.fixture(scope="module")
def timing_topic(real: FaultCluster) -> str:
    """A topic whose channels ``touch`` and ``late`` nsqd times out: nsqd 1.3.0's queue scan
    learns of new channels only every 5 s (--queue-scan-refresh-interval), and until then
    nothing of theirs times out."""
    topic = unique("timing")
    node = real.nodes[0]
    for path in ("topic/create?", "channel/create?channel=touch&",
                 "channel/create?channel=late&"):
        urllib.request.urlopen(urllib.request.Request(
            f"http://{node.http}/{path}topic={topic}", method="POST"), timeout=WAIT).close()

    async def both() -> None:
        await publish(node.tcp, topic, [b"probe"])
        async with asyncio.TaskGroup() as tg:
            for channel in ("touch", "late"):
                tg.create_task(redelivered(node.tcp, topic, channel))

    asyncio.run(both())
    return topic



async def test_touching_handler_outlives_the_server_msg_timeout(
        real: FaultCluster, timing_topic: str) -> None:
    """nsqd --msg-timeout=1s, a 1.6 s handler that touches every 0.2 s: each message is
    handled once, on its first attempt."""
    topic = timing_topic
    sent = [f"t{i}".encode() for i in range(3)]
    await publish(real.nodes[0].tcp, topic, sent)
    attempts: list[int] = []
    got = Collector()

    async def handle(msg: Message) -> None:
        attempts.append(msg.attempts)
        for _ in range(8):
            await asyncio.sleep(0.2)
            assert msg.touch()
        await got(msg)

    async with Consumer(topic, "touch", handle, nsqd=[real.nodes[0].tcp],
                        config=fast_config(max_in_flight=3)) as c:
        await got.wait_for(lambda: got.distinct == set(sent), WAIT)
        assert c.stats().finished == 3
    assert attempts == [1, 1, 1]


async def test_late_fin_after_the_server_timeout_keeps_the_connection(
        real: FaultCluster, timing_topic: str, caplog: pytest.LogCaptureFixture) -> None:
    """No touch: a 1.6 s handler outlives nsqd's 1 s timeout, the message is delivered again
    meanwhile and the late FIN gets E_FIN_FAILED: the connection stays up (one connect), the
    other messages flow, and the redelivery is finished."""
    caplog.set_level(logging.INFO, logger="smartnsq")
    node = real.nodes[0]
    topic = timing_topic
    await publish(node.tcp, topic, [b"slow"])
    slow: list[int] = []
    got = Collector()

    async def handle(msg: Message) -> None:
        if msg.body == b"slow" and msg.attempts == 1:
            slow.append(msg.attempts)
            # answered only once nsqd gave it again
            await got.wait_for(lambda: b"slow" in got.distinct, WAIT)
            slow.append(int(msg.finish()))
            return
        await got(msg)

    async with Consumer(topic, "late", handle, nsqd=[node.tcp],
                        config=fast_config(max_in_flight=5)) as c:
        await eventually(lambda: b"slow" in got.distinct, WAIT)
        await eventually(lambda: len(slow) == 2, WAIT)
        more = [f"after{i}".encode() for i in range(5)]
        await publish(node.tcp, topic, more)
        await got.wait_for(lambda: set(more) <= got.distinct, WAIT)
        stats = c.stats()
        assert stats.connects == 1
        assert [s.connected for s in stats.subscriptions] == [True]
    # finish() wrote the FIN: nsqd answered E_FIN_FAILED, which closed nothing
    assert slow == [1, 1]
    assert not handler_errors(caplog)


@pytest.fixture(params=["double", "real"])
async def strict_nsqd(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """An nsqd with --max-msg-timeout=5s: the double, or the real cluster's first node."""
    if request.param == "real":
        real: FaultCluster = request.getfixturevalue("real")
        yield real.nodes[0].tcp
        return
    async with DevCluster(nodes=1, flavour="stock",
                          nsqd_options=NsqdOptions(max_msg_timeout=5.0)) as dev:
        yield dev.nsqd_tcp_addresses[0]


async def test_msg_timeout_above_the_server_maximum_ends_the_consumer(
        strict_nsqd: str) -> None:
    """ConnectionConfig(msg_timeout=10) against nsqd --max-msg-timeout=5s: nsqd refuses every
    IDENTIFY (E_BAD_BODY), which no reconnect fixes: start() raises it, as for the other
    settings nsqd refuses, instead of retrying for ever with warnings."""
    config = fast_config(connection={"msg_timeout": 10.0})
    consumer = Consumer(unique("maxto"), "ch", Collector(), nsqd=[strict_nsqd], config=config)
    with pytest.raises(BadBodyError, match="msg timeout"):
        async with asyncio.timeout(WAIT):
            await consumer.start()
    assert isinstance(consumer.error, BadBodyError)
    await consumer.stop()


async def produce_until(p: Producer, topic: str, stop: asyncio.Event, acked: list[bytes],
                        failed: list[BaseException]) -> None:
    """Publish ``topic`` every 10 ms until ``stop``; what was acknowledged goes to ``acked``."""
    for i in range(3000):
        if stop.is_set():
            return
        body = f"p{i}".encode()
        try:
            await p.publish(topic, body, timeout=WAIT)
        except Exception as exc:  # counted: nothing may fail
            failed.append(exc)
        else:
            acked.append(body)
        await asyncio.sleep(0.01)


async def test_one_of_two_lookupds_killed_and_restarted(
        real: FaultCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Each nsqd registered with two nsqlookupd; one is SIGKILLed and started again (it lists
    nothing until the nsqds re-register on their next 15 s ping, so the two disagree): the
    consumer and Producer(lookupd=[l1, l2]) go on, nothing is lost, no subscription is
    dropped or opened again."""
    caplog.set_level(logging.INFO, logger="smartnsq")
    topic = unique("twolk")
    for node in real.nodes:
        await publish(node.tcp, topic, [f"seed@{node.tcp}".encode()])
    acked: list[bytes] = []
    failed: list[BaseException] = []
    stop = asyncio.Event()
    got = Collector()
    config = fast_config(max_in_flight=10)
    async with Producer(lookupd=real.lookupd_http) as p, \
            Consumer(topic, "ch", got, lookupd=real.lookupd_http, config=config) as c:
        task = asyncio.create_task(produce_until(p, topic, stop, acked, failed))
        try:
            await eventually(lambda: len(acked) > 20, WAIT)
            await asyncio.to_thread(real.lookupds[0].restart, signal.SIGKILL)
            n = len(acked)
            # a few lookupd polls (0.3 s) with the lookupds disagreeing
            await eventually(lambda: len(acked) > n + 100, WAIT)
        finally:
            stop.set()
            await task
        await got.wait_for(lambda: set(acked) <= got.distinct, WAIT)
        stats = c.stats()
        assert stats.connects == 2
        assert [s.connected for s in stats.subscriptions] == [True, True]
    assert not failed
    assert "no longer listed" not in caplog.text


async def test_nsqd_restarted_on_other_ports_is_followed_through_lookupd(
        real: FaultCluster) -> None:
    """An nsqd stopped and started on other ports (its old address gone, the new one
    registered with the lookupds): the consumer subscribes at the new address and gets
    what is published there."""
    node = real.nodes[1]
    topic = unique("moved")
    await publish(node.tcp, topic, [b"before"])
    got = Collector()
    old_ports = node.tcp_port, node.http_port
    async with Consumer(topic, "ch", got, lookupd=real.lookupd_http,
                        config=fast_config(max_in_flight=10)) as c:
        await got.wait_for(lambda: b"before" in got.distinct, WAIT)
        try:
            await asyncio.to_thread(node.restart, signal.SIGTERM, real.spare_ports)
            await publish(node.tcp, topic, [b"after"])
            await got.wait_for(lambda: b"after" in got.distinct, WAIT)
            assert [s.address for s in c.stats().subscriptions if s.connected] == [node.tcp]
        finally:
            await asyncio.to_thread(node.restart, signal.SIGTERM, old_ports)
