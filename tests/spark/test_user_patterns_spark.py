"""What a Spark user writes first, from the guide and from habits of Spark's Kafka source and
sink, through local Spark against the embedded youzan cluster. Each pattern asserts the
invariant: every message published reaches the query's output or stays in the channel, and
every call returns or fails within a bounded time naming what was wrong (at ``load()`` for a
bad option, not inside the first action's executor trace).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from smartnsq.errors import ConfigError, SourceOptionError
from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.producer import Producer
from smartnsq.spark.fetch import channel_position
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.planning import snapshot
from smartnsq.spark.sink_options import parse_sink_options
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

#: every Spark call here is small; this bounds a call that would hang
WAIT = 60.0


def error_text(exc: BaseException) -> str:
    return f"{exc}\n{getattr(exc, 'desc', '')}"


def topic(tc: ThreadedCluster, name: str, partitions: int = 2) -> str:
    tc.sync(tc.cluster.create_topic, name, partition_num=partitions, replica=1,
            channels=["app"])
    return name


def publish(tc: ThreadedCluster, name: str, partition: int, bodies: list[bytes]) -> list[Any]:
    async def run() -> list[Any]:
        async with Producer(lookupd=tc.cluster.lookupd_http_addresses) as p:
            return [await p.publish(name, b, partition=partition, trace_id=i + 1)
                    for i, b in enumerate(bodies)]
    return list(tc.call(run()))


def offs(p0: int, p1: int) -> str:
    return json.dumps({"0": p0, "1": p1})


def lookupd(tc: ThreadedCluster) -> str:
    return tc.cluster.lookupd_http_addresses[0]


def count_in_topic(spark: Any, tc: ThreadedCluster, name: str) -> Counter[bytes]:
    rows = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", name) \
        .load().select("body").collect()
    return Counter(bytes(r.body) for r in rows)


# ------------------------------------------------------------------ options, no servers


@pytest.mark.parametrize(("given", "hint"), [
    ({"lookupdAddresses": "h:4161"}, "(did you mean lookupd?)"),
    ({"startingOfsets": "earliest"}, "(did you mean startingOffsets?)"),
    ({"maxOffsetsPerTrigger": "10"}, "the nsq name is maxMessagesPerTrigger"),
    ({"subscribe": "orders"}, "the nsq name is topic"),
    ({"kafka.bootstrap.servers": "h:9092"}, "the nsq name is lookupd"),
])
def test_misspelled_and_kafka_options_name_the_right_one(given: dict[str, str],
                                                         hint: str) -> None:
    o = {"lookupd": "127.0.0.1:4161", "topic": "orders", **given}
    with pytest.raises(SourceOptionError) as info:
        parse_source_options({k.lower(): v for k, v in o.items()}, streaming=True)
    assert hint in str(info.value) and "unknown option" in str(info.value)


def test_sink_names_the_option_meant() -> None:
    with pytest.raises(ConfigError, match=r"lookupdAddresses \(did you mean lookupd\?\)"):
        parse_sink_options({"lookupdAddresses": "h:4161", "topic": "t"})
    with pytest.raises(ConfigError, match=r"kafka.bootstrap.servers \(a Kafka option; the nsq "
                                          r"name is lookupd"):
        parse_sink_options({"kafka.bootstrap.servers": "h:9092", "topic": "t"})


def test_start_after_end_and_millisecond_timestamps_are_refused() -> None:
    base = {"lookupd": "127.0.0.1:4161", "topic": "orders"}
    # both silently read nothing before: an empty result for a typo
    with pytest.raises(SourceOptionError, match=r"starts partition 0 at 160, after its end 64"):
        parse_source_options({**base, "startingoffsets": '{"0": 160, "1": 0}',
                              "endingoffsets": '{"0": 64, "1": -1}'}, streaming=False)
    ms = str(int(time.time() * 1000))
    with pytest.raises(SourceOptionError, match=f"looks like milliseconds.*use {ms[:-3]}"):
        parse_source_options({**base, "startingtimestamp": ms}, streaming=True)
    # seconds pass; so does an end equal to the start (an empty range, asked for)
    parse_source_options({**base, "startingtimestamp": ms[:-3]}, streaming=True)
    parse_source_options({**base, "startingoffsets": '{"0": 64}',
                          "endingoffsets": '{"0": 64}'}, streaming=False)


# ------------------------------------------------------------------ through Spark


@pytest.mark.parametrize(("given", "named"), [
    ({"lookupdAddresses": "127.0.0.1:4161", "topic": "t"}, "did you mean lookupd?"),
    ({"lookupd": "127.0.0.1:4161", "topic": "t", "maxMessagesPerTrigger": "-5"},
     "option maxMessagesPerTrigger='-5'"),
    ({"lookupd": "127.0.0.1:4161", "topic": "t", "channel": "my channel"},
     "option channel='my channel': invalid channel name"),
])
def test_bad_options_fail_at_load_naming_the_option(spark: Any, given: dict[str, str],
                                                    named: str) -> None:
    # before: load() returned a DataFrame (readStream: start() returned a query) and the
    # error came at the first action, or in the query's thread
    for reader in (spark.read, spark.readStream):
        began = time.monotonic()
        with pytest.raises(Exception) as info:
            reader.format("nsq").options(**given).load()
        assert named in error_text(info.value)
        assert time.monotonic() - began < WAIT


def test_batch_reads_a_user_tries_first(spark: Any, youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    one = topic(tc, "up_one")
    publish(tc, one, 1, [b"only"])
    r = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", one)
    rows = r.load().collect()
    assert [(bytes(x.body), x.partition, x.offset) for x in rows] == [(b"only", 1, 0)]
    many = topic(tc, "up_range")
    sent = publish(tc, many, 0, [b"m%d" % i for i in range(10)])
    r = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", many)
    # start after end: before, partition 0 read nothing and the rest went on
    with pytest.raises(Exception) as info:
        r.option("startingOffsets", offs(sent[5].offset, -2)) \
            .option("endingOffsets", offs(sent[2].offset, -1)).load().collect()
    assert f"starts partition 0 at {sent[5].offset}, after its end {sent[2].offset}" \
        in error_text(info.value)
    # "latest" against an explicit end before it: backwards too, found once the ends are known
    with pytest.raises(Exception) as info:
        r.option("startingOffsets", "latest") \
            .option("endingOffsets", offs(sent[2].offset, -1)).load().collect()
    assert "partition 0 of topic 'up_range' would start at" in error_text(info.value)
    # an end equal to the start is an empty range, not an error
    at = sent[4].offset
    assert r.option("startingOffsets", offs(at, -2)) \
        .option("endingOffsets", offs(at, -1)).load().count() == 0


def _commit_channel(tc: ThreadedCluster, options: dict[str, str]) -> dict[int, int]:
    o = parse_source_options(options, streaming=True)

    async def run() -> dict[int, int]:
        snap = await snapshot(o)
        async with NsqdHttpClient() as http:
            return {p: await channel_position(http, st.leader_http, o.topic, p,
                                              o.channel_for(""))
                    for p, st in snap.partitions.items() if st.end}
    return tc.call(run())


def test_restarts_from_one_checkpoint_lose_and_repeat_nothing(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    # the guide's stream stopped mid-stream and started again from its checkpoint, with
    # publishes in between (partition 0 stays empty)
    tc = youzan_cluster
    name = topic(tc, "up_restart")
    o = {"lookupd": lookupd(tc), "topic": name, "startingOffsets": "earliest",
         "maxMessagesPerTrigger": "40"}
    want: list[bytes] = []
    timings = []
    for round_ in range(3):
        batch = [b"r%d-%d" % (round_, i) for i in range(100)]
        publish(tc, name, 1, batch)
        want += batch
        began = time.monotonic()
        q = (spark.readStream.format("nsq").options(**o).load().select("body")
             .writeStream.format("parquet").option("path", str(tmp_path / "data"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(processingTime="0 seconds").start())
        try:
            deadline = time.monotonic() + WAIT
            while sum(p["numInputRows"] for p in q.recentProgress) < 40:
                assert q.exception() is None, q.exception()
                assert time.monotonic() < deadline, "no batch within the wait"
                q.awaitTermination(0.2)
        finally:
            stopping = time.monotonic()
            q.stop()   # mid-stream: what it has not committed is read by the next run
        timings.append((stopping - began, time.monotonic() - stopping))
        assert timings[-1][1] < 10, f"stop() took {timings[-1][1]:.1f}s"
    q = (spark.readStream.format("nsq").options(**o).load().select("body")
         .writeStream.format("parquet").option("path", str(tmp_path / "data"))
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True)
         .start())
    assert q.awaitTermination(WAIT) and q.exception() is None
    got = Counter(bytes(r.body) for r in spark.read.parquet(str(tmp_path / "data")).collect())
    assert sorted(got) == sorted(want), "a message was lost"
    assert max(got.values()) == 1, "a message was read twice"
    end = publish(tc, name, 1, [b"tail"])[0].offset
    assert _commit_channel(tc, o) == {1: end}, "the query's channel is not at its commit"


def test_commit_moves_the_channel_past_an_empty_partition(
        youzan_cluster: ThreadedCluster) -> None:
    # commitToChannel on a topic whose partition 0 never had a message: nsqd cannot position
    # a channel there ("commit log end of file"); that refusal used to abort the commit, so
    # partition 1's channel never moved (and every batch logged a warning)
    from smartnsq.spark.source_youzan import YouzanStreamReader

    tc = youzan_cluster
    name = topic(tc, "up_commit")
    sent = publish(tc, name, 1, [b"c%d" % i for i in range(10)])
    o = {"lookupd": lookupd(tc), "topic": name, "startingOffsets": "earliest"}
    reader = YouzanStreamReader(parse_source_options(o, streaming=True))
    try:
        reader.commit({"0": 0, "1": sent[6].offset})
        assert _commit_channel(tc, o) == {1: sent[6].offset}
    finally:
        reader.stop()


def test_trigger_once_and_await_termination_timeout(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    tc = youzan_cluster
    name = topic(tc, "up_once")
    publish(tc, name, 0, [b"a", b"b"])
    q = (spark.readStream.format("nsq").option("lookupd", lookupd(tc)).option("topic", name)
         .option("startingOffsets", "earliest").load().select("body").writeStream
         .format("memory").queryName("up_once").trigger(once=True)
         .option("checkpointLocation", str(tmp_path / "once")).start())
    assert q.awaitTermination(WAIT) and q.exception() is None
    assert sorted(bytes(r.body) for r in spark.table("up_once").collect()) == [b"a", b"b"]
    # a running query: awaitTermination(timeout) returns False on time, stop() promptly
    q = (spark.readStream.format("nsq").option("lookupd", lookupd(tc)).option("topic", name)
         .load().writeStream.format("noop").trigger(processingTime="0 seconds").start())
    try:
        began = time.monotonic()
        assert q.awaitTermination(2) is False
        assert time.monotonic() - began < 10
    finally:
        began = time.monotonic()
        q.stop()
    assert time.monotonic() - began < 10 and not q.isActive


@pytest.mark.parametrize(("value", "named"), [
    ("null", "row 2500 of the task has a null value"),
    ("''", "row 2500 of the task: message body must not be empty"),
    ("repeat('x', 2000000)", "row 2500 of the task: message body of 2000000 bytes exceeds"),
])
def test_a_bad_row_late_in_a_task_says_what_was_published(
        spark: Any, youzan_cluster: ThreadedCluster, value: str, named: str) -> None:
    # the sink takes a task's rows in Arrow batches as they come: rows before a bad one may
    # be out already (NSQ cannot take them back); the error names the row and how many
    tc = youzan_cluster
    name = topic(tc, f"up_bad_{abs(hash(value)) % 10_000}")
    conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
    old = spark.conf.get(conf)
    spark.conf.set(conf, "1000")
    try:
        df = spark.range(0, 3000, 1, numPartitions=1).selectExpr(
            f"case when id = 2500 then {value} else cast(id as string) end as value")
        with pytest.raises(Exception) as info:
            df.write.format("nsq").mode("append").option("lookupd", lookupd(tc)) \
                .option("topic", name).save()
    finally:
        spark.conf.set(conf, old)
    text = error_text(info.value)
    assert named in text
    said = re.search(r"Spark task partition 0: .*; (\d+) earlier row\(s\) of this task were "
                     r"published and stay published", text)
    assert said is not None, text
    got = count_in_topic(spark, tc, name)
    assert sum(got.values()) == int(said.group(1)) == 2000
    assert sorted(got) == sorted(str(i).encode() for i in range(2000))


def test_sink_column_shapes_a_user_writes(spark: Any, youzan_cluster: ThreadedCluster,
                                          tmp_path: Path) -> None:
    tc = youzan_cluster
    name = topic(tc, "up_sink")
    w = lambda df: df.write.format("nsq").mode("append").option(  # noqa: E731
        "lookupd", lookupd(tc)).option("topic", name)
    # a string value is the UTF-8 body
    w(spark.createDataFrame([("héllo",), ("b",)], "value string")).save()
    # Kafka's key column: named, with what NSQ uses instead
    with pytest.raises(Exception) as info:
        w(spark.createDataFrame([("k", "v")], "key string, value string")).save()
    assert "unknown column(s) for the nsq sink: key" in error_text(info.value)
    assert "shard_key" in error_text(info.value)
    # an invalid topic: refused on the driver, before any task
    with pytest.raises(Exception) as info:
        spark.createDataFrame([("v",)], "value string").write.format("nsq").mode("append") \
            .option("lookupd", lookupd(tc)).option("topic", "bad topic!").save()
    assert "nsq sink option topic='bad topic!': invalid topic name" in error_text(info.value)

    # foreachBatch with the sink inside: a stream re-published batch by batch
    src = topic(tc, "up_fb_src")
    publish(tc, src, 0, [b"f%d" % i for i in range(30)])
    publish(tc, src, 1, [b"g%d" % i for i in range(20)])

    def forward(batch: Any, batch_id: int) -> None:
        w(batch.selectExpr("body as value")).save()

    q = (spark.readStream.format("nsq").option("lookupd", lookupd(tc)).option("topic", src)
         .option("startingOffsets", "earliest").load().writeStream.foreachBatch(forward)
         .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "fb"))
         .start())
    assert q.awaitTermination(WAIT) and q.exception() is None
    want = Counter([b"h\xc3\xa9llo", b"b"] + [b"f%d" % i for i in range(30)]
                   + [b"g%d" % i for i in range(20)])
    assert count_in_topic(spark, tc, name) == want


def test_stock_replay_options_are_refused_and_streams_read_their_channel(
        spark: Any, stock_cluster: ThreadedCluster, tmp_path: Path) -> None:
    # a stock channel gets what is published after it exists; startingOffsets=earliest used
    # to be taken and read nothing of the past, silently
    tc = stock_cluster
    tc.sync(tc.cluster.create_topic, "up_stock", channels=["app", "spark_q"])

    async def pub() -> None:
        async with Producer(nsqd=tc.cluster.nsqd_tcp_addresses) as p:
            await p.publish_many("up_stock", [b"s%d" % i for i in range(30)])
    tc.call(pub())
    o = {"lookupd": lookupd(tc), "topic": "up_stock", "channel": "spark_q"}
    refused = "option(s) startingOffsets need a replayable youzan topic; topic 'up_stock' " \
              "is on stock nsqd"
    with pytest.raises(Exception) as info:
        spark.read.format("nsq").options(**o, consume="true",
                                          startingOffsets="earliest").load().collect()
    assert refused in error_text(info.value)
    q = (spark.readStream.format("nsq").options(**o, startingOffsets="earliest").load()
         .writeStream.format("noop").start())
    try:
        with pytest.raises(Exception) as info:
            q.awaitTermination(WAIT)
        assert refused in error_text(info.value)
    finally:
        q.stop()
    # the guide's availableNow stream on the channel: every message, once
    q = (spark.readStream.format("nsq").options(**o).load().selectExpr("body").writeStream
         .format("memory").queryName("up_stock").trigger(availableNow=True)
         .option("checkpointLocation", str(tmp_path / "stock")).start())
    assert q.awaitTermination(WAIT) and q.exception() is None
    assert sorted(bytes(r.body) for r in spark.table("up_stock").collect()) == \
        sorted(b"s%d" % i for i in range(30))
