"""Ordered consumption and sharded publishing as a new user writes them (docs/concepts/
ordered.md, the OrderedConsumer and publish_ordered docstrings), on the embedded youzan
cluster. Invariant everywhere: every message published reaches the handler in per-key
order (first deliveries; redeliveries of an unfinished message are allowed) or stays in the
channel, nothing is lost, and each call returns or fails within its stated time with a
message naming what was wrong."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable

import pytest

from smartnsq import Consumer, Message, OffsetSpec, OrderedConsumer, Producer
from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import SubOrderIsMustError
from smartnsq.sharding import shard_partition
from tests.consumer_support import Collector, eventually, fast_config

TOPIC = "payments"
PLAIN = "events"
CHANNEL = "ledger"
PARTS = 4
KEYS = ("alice", "bob", "carol", "dave", "erin")
PUB = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=2, lookupds=1, flavour="youzan") as c:
        c.create_topic(TOPIC, partition_num=PARTS, replica=1, ordered=True, channels=[CHANNEL])
        # a plain youzan topic: one partition per node
        c.create_topic(PLAIN, partition_num=2, replica=1, channels=[CHANNEL])
        yield c


def config(**kw: object) -> ConsumerConfig:
    return fast_config(**{"max_in_flight": PARTS * 2, "ordered_retry_pause": 0.05, **kw})


async def publish_keyed(cluster: DevCluster, per_key: int, start: int = 0,
                        keys: Iterable[str] = KEYS, topic: str = TOPIC) -> list[bytes]:
    """``key:seq`` bodies, keys interleaved, published with publish_ordered."""
    sent = []
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        for seq in range(start, start + per_key):
            for key in keys:
                body = f"{key}:{seq}".encode()
                await p.publish_ordered(topic, key, body)
                sent.append(body)
    return sent


def firsts(handled: Iterable[bytes]) -> list[bytes]:
    """The handler's calls without repeats: a redelivery of an unfinished message is legal."""
    seen: set[bytes] = set()
    out = []
    for b in handled:
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def assert_per_key_order(handled: Iterable[bytes], sent: list[bytes]) -> None:
    got: dict[str, list[int]] = defaultdict(list)
    for b in firsts(handled):
        key, seq = b.decode().split(":")
        got[key].append(int(seq))
    want: dict[str, list[int]] = defaultdict(list)
    for b in sent:
        key, seq = b.decode().split(":")
        want[key].append(int(seq))
    assert dict(got) == dict(want)


def consumer(cluster: DevCluster, handler: object = None, *, topic: str = TOPIC,
             **kw: object) -> OrderedConsumer:
    cfg = kw.pop("config", None) or config()
    return OrderedConsumer(topic, CHANNEL, handler,  # type: ignore[arg-type]
                           lookupd=cluster.lookupd_http_addresses, config=cfg,
                           **kw)  # type: ignore[arg-type]


def depth(cluster: DevCluster, topic: str = TOPIC) -> int:
    return sum(cluster.store.partition(topic, p).channels[CHANNEL].depth()
               for p in range(PARTS))


async def test_async_for_and_break_leaves_the_rest_in_the_channel(cluster: DevCluster) -> None:
    sent = await publish_keyed(cluster, 10)
    handled: list[bytes] = []
    t0 = time.monotonic()
    async with consumer(cluster) as c:
        async with asyncio.timeout(10):
            async for msg in c:
                handled.append(msg.body)
                msg.finish()
                if len(handled) == 12:
                    break
    first_run = time.monotonic() - t0
    # what was read ahead but not handed over went back: it is all still in the channel
    assert depth(cluster) == len(sent) - 12
    # a second user, this time without finishing the message it breaks on
    async with consumer(cluster) as c:
        async with asyncio.timeout(10):
            async for msg in c:
                handled.append(msg.body)
                if len(handled) == 20:
                    break
                msg.finish()
    assert depth(cluster) == len(sent) - 19
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(firsts(handled + got.handled)) == len(sent))
    assert_per_key_order(handled + got.handled, sent)
    assert first_run < 5.0, first_run


