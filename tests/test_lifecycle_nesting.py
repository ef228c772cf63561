"""One ``async with`` (``with`` for the sync facades) per client at a time, and none around a
client that ``start()`` started: the code that does either, a helper that "makes sure the
client is open" with its own block, say, used to stop the client at the end of its block,
under the outer block (or under the code that started it), which then failed with
"the producer is stopped" or lost its consumer. Now the entry is refused with ConfigError
naming the client, and the client runs on: what is published reaches the channel or the
handler. ``start()`` stays idempotent."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import smartnsq.sync
from smartnsq import Consumer, OrderedConsumer, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ClientClosedError, ConfigError
from smartnsq.message import Message
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.producer.http import HttpProducer
from tests.consumer_support import WAIT, fast_config
from tests.test_sync_consumer import ClusterThread

Publisher = Producer | HttpProducer


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, flavour="stock") as c:
        c.create_topic("t", channels=["c"])
        yield c


def publishers(cluster: DevCluster) -> dict[str, Callable[[], Publisher]]:
    return {"Producer": lambda: Producer(nsqd=cluster.nsqd_tcp_addresses[0]),
            "HttpProducer": lambda: HttpProducer(nsqd=cluster.nsqd_http_addresses[0])}


def depth(cluster: DevCluster) -> int:
    """Messages waiting in channel t/c (queued or in flight)."""
    total = 0
    for node in cluster.nodes:
        st = cluster.store.stock_topic(node.node_id, "t")
        if st is not None and "c" in st.channels:
            total += st.channels["c"].depth() + st.channels["c"].in_flight_count
    return total


async def make_sure_open(client: Any) -> None:
    """What the refused code looks like: a helper that opens the client it was given."""
    async with client:
        pass


@pytest.mark.parametrize("kind", ["Producer", "HttpProducer"])
async def test_helper_with_its_own_block_is_refused_and_the_outer_block_goes_on(
        cluster: DevCluster, kind: str) -> None:
    p = publishers(cluster)[kind]()
    async with p:
        await p.publish("t", b"before")
        with pytest.raises(ConfigError) as refused:
            await make_sure_open(p)
        text = str(refused.value)
        assert f"this {kind} is already inside an 'async with' block" in text
        assert "would stop it" in text
        # before: ClientClosedError "the producer is stopped"
        await p.publish("t", b"after")
        assert not p.is_closed
    assert p.is_closed  # the outer block still stops it
    assert depth(cluster) == 2


@pytest.mark.parametrize("kind", ["Producer", "HttpProducer"])
async def test_block_around_a_started_producer_is_refused(cluster: DevCluster,
                                                          kind: str) -> None:
    p = publishers(cluster)[kind]()
    await p.start()
    await p.start()  # idempotent: starts nothing more, stops nothing
    with pytest.raises(ConfigError, match=f"this {kind} was started with start"):
        await make_sure_open(p)
    await p.publish("t", b"still open")
    await p.stop()
    assert depth(cluster) == 1
    # a stopped producer is refused as before: stopped, not "started"
    with pytest.raises(ClientClosedError):
        await make_sure_open(p)


async def test_two_blocks_one_after_the_other_on_a_stopped_producer_fail_as_before(
        cluster: DevCluster) -> None:
    p = Producer(nsqd=cluster.nsqd_tcp_addresses[0])
    async with p:
        await p.publish("t", b"x")
    with pytest.raises(ClientClosedError, match="stopped"):
        async with p:
            pass


async def test_consumer_keeps_consuming_after_a_refused_inner_block(
        cluster: DevCluster) -> None:
    got: list[bytes] = []
    enough = asyncio.Event()

    async def handle(msg: Message) -> None:
        got.append(msg.body)
        if len(got) == 2:
            enough.set()

    c = Consumer("t", "c", handle, nsqd=cluster.nsqd_tcp_addresses[0],
                 config=fast_config(max_in_flight=10))
    async with Producer(nsqd=cluster.nsqd_tcp_addresses[0]) as p, c:
        await p.publish("t", b"one")
        with pytest.raises(ConfigError, match="this Consumer is already inside"):
            await make_sure_open(c)
        # before: the inner exit stopped the consumer; "two" stayed in the channel
        assert c.is_running
        await p.publish("t", b"two")
        async with asyncio.timeout(WAIT):
            await enough.wait()
    assert sorted(got) == [b"one", b"two"]
    assert c.is_closed


async def test_block_around_a_started_consumer_is_refused(cluster: DevCluster) -> None:
    async def handle(msg: Message) -> None:
        pass

    c = Consumer("t", "c", handle, nsqd=cluster.nsqd_tcp_addresses[0], config=fast_config())
    await c.start()
    try:
        await c.start()
        with pytest.raises(ConfigError, match="this Consumer was started with start"):
            await make_sure_open(c)
        assert c.is_running
    finally:
        await c.stop()


async def test_ordered_consumer_names_itself() -> None:
    async with DevCluster(nodes=1, lookupds=1, flavour="youzan") as cl:
        cl.create_topic("o", partition_num=1, ordered=True, channels=["c"])

        async def handle(msg: Message) -> None:
            pass

        c = OrderedConsumer("o", "c", handle, lookupd=cl.lookupd_http_addresses,
                            config=fast_config())
        async with c:
            with pytest.raises(ConfigError, match="this OrderedConsumer is already inside"):
                await make_sure_open(c)
            assert c.is_running
        assert c.is_closed


async def test_a_failed_start_leaves_no_block_behind(cluster: DevCluster) -> None:
    """A block whose start failed is no block: the next entry fails for its own reason
    (the consumer is closed), not as 'already inside'."""
    async def handle(msg: Message) -> None:
        pass

    c = Consumer("t", "c", handle, nsqd="127.0.0.1:1", config=fast_config())
    attempt: Callable[[], Awaitable[None]] = lambda: make_sure_open(c)  # noqa: E731
    async with asyncio.timeout(WAIT):
        first = await asyncio.gather(attempt(), return_exceptions=True)
    assert not isinstance(first[0], ConfigError)
    with pytest.raises(ClientClosedError):
        await attempt()


# ------------------------------------------------------------------ the sync facades


def make_sure_open_sync(client: Any) -> None:
    with client:
        pass


def test_sync_producer_nested_with_is_refused(stock_one: ClusterThread) -> None:
    p = smartnsq.sync.Producer(nsqd=stock_one.cluster.nsqd_tcp_addresses[0])
    with p:
        with pytest.raises(ConfigError, match=re.escape(
                "this smartnsq.sync.Producer is already inside a 'with' block")):
            make_sure_open_sync(p)
        p.publish("t", b"after")  # before: ClientClosedError
    assert p.is_closed
    started = smartnsq.sync.Producer(nsqd=stock_one.cluster.nsqd_tcp_addresses[0])
    started.start()
    started.start()
    try:
        with pytest.raises(ConfigError, match="was started with start"):
            make_sure_open_sync(started)
        started.publish("t", b"started")
    finally:
        started.stop()
    assert depth(stock_one.cluster) == 2


def test_sync_consumer_nested_with_is_refused(stock_one: ClusterThread) -> None:
    got: list[bytes] = []

    def handle(msg: Any) -> None:
        got.append(msg.body)

    c = smartnsq.sync.Consumer("t", "c", handle, nsqd=stock_one.cluster.nsqd_tcp_addresses[0],
                               config=fast_config())
    with smartnsq.sync.Producer(nsqd=stock_one.cluster.nsqd_tcp_addresses[0]) as p, c:
        with pytest.raises(ConfigError, match=re.escape(
                "this smartnsq.sync.Consumer is already inside a 'with' block")):
            make_sure_open_sync(c)
        assert c.is_running
        p.publish("t", b"after")
        assert not c.wait(0.0)
        for _ in range(int(WAIT / 0.02)):  # bounded poll for the delivery
            if got:
                break
            c.wait(0.02)
    assert got == [b"after"]
    assert c.is_closed
    o = smartnsq.sync.Consumer("t", "c", handle, nsqd=stock_one.cluster.nsqd_tcp_addresses[0],
                               config=fast_config())
    o.start()
    try:
        with pytest.raises(ConfigError, match=re.escape("smartnsq.sync.Consumer was started")):
            make_sure_open_sync(o)
        assert o.is_running
    finally:
        o.stop()


async def test_nsqd_http_client_keeps_its_session_through_a_helpers_block(
        cluster: DevCluster) -> None:
    """The nsqd HTTP client's block closes its session: a helper's own block used to close it
    under the outer one, whose next call then failed with "closed"."""
    http = cluster.nsqd_http_addresses[0]
    async with NsqdHttpClient(timeout=WAIT) as nsqd:
        with pytest.raises(ConfigError, match="this NsqdHttpClient is already inside"):
            await make_sure_open(nsqd)
        async with asyncio.timeout(WAIT):
            info = await nsqd.info(http)  # still open
        assert info
    with pytest.raises(ClientClosedError, match="this NsqdHttpClient is closed"):
        async with nsqd:
            pass
