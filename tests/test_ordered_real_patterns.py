"""Ordered publishing and consumption as a user writes them, on the youzan double *and* a real
youzan cluster (tests.real_servers' ``youzan`` fixture; the real variant runs when
SMARTNSQ_REAL_YOUZAN_LOOKUPD is set). Invariant: every message published reaches the handler,
in order per key, or stays in the channel; positions() after a stop is the offset of the last
message the handler finished on each partition."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable

import pytest

from smartnsq import Message, OrderedConsumer, Producer
from smartnsq.config import ConsumerConfig, ProducerConfig
from tests.consumer_support import eventually, fast_config
from tests.real_servers import YouzanCluster, youzan  # noqa: F401  (the fixture)

PARTS = 3
PUB = ProducerConfig(publish_timeout=10.0, reconnect_min=0.02, reconnect_max=0.2)


def config(**kw: object) -> ConsumerConfig:
    return fast_config(**{"max_in_flight": PARTS * 2, "ordered_retry_pause": 0.05, **kw})


def per_key(handled: Iterable[bytes]) -> dict[str, list[int]]:
    """First deliveries per key (a redelivery of an unfinished message is legal)."""
    seen: set[bytes] = set()
    out: dict[str, list[int]] = defaultdict(list)
    for b in handled:
        if b not in seen:
            seen.add(b)
            key, seq = b.decode().split(":")
            out[key].append(int(seq))
    return dict(out)


async def publish_concurrently(lookupd: str, topic: str, keys: int, per: int,
                               callers_per_key: int) -> dict[str, list[int]]:
    """``callers_per_key`` tasks per key, each publishing its share; returns each key's
    sequence numbers in the order their publish_ordered calls were made."""
    calls: dict[str, list[int]] = defaultdict(list)
    async with Producer(lookupd=[lookupd], config=PUB) as p:

        async def caller(key: str, seqs: range) -> None:
            for seq in seqs:
                calls[key].append(seq)  # the call order is the order the lane keeps
                await p.publish_ordered(topic, key, f"{key}:{seq}".encode())

        async with asyncio.timeout(30):
            await asyncio.gather(*(caller(f"k{k}", range(c, per, callers_per_key))
                                   for k in range(keys) for c in range(callers_per_key)))
    return dict(calls)


@pytest.mark.real_youzan
@pytest.mark.parametrize("callers_per_key", [1, 4])
async def test_concurrent_publishers_then_one_ordered_consumer(
        youzan: YouzanCluster, callers_per_key: int) -> None:  # noqa: F811
    topic = await youzan.create_topic("ord_cc", partition_num=PARTS, ordered=True)
    sent = await publish_concurrently(youzan.lookupd, topic.name, 12, 40, callers_per_key)
    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        handled.append(msg.body)

    async with OrderedConsumer(topic.name, "ch", handler, lookupd=[youzan.lookupd],
                               config=config()):
        await eventually(lambda: len(set(handled)) == 12 * 40, timeout=30)
    assert per_key(handled) == sent
    assert len(handled) == len(set(handled))  # nothing twice


@pytest.mark.real_youzan
async def test_start_stop_loop_mid_stream_positions_match(
        youzan: YouzanCluster) -> None:  # noqa: F811
    """20 consumers started and stopped while a publisher runs: after each stop positions()
    is the offset of the last message handled on each partition; nothing is lost."""
    topic = await youzan.create_topic("ord_ss", partition_num=PARTS, ordered=True)
    sent: dict[str, list[int]] = defaultdict(list)
    done = asyncio.Event()

    async def publisher() -> None:
        async with Producer(lookupd=[youzan.lookupd], config=PUB) as p:
            for seq in range(60):
                for key in ("a", "b", "c", "d", "e", "f"):
                    await p.publish_ordered(topic.name, key, f"{key}:{seq}".encode())
                    sent[key].append(seq)
                await asyncio.sleep(0.01)
        done.set()

    handled: list[bytes] = []
    stops: list[float] = []
    mismatches: list[tuple[int, dict[int, int], dict[int, int]]] = []
    pub = asyncio.create_task(publisher())
    try:
        for rnd in range(20):
            last: dict[int, int] = {}

            async def handler(msg: Message, last: dict[int, int] = last) -> None:
                handled.append(msg.body)
                assert msg.partition is not None and msg.offset is not None
                await asyncio.sleep(0.002)
                last[msg.partition] = msg.offset

            c = OrderedConsumer(topic.name, "ch", handler, lookupd=[youzan.lookupd],
                                config=config())
            await c.start()
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            await c.stop()
            stops.append(time.monotonic() - t0)
            if c.positions() != last:
                mismatches.append((rnd, c.positions(), last))
        async with asyncio.timeout(30):
            await pub
    finally:
        pub.cancel()
    assert mismatches == []
    assert max(stops) < 3.0, stops
    total = sum(map(len, sent.values()))

    async def rest(msg: Message) -> None:
        handled.append(msg.body)

    async with OrderedConsumer(topic.name, "ch", rest, lookupd=[youzan.lookupd],
                               config=config()):
        await eventually(lambda: len(set(handled)) == total, timeout=30)
    assert per_key(handled) == dict(sent)


@pytest.mark.real_youzan
async def test_a_failing_message_blocks_its_partition_until_it_passes(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("ord_fail", partition_num=PARTS, ordered=True)
    sent = await publish_concurrently(youzan.lookupd, topic.name, 6, 6, 1)
    calls: list[tuple[int | None, bytes, int]] = []

    async def handler(msg: Message) -> None:
        calls.append((msg.partition, msg.body, msg.attempts))
        if msg.body == b"k0:2" and msg.attempts < 3:
            raise RuntimeError("downstream refused")

    async with OrderedConsumer(topic.name, "ch", handler, lookupd=[youzan.lookupd],
                               config=config()):
        await eventually(lambda: len({b for _, b, _ in calls}) == 36, timeout=30)
    assert per_key(b for _, b, _ in calls) == sent
    part = next(p for p, b, _ in calls if b == b"k0:2")
    same = [(b, a) for p, b, a in calls if p == part]
    i = same.index((b"k0:2", 1))
    # retried in place: nothing of its partition in between, then on in order
    assert same[i:i + 3] == [(b"k0:2", 1), (b"k0:2", 2), (b"k0:2", 3)]


@pytest.mark.real_youzan
async def test_async_for_break_then_a_new_consumer(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("ord_brk", partition_num=PARTS, ordered=True)
    sent = await publish_concurrently(youzan.lookupd, topic.name, 6, 10, 1)
    handled: list[bytes] = []
    async with OrderedConsumer(topic.name, "ch", lookupd=[youzan.lookupd],
                               config=config()) as c:
        async with asyncio.timeout(15):
            async for msg in c:
                handled.append(msg.body)
                msg.finish()
                if len(handled) == 20:
                    break
    t0 = time.monotonic()

    async def rest(msg: Message) -> None:
        handled.append(msg.body)

    async with OrderedConsumer(topic.name, "ch", rest, lookupd=[youzan.lookupd],
                               config=config()):
        await eventually(lambda: len(set(handled)) == 60, timeout=15)
    # the read-ahead went back at once, not after drain_timeout
    assert time.monotonic() - t0 < 10
    assert per_key(handled) == sent


@pytest.mark.real_youzan
@pytest.mark.parametrize("touch", [False, True], ids=["no_touch", "touch"])
async def test_a_handler_slower_than_the_msg_timeout(
        youzan: YouzanCluster, touch: bool) -> None:  # noqa: F811
    """msg_timeout 1 s, one handler call of 1.6 s: with touch() nothing comes again; without,
    the server's redelivery waits for the first call; never two calls of a partition at
    once, and the next message starts after the slow one ended."""
    topic = await youzan.create_topic("ord_slow", partition_num=1, ordered=True)
    sent = await publish_concurrently(youzan.lookupd, topic.name, 1, 3, 1)
    events: list[str] = []
    running = 0
    overlap = 0

    async def handler(msg: Message) -> None:
        nonlocal running, overlap
        events.append(f"start {msg.body.decode()} {msg.attempts}")
        running += 1
        overlap = max(overlap, running)
        try:
            if msg.body == b"k0:1":
                for _ in range(4):
                    await asyncio.sleep(0.4)
                    if touch:
                        assert msg.touch()
        finally:
            running -= 1
            events.append(f"end {msg.body.decode()}")

    async with OrderedConsumer(topic.name, "ch", handler, lookupd=[youzan.lookupd],
                               config=config(connection={"msg_timeout": 1.0})) as c:
        await eventually(lambda: "end k0:2" in events and running == 0, timeout=15)
        await eventually(lambda: c.stats().in_flight == 0, timeout=5)
    assert overlap == 1
    assert [e.split()[:2] for e in events] == [
        [what, f"k0:{s}"] for s in sent["k0"] for what in ("start", "end")]
    assert all(e.endswith(" 1") for e in events if e.startswith("start"))


@pytest.mark.real_youzan
async def test_ordered_consumer_on_a_topic_that_is_not_ordered(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("ord_plain", partition_num=2)
    sent = await publish_concurrently(youzan.lookupd, topic.name, 4, 10, 2)
    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        handled.append(msg.body)

    async with OrderedConsumer(topic.name, "ch", handler, lookupd=[youzan.lookupd],
                               config=config()):
        await eventually(lambda: len(set(handled)) == 40, timeout=15)
    assert per_key(handled) == sent
