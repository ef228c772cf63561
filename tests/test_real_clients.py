"""The clients end to end, against the double and (``make test-real``) the real servers.

Every test takes the ``stock`` or ``youzan`` fixture of :mod:`tests.real_servers` and runs the
same code on both: publish/consume on stock nsqd and on a partitioned youzan topic, ordered and
pinned publishing while a partition leader is moved through lookupd's admin API (no failed
publish, per-key order kept, nothing acknowledged lost), and traced publish receipts against
the positions the OrderedConsumer sees.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Awaitable, Callable

import aiohttp
import pytest

from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.ordered.consumer import OrderedConsumer
from smartnsq.producer import Producer, PublishReceipt, encode_batch
from tests.real_servers import (
    StockServer,
    YouzanCluster,
    stock,  # noqa: F401  (fixture)
    unique,
    youzan,  # noqa: F401  (fixture)
)

#: bound on consuming what a test published
CONSUME_SECONDS = 60.0
FAST_CONSUMER = ConsumerConfig(max_in_flight=100, reconnect_min=0.05, reconnect_max=0.5,
                               lookupd_poll_interval=1.0)


class Collector:
    """A handler that records message bodies and wakes the test once ``want`` distinct
    bodies arrived (redeliveries are recorded too)."""

    def __init__(self, want: set[bytes]) -> None:
        self.missing = set(want)
        self.messages: list[Message] = []
        self.done = asyncio.Event()
        if not self.missing:
            self.done.set()

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        self.missing.discard(msg.body)
        if not self.missing:
            self.done.set()

    async def wait(self) -> None:
        try:
            async with asyncio.timeout(CONSUME_SECONDS):
                await self.done.wait()
        except TimeoutError:
            raise AssertionError(f"{len(self.missing)} published messages not consumed within "
                                 f"{CONSUME_SECONDS:.0f} s, e.g. {sorted(self.missing)[:5]}"
                                 ) from None


async def wait_for(what: str, probe: Callable[[], Awaitable[bool]], seconds: float) -> None:
    """Poll ``probe`` (a server's HTTP answer: nothing to wait on but time) within a bound."""
    try:
        async with asyncio.timeout(seconds):
            while not await probe():  # noqa: ASYNC110
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {seconds:.0f} s") from None


# --- stock -------------------------------------------------------------------------------------


@pytest.mark.real_nsqd
async def test_stock_publish_and_consume(stock: StockServer) -> None:  # noqa: F811
    topic = unique("rc_stock")
    bodies = [b"one-%d" % i for i in range(50)]
    batch = [b"many-%d" % i for i in range(150)]
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        for b in bodies:
            assert await p.publish(topic, b) is None
        sent = await p.publish_many(topic, batch)
        # one MPUB to the one nsqd (no partitions on stock), no receipts without trace_id
        assert (sent.topic, sent.count, sent.partitions, sent.receipts) == (
            topic, 150, (None,), ())
    if stock.lookupd is not None:
        # nsqd registers the new topic with nsqlookupd asynchronously
        async with aiohttp.ClientSession() as s:
            async def listed() -> bool:
                async with s.get(f"http://{stock.lookupd}/lookup",
                                 params={"topic": topic}) as r:
                    return r.status == 200 and bool((await r.json()).get("producers"))

            await wait_for(f"{topic} in nsqlookupd", listed, 10)
        source = {"lookupd": [stock.lookupd]}
    else:
        source = {"nsqd": [stock.nsqd_tcp]}
    got = Collector(set(bodies + batch))
    async with Consumer(topic, "c", got, config=FAST_CONSUMER, **source):
        await got.wait()
    assert {m.body for m in got.messages} == set(bodies + batch)
    assert all(m.partition is None and m.internal_id is None for m in got.messages)
    # one connection, one nsqd: delivered in publish order
    first = [m.body for m in got.messages if m.attempts == 1]
    assert first == bodies + batch


# --- youzan ------------------------------------------------------------------------------------


@pytest.mark.real_youzan
async def test_youzan_publish_and_consume_over_partitions(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("rc_yz", partition_num=2, replicator=1)
    bodies = [b"m-%d" % i for i in range(100)]
    batch = [b"b-%d" % i for i in range(100)]
    async with Producer(lookupd=[youzan.lookupd]) as p:
        for b in bodies:
            await p.publish(topic.name, b)  # round-robin over both partitions
        await p.publish_many(topic.name, batch, partition=1)
    got = Collector(set(bodies + batch))
    async with Consumer(topic.name, "ch", got, lookupd=[youzan.lookupd],
                        config=FAST_CONSUMER):
        await got.wait()
    where = {m.body: m.partition for m in got.messages}
    assert {where[b] for b in bodies} == {0, 1}
    assert {where[b] for b in batch} == {1}
    assert all(m.internal_id is not None and m.internal_id > 0 for m in got.messages)


@pytest.mark.real_youzan
async def test_ordered_and_pinned_publishing_through_a_leader_move(
        youzan: YouzanCluster) -> None:  # noqa: F811
    """The move leaves partition 0 without a writable leader for a while (1 s on the double,
    4–7 s on the real cluster): publishes wait for the new leader instead of failing."""
    topic = await youzan.create_topic("rc_mv", partition_num=2, replicator=2, ordered=True)
    name = topic.name
    acked: dict[str, list[int]] = collections.defaultdict(list)
    failures: list[str] = []
    stop = asyncio.Event()
    moved = asyncio.Event()
    after_move = 0
    warm = asyncio.Event()
    config = ProducerConfig(publish_timeout=30.0 if youzan.real else 10.0,
                            lookupd_poll_interval=1.0)

    async with Producer(lookupd=[youzan.lookupd], config=config) as p:

        async def worker(key: str, send: Callable[[bytes], Awaitable[object]]) -> None:
            nonlocal after_move
            seq = 0
            while not stop.is_set():
                try:
                    await send(f"{key}:{seq}".encode())
                except Exception as exc:
                    failures.append(f"{key}:{seq}: {exc!r}")
                    await asyncio.sleep(0.05)  # a failure must not spin the loop
                else:
                    acked[key].append(seq)
                    if sum(map(len, acked.values())) >= 200:
                        warm.set()
                    if moved.is_set():
                        after_move += 1
                seq += 1

        tasks = [asyncio.create_task(worker(
            f"k{i}", lambda b, k=f"k{i}": p.publish_ordered(name, k, b))) for i in range(16)]
        # plain publishes pinned to the moving partition
        tasks.append(asyncio.create_task(worker(
            "pinned", lambda b: p.publish(name, b, partition=0))))
        try:
            async with asyncio.timeout(30):
                await warm.wait()
            old, new = await youzan.move_leader(name, 0)
            await youzan.wait_leader(name, 0, new)
            moved.set()

            async def published_after() -> bool:
                return after_move >= 200

            await wait_for("publishing after the move", published_after, 30)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
    assert old.distributed_id != new
    assert failures == []
    # everything acknowledged arrives, each key in publish order (a redelivery may repeat)
    want = {f"{k}:{s}".encode() for k, seqs in acked.items() for s in seqs}
    got = Collector(want)
    async with OrderedConsumer(name, "ch", got, lookupd=[youzan.lookupd],
                               config=FAST_CONSUMER):
        await got.wait()
    first: dict[str, list[int]] = collections.defaultdict(list)
    seen: set[bytes] = set()
    for m in got.messages:
        if m.body in seen:
            continue
        seen.add(m.body)
        key, seq = m.body.decode().split(":")
        first[key].append(int(seq))
    for key, seqs in acked.items():
        in_order = [s for s in first[key] if s in set(seqs)]
        assert in_order == seqs, f"key {key}: {in_order[:10]} vs {seqs[:10]}"
    assert {m.partition for m in got.messages if m.body.startswith(b"pinned:")} == {0}


@pytest.mark.real_youzan
async def test_traced_receipts_match_consumed_positions(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("rc_tr", partition_num=2, replicator=1, ordered=True)
    receipts: dict[bytes, PublishReceipt] = {}
    batches: list[tuple[list[bytes], PublishReceipt]] = []
    async with Producer(lookupd=[youzan.lookupd]) as p:
        for i in range(40):
            body = b"t-%d" % i
            r = await p.publish(topic.name, body, partition=i % 2, trace_id=1000 + i)
            assert r is not None and r.trace_id == 1000 + i and r.partition == i % 2
            receipts[body] = r
        many = [b"mt-%d" % i for i in range(10)]
        sent = await p.publish_many(topic.name, many, partition=1, trace_id=7)
        assert (sent.count, sent.partitions) == (10, (1,))
        (r,) = sent.receipts
        assert r.count == 10
        batches.append((many, r))
    want = set(receipts) | {b for bodies, _ in batches for b in bodies}
    got = Collector(want)
    async with OrderedConsumer(topic.name, "ch", got, lookupd=[youzan.lookupd],
                               config=FAST_CONSUMER):
        await got.wait()
    by_body = {m.body: m for m in got.messages}
    for body, r in receipts.items():
        m = by_body[body]
        assert (m.partition, m.internal_id, m.offset, m.raw_size, m.trace_id) == (
            r.partition, r.internal_id, r.offset, r.raw_size, r.trace_id), body
    for bodies, r in batches:
        msgs = [by_body[b] for b in bodies]
        # the batch starts at the receipt's offset and its records fill raw_size exactly
        assert msgs[0].offset == r.offset and msgs[0].internal_id == r.internal_id
        assert sum(m.raw_size or 0 for m in msgs) == r.raw_size
        assert msgs[-1].offset == r.next_offset - (msgs[-1].raw_size or 0)
    # within a partition, consecutive records are back to back
    for part in (0, 1):
        offs = sorted((m.offset or 0, m.raw_size or 0) for m in by_body.values()
                      if m.partition == part)
        for (a, size), (b, _) in itertools.pairwise(offs):
            assert b == a + size


@pytest.mark.real_nsqd
async def test_stock_encoded_batch(stock: StockServer) -> None:  # noqa: F811
    topic = unique("rc_enc")
    bodies = [b"e-%d" % i for i in range(200)]
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        sent = await p.publish_encoded(topic, encode_batch(bodies))
        assert (sent.topic, sent.count, sent.partitions, sent.receipts) == (
            topic, 200, (None,), ())
    got = Collector(set(bodies))
    async with Consumer(topic, "c", got, nsqd=[stock.nsqd_tcp],
                        config=FAST_CONSUMER):
        await got.wait()
    assert [m.body for m in got.messages if m.attempts == 1] == bodies


@pytest.mark.real_youzan
async def test_encoded_batches_keep_per_message_trace_ids(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = await youzan.create_topic("rc_enc", partition_num=2, replicator=1, ordered=True)
    traced = [b"et-%d" % i for i in range(30)]
    plain = [b"ep-%d" % i for i in range(30)]
    async with Producer(lookupd=[youzan.lookupd]) as p:
        sent = await p.publish_encoded(
            topic.name, encode_batch(traced, [5000 + i for i in range(30)]), partition=1,
            traced=True)
        rr = await p.publish_encoded(topic.name, encode_batch(plain))
    assert sent.partitions == (1,) and sent.count == 30
    (receipt,) = sent.receipts  # traced=True: the MPUB_TRACE's receipt
    assert receipt.count == 30
    (rr_partition,) = rr.partitions
    assert rr_partition in (0, 1) and rr.receipts == ()
    got = Collector(set(traced + plain))
    async with OrderedConsumer(topic.name, "ch", got, lookupd=[youzan.lookupd],
                               config=FAST_CONSUMER):
        await got.wait()
    by_body = {m.body: m for m in got.messages}
    assert [by_body[b].trace_id for b in traced] == [5000 + i for i in range(30)]
    assert by_body[traced[0]].offset == receipt.offset
    assert sum(by_body[b].raw_size or 0 for b in traced) == receipt.raw_size
    assert {by_body[b].partition for b in plain} == {rr_partition}
