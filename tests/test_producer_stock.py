"""Producer against the embedded stock cluster: PUB/MPUB/DPUB, timeouts, cancellation,
failover with nothing acknowledged lost, auto-batching, HTTP transport, compatibility errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd import NsqdOptions
from smartnsq.errors import (
    BadMessageError,
    ClientClosedError,
    ConfigError,
    NotStartedError,
    PublishError,
    PublishTimeoutError,
    UnsupportedFeatureError,
)
from smartnsq.producer import BatchReceipt, HttpProducer, Producer
from tests.test_producer_support import bodies_of, consume

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, flavour="stock") as c:
        yield c


def stock_count(c: DevCluster, node: int, topic: str) -> int:
    st = c.store.stock_topic(c.nodes[node].node_id, topic)
    return 0 if st is None else st.message_count


async def test_publish_mpub_split_and_dpub(cluster: DevCluster) -> None:
    cluster.create_topic("plain", channels=("c",))
    addr = cluster.nsqd_tcp_addresses[0]
    cfg = FAST.replace(max_body_size=1024, max_msg_size=1024, connections_per_nsqd=1)
    async with Producer(nsqd=[addr], config=cfg) as p:
        assert await p.publish("plain", b"one") is None
        bodies = [b"%03d" % i + b"x" * 97 for i in range(100)]
        # stock nsqd: no partitions, and no receipts (the call passed no trace_id)
        assert await p.publish_many("plain", bodies) == BatchReceipt("plain", 100,
                                                                     (None,) * 12, ())
        await p.publish_deferred("plain", b"later", 0.05)
        # 1 PUB + 12 MPUBs (9 messages of 104 bytes per 1024-byte body) + 1 DPUB
        assert sum(c.stats().publishes for c in p.pools[addr].connections) == 14
    ch = cluster.store.stock_topic(cluster.nodes[0].node_id, "plain").channels["c"]  # type: ignore[union-attr]
    assert ch.deferred_count == 1
    got = bodies_of(await consume(addr, "plain", "c", 102))
    assert got[0] == b"one"
    assert got[1:101] == bodies  # MPUB chunks sent in order
    assert got[101] == b"later"


async def test_timeout_and_cancel_leave_the_connection_usable(cluster: DevCluster) -> None:
    cluster.create_topic("slow", channels=("c",))
    addr = cluster.nsqd_tcp_addresses[0]
    async with Producer(nsqd=[addr], config=FAST) as p:
        await p.publish("slow", b"warm-up")
        conn = p.pools[addr].connections[0]
        cluster.delay_responses(0, 0.3)
        with pytest.raises(PublishTimeoutError) as info:
            await p.publish("slow", b"late", timeout=0.05)
        assert isinstance(info.value, TimeoutError) and isinstance(info.value, PublishError)
        task = asyncio.create_task(p.publish("slow", b"cancelled"))
        await asyncio.sleep(0)  # one step: the PUB is written and waits for its answer
        assert conn.pending >= 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cluster.delay_responses(0, 0)
        # the late answers take their FIFO slots; the next publish gets its own
        await p.publish("slow", b"after", timeout=2)
        assert conn.is_connected and p.pools[addr].connections == (conn,)
        assert conn.error is None
    # the timed-out and the cancelled PUB were written, so nsqd stored them: only the caller
    # stopped waiting
    assert stock_count(cluster, 0, "slow") == 4


async def test_failover_when_an_nsqd_dies_loses_nothing_acknowledged(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="smartnsq.producer")
    cluster.create_topic("fo", channels=("c",))
    cfg = FAST.replace(max_attempts=5)
    acked: list[bytes] = []
    failed: list[BaseException] = []
    stop_at = 300
    half = asyncio.Event()

    async def worker(p: Producer, w: int) -> None:
        for i in range(60):
            body = b"w%02d-%03d" % (w, i)
            try:
                await p.publish("fo", body)
            except PublishError as exc:
                failed.append(exc)
            else:
                acked.append(body)
                if len(acked) >= stop_at:
                    half.set()

    async with Producer(nsqd=cluster.nsqd_tcp_addresses, config=cfg) as p:
        workers = [asyncio.create_task(worker(p, w)) for w in range(20)]
        async with asyncio.timeout(10):
            await half.wait()
            before = stock_count(cluster, 1, "fo")
            await cluster.stop_node(1)
            await asyncio.gather(*workers)
        assert not failed, failed[:3]
        assert len(acked) == 1200
        # publishes that were pending on the dying connection were retried elsewhere
        dead = cluster.nsqd_tcp_addresses[1]
        assert any(dead in r.getMessage() and "failover" in r.getMessage()
                   for r in caplog.records)
        assert not p.pools[cluster.nsqd_tcp_addresses[1]].is_up
        # node 1 comes back: the pool redials it by itself (backoff) and uses it again
        await cluster.start_node(1)
        async with asyncio.timeout(5):
            await p.pools[cluster.nsqd_tcp_addresses[1]].wait_up()
        for i in range(30):
            await p.publish("fo", b"back-%02d" % i)
            acked.append(b"back-%02d" % i)
    assert before > 0
    assert stock_count(cluster, 1, "fo") > before
    counts = [stock_count(cluster, i, "fo") for i in range(3)]
    stored: list[bytes] = []
    for i, addr in enumerate(cluster.nsqd_tcp_addresses):
        stored += bodies_of(await consume(addr, "fo", "c", counts[i]))
    # every acknowledged message is stored; an unacknowledged one may be stored too (it was
    # retried elsewhere after the connection died), which at-least-once allows
    assert set(acked) <= set(stored)
    assert len(set(stored)) == len(set(acked))


async def test_all_nodes_down_raises_with_the_cause(cluster: DevCluster) -> None:
    addrs = cluster.nsqd_tcp_addresses[:1]
    cfg = FAST.replace(max_attempts=3)
    async with Producer(nsqd=addrs, config=cfg) as p:
        await cluster.stop_node(0)
        with pytest.raises(PublishError) as info:
            await p.publish("gone", b"x", timeout=3)
        assert not isinstance(info.value, PublishTimeoutError)
        assert info.value.__cause__ is not None
        assert "attempt" in str(info.value)


async def test_auto_batching_gives_each_caller_its_result_in_order(
        cluster: DevCluster) -> None:
    cluster.create_topic("batched", channels=("c",))
    addr = cluster.nsqd_tcp_addresses[0]
    cfg = FAST.replace(linger=0.005, max_batch=50, connections_per_nsqd=1)
    async with Producer(nsqd=[addr], config=cfg) as p:
        bodies = [b"m%04d" % i for i in range(500)]
        results = await asyncio.gather(*(p.publish("batched", b) for b in bodies))
        assert results == [None] * 500
        assert p.batcher is not None
        assert p.batcher.messages == 500
        assert p.batcher.batches == 10  # full batches of max_batch
        assert p.pools[addr].connections[0].stats().publishes == 10
    got = bodies_of(await consume(addr, "batched", "c", 500))
    assert got == bodies


async def test_a_failed_batch_fails_every_caller_in_it() -> None:
    # the server takes 50-byte messages, the client allows more: the MPUB is refused whole
    async with DevCluster(nodes=1, flavour="stock",
                          nsqd_options=NsqdOptions(max_msg_size=50)) as c:
        c.create_topic("strict", channels=("c",))
        cfg = FAST.replace(linger=0.01, max_batch=10, connections_per_nsqd=1)
        async with Producer(nsqd=c.nsqd_tcp_addresses, config=cfg) as p:
            bodies = [b"ok"] * 5 + [b"x" * 100] + [b"ok"] * 4
            results = await asyncio.gather(*(p.publish("strict", b) for b in bodies),
                                           return_exceptions=True)
            assert all(isinstance(r, PublishError) for r in results)
            assert all(isinstance(r.__cause__, BadMessageError) for r in results)  # type: ignore[union-attr]
            assert len({id(r) for r in results}) == 1  # one MPUB, one outcome
            # E_BAD_MESSAGE is fatal on stock: the next publish gets a fresh connection
            await p.publish("strict", b"fine")
        assert c.store.stock_topic(c.nodes[0].node_id, "strict").message_count == 1  # type: ignore[union-attr]


async def test_cancelled_caller_is_left_out_of_its_batch(cluster: DevCluster) -> None:
    cluster.create_topic("cb", channels=("c",))
    addr = cluster.nsqd_tcp_addresses[0]
    cfg = FAST.replace(linger=0.05, max_batch=100)
    async with Producer(nsqd=[addr], config=cfg) as p:
        keep = asyncio.create_task(p.publish("cb", b"keep"))
        drop = asyncio.create_task(p.publish("cb", b"drop"))
        await asyncio.sleep(0)
        drop.cancel()
        await keep
        with pytest.raises(asyncio.CancelledError):
            await drop
    assert bodies_of(await consume(addr, "cb", "c", 1)) == [b"keep"]
    assert stock_count(cluster, 0, "cb") == 1


async def test_stop_waits_for_accepted_publishes(cluster: DevCluster) -> None:
    cluster.create_topic("closing", channels=("c",))
    addr = cluster.nsqd_tcp_addresses[0]
    p = Producer(nsqd=[addr], config=FAST.replace(linger=0.2))
    with pytest.raises(NotStartedError, match=r"start\(\)"):  # no implicit start
        await p.publish("closing", b"too early")
    await p.start()
    tasks = [asyncio.create_task(p.publish("closing", b"%d" % i)) for i in range(20)]
    await asyncio.sleep(0)
    await p.stop()  # flushes the open batch and waits for its answer
    assert p.is_closed
    assert all(t.done() and t.exception() is None for t in tasks)
    assert stock_count(cluster, 0, "closing") == 20
    with pytest.raises(ClientClosedError):
        await p.publish("closing", b"too late")


async def test_stock_compatibility_errors(cluster: DevCluster) -> None:
    cluster.create_topic("compat", channels=("c",))
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=FAST) as p:
        await p.publish("compat", b"plain works through stock lookupd")
        for coro in (p.publish("compat", b"x", trace_id=1),
                     p.publish("compat", b"x", ext={"k": "v"}),
                     p.publish("compat", b"x", partition=0),
                     p.publish_many("compat", [b"x"], trace_id=1),
                     p.publish_ordered("compat", "key", b"x")):
            with pytest.raises(UnsupportedFeatureError):
                await coro
        await p.publish_deferred("compat", b"deferred works", 0.01)
    async with Producer(nsqd=cluster.nsqd_tcp_addresses[:1], config=FAST) as p:
        with pytest.raises(UnsupportedFeatureError):
            await p.publish("compat", b"x", trace_id=7)
        with pytest.raises(UnsupportedFeatureError):
            await p.publish("compat", b"x", partition=1)
        with pytest.raises(UnsupportedFeatureError):
            await p.publish("compat", b"x", ext={"a": "b"})
        await p.publish("compat", b"still fine")
    total = sum(stock_count(cluster, i, "compat") for i in range(3))
    assert total == 3


async def test_http_producer_stock(cluster: DevCluster) -> None:
    cluster.create_topic("web", channels=("c",))
    http = cluster.nsqd_http_addresses
    cfg = FAST.replace(max_body_size=1024, max_msg_size=1024)
    async with HttpProducer(nsqd=[http[0]], config=cfg) as p:
        await p.publish("web", b"via http")
        bodies = [b"%03d" % i + b"y" * 97 for i in range(30)]
        sent = await p.publish_many("web", bodies)
        assert (sent.topic, sent.count, sent.receipts) == ("web", 30, ())
        assert sent.partitions and set(sent.partitions) == {None}
        await p.publish_deferred("web", b"deferred", 0.01)
        with pytest.raises(UnsupportedFeatureError):
            await p.publish("web", b"x", trace_id=1)
        with pytest.raises(ConfigError):
            await p.publish("web", b"")
    got = bodies_of(await consume(cluster.nsqd_tcp_addresses[0], "web", "c", 32))
    assert got[:31] == [b"via http", *bodies]
    assert got[31] == b"deferred"
    # failover: a dead node is skipped
    await cluster.stop_node(1)
    async with HttpProducer(nsqd=[http[1], http[2]], config=FAST) as p:
        for i in range(6):
            await p.publish("web", b"fo%d" % i)
    assert stock_count(cluster, 2, "web") == 6


async def test_a_new_stock_topic_through_lookupd_says_how_to_publish_it(
        cluster: DevCluster) -> None:
    """No lookupd lists an nsqd for a topic nobody published yet: the producer cannot know
    where to send it. The error said TOPIC_NOT_FOUND and only how youzan topics are made."""
    config = ProducerConfig(publish_timeout=0.5)
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=config) as p:
        with pytest.raises(PublishTimeoutError) as info:
            await p.publish("never_published", b"x")
    text = str(info.value)
    assert "'never_published'" in text
    assert "nsqd=" in text and "smartnsq topic create" in text
