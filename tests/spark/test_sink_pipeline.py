"""The sink's MPUBs of one partition are pipelined: a task keeps several in flight per
(topic, partition), bounded, in the order of its rows, and the order of every shard key's rows
is what it was when MPUBs went one at a time.

The lane rules are checked with a stand-in producer whose answers take a set time (how many
MPUBs are in flight, in which order they were sent, what an MPUB overtaken by a slow retry
makes the lane do); the rows' order on the server on the embedded youzan cluster and on a real
one (``real_youzan``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest

from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.producer.types import BatchReceipt
from smartnsq.spark.sink import PIPELINE_DEPTH, NsqCommitMessage, _TaskPublisher, publish_task
from smartnsq.spark.sink_arrow import EncodedBatch
from smartnsq.spark.sink_options import parse_sink_options
from tests.consumer_support import fast_config
from tests.real_servers import YouzanCluster, youzan  # noqa: F401  (the fixture)

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

TOPIC = "pipe"
CHANNEL = "verify"
WAIT = 30.0


class SlowNsqd:
    """Stands in for the task's Producer: each MPUB is answered after ``delay`` seconds (or
    ``slow[(partition, n)]`` for the n-th MPUB sent to that partition) and remembered."""

    def __init__(self, delay: float, slow: dict[tuple[int, int], float] | None = None) -> None:
        self.delay = delay
        self.slow = slow or {}
        self.in_flight: dict[int, int] = defaultdict(int)
        self.most: dict[int, int] = defaultdict(int)
        self.most_total = 0
        self.sent: dict[int, list[bytes]] = defaultdict(list)
        self.stored: dict[int, list[bytes]] = defaultdict(list)

    async def publish_encoded(self, topic: str, body: Any, *, partition: int | None = None,
                              traced: bool = False,
                              timeout: float | None = None  # noqa: ASYNC109  (its signature)
                              ) -> BatchReceipt:
        assert partition is not None
        n = len(self.sent[partition])
        self.sent[partition].append(bytes(body))
        self.in_flight[partition] += 1
        self.most[partition] = max(self.most[partition], self.in_flight[partition])
        self.most_total = max(self.most_total, sum(self.in_flight.values()))
        try:
            await asyncio.sleep(self.slow.get((partition, n), self.delay))
        finally:
            self.in_flight[partition] -= 1
        self.stored[partition].append(bytes(body))
        return BatchReceipt(topic, 1, (partition,))


def units(partitions: int, per_partition: int) -> list[EncodedBatch]:
    # interleaved, as a task's Arrow batches give them: one MPUB per partition per batch
    return [EncodedBatch(TOPIC, p, b"%d:%d" % (p, i), 1, False)
            for i in range(per_partition) for p in range(partitions)]


def run_lanes(nsqd: SlowNsqd, todo: list[EncodedBatch]) -> NsqCommitMessage:
    opts = parse_sink_options({"lookupd": "127.0.0.1:4161", "topic": TOPIC})
    message = NsqCommitMessage(0, 0, None)

    async def run() -> None:
        pub = _TaskPublisher(nsqd, opts, message)  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(WAIT):
                await pub.submit(todo)
                await pub.finish()
        finally:
            pub.cancel()

    asyncio.run(run())
    return message


def test_mpubs_of_a_partition_are_in_flight_together_bounded_and_in_order() -> None:
    nsqd = SlowNsqd(0.02)
    message = run_lanes(nsqd, units(3, 12))
    # several MPUBs of each partition at once, never more than the pipeline's depth
    assert dict(nsqd.most) == {0: PIPELINE_DEPTH, 1: PIPELINE_DEPTH, 2: PIPELINE_DEPTH}
    assert PIPELINE_DEPTH > 1
    assert nsqd.most_total == 3 * PIPELINE_DEPTH
    # sent, and stored, in the order of the task's rows
    for p in range(3):
        want = [b"%d:%d" % (p, i) for i in range(12)]
        assert nsqd.sent[p] == want and nsqd.stored[p] == want
    assert message.rows == 36 and message.counts == {(TOPIC, p): 12 for p in range(3)}


def test_mpubs_stored_ahead_of_a_slow_retry_are_published_again_after_it() -> None:
    # the 3rd MPUB of partition 0 is answered late (a retry after a leader move, say): the
    # ones sent behind it were stored first; the lane publishes them again after it, so that
    # the last copy of every row is in order (at-least-once: the copies are duplicates)
    nsqd = SlowNsqd(0.01, slow={(0, 2): 0.3})
    message = run_lanes(nsqd, units(2, 10))
    want0 = [b"0:%d" % i for i in range(10)]
    stored = nsqd.stored[0]
    last = sorted(set(stored), key=lambda body: max(i for i, b in enumerate(stored)
                                                    if b == body))
    assert last == want0, stored
    assert stored != want0  # it did overtake: 0:3 .. were stored before 0:2
    assert nsqd.stored[1] == [b"1:%d" % i for i in range(10)]  # other lanes go on
    # the commit message counts rows, not copies
    assert message.rows == 20 and message.counts == {(TOPIC, 0): 10, (TOPIC, 1): 10}


async def collect(lookupd: str, topic: str, n: int) -> list[Message]:
    got: list[Message] = []
    done = asyncio.Event()

    async def handler(msg: Message) -> None:
        got.append(msg)
        if len(got) >= n:
            done.set()

    async with Consumer(topic, CHANNEL, handler, lookupd=[lookupd],
                        config=fast_config(max_in_flight=200)):
        try:
            async with asyncio.timeout(WAIT):
                await done.wait()
        except TimeoutError:
            raise AssertionError(f"only {len(got)} of {n} arrived") from None
    return got


@pytest.mark.real_youzan
async def test_shard_keys_keep_their_order_through_the_pipeline(
        youzan: YouzanCluster) -> None:  # noqa: F811
    topic = (await youzan.create_topic("pipe_order", partition_num=3, replicator=1,
                                       channels=(CHANNEL,))).name
    keys, per_batch, batches = 40, 600, 5
    data = []
    for b in range(batches):
        rows = range(b * per_batch, (b + 1) * per_batch)
        data.append(pa.record_batch({
            "value": pa.array([b"k%d:%d" % (i % keys, i) for i in rows], pa.binary()),
            "shard_key": pa.array([f"k{i % keys}" for i in rows], pa.string())}))
    # small MPUBs: dozens per partition, so that the pipeline is full
    opts = parse_sink_options({"lookupd": youzan.lookupd, "topic": topic,
                               "maxBatchBytes": "2048"})
    # the task runs on a thread with its own loop, as on an executor
    message = await asyncio.to_thread(publish_task, opts, iter(data))
    n = per_batch * batches
    assert message.rows == n
    got = await collect(youzan.lookupd, topic, n)
    assert sorted(m.body for m in got) == sorted(b"k%d:%d" % (i % keys, i) for i in range(n))
    # in each partition's queue (by offset), every key's rows in the order they were given
    by_key: dict[bytes, list[int]] = defaultdict(list)
    partitions: dict[bytes, set[int | None]] = defaultdict(set)
    for m in sorted(got, key=lambda m: (m.partition or 0, m.offset or 0)):
        key, index = m.body.split(b":")
        by_key[key].append(int(index))
        partitions[key].add(m.partition)
    assert all(len(ps) == 1 for ps in partitions.values())
    assert len({p for ps in partitions.values() for p in ps}) == 3
    assert all(idx == sorted(idx) for idx in by_key.values())
