"""Ordered consumption in less common shapes, on the embedded youzan cluster: two consumers
of one channel when one leaves, consumers given partitions=[...], a handler that fails or
outlasts msg_timeout around a leader move, on_blocked="stop". Invariant: per key, the
handler sees messages in the order published, and nothing published is lost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from smartnsq import Message, Producer
from smartnsq.devcluster import DevCluster
from smartnsq.sharding import shard_partition
from tests.consumer_support import Collector, eventually
from tests.test_ordered_hunt2_faults import consumer, depth
from tests.test_ordered_user_patterns import (
    CHANNEL,
    PARTS,
    PUB,
    TOPIC,
    assert_per_key_order,
    config,
    firsts,
)

KEYS = tuple(f"u{i}" for i in range(12))


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, lookupds=1, flavour="youzan") as c:
        c.create_topic(TOPIC, partition_num=PARTS, replica=2, ordered=True,
                       channels=[CHANNEL])
        yield c


async def publish(cluster: DevCluster, per_key: int, keys: tuple[str, ...] = KEYS,
                  start: int = 0) -> list[bytes]:
    sent: list[bytes] = []
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        async def one_key(key: str) -> None:
            for seq in range(start, start + per_key):
                body = f"{key}:{seq}".encode()
                await p.publish_ordered(TOPIC, key, body)
                sent.append(body)

        async with asyncio.timeout(8):
            await asyncio.gather(*(one_key(k) for k in keys))
    return sent


async def test_two_consumers_one_leaves_the_other_takes_over(cluster: DevCluster) -> None:
    sent = await publish(cluster, 15)
    handled: list[bytes] = []
    busy: dict[int | None, int] = {}
    overlap = False

    async def handler(msg: Message) -> None:
        nonlocal overlap
        busy[msg.partition] = busy.get(msg.partition, 0) + 1
        overlap = overlap or busy[msg.partition] > 1
        await asyncio.sleep(0.002)
        handled.append(msg.body)
        busy[msg.partition] -= 1

    ca, cb = consumer(cluster, handler), consumer(cluster, handler)
    await ca.start()
    await cb.start()
    try:
        await eventually(lambda: len(handled) >= len(sent) // 3, timeout=5)
        await ca.stop()
        await eventually(lambda: set(handled) >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    finally:
        await ca.stop()
        await cb.stop()
    assert not overlap
    assert_per_key_order(handled, sent)


async def test_consumers_given_disjoint_partitions(cluster: DevCluster) -> None:
    sent = await publish(cluster, 10)
    low, high = Collector(), Collector()
    half = PARTS // 2
    async with consumer(cluster, low, partitions=range(half)) as cl, \
            consumer(cluster, high, partitions=[*range(half, PARTS)]) as ch:
        await eventually(lambda: low.distinct | high.distinct >= set(sent), timeout=8)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
        assert set(cl.positions()) <= set(range(half))
        assert set(ch.positions()) <= set(range(half, PARTS))
    for got, parts in ((low, range(half)), (high, range(half, PARTS))):
        mine = [b for b in sent if shard_partition(b.decode().split(":")[0], PARTS) in parts]
        assert set(got.handled) == set(mine)
        assert_per_key_order(got.handled, mine)


async def test_a_partitions_consumer_restarted_with_publishes_in_between(
        cluster: DevCluster) -> None:
    part = shard_partition(KEYS[0], PARTS)
    keys = tuple(k for k in KEYS if shard_partition(k, PARTS) == part)
    sent: list[bytes] = []
    handled: list[bytes] = []
    for rnd in range(5):
        sent += await publish(cluster, 3, keys=keys, start=rnd * 3)
        got = Collector()
        async with consumer(cluster, got, partitions=[part]):
            await got.wait_for(lambda: len(got.handled) >= 2, timeout=5)  # noqa: B023
        handled += got.handled
    got = Collector()
    async with consumer(cluster, got, partitions=[part]):
        await got.wait_for(lambda: set(handled) | got.distinct >= set(sent), timeout=5)
    assert_per_key_order(handled + got.handled, sent)


async def test_restarts_never_skip_a_message_that_keeps_failing(cluster: DevCluster) -> None:
    """u0:1 fails in every one of 5 runs (default on_blocked: retry): no run hands over a
    later message of u0, each run starts with u0:1 again; a last run that succeeds gets the
    rest in order."""
    sent = await publish(cluster, 4, keys=("u0", "u1"))
    handled: list[bytes] = []
    for _ in range(5):
        got = Collector(fail=lambda m: m.body == b"u0:1")
        async with consumer(cluster, got, config=config(ordered_retry_pause=0.02)):
            await got.wait_for(lambda: sum(m.body == b"u0:1"
                                           for m in got.messages) >= 2, timeout=5)  # noqa: B023
        handled += got.handled
        assert [m.body for m in got.messages if m.body.startswith(b"u0:")][-1] == b"u0:1"
    assert not any(b in handled for b in (b"u0:1", b"u0:2", b"u0:3"))
    last = Collector()
    async with consumer(cluster, last):
        await last.wait_for(lambda: set(handled) | last.distinct >= set(sent), timeout=5)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(handled + last.handled, sent)


@pytest.mark.parametrize("outcome", ["finish", "raise"])
async def test_a_handler_past_msg_timeout_while_its_leader_moves(
        cluster: DevCluster, outcome: str) -> None:
    """u0:1's first call takes 1.3 s (msg_timeout 1 s) and the partition's leader moves
    meanwhile; then it finishes, or raises (retried). Never two calls at once, u0:2 only
    after u0:1 succeeded, nothing skipped."""
    sent = await publish(cluster, 4, keys=("u0",))
    part = shard_partition("u0", PARTS)
    running = 0
    overlap = 0
    calls: list[tuple[bytes, int]] = []
    started = asyncio.Event()

    async def handler(msg: Message) -> None:
        nonlocal running, overlap
        running += 1
        overlap = max(overlap, running)
        calls.append((msg.body, msg.attempts))
        try:
            if msg.body == b"u0:1" and not started.is_set():
                started.set()
                await asyncio.sleep(1.3)
                if outcome == "raise":
                    raise RuntimeError("downstream refused")
        finally:
            running -= 1

    cfg = config(connection={"msg_timeout": 1.0})
    async with consumer(cluster, handler, config=cfg) as c:
        async with asyncio.timeout(5):
            await started.wait()
        cluster.move_leader(TOPIC, part)
        await eventually(lambda: len(firsts(b for b, _ in calls)) == 4 and running == 0
                         and depth(cluster) == 0, timeout=8)
        assert c.skipped == 0
    assert overlap == 1, calls
    bodies = [b for b, _ in calls]
    want = [b"u0:0", b"u0:1"] + ([b"u0:1"] if outcome == "raise" else []) + sent[2:]
    assert bodies == want, calls


async def test_async_for_holding_a_message_while_its_connection_drops(
        cluster: DevCluster) -> None:
    """The user holds u0:1 (iterated, unfinished) while the connection drops: the new
    connection's redelivery is not yielded a second time; u0:2 comes after u0:1's finish."""
    sent = await publish(cluster, 4, keys=("u0",))
    seen: list[bytes] = []
    async with consumer(cluster, None) as c:
        async with asyncio.timeout(8):
            async for msg in c:
                seen.append(msg.body)
                if msg.body == b"u0:1" and seen.count(msg.body) == 1:
                    assert sum(cluster.drop_client(n) for n in range(2)) >= 1
                    await asyncio.sleep(0.5)  # the consumer reconnects meanwhile
                msg.finish()
                if msg.body == b"u0:3":
                    break
    assert seen == sent
    await eventually(lambda: depth(cluster) == 0, timeout=5)


async def test_stop_while_a_held_redelivery_waits(cluster: DevCluster) -> None:
    """u0:1's handler runs 1.5 s, its connection drops (the redelivery is held), then
    stop() with drain_timeout 0.5 s: stop returns in about that, and the next consumer gets
    u0:1 again and the rest in order."""
    sent = await publish(cluster, 3, keys=("u0",))
    started = asyncio.Event()
    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        if msg.body == b"u0:1" and not started.is_set():
            started.set()
            await asyncio.sleep(1.5)
        handled.append(msg.body)

    c = consumer(cluster, handler, config=config(drain_timeout=0.5))
    await c.start()
    async with asyncio.timeout(5):
        await started.wait()
    cluster.drop_client(0)
    cluster.drop_client(1)
    await asyncio.sleep(0.3)  # the new connection redelivers u0:1
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await c.stop()
    assert loop.time() - t0 < 1.5
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: set(handled) | got.distinct >= set(sent), timeout=5)
        await eventually(lambda: depth(cluster) == 0, timeout=5)
    assert_per_key_order(handled + got.handled, sent)
