"""Ordered publishing and consuming under faults, on the embedded youzan cluster: many keys
published concurrently while partition leaders move, consumer connections dropped, the
consumer stopped and started while publishing goes on, a handler that fails or outlasts
msg_timeout while its connection drops. Invariant: per key, the handler sees messages in
the order published (first deliveries; a redelivery of an unfinished message is allowed),
and everything published is handled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from smartnsq import Message, OrderedConsumer, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd.node import ClientInfo
from smartnsq.sharding import ShardRule, shard_partition
from tests.consumer_support import Collector, eventually
from tests.test_ordered_user_patterns import (
    CHANNEL,
    PARTS,
    PUB,
    TOPIC,
    assert_per_key_order,
    config,
    firsts,
)

KEYS = [f"k{i}" for i in range(24)]


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=1, flavour="youzan") as c:
        c.create_topic(TOPIC, partition_num=PARTS, replica=2, ordered=True,
                       channels=[CHANNEL])
        yield c


def consumer(cluster: DevCluster, handler: object, **kw: object) -> OrderedConsumer:
    cfg = kw.pop("config", None) or config()
    return OrderedConsumer(TOPIC, CHANNEL, handler,  # type: ignore[arg-type]
                           lookupd=cluster.lookupd_http_addresses, config=cfg,
                           **kw)  # type: ignore[arg-type]


def depth(cluster: DevCluster) -> int:
    return sum(cluster.store.partition(TOPIC, p).channels[CHANNEL].depth()
               for p in range(PARTS))


async def publish_k0(cluster: DevCluster, n: int) -> list[bytes]:
    """``k0:0`` .. ``k0:<n-1>`` published in order with key ``k0``; returns them."""
    sent: list[bytes] = []
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        for seq in range(n):
            body = f"k0:{seq}".encode()
            await p.publish_ordered(TOPIC, "k0", body)
            sent.append(body)
    return sent


def is_reader(info: ClientInfo) -> bool:
    return info.sub_command == "SUB_ORDERED"


async def publish_all(cluster: DevCluster, per_key: int, *, linger: float = 0.0,
                      rule: ShardRule = "murmur3", sent: list[bytes] | None = None,
                      during: asyncio.Event | None = None) -> list[bytes]:
    """Every key published concurrently (one task per key, in seq order); ``during`` is
    set once a third of the messages are acknowledged."""
    out = [] if sent is None else sent
    total = per_key * len(KEYS)
    cfg = PUB.replace(linger=linger, max_attempts=8)
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=cfg) as p:
        async def one_key(key: str) -> None:
            for seq in range(per_key):
                body = f"{key}:{seq}".encode()
                await p.publish_ordered(TOPIC, key, body, rule=rule)
                out.append(body)
                if during is not None and len(out) >= total // 3:
                    during.set()

        async with asyncio.timeout(10):
            await asyncio.gather(*(one_key(k) for k in KEYS))
    return out


@pytest.mark.parametrize(("linger", "rule"), [(0.0, "murmur3"), (0.005, "java")],
                         ids=["no-linger-murmur3", "linger-java"])
async def test_leaders_move_while_publishing_and_consuming(
        cluster: DevCluster, linger: float, rule: ShardRule) -> None:
    got = Collector()
    moved = asyncio.Event()
    sent: list[bytes] = []
    async with consumer(cluster, got):
        pub = asyncio.create_task(publish_all(cluster, 20, linger=linger, rule=rule,
                                              sent=sent, during=moved))
        async with asyncio.timeout(10):
            await moved.wait()
        for part in range(PARTS):
            cluster.move_leader(TOPIC, part)
        await pub
        await got.wait_for(lambda: got.distinct >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(got.handled, sent)


async def test_consumer_connections_dropped_again_and_again(cluster: DevCluster) -> None:
    got = Collector(delay=0.002)
    sent: list[bytes] = []
    async with consumer(cluster, got):
        pub = asyncio.create_task(publish_all(cluster, 20, sent=sent))
        dropped = 0
        for _ in range(6):
            n = len(got.handled)
            await got.wait_for(lambda: len(got.handled) > n + 20, timeout=5)  # noqa: B023
            for node in range(3):
                dropped += cluster.drop_client(node, predicate=is_reader)
            if pub.done():
                break
        await pub
        assert dropped > 0
        await got.wait_for(lambda: got.distinct >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(got.handled, sent)


async def test_stop_and_start_five_times_while_publishing(cluster: DevCluster) -> None:
    sent: list[bytes] = []
    handled: list[bytes] = []
    pub = asyncio.create_task(publish_all(cluster, 25, sent=sent))
    for _ in range(5):
        got = Collector()
        c = consumer(cluster, got)
        await c.start()
        try:
            await got.wait_for(lambda: len(got.handled) >= 15, timeout=5)  # noqa: B023
        finally:
            await c.stop()
        handled += got.handled
    await pub
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: set(handled) | got.distinct >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(handled + got.handled, sent)


async def test_a_slow_handler_whose_connection_drops(cluster: DevCluster) -> None:
    """k0:1's handler runs 1.2 s; its connection drops meanwhile. The redelivery on the
    new connection must not run k0:1 a second time at once, nor k0:2 before the first call
    ended."""
    sent = await publish_k0(cluster, 4)
    started = asyncio.Event()
    events: list[str] = []
    running = 0
    overlap = 0

    async def handler(msg: Message) -> None:
        nonlocal running, overlap
        running += 1
        overlap = max(overlap, running)
        events.append(f"start {msg.body.decode()}")
        try:
            if msg.body == b"k0:1" and not started.is_set():
                started.set()
                await asyncio.sleep(1.2)
        finally:
            running -= 1
            events.append(f"end {msg.body.decode()}")

    part = shard_partition("k0", PARTS)
    async with consumer(cluster, handler) as c:
        async with asyncio.timeout(5):
            await started.wait()
        assert sum(cluster.drop_client(n, predicate=is_reader) for n in range(3)) >= 1
        await eventually(lambda: "end k0:3" in events and running == 0, timeout=6)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
        # the held copy's FIN moved the position: no gap was seen after it
        assert c.validator(part).gaps == 0
        assert c.position(part) == cluster.store.partition(TOPIC, part).records[-1].offset
    assert overlap == 1, events
    assert_per_key_order([e.split()[1].encode() for e in events if e.startswith("end")],
                         sent)


async def test_a_failing_message_across_a_leader_move(cluster: DevCluster) -> None:
    """k0:1 fails 3 times (default on_blocked: retry); meanwhile its leader moves. It is
    retried, never skipped; nothing of its key comes before it succeeds."""
    sent = await publish_k0(cluster, 5)
    part = shard_partition("k0", PARTS)
    calls: list[tuple[bytes, int]] = []
    failed = asyncio.Event()

    async def handler(msg: Message) -> None:
        calls.append((msg.body, msg.attempts))
        if msg.body == b"k0:1" and sum(b == b"k0:1" for b, _ in calls) <= 3:
            failed.set()
            raise RuntimeError("refused")

    async with consumer(cluster, handler, config=config(ordered_retry_pause=0.2)) as c:
        async with asyncio.timeout(5):
            await failed.wait()
        cluster.move_leader(TOPIC, part)
        await eventually(lambda: len(firsts(b for b, _ in calls)) == 5 and depth(cluster) == 0,
                         timeout=6)
        assert c.skipped == 0
    bodies = [b for b, _ in calls]
    assert bodies[:5] == [b"k0:0"] + [b"k0:1"] * 4, calls
    assert firsts(bodies) == sent


async def test_a_leader_node_stops_and_comes_back(cluster: DevCluster) -> None:
    """Node 0 stops while publishing and consuming go on (replica 2: its partitions fail
    over), then starts again."""
    got = Collector(delay=0.001)
    third = asyncio.Event()
    sent: list[bytes] = []
    async with consumer(cluster, got):
        pub = asyncio.create_task(publish_all(cluster, 20, sent=sent, during=third))
        async with asyncio.timeout(10):
            await third.wait()
        await cluster.stop_node(0)
        await pub
        await cluster.start_node(0)
        await got.wait_for(lambda: got.distinct >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(got.handled, sent)


async def test_slow_answers_from_the_nodes_while_consuming(cluster: DevCluster) -> None:
    sent = await publish_all(cluster, 10)
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(got.handled) >= 30, timeout=5)
        for node in range(3):
            cluster.delay_responses(node, 0.3)
            cluster.drop_client(node, predicate=is_reader)
        await got.wait_for(lambda: len(got.handled) >= 80, timeout=8)
        for node in range(3):
            cluster.delay_responses(node, 0)
        await got.wait_for(lambda: got.distinct >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(got.handled, sent)


async def test_a_failing_message_whose_connection_drops_in_its_retry_pause(
        cluster: DevCluster) -> None:
    """k0:1 fails once; its connection drops during the 0.5 s retry pause and the new one
    redelivers it at once: it is retried, once the pause is over, and k0:2 follows it."""
    await publish_k0(cluster, 4)
    calls: list[tuple[bytes, float]] = []
    failed = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def handler(msg: Message) -> None:
        calls.append((msg.body, loop.time()))
        if msg.body == b"k0:1" and not failed.is_set():
            failed.set()
            raise RuntimeError("refused")

    async with consumer(cluster, handler, config=config(ordered_retry_pause=0.5)) as c:
        async with asyncio.timeout(5):
            await failed.wait()
        assert sum(cluster.drop_client(n, predicate=is_reader) for n in range(3)) >= 1
        await eventually(lambda: len(firsts(b for b, _ in calls)) == 4 and depth(cluster) == 0,
                         timeout=6)
        assert c.skipped == 0
    bodies = [b for b, _ in calls]
    assert bodies == [b"k0:0", b"k0:1", b"k0:1", b"k0:2", b"k0:3"], calls
    assert calls[2][1] - calls[1][1] >= 0.45  # the retry pause was kept