async def test_a_failing_handler_is_retried_before_the_next_message_of_its_key(
        cluster: DevCluster) -> None:
    sent = await publish_keyed(cluster, 8)
    calls: list[tuple[bytes, int]] = []

    async def handler(msg: Message) -> None:
        calls.append((msg.body, msg.attempts))
        if msg.body.endswith(b":3") and msg.attempts < 3:
            raise RuntimeError("downstream refused")

    async with consumer(cluster, handler) as c:
        await eventually(lambda: len(firsts(b for b, _ in calls)) == len(sent)
                         and depth(cluster) == 0)
        assert c.stats().requeued == len(KEYS) * 2
    for key in KEYS:
        mine = [(b, a) for b, a in calls if b.startswith(f"{key}:".encode())]
        # seq 3 three times in a row, nothing of its partition in between for this key
        assert [b for b, _ in mine] == [f"{key}:{s}".encode()
                                       for s in (0, 1, 2, 3, 3, 3, 4, 5, 6, 7)]
        assert [a for b, a in mine if b.endswith(b":3")] == [1, 2, 3]
    # and per partition: no later message of the partition was handled during the retries
    for key in KEYS:
        part = shard_partition(key, PARTS)
        same = [b for b, _ in calls
                if shard_partition(b.decode().split(":")[0], PARTS) == part]
        i = same.index(f"{key}:3".encode())
        assert same[i:i + 3] == [f"{key}:3".encode()] * 3
    assert_per_key_order((b for b, _ in calls), sent)


async def test_a_handler_slower_than_the_msg_timeout(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    """The server's msg_timeout (1 s) runs out while the handler (1.6 s) still works on
    alice:1: its redelivery waits for that call (before: a second call of alice:1 ran at
    the same time, finished, and alice:2 was handled while the first call still ran)."""
    sent = await publish_keyed(cluster, 3, keys=("alice",))
    running = 0
    overlap = 0
    events: list[str] = []

    async def handler(msg: Message) -> None:
        nonlocal running, overlap
        events.append(f"start {msg.body.decode()}")
        running += 1
        overlap = max(overlap, running)
        try:
            if msg.body == b"alice:1":
                await asyncio.sleep(1.6)
        finally:
            running -= 1
            events.append(f"end {msg.body.decode()}")

    cfg = config(connection={"msg_timeout": 1.0})
    async with consumer(cluster, handler, config=cfg) as c:
        await eventually(lambda: "end alice:2" in events and running == 0
                         and depth(cluster) == 0)
        await eventually(lambda: c.stats().in_flight == 0)
    assert events == [f"{what} {b.decode()}" for b in sent for what in ("start", "end")]
    assert overlap == 1
    assert any("touch()" in r.getMessage() for r in caplog.records)


async def test_an_iterated_message_held_past_the_msg_timeout(cluster: DevCluster) -> None:
    """``async for`` holding a message for longer than msg_timeout before finishing it: it
    is not yielded a second time, and the next one comes after it."""
    sent = await publish_keyed(cluster, 3, keys=("bob",))
    seen: list[tuple[bytes, int]] = []
    cfg = config(connection={"msg_timeout": 1.0})
    async with consumer(cluster, config=cfg) as c:
        async with asyncio.timeout(10):
            async for msg in c:
                seen.append((msg.body, msg.attempts))
                if msg.body == b"bob:0":
                    await asyncio.sleep(1.5)
                msg.finish()
                if msg.body == b"bob:2":
                    break
    assert seen == [(b, 1) for b in sent]
    await eventually(lambda: depth(cluster) == 0)


async def test_touch_keeps_a_slow_message(cluster: DevCluster) -> None:
    sent = await publish_keyed(cluster, 3, keys=("alice",))
    calls: list[tuple[bytes, int]] = []

    async def handler(msg: Message) -> None:
        calls.append((msg.body, msg.attempts))
        if msg.body == b"alice:1":
            for _ in range(4):
                await asyncio.sleep(0.4)
                assert msg.touch()

    cfg = config(connection={"msg_timeout": 1.0})
    async with consumer(cluster, handler, config=cfg):
        await eventually(lambda: len(calls) >= 3 and depth(cluster) == 0)
    assert calls == [(b, 1) for b in sent]


async def test_stop_and_restart_in_a_loop_with_publishes_in_between(
        cluster: DevCluster) -> None:
    sent: list[bytes] = []
    handled: list[bytes] = []
    stops: list[float] = []
    for rnd in range(5):
        sent += await publish_keyed(cluster, 4, start=rnd * 4, keys=KEYS[:3])
        got = Collector()
        c = consumer(cluster, got)
        await c.start()
        await got.wait_for(lambda: len(got.handled) >= 5)  # noqa: B023
        t0 = time.monotonic()
        await c.stop()
        stops.append(time.monotonic() - t0)
        handled += got.handled
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(firsts(handled + got.handled)) == len(sent))
    assert_per_key_order(handled + got.handled, sent)
    assert max(stops) < 2.0, stops


