"""The stock-nsqd sink and at-least-once source on a Spark standalone cluster, against the
real stock nsqd (``SMARTNSQ_REAL_NSQD``, ``SMARTNSQ_REAL_NSQD_HTTP``,
``SMARTNSQ_REAL_LOOKUPD``), executors on the packed environment (tests/spark/cluster.py).

The stock source's reader lives in the driver's planning worker (FIN must travel on the
connection that delivered a message), so it runs the driver's unpacked copy of the archive;
the sink's tasks run on the executors.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.spark.cluster import (
    TEST_SECONDS,
    driver_args,
    driver_env,
    driver_session,
    run_driver,
    unpack,
)

pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(TEST_SECONDS)]

FIRST, SECOND, PER_TRIGGER = 600, 200, 200
CHANNEL = "spark_q"


def drive_stock(args: dict[str, Any]) -> dict[str, Any]:
    """Sink FIRST rows; a stream stopped after its first batches; SECOND more rows sunk; the
    stream restarted from its checkpoint until every row is in its output."""
    from pyspark.sql import functions as sf

    import smartnsq.spark

    spark = driver_session(args)
    smartnsq.spark.register(spark)

    def sink(start: int, n: int) -> None:
        (spark.range(start, start + n, numPartitions=2)
         .selectExpr("concat('s', cast(id as string)) as value")
         .write.format("nsq").mode("append")
         .option("nsqd", args["nsqd"]).option("topic", args["topic"]).save())

    def stream() -> Any:
        return (spark.readStream.format("nsq")
                .options(lookupd=args["lookupd"], topic=args["topic"], channel=CHANNEL,
                         maxMessagesPerTrigger=str(PER_TRIGGER), messageTimeoutSeconds="2")
                .load().select(sf.col("body").cast("string").alias("b"))
                .writeStream.format("parquet").option("path", args["out"])
                .option("checkpointLocation", args["checkpoint"])
                .trigger(processingTime="0 seconds").start())

    def output() -> list[str]:
        try:
            return [r.b for r in spark.read.parquet(args["out"]).collect()]
        except Exception:  # no file yet
            return []

    sink(0, FIRST)
    first = stream()
    deadline = time.monotonic() + 180
    while sum(int(p["numInputRows"]) for p in first.recentProgress) < PER_TRIGGER:
        if first.exception() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"first stream: {first.exception()} {first.recentProgress}")
        first.awaitTermination(0.5)
    first.stop()
    sink(FIRST, SECOND)
    want = {f"s{i}" for i in range(FIRST + SECOND)}
    second = stream()
    deadline = time.monotonic() + 180
    try:
        while not want <= set(output()):
            if second.exception() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"restarted stream: {second.exception()}")
            second.awaitTermination(1.0)
    finally:
        second.stop()
    batches = [int(p["numInputRows"]) for p in first.recentProgress + second.recentProgress]
    rows = output()
    spark.stop()
    return {"rows": rows, "batches": batches}


@pytest.fixture(scope="module")
def stock_servers() -> dict[str, str]:
    from tests.real_servers import REAL_LOOKUPD, REAL_NSQD, REAL_NSQD_HTTP

    if not (REAL_NSQD and REAL_NSQD_HTTP and REAL_LOOKUPD):
        pytest.skip("SMARTNSQ_REAL_NSQD, SMARTNSQ_REAL_NSQD_HTTP and SMARTNSQ_REAL_LOOKUPD "
                    "(a stock nsqd and its nsqlookupd) are not all set")
    return {"nsqd": REAL_NSQD, "http": REAL_NSQD_HTTP, "lookupd": REAL_LOOKUPD}


async def _nsqd_http(http: str, path: str, **params: str) -> None:
    import aiohttp

    from tests.real_servers import HTTP_TIMEOUT

    async with (aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session,
                session.post(f"http://{http}{path}", params=params) as answer):
        assert answer.status == 200, (path, answer.status, await answer.text())


def test_stock_sink_and_source_across_a_restart(
        spark_standalone: Any, spark_packed_env: Any, stock_servers: dict[str, str],
        tmp_path: Path) -> None:
    topic = f"sparkclstock_{secrets.token_hex(3)}"
    http = stock_servers["http"]
    # the channel before the first publish, as an application's consumers would have it
    asyncio.run(_nsqd_http(http, "/topic/create", topic=topic))
    asyncio.run(_nsqd_http(http, "/channel/create", topic=topic, channel=CHANNEL))
    cwd = tmp_path / "driver"
    unpack(spark_packed_env.archive, cwd)
    try:
        got = run_driver(__name__, "drive_stock", driver_args(
            spark_standalone, spark_packed_env.archive, "smartnsq-cluster-stock",
            nsqd=stock_servers["nsqd"], lookupd=stock_servers["lookupd"], topic=topic,
            out=str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt")), cwd, driver_env())
    finally:
        asyncio.run(_nsqd_http(http, "/topic/delete", topic=topic))
    counts = Counter(got["rows"])
    duplicates = sum(n - 1 for n in counts.values())
    print(f"\nstock on the cluster: {len(counts)} distinct, {duplicates} duplicates across "
          f"the restart, {len(got['batches'])} batches, driver process "
          f"{got['driver_seconds']} s")
    assert set(counts) == {f"s{i}" for i in range(FIRST + SECOND)}  # nothing lost
    assert max(got["batches"]) <= PER_TRIGGER
