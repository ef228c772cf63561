"""The stock reader's driver methods called directly (no Spark session): per-batch cap, FIN
only on commit, uncommitted messages redelivered to the next reader, availableNow's end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from smartnsq.producer import Producer
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")

from smartnsq.spark.options import parse_source_options
from smartnsq.spark.source_stock import StockStreamReader

TOPIC = "stockdrv"
CHANNEL = "spark_drv"


@pytest.fixture(scope="module")
def tc() -> Iterator[ThreadedCluster]:
    c = ThreadedCluster(nodes=1, flavour="stock")
    try:
        c.sync(c.cluster.create_topic, TOPIC, channels=[CHANNEL])
        yield c
    finally:
        c.close()


def publish(tc: ThreadedCluster, bodies: list[bytes]) -> None:
    async def run() -> None:
        async with Producer(nsqd=tc.cluster.nsqd_tcp_addresses) as p:
            await p.publish_many(TOPIC, bodies)
    tc.call(run())


def reader(tc: ThreadedCluster, **kw: str) -> StockStreamReader:
    o = {"lookupd": tc.cluster.lookupd_http_addresses[0], "topic": TOPIC, "channel": CHANNEL,
         "maxWaitSeconds": "5", "triggerWaitSeconds": "0.3", **kw}
    return StockStreamReader(parse_source_options(o, streaming=True))


def take(r: StockStreamReader, start: dict[str, Any]) -> tuple[list[tuple[Any, ...]],
                                                               dict[str, Any]]:
    rows, end = r.read(start)
    return list(rows), end


def test_fin_on_commit_and_redelivery(tc: ThreadedCluster) -> None:
    publish(tc, [f"s{i}".encode() for i in range(25)])
    r = reader(tc, maxMessagesPerTrigger="10")
    try:
        assert r.initialOffset() == {"batch": 0}
        rows1, end1 = take(r, {"batch": 0})
        rows2, end2 = take(r, end1)
        assert (len(rows1), end1, len(rows2), end2) == (10, {"batch": 1}, 10, {"batch": 2})
        row = rows1[0]
        # stock rows: no partition, offset or ids; attempts and the nsqd are there
        assert row[1] == TOPIC and row[2:7] == (None,) * 5 and row[8] == 1
        assert row[10] == tc.cluster.nsqd_tcp_addresses[0]
        r.commit(end1)  # only the first batch is finished
        assert r.delivered == 10
    finally:
        r.stop()
    # the second batch was never committed: a new reader gets it (and the rest) again
    again = reader(tc, maxMessagesPerTrigger="100")
    try:
        rows, end = take(again, {"batch": 7})
        assert end == {"batch": 8}
        # the committed batch is gone; the uncommitted one comes back, once, with the rest
        got = sorted(x[0] for x in rows)
        assert got == sorted(f"s{i}".encode() for i in range(10, 25))
        assert {x[0] for x in rows2} <= set(got)
        assert max(x[8] for x in rows) == 2
        again.commit(end)
        # availableNow: once nothing comes, the offset stops moving
        again.prepareForTriggerAvailableNow()
        rows, end2 = take(again, end)
        assert rows == [] and end2 == end
    finally:
        again.stop()
    # nothing is left: everything was finished
    last = reader(tc, maxWaitSeconds="1")
    try:
        rows, end = take(last, {"batch": 0})
        assert rows == [] and end == {"batch": 0}
    finally:
        last.stop()
