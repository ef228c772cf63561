"""The sink through local Spark (``local[2]``) into the embedded clusters, read back with the
source's batch read (the 20k-row test) or the plain smartnsq Consumer (independent of the
sink's code path)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import mmh3
import pytest

from smartnsq.consumer import Consumer
from smartnsq.message import Message
from tests.consumer_support import fast_config
from tests.real_servers import HTTP_TIMEOUT, REAL_YOUZAN_LOOKUPD, YouzanCluster
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

CHANNEL = "verify"
ROWS = 20_000
KEYS = 50
PARTITIONS = 4
WAIT = 60.0


def collect(tc: ThreadedCluster, topic: str, n: int, *, timeout: float = WAIT) -> list[Message]:
    """Consume ``n`` messages of ``topic`` on the cluster's loop (FIN each); fail after
    ``timeout`` seconds with what arrived so far."""
    lookupds = tc.cluster.lookupd_http_addresses

    async def run() -> list[Message]:
        got: list[Message] = []
        done = asyncio.Event()

        async def handler(msg: Message) -> None:
            got.append(msg)
            if len(got) >= n:
                done.set()

        c = Consumer(topic, CHANNEL, handler, lookupd=lookupds,
                     config=fast_config(max_in_flight=200))
        async with c:
            try:
                async with asyncio.timeout(timeout):
                    await done.wait()
            except TimeoutError:
                raise AssertionError(f"only {len(got)} of {n} messages of {topic!r} "
                                     f"arrived within {timeout}s") from None
        return got

    return tc.call(run(), timeout=timeout + 30)


def error_text(exc: BaseException) -> str:
    """Spark wraps the Python error; its text carries ours."""
    return f"{exc}\n{getattr(exc, 'desc', '')}"


# ---------------------------------------------------------------------------- youzan


def write_and_check_sharded(spark: Any, lookupd: str, topic: str) -> None:
    """20,000 rows with shard keys through the sink, read back with the source's batch read:
    the same multiset, each key on its independent murmur3 partition, each key's rows of one
    Spark task in input order."""
    df = spark.range(0, ROWS, 1, numPartitions=2).selectExpr(
        f"concat('k', cast(id % {KEYS} as string)) as shard_key",
        f"cast(concat('k', cast(id % {KEYS} as string), ':', cast(id as string)) as binary) "
        "as value")
    df.write.format("nsq").mode("append").option("lookupd", lookupd) \
        .option("topic", topic).save()
    # read back through the source (batch read: every partition from earliest to latest)
    got = df_rows(spark.read.format("nsq").option("lookupd", lookupd).option("topic", topic)
                  .load().select("body", "partition", "offset"))
    assert sorted(b for b, _, _ in got) == sorted(f"k{i % KEYS}:{i}".encode()
                                                  for i in range(ROWS))
    by_task: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for body, partition, offset in got:
        key, seq = body.decode().split(":")
        # placement: an independent murmur3 over the key's bytes
        assert partition == mmh3.hash(key, 0, signed=False) % PARTITIONS, body
        by_task[(key, int(seq) // (ROWS // 2))].append((partition, offset, int(seq)))
    # a key's rows from one Spark task are stored in their input order
    for (key, task), items in by_task.items():
        assert len({p for p, _, _ in items}) == 1
        seqs = [s for _, _, s in sorted(items)]
        assert seqs == sorted(seqs), f"key {key} task {task} out of order"


def test_youzan_batch_write_20k_rows_with_shard_keys(spark: Any,
                                                     youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    topic = "sink_sharded"
    tc.sync(tc.cluster.create_topic, topic, PARTITIONS, ordered=True, channels=[CHANNEL])
    write_and_check_sharded(spark, ",".join(tc.cluster.lookupd_http_addresses), topic)


@pytest.mark.real_youzan
def test_real_youzan_batch_write_20k_rows_with_shard_keys(spark: Any) -> None:
    if not REAL_YOUZAN_LOOKUPD:
        pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD (a real youzan nsqlookupd) is not set; "
                    "`make test-real` sets it")

    async def session_call(fn: Any) -> Any:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            return await fn(YouzanCluster("real", REAL_YOUZAN_LOOKUPD, session))

    topic = asyncio.run(session_call(lambda yc: yc.create_topic(
        "sink_real", PARTITIONS, 1, ordered=True, channels=(CHANNEL,))))
    try:
        write_and_check_sharded(spark, REAL_YOUZAN_LOOKUPD, topic.name)
    finally:
        async def delete(yc: YouzanCluster) -> None:
            yc.created.append(topic.name)
            await yc.cleanup()

        asyncio.run(session_call(delete))


def df_rows(df: Any) -> list[tuple[bytes, int, int]]:
    return [(bytes(r[0]), int(r[1]), int(r[2])) for r in df.collect()]


def test_youzan_streaming_sink_with_deterministic_trace_ids(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    tc = youzan_cluster
    topic = "sink_stream"
    tc.sync(tc.cluster.create_topic, topic, 2, channels=[CHANNEL])
    src = tmp_path / "in"
    # two input files, one per micro-batch (maxFilesPerTrigger=1)
    for f in range(2):
        spark.createDataFrame([(f"f{f}-{i}",) for i in range(300)], "value string") \
            .coalesce(1).write.mode("overwrite").parquet(str(src / f"part{f}"))
    files = sorted(src.glob("part*/*.parquet"))
    flat = tmp_path / "flat"
    flat.mkdir()
    for i, p in enumerate(files):
        p.rename(flat / f"{i}.parquet")
    q = (spark.readStream.schema("value string").option("maxFilesPerTrigger", 1)
         .parquet(str(flat))
         .writeStream.format("nsq")
         .option("lookupd", ",".join(tc.cluster.lookupd_http_addresses))
         .option("topic", topic).option("deterministicTraceIds", "true")
         .option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(WAIT)
    assert q.exception() is None
    got = collect(tc, topic, 600)
    assert sorted(m.body for m in got) == sorted(f"f{f}-{i}".encode()
                                                 for f in range(2) for i in range(300))
    # trace id = batch id << 40 | task partition << 24 | row index in the task
    batch_of_file: dict[str, set[int]] = defaultdict(set)
    rows: dict[int, set[int]] = defaultdict(set)
    for m in got:
        assert m.trace_id is not None
        batch, row = m.trace_id >> 40, m.trace_id & ((1 << 24) - 1)
        batch_of_file[m.body.decode().split("-")[0]].add(batch)
        rows[batch].add(row)
    # one file per micro-batch: Spark's batch ids 0 and 1 reached the executors' tasks
    assert batch_of_file == {"f0": {0}, "f1": {1}}
    assert all(r == set(range(300)) for r in rows.values())


def test_youzan_missing_topic_fails_the_task_with_the_producer_error(
        spark: Any, youzan_cluster: ThreadedCluster) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception) as info:
        df.write.format("nsq").mode("append") \
            .option("lookupd", ",".join(youzan_cluster.cluster.lookupd_http_addresses)) \
            .option("topic", "sink_no_such_topic").option("publishTimeout", "1.5").save()
    text = error_text(info.value)
    assert "PublishTimeoutError" in text and "sink_no_such_topic" in text


def test_body_too_large_fails_the_task(spark: Any, youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, "sink_big", 1, channels=[CHANNEL])
    df = spark.createDataFrame([(b"a",), (b"x" * 5000,)], "value binary").coalesce(1)
    with pytest.raises(Exception) as info:
        df.write.format("nsq").mode("append") \
            .option("lookupd", ",".join(tc.cluster.lookupd_http_addresses)) \
            .option("topic", "sink_big").option("maxMessageBytes", "4096").save()
    assert "row 1 of the task: message body of 5000 bytes exceeds max_msg_size" \
        in error_text(info.value)


# ---------------------------------------------------------------------------- stock


@pytest.mark.parametrize("via", ["nsqd", "lookupd"])
def test_stock_sink_with_delay_ms(spark: Any, stock_cluster: ThreadedCluster, via: str) -> None:
    tc = stock_cluster
    topic = f"sink_stock_{via}"
    tc.sync(tc.cluster.create_topic, topic, channels=[CHANNEL])
    rows = [(f"now-{i}", None) for i in range(200)] + [(f"later-{i}", 50) for i in range(20)]
    df = spark.createDataFrame(rows, "value string, delay_ms long")
    addresses = tc.cluster.nsqd_tcp_addresses if via == "nsqd" else \
        tc.cluster.lookupd_http_addresses
    df.write.format("nsq").mode("append") \
        .option(via, ",".join(addresses)).option("topic", topic).save()
    got = collect(tc, topic, len(rows))
    assert sorted(m.body.decode() for m in got) == sorted(v for v, _ in rows)


# ---------------------------------------------------------------------------- bad input


def test_overwrite_mode_is_refused(spark: Any) -> None:
    df = spark.createDataFrame([(b"x",)], "value binary")
    with pytest.raises(Exception) as info:
        df.write.format("nsq").mode("overwrite").option("lookupd", "127.0.0.1:1") \
            .option("topic", "t").save()
    assert "the nsq sink only appends" in error_text(info.value)


@pytest.mark.parametrize(("cols", "options", "message"), [
    ("value binary, key string", {"topic": "t"}, "unknown column(s) for the nsq sink: key"),
    ("body binary", {"topic": "t"}, "column value is required by the nsq sink"),
    # a table written as it is: the missing body column is named, with what was given
    ("id string, name string", {"topic": "t"},
     "column value is required by the nsq sink (the message body, binary or string); "
     "columns given: id, name"),
    ("value binary", {}, "needs the topic option or a topic column"),
    ("value binary", {"topic": "t", "maxAttempts": "0"}, "maxAttempts='0'"),
    ("value binary", {"topic": "t", "bogus": "1"}, "unknown nsq sink option(s): bogus"),
])
def test_bad_columns_and_options_fail_the_write(spark: Any, cols: str, options: dict[str, str],
                                                message: str) -> None:
    names = [c.split()[0] for c in cols.split(",")]
    row = tuple(b"x" if "binary" in c else "x" for c in cols.split(","))
    df = spark.createDataFrame([row], cols).select(*names)
    w = df.write.format("nsq").mode("append").option("lookupd", "127.0.0.1:1")
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception) as info:
        w.save()
    assert message in error_text(info.value)
