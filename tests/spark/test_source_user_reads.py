"""Batch and streaming reads as a user writes them from the README, through local Spark, on
the embedded youzan cluster and on a real one (``real_youzan``): a start offset that is not a
message boundary, and reads that have nothing to return.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from smartnsq.producer import Producer
from smartnsq.spark.schema import SOURCE_SCHEMA
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")
_real = pytest.importorskip("tests.real_servers", reason="tests/real_servers.py is missing")

pytestmark = pytest.mark.real_youzan

#: a README read that used to take minutes must take seconds; generous for a loaded machine
QUICK = 60.0


class Target:
    """Where the queries read: the embedded cluster (on its thread) or the real cluster."""

    def __init__(self, kind: str, lookupd: str, tc: ThreadedCluster | None = None) -> None:
        self.kind, self.lookupd, self._tc = kind, lookupd, tc
        self._created: list[str] = []

    def _run(self, coro: Any) -> Any:
        return self._tc.call(coro) if self._tc is not None else asyncio.run(coro)

    def topic(self, prefix: str, partition_num: int) -> str:
        if self._tc is not None:
            name = _real.unique(prefix)
            self._tc.sync(self._tc.cluster.create_topic, name, partition_num=partition_num,
                          replica=1, channels=["app"])
            return name

        async def create() -> str:
            async with aiohttp.ClientSession(timeout=_real.HTTP_TIMEOUT) as session:
                yc = _real.YouzanCluster("real", self.lookupd, session)
                return str((await yc.create_topic(prefix, partition_num=partition_num,
                                                  replicator=1)).name)

        name = asyncio.run(create())
        self._created.append(name)
        return name

    def publish(self, topic: str, partition: int, bodies: list[bytes]) -> list[Any]:
        async def run() -> list[Any]:
            async with Producer(lookupd=[self.lookupd]) as p:
                return [await p.publish(topic, b, partition=partition, trace_id=i + 1)
                        for i, b in enumerate(bodies)]
        return list(self._run(run()))

    def cleanup(self) -> None:
        async def drop() -> None:
            async with aiohttp.ClientSession(timeout=_real.HTTP_TIMEOUT) as session:
                yc = _real.YouzanCluster("real", self.lookupd, session)
                yc.created.extend(self._created)
                await yc.cleanup()
        if self._created:
            asyncio.run(drop())


@pytest.fixture(params=["double", "real"])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    if request.param == "real":
        if not _real.REAL_YOUZAN_LOOKUPD:
            pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD (host:port of a youzan nsqlookupd) is "
                        "not set; `make test-real` sets it")
        t = Target("real", _real.REAL_YOUZAN_LOOKUPD)
    else:
        tc: ThreadedCluster = request.getfixturevalue("youzan_cluster")
        t = Target("double", tc.cluster.lookupd_http_addresses[0], tc)
    try:
        yield t
    finally:
        t.cleanup()


def _available_now(spark: Any, options: dict[str, str], out: Path) -> list[Any]:
    q = (spark.readStream.format("nsq").options(**options).load()
         .select("body", "partition", "offset").writeStream.format("parquet")
         .option("path", str(out / "data")).option("checkpointLocation", str(out / "ckpt"))
         .trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(QUICK * 2), "availableNow query did not finish"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    if not (out / "data").exists():
        return []
    return list(spark.read.parquet(str(out / "data")).collect())


def test_readme_start_offset_inside_a_message(spark: Any, target: Target,
                                              tmp_path: Path) -> None:
    # the README's batch read: offset 1024 of partition 0 is inside a message; nsqd (and the
    # CLI's --from offset:0=1024) read from the next message boundary, so does the source
    topic = target.topic("sp_mid", 2)
    p0 = target.publish(topic, 0, [b"a%03d" % i + b"x" * 60 for i in range(30)])
    target.publish(topic, 1, [b"b%d" % i for i in range(5)])
    assert 1024 not in {r.offset for r in p0} and p0[-1].offset > 1024
    first = next(i for i, r in enumerate(p0) if r.offset > 1024)
    want = sorted([b"a%03d" % i + b"x" * 60 for i in range(first, 30)] +
                  [b"b%d" % i for i in range(5)])
    began = time.monotonic()
    df = (spark.read.format("nsq").option("lookupd", target.lookupd).option("topic", topic)
          .option("startingOffsets", '{"0": 1024, "1": -2}')
          .option("endingOffsets", "latest").load())
    rows = df.select("body", "partition", "offset").collect()
    took = time.monotonic() - began
    assert sorted(bytes(r.body) for r in rows) == want
    # the offsets reported are the messages' own, the first at the boundary after 1024
    assert sorted(r.offset for r in rows if r.partition == 0) == \
        [r.offset for r in p0[first:]]
    assert took < QUICK, f"the read took {took:.0f}s"
    print(f"README read on the {target.kind} cluster: {len(rows)} rows in {took:.1f}s")
    # the same start in a stream: the same rows from the boundary on
    got = _available_now(spark, {"lookupd": target.lookupd, "topic": topic,
                                 "startingOffsets": '{"0": 1024, "1": -2}'}, tmp_path)
    assert sorted(bytes(r.body) for r in got) == want


def test_reads_with_nothing_to_return(spark: Any, target: Target, tmp_path: Path) -> None:
    # a batch read of nothing is an empty DataFrame with the source's columns, not an error
    busy = target.topic("sp_busy", 2)
    target.publish(busy, 0, [b"old0", b"old1"])
    target.publish(busy, 1, [b"old2"])
    empty = target.topic("sp_empty", 2)
    future = str(int(time.time()) + 3600)
    cases = {
        "startingOffsets latest": {"topic": busy, "startingOffsets": "latest"},
        "an empty topic": {"topic": empty},
        "a future startingTimestamp": {"topic": busy, "startingTimestamp": future},
    }
    for name, options in cases.items():
        o = {"lookupd": target.lookupd, **options}
        df = spark.read.format("nsq").options(**o).load()
        assert df.schema == SOURCE_SCHEMA, name
        assert df.collect() == [], name
        # the streaming equivalent: no rows, no error
        assert _available_now(spark, o, tmp_path / name.replace(" ", "_")) == [], name


def test_stream_start_inside_a_message_is_reported_at_the_boundary(target: Target) -> None:
    # Spark stores the source's initial offsets in its checkpoint: they are message
    # boundaries, the ones nsqd positions at
    pytest.importorskip("pyspark")
    from smartnsq.spark.options import parse_source_options
    from smartnsq.spark.source_youzan import YouzanStreamReader

    topic = target.topic("sp_init", 2)
    p0 = target.publish(topic, 0, [b"c%03d" % i + b"y" * 60 for i in range(20)])
    p1 = target.publish(topic, 1, [b"d%03d" % i + b"y" * 60 for i in range(20)])
    inside = {"0": p0[3].offset + 1, "1": p1[-1].offset + 1}
    reader = YouzanStreamReader(parse_source_options(
        {"lookupd": target.lookupd, "topic": topic, "startingOffsets": json.dumps(inside)},
        streaming=True))
    assert reader.initialOffset() == {topic: {"0": p0[4].offset,
                                              "1": p1[-1].offset + p1[-1].raw_size}}
