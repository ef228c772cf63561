"""How far behind a youzan stream is, as its progress shows it: each source's ``latestOffset``
in ``StreamingQueryProgress`` holds, per partition, the end of the queue when the batch was
planned and the messages and bytes the query is behind after that batch. A query limited to
100 messages a trigger over 300 messages is 200 behind after its first batch and 0 once it
caught up; on the embedded cluster (``local[2]``) and on a real youzan cluster
(``real_youzan``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from smartnsq.producer import Producer
from tests.real_servers import HTTP_TIMEOUT, REAL_YOUZAN_LOOKUPD, YouzanCluster
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

WAIT = 120.0
PER_TRIGGER = 100
#: messages per partition (300 in all: three batches of 100 at least)
COUNTS = {0: 200, 1: 100}

Publish = Callable[[int, list[bytes]], None]


def publish_all(publish: Publish) -> None:
    for p, n in COUNTS.items():
        publish(p, [f"p{p}-{i}".encode() * (1 + i % 3) for i in range(n)])


def fill_double(tc: ThreadedCluster, topic: str) -> None:
    """A 2-partition topic with channel "app" on the embedded cluster, filled by
    :func:`publish_all`."""
    tc.sync(tc.cluster.create_topic, topic, partition_num=2, replica=1, channels=["app"])

    def publish(partition: int, bodies: list[bytes]) -> None:
        async def run() -> None:
            async with Producer(lookupd=tc.cluster.lookupd_http_addresses) as p:
                await p.publish_many(topic, bodies, partition=partition)
        tc.call(run())

    publish_all(publish)


def source_progress(q: Any) -> list[dict[str, Any]]:
    """The source's progress of every batch that took rows, oldest first."""
    return [p["sources"][0] for p in q.recentProgress if p["numInputRows"]]


def lag(source: dict[str, Any]) -> dict[int, tuple[int, int]]:
    """(messages, bytes) behind, per partition, after the batch."""
    latest = json.loads(source["latestOffset"])
    (end,) = json.loads(source["endOffset"]).values()  # {"<topic>": {"<partition>": offset}}
    out = {}
    for p, st in latest.items():
        # the bytes behind are the distance from the batch's end to the latest offset
        assert st["lagBytes"] == st["offset"] - end[p], (p, st, end)
        out[int(p)] = (st["lagMessages"], st["lagBytes"])
    return out


def run_until_caught_up(spark: Any, lookupd: str, topic: str) -> list[dict[str, Any]]:
    q = (spark.readStream.format("nsq")
         .options(lookupd=lookupd, topic=topic, startingOffsets="earliest",
                  maxMessagesPerTrigger=str(PER_TRIGGER)).load()
         .writeStream.format("noop").trigger(processingTime="0 seconds").start())
    try:
        deadline = time.monotonic() + WAIT
        while sum(s["numInputRows"] for s in source_progress(q)) < sum(COUNTS.values()):
            if q.exception() is not None:
                raise AssertionError(f"query failed: {q.exception()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not caught up within {WAIT} s: {q.recentProgress}")
            q.awaitTermination(0.2)
        return source_progress(q)
    finally:
        q.stop()


def check_lag(batches: list[dict[str, Any]]) -> None:
    first, last = lag(batches[0]), lag(batches[-1])
    assert batches[0]["numInputRows"] == PER_TRIGGER
    # 300 published, 100 read: the rest is behind, in messages and in bytes
    assert sum(m for m, _ in first.values()) == sum(COUNTS.values()) - PER_TRIGGER, first
    assert all(b > 0 for m, b in first.values() if m), first
    assert sum(b for _, b in first.values()) > 0
    # every batch is behind by what the later batches took
    for i, b in enumerate(batches):
        behind = sum(m for m, _ in lag(b).values())
        assert behind == sum(x["numInputRows"] for x in batches[i + 1:]), (i, batches)
    assert last == {p: (0, 0) for p in COUNTS}, last


def test_lag_shows_in_progress_and_goes_to_zero(spark: Any,
                                                youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    topic = "lag_progress"
    fill_double(tc, topic)
    check_lag(run_until_caught_up(spark, tc.cluster.lookupd_http_addresses[0], topic))


@pytest.mark.real_youzan
@pytest.mark.skipif(not REAL_YOUZAN_LOOKUPD, reason="SMARTNSQ_REAL_YOUZAN_LOOKUPD (host:port "
                    "of a youzan nsqlookupd) is not set; `make test-real` sets it")
def test_lag_on_real_cluster(spark: Any) -> None:
    lookupd = REAL_YOUZAN_LOOKUPD

    async def create() -> str:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            return (await YouzanCluster("real", lookupd, session).create_topic(
                "sparklag", partition_num=2, replicator=1)).name

    async def delete() -> None:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            await YouzanCluster("real", lookupd, session, created=[topic]).cleanup()

    topic = asyncio.run(create())
    try:
        def publish(partition: int, bodies: list[bytes]) -> None:
            async def run() -> None:
                async with Producer(lookupd=[lookupd]) as p:
                    await p.publish_many(topic, bodies, partition=partition)
            asyncio.run(run())

        publish_all(publish)
        check_lag(run_until_caught_up(spark, lookupd, topic))
    finally:
        asyncio.run(delete())


def test_lag_gauges_through_the_metrics_interface(youzan_cluster: ThreadedCluster) -> None:
    """The stream reader (what Spark's planning worker runs) reports its lag per partition as
    the catalog's gauges, read at collection, and removes them when the query stops."""
    pytest.importorskip("pyspark")
    from prometheus_client import CollectorRegistry
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from smartnsq.metrics import set_metrics
    from smartnsq.metrics.prometheus import PrometheusMetrics
    from smartnsq.spark.options import parse_source_options
    from smartnsq.spark.source_youzan import YouzanStreamReader

    tc = youzan_cluster
    topic = "lag_gauges"
    fill_double(tc, topic)
    metrics = PrometheusMetrics(CollectorRegistry())
    previous = set_metrics(metrics)
    try:
        r = YouzanStreamReader(parse_source_options(
            {"lookupd": tc.cluster.lookupd_http_addresses[0], "topic": topic,
             "startingOffsets": "earliest"}, streaming=True))

        def gauge(name: str) -> dict[str, float | None]:
            return {str(p): metrics.registry.get_sample_value(
                f"smartnsq_spark_source_lag_{name}",
                {"topic": topic, "channel": r.channel, "partition": str(p)}) for p in COUNTS}

        assert gauge("messages") == {"0": None, "1": None}  # nothing planned yet
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(PER_TRIGGER))
        assert sum(v or 0 for v in gauge("messages").values()) == 200
        progress = r.reportLatestOffset()
        assert progress is not None
        assert gauge("bytes") == {p: float(st["lagBytes"]) for p, st in progress.items()}
        while end != start:  # bounded: each batch takes 100 of 300
            start, end = end, r.latestOffset(end, ReadMaxRows(PER_TRIGGER))
        assert gauge("messages") == gauge("bytes") == {"0": 0.0, "1": 0.0}
        r.stop()
        assert gauge("messages") == {"0": None, "1": None}
    finally:
        set_metrics(previous)
        metrics.close()