async def test_two_consumers_of_one_channel(cluster: DevCluster) -> None:
    sent = await publish_keyed(cluster, 20)
    order: list[bytes] = []
    who: list[str] = []
    busy: dict[int, int] = defaultdict(int)
    overlap = False

    def make(name: str) -> object:
        async def handler(msg: Message) -> None:
            nonlocal overlap
            assert msg.partition is not None
            busy[msg.partition] += 1
            overlap = overlap or busy[msg.partition] > 1
            order.append(msg.body)
            who.append(name)
            await asyncio.sleep(0.001)
            busy[msg.partition] -= 1
        return handler

    async with consumer(cluster, make("a")), consumer(cluster, make("b")):
        await eventually(lambda: len(firsts(order)) == len(sent) and depth(cluster) == 0)
    # the channel's one message in flight goes to either consumer: never two at once
    assert not overlap and set(who) <= {"a", "b"}
    assert_per_key_order(order, sent)


async def test_a_shard_key_as_str_bytes_or_int_is_one_key(cluster: DevCluster) -> None:
    sent = []
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        for seq in range(9):
            key: str | bytes | int = ("42", b"42", 42)[seq % 3]
            body = f"k42:{seq}".encode()
            await p.publish_ordered(TOPIC, key, body)
            sent.append(body)
    part = shard_partition("42", PARTS)
    assert shard_partition(b"42", PARTS) == shard_partition(42, PARTS) == part
    assert [r.body for r in cluster.store.partition(TOPIC, part).records] == sent
    got = Collector()
    async with consumer(cluster, got):
        await got.wait_for(lambda: len(got.distinct) == 9)
    assert firsts(got.handled) == sent


async def test_sharded_publishing_to_a_topic_that_is_not_ordered(cluster: DevCluster) -> None:
    """youzan shards by key on any partitioned topic: the key's partition, in call order."""
    sent = []
    async with Producer(lookupd=cluster.lookupd_http_addresses, config=PUB) as p:
        async with asyncio.timeout(PUB.publish_timeout):
            for seq in range(4):
                sent.append(f"alice:{seq}".encode())
                await p.publish_ordered(PLAIN, "alice", sent[-1])
    part = shard_partition("alice", 2)
    assert [r.body for r in cluster.store.partition(PLAIN, part).records] == sent
    assert cluster.store.partition(PLAIN, 1 - part).records == []


async def test_ordered_consumer_on_a_topic_that_is_not_ordered(cluster: DevCluster) -> None:
    """The docstring's "or consume any youzan topic in order": it works, in order."""
    sent = await publish_keyed(cluster, 5, topic=PLAIN)
    got = Collector()
    async with consumer(cluster, got, topic=PLAIN):
        await got.wait_for(lambda: len(got.distinct) == len(sent), timeout=5)
    assert_per_key_order(got.handled, sent)


async def test_plain_consumer_on_an_ordered_topic_names_the_fix(cluster: DevCluster) -> None:
    sent = await publish_keyed(cluster, 2)
    c = Consumer(TOPIC, CHANNEL, Collector(), lookupd=cluster.lookupd_http_addresses,
                 config=config())
    t0 = time.monotonic()
    with pytest.raises(SubOrderIsMustError, match=r"E_SUB_ORDER_IS_MUST.*OrderedConsumer"):
        async with asyncio.timeout(5):
            await c.start()
    assert time.monotonic() - t0 < 1.0
    await c.stop()
    assert depth(cluster) == len(sent)  # nothing taken


