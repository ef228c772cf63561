"""Careless inputs a data engineer gives the nsq source and sink, through local Spark against
the embedded youzan cluster: each fails on the driver (or names the row) with an error that
says which option, value or row was wrong, and nothing published is lost.
"""

from __future__ import annotations

import socket
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


def test_a_partition_beyond_the_topic_names_its_row(spark: Any,
                                                    youzan_cluster: ThreadedCluster) -> None:
    # a partition column computed for another topic (id % 4 on 2 partitions): the guide
    # promises a bad partition fails naming the row, the Spark task partition and how many
    # rows were published; the producer's bare "partition 5 out of range" named none, and
    # the bad row's batch was half out already
    tc = youzan_cluster
    name = topic(tc, "hunt_part_range")
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(conf)
    spark.conf.set(conf, "100")
    try:
        df = spark.range(0, 300, 1, numPartitions=1).selectExpr(
            "cast(id as string) as value",
            "case when id = 250 then 5 else cast(id % 2 as int) end as partition")
        began = time.monotonic()
        with pytest.raises(Exception) as info:
            df.write.format("nsq").mode("append").option("lookupd", lookupd(tc)) \
                .option("topic", name).save()
        assert time.monotonic() - began < WAIT
    finally:
        spark.conf.set(conf, old)
    text = error_text(info.value)
    assert "Spark task partition 0: row 250 of the task: partition 5 out of range: topic " \
           f"'{name}' has 2 partitions; 200 earlier row(s) of this task were published" in text
    rows = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", name) \
        .load().select("body", "partition").collect()
    assert sorted((int(bytes(r.body)), r.partition) for r in rows) == \
        [(i, i % 2) for i in range(200)]


def test_partition_range_is_checked_per_topic_of_a_topic_column() -> None:
    pa = pytest.importorskip("pyarrow")
    from smartnsq.spark.sink_arrow import BatchPlan

    batch = pa.RecordBatch.from_pydict({
        "value": [b"v0", b"v1", b"v2", b"v3"], "topic": ["b", "a", "b", "a"],
        "partition": pa.array([3, 1, None, 3], pa.int32())})
    plan = BatchPlan(batch, parse_sink_options({"lookupd": "127.0.0.1:4161"}), row_base=10)
    # row 0 (partition 3 of b) is in range; row 3 (partition 3 of a) is not
    with pytest.raises(ConfigError, match=r"^row 13 of the task: partition 3 out of range: "
                                          r"topic 'a' has 2 partitions$"):
        plan.units({"a": 2, "b": 4})
    units = plan.units({"a": 4, "b": 4})
    assert sorted((u.topic, -1 if u.partition is None else u.partition, u.count)
                  for u in units) == [("a", 1, 1), ("a", 3, 1), ("b", -1, 1), ("b", 3, 1)]
    # a count not known (no lookupd answer yet): the producer decides, as before
    assert len(plan.units({})) == 4


@pytest.fixture
def dead_lookupd() -> str:
    """host:port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_stock_reads_of_a_lookupd_that_does_not_answer_fail_naming_it(
        spark: Any, dead_lookupd: str, tmp_path: Path) -> None:
    # flavour=stock skipped the one question asked of the lookupd: the batch read returned
    # an empty DataFrame after maxWaitSeconds and the availableNow stream ended as if the
    # queue were empty, where the guide promises a failure naming the lookupd
    o = {"lookupd": dead_lookupd, "topic": "hunt_stock", "flavour": "stock",
         "maxWaitSeconds": "2"}
    began = time.monotonic()
    with pytest.raises(Exception) as info:
        spark.read.format("nsq").options(**o, consume="true").load().collect()
    assert f"no lookupd answered /lookup for topic 'hunt_stock' (access=r): " \
           f"http://{dead_lookupd}" in error_text(info.value)
    q = (spark.readStream.format("nsq").options(**o).load().writeStream.format("noop")
         .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "s"))
         .start())
    try:
        with pytest.raises(Exception) as info:
            q.awaitTermination(WAIT)
    finally:
        q.stop()
    assert f"http://{dead_lookupd}" in error_text(info.value)
    assert time.monotonic() - began < WAIT


def test_a_partition_column_write_to_a_silent_lookupd_fails_within_publish_timeout() -> None:
    # the partition count is looked up before the first MPUB; that look at a lookupd that
    # never answers must come out of publishTimeout, not before it (3 s became 5 s)
    pa = pytest.importorskip("pyarrow")
    from smartnsq.errors import PublishTimeoutError
    from smartnsq.spark.sink import publish_task

    batch = pa.RecordBatch.from_pydict({"value": [b"v"], "partition": pa.array([0], pa.int32())})
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        with pytest.raises(PublishTimeoutError, match="topic 't' had no writable partition"):
            publish_task(parse_sink_options({"lookupd": address, "topic": "t",
                                             "publishTimeout": "3"}), iter([batch]))
        took = time.monotonic() - began
    assert took < 3.8, f"publishTimeout 3 took {took:.1f}s"


def test_a_schema_given_to_the_source_is_refused_naming_the_fixed_one(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    # .schema("body binary") on a read was taken at load(); the read ran on the executors
    # and failed with "Return schema mismatch ... Expected: 1 columns, Found: 11 columns"
    tc = youzan_cluster
    name = topic(tc, "hunt_schema")
    publish(tc, name, 0, [b"a"])
    said = "the nsq source has a fixed schema (body binary, topic string, "
    with pytest.raises(Exception) as info:
        spark.read.format("nsq").schema("body binary").option("lookupd", lookupd(tc)) \
            .option("topic", name).load().collect()
    assert said in error_text(info.value) and "not struct<body:binary>" in \
        error_text(info.value)
    q = (spark.readStream.format("nsq").schema("body string").option("lookupd", lookupd(tc))
         .option("topic", name).option("startingOffsets", "earliest").load()
         .writeStream.format("noop").trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "s")).start())
    try:
        with pytest.raises(Exception) as info:
            q.awaitTermination(WAIT)
    finally:
        q.stop()
    assert said in error_text(info.value)
    # the schema it has, given as it is, is taken
    from smartnsq.spark.schema import SOURCE_DDL
    assert spark.read.format("nsq").schema(SOURCE_DDL).option("lookupd", lookupd(tc)) \
        .option("topic", name).load().count() == 1
