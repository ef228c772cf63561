"""The sink's task publisher (what one Spark task runs) without Spark, against the embedded
youzan cluster: leader moves while a task publishes, traced offsets in the commit message,
ext headers, and a partition that stays unwritable failing the task."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from smartnsq.consumer import Consumer
from smartnsq.errors import PublishError
from smartnsq.message import Message
from smartnsq.spark.sink import publish_task
from smartnsq.spark.sink_options import parse_sink_options
from tests.consumer_support import fast_config
from tests.spark.conftest import ThreadedCluster

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

CHANNEL = "verify"
WAIT = 30.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedCluster]:
    tc = ThreadedCluster(nodes=4, flavour="youzan")
    try:
        yield tc
    finally:
        tc.close()


def options(tc: ThreadedCluster, topic: str, **kw: str) -> Any:
    return parse_sink_options({"lookupd": ",".join(tc.cluster.lookupd_http_addresses),
                               "topic": topic, "publishTimeout": "10", **kw})


def collect(tc: ThreadedCluster, topic: str, n: int) -> list[Message]:
    lookupds = tc.cluster.lookupd_http_addresses

    async def run() -> list[Message]:
        got: list[Message] = []
        done = asyncio.Event()

        async def handler(msg: Message) -> None:
            got.append(msg)
            if len(got) >= n:
                done.set()

        async with Consumer(topic, CHANNEL, handler, lookupd=lookupds,
                            config=fast_config(max_in_flight=200)):
            try:
                async with asyncio.timeout(WAIT):
                    await done.wait()
            except TimeoutError:
                raise AssertionError(f"only {len(got)} of {n} arrived") from None
        return got

    return tc.call(run(), timeout=WAIT + 30)


def batches(keys: int, per_batch: int, count: int, prefix: str) -> list[Any]:
    out = []
    for b in range(count):
        rows = range(b * per_batch, (b + 1) * per_batch)
        out.append(pa.record_batch({
            "value": pa.array([f"{prefix}{i % keys}:{i}".encode() for i in rows], pa.binary()),
            "shard_key": pa.array([f"{prefix}{i % keys}" for i in rows], pa.string())}))
    return out


def test_leader_moves_while_a_task_publishes(cluster: ThreadedCluster) -> None:
    tc = cluster
    topic = "pub_move"
    tc.sync(tc.cluster.create_topic, topic, 2, replica=2, channels=[CHANNEL])
    data = batches(20, 500, 6, "m")

    def feed() -> Iterator[Any]:
        for i, b in enumerate(data):
            if i in (2, 4):
                # runs on the task's input thread while earlier MPUBs may be in flight
                tc.sync(tc.cluster.move_leader, topic, i // 2 - 1)
            yield b

    msg = publish_task(options(tc, topic, deterministicTraceIds="true"), feed(),
                       task_partition=1, batch_id=9)
    assert msg.rows == 3000
    assert sum(msg.counts.values()) == 3000 and set(msg.counts) == {(topic, 0), (topic, 1)}
    # traced: the commit message knows where each partition's rows were stored
    assert set(msg.first_offsets) == set(msg.end_offsets) == {(topic, 0), (topic, 1)}
    got = collect(tc, topic, 3000)
    bodies = [m.body for m in got]
    assert sorted(set(bodies)) == sorted(f"m{i % 20}:{i}".encode() for i in range(3000))
    # retries may duplicate (at-least-once); the deterministic trace id tells copies apart
    ids = {}
    for m in got:
        assert m.trace_id is not None
        ids.setdefault(m.trace_id, set()).add(m.body)
        assert m.trace_id >> 40 == 9 and (m.trace_id >> 24) & 0xFFFF == 1
    assert all(len(b) == 1 for b in ids.values())
    assert len(ids) == 3000


def test_ext_headers_reach_the_consumer(cluster: ThreadedCluster) -> None:
    tc = cluster
    topic = "pub_ext"
    tc.sync(tc.cluster.create_topic, topic, 1, ext=True, channels=[CHANNEL])
    ext = pa.array([[("region", "eu")], [("region", "us"), ("k", "v")]],
                   pa.map_(pa.string(), pa.string()))
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()), "ext": ext})
    msg = publish_task(options(tc, topic), iter([batch]))
    assert msg.rows == 2
    got = {m.body: m.ext for m in collect(tc, topic, 2)}
    assert got[b"a"] is not None and got[b"a"]["region"] == "eu"
    assert got[b"b"] is not None and got[b"b"]["k"] == "v"


def test_unwritable_partition_fails_the_task_with_the_producer_error(
        cluster: ThreadedCluster) -> None:
    tc = cluster
    topic = "pub_closed"
    tc.sync(tc.cluster.create_topic, topic, 2, channels=[CHANNEL])
    tc.sync(tc.cluster.set_writable, topic, 1, False)
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()),
                             "partition": pa.array([0, 1], pa.int32())})
    with pytest.raises(PublishError) as info:
        publish_task(options(tc, topic, publishTimeout="2", maxAttempts="2"), iter([batch]))
    assert "partition 1" in str(info.value)