@pytest.mark.parametrize("start", [
    OffsetSpec.msgcount(1000),
    # past the end: the channel went to the end while the start guard kept the asked offset
    # as its floor and finished every later message unseen (5 of 5 lost)
    OffsetSpec.virtual_queue(10**9),
    OffsetSpec.timestamp(4_000_000_000)], ids=["msgcount", "virtual_queue", "timestamp"])
async def test_a_start_position_past_the_end_starts_at_the_end(
        cluster: DevCluster, start: OffsetSpec) -> None:
    """As on real nsqd a position past the end is the end; what came before stays in the
    partitions, where "earliest" finds it again."""
    old = await publish_keyed(cluster, 2)
    got = Collector()
    async with consumer(cluster, got, start_at=start) as c:
        new = await publish_keyed(cluster, 1, start=2)
        # every partition that holds old messages gets a new one after them
        await got.wait_for(lambda: len(got.distinct) == len(new), timeout=5)
        assert c.stats().dropped_before_start <= len(old)
        assert firsts(got.handled) == sorted(new, key=firsts(got.handled).index)
        assert set(got.handled) == set(new)
    replay = Collector()
    async with consumer(cluster, replay, start_at="earliest"):
        await replay.wait_for(lambda: len(replay.distinct) == len(old + new), timeout=5)
    assert_per_key_order(replay.handled, old + new)


async def test_a_start_position_for_a_partition_the_topic_lacks(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    """{7: "end"} on a 4-partition topic (a string as in the one-position form): said once
    (it was ignored without a word); the others start where the channel is; nothing of
    them is lost."""
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    sent = await publish_keyed(cluster, 2)
    got = Collector()
    async with consumer(cluster, got, start_at={7: "end"}):
        await got.wait_for(lambda: len(got.distinct) == len(sent), timeout=5)
    assert_per_key_order(got.handled, sent)
    said = [r.getMessage() for r in caplog.records if "start_at names partition 7" in
            r.getMessage()]
    assert len(said) == 1 and "it has partitions 0..3" in said[0], caplog.text


async def test_a_partition_list_naming_a_missing_partition(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    """partitions=[p, 7] on a 4-partition topic: start() returns at once, a warning names
    the partitions the topic has, partition p is consumed in order, the others stay."""
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    sent = await publish_keyed(cluster, 3)
    part = shard_partition(KEYS[0], PARTS)
    mine = [b for b in sent if shard_partition(b.decode().split(":")[0], PARTS) == part]
    got = Collector()
    t0 = time.monotonic()
    async with consumer(cluster, got, partitions=[part, 7]) as c:
        assert time.monotonic() - t0 < 1.0
        await got.wait_for(lambda: len(got.distinct) == len(mine), timeout=5)
        assert set(c.positions()) == {part}
    assert_per_key_order(got.handled, mine)
    assert depth(cluster) == len(sent) - len(mine)
    assert any("no partition 7 (it has partitions 0..3); subscribing to the others asked "
               "for" in r.getMessage() for r in caplog.records), caplog.text


async def test_a_partition_list_naming_only_missing_partitions(
        cluster: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    """partitions=[7] on a 4-partition topic: start() returns at once, the warning says the
    consumer waits for it (not that it subscribes to "the others": there are none), and
    every message stays in the channel."""
    caplog.set_level(logging.WARNING, "smartnsq.consumer")
    sent = await publish_keyed(cluster, 2)
    got = Collector()
    t0 = time.monotonic()
    async with consumer(cluster, got, partitions=[7]) as c:
        assert time.monotonic() - t0 < 1.0
        assert c.positions() == {}
    assert got.handled == []
    assert depth(cluster) == len(sent)
    said = [r.getMessage() for r in caplog.records if "no partition 7" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "none of those asked for exists yet: waiting for them" in said[0], said
