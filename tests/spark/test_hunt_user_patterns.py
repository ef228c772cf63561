"""Careless inputs a data engineer gives the nsq source and sink, through local Spark against
the embedded youzan cluster: each fails on the driver (or names the row) with an error that
says which option, value or row was wrong, and nothing published is lost.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from smartnsq.errors import ConfigError, SourceOptionError
from smartnsq.producer import Producer
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.sink_options import parse_sink_options
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

#: bounds a Spark call that would hang; each one here takes seconds
WAIT = 60.0


def error_text(exc: BaseException) -> str:
    return f"{exc}\n{getattr(exc, 'desc', '')}"


def lookupd(tc: ThreadedCluster) -> str:
    return tc.cluster.lookupd_http_addresses[0]


def topic(tc: ThreadedCluster, name: str, partitions: int = 2) -> str:
    tc.sync(tc.cluster.create_topic, name, partition_num=partitions, replica=1,
            channels=["app"])
    return name


def publish(tc: ThreadedCluster, name: str, partition: int, bodies: list[bytes]) -> None:
    async def run() -> None:
        async with Producer(lookupd=tc.cluster.lookupd_http_addresses) as p:
            await p.publish_many(name, bodies, partition=partition)
    tc.call(run())


# ------------------------------------------------------------------ options, no servers


@pytest.mark.parametrize("value", ["not an address", "127.0.0.1", "h:port", "127.0.0.1:1/x"])
def test_sink_lookupd_address_is_checked_on_the_driver(value: str) -> None:
    # the nsqd option's addresses were checked, lookupd's were not: the write started its
    # tasks and each failed with "Producer: lookupd=: invalid HTTP address ..."
    with pytest.raises(ConfigError, match=f"nsq sink option lookupd={value!r}: invalid HTTP "):
        parse_sink_options({"lookupd": value, "topic": "t"})
    parse_sink_options({"lookupd": "http://127.0.0.1:4161, 127.0.0.1:4162", "topic": "t"})


@pytest.mark.parametrize("value", [",", " , ,"])
def test_source_lookupd_without_an_address_names_the_option(value: str) -> None:
    # passed the required check (the text is not blank) and failed the first action with
    # "invalid LookupConfig: ... at least one nsqlookupd address is required"
    for streaming in (False, True):
        with pytest.raises(SourceOptionError, match=f"option lookupd={value!r}: expected "):
            parse_source_options({"lookupd": value, "topic": "t"}, streaming=streaming)


# ------------------------------------------------------------------ through Spark


def test_sink_bad_lookupd_fails_the_write_before_any_task(spark: Any) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    began = time.monotonic()
    with pytest.raises(Exception) as info:
        df.write.format("nsq").mode("append").option("lookupd", "not an address") \
            .option("topic", "t").save()
    assert "nsq sink option lookupd='not an address': invalid HTTP address" \
        in error_text(info.value)
    assert "Failed to initialize Python data source writer" in error_text(info.value)
    assert time.monotonic() - began < WAIT


def test_foreach_batch_sink_trace_ids_differ_between_micro_batches(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    # the guide's dedup recipe inside foreachBatch: each micro-batch's write is a batch
    # write, whose ids came from traceBatchId (0) every time, so rows of different
    # micro-batches shared trace ids and a consumer dropping repeats dropped real messages
    # (600 rows, 200 distinct ids)
    tc = youzan_cluster
    src, dst = topic(tc, "hunt_fb_src"), topic(tc, "hunt_fb_dst")
    publish(tc, src, 0, [b"m%d" % i for i in range(20)])

    def forward(batch: Any, batch_id: int) -> None:
        batch.selectExpr("body as value").write.format("nsq").mode("append") \
            .option("lookupd", lookupd(tc)).option("topic", dst) \
            .option("deterministicTraceIds", "true").save()

    q = (spark.readStream.format("nsq").option("lookupd", lookupd(tc)).option("topic", src)
         .option("startingOffsets", "earliest").option("maxMessagesPerTrigger", "10").load()
         .writeStream.foreachBatch(forward).trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "fb")).start())
    assert q.awaitTermination(WAIT) and q.exception() is None
    rows = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", dst) \
        .load().select("body", "trace_id").collect()
    assert sorted(bytes(r.body) for r in rows) == sorted(b"m%d" % i for i in range(20))
    ids = [r.trace_id for r in rows]
    assert len(set(ids)) == 20, f"{len(set(ids))} distinct trace ids for 20 messages"
    # the high bits are the micro-batch ids, as in a streaming write: a replay repeats them
    assert {i >> 40 for i in ids} == {0, 1}
    # an explicit traceBatchId still wins
    spark.createDataFrame([("x",)], "value string").write.format("nsq").mode("append") \
        .option("lookupd", lookupd(tc)).option("topic", dst) \
        .option("deterministicTraceIds", "true").option("traceBatchId", "7").save()
    rows = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", dst) \
        .load().where("cast(body as string) = 'x'").select("trace_id").collect()
    assert [r.trace_id >> 40 for r in rows] == [7]
