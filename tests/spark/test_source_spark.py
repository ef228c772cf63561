"""The source through local Spark (``local[2]``) against the embedded clusters: streaming
with checkpoints (exactly once on youzan across a restart, at-least-once on stock), starting
positions, per-batch limits, a leader move, data loss both ways, batch ranges, bad options.

Queries are few and small on purpose (the machine has two cores); the range reader's
details are tested without Spark in ``test_source_fetch.py``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from smartnsq.nsqd_http import NsqdHttpClient
from smartnsq.producer import Producer
from smartnsq.spark.fetch import channel_position
from smartnsq.spark.options import parse_source_options
from smartnsq.spark.planning import snapshot
from tests.spark.conftest import ThreadedCluster

pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

WAIT = 120.0


def publish(tc: ThreadedCluster, topic: str, partition: int | None, bodies: list[bytes],
            *, traced: bool = False) -> list[Any]:
    """Publish on the cluster's loop; with ``traced`` return each message's receipt."""
    lookupds = tc.cluster.lookupd_http_addresses
    stock = tc.cluster.flavour == "stock"

    async def run() -> list[Any]:
        p = Producer(nsqd=tc.cluster.nsqd_tcp_addresses) if stock else Producer(lookupd=lookupds)
        async with p:
            if traced:
                out = []
                for i, b in enumerate(bodies):
                    out.append(await p.publish(topic, b, partition=partition, trace_id=i + 1))
                return out
            for i in range(0, len(bodies), 500):
                await p.publish_many(topic, bodies[i:i + 500], partition=partition)
            return []

    return tc.call(run())


def opts(tc: ThreadedCluster, topic: str, **kw: Any) -> dict[str, str]:
    o = {"lookupd": ",".join(tc.cluster.lookupd_http_addresses), "topic": topic}
    o.update({k: str(v) for k, v in kw.items()})
    return o


def start_stream(spark: Any, options: dict[str, str], out: Path, *,
                 available_now: bool) -> Any:
    df = spark.readStream.format("nsq").options(**options).load()
    w = (df.select("body", "partition", "offset").writeStream.format("parquet")
         .option("path", str(out / "data")).option("checkpointLocation", str(out / "ckpt")))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="0 seconds")
    return w.start()


def run_available_now(spark: Any, options: dict[str, str], out: Path) -> Any:
    q = start_stream(spark, options, out, available_now=True)
    assert q.awaitTermination(WAIT), "availableNow query did not finish"
    if q.exception() is not None:
        raise AssertionError(f"query failed: {q.exception()}")
    return q


def wait_rows(q: Any, n: int, timeout: float = WAIT) -> int:
    """Wait (bounded) until the query's batches have taken ``n`` rows; return the count."""
    deadline = time.monotonic() + timeout
    while True:
        seen = sum(p["numInputRows"] for p in q.recentProgress)
        if seen >= n:
            return int(seen)
        if q.exception() is not None:
            raise AssertionError(f"query failed: {q.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"only {seen} of {n} rows within {timeout}s")
        q.awaitTermination(0.2)


def bodies(spark: Any, out: Path) -> list[bytes]:
    if not (out / "data").exists():
        return []
    return [bytes(r.body) for r in spark.read.parquet(str(out / "data")).collect()]


def parse(options: dict[str, str]) -> Any:
    return parse_source_options(options, streaming=True)


def channel_positions(tc: ThreadedCluster, options: dict[str, str]) -> dict[int, int]:
    o = parse(options)

    async def run() -> dict[int, int]:
        snap = await snapshot(o)
        async with NsqdHttpClient() as http:
            return {p: await channel_position(http, st.leader_http, o.topic, p,
                                              o.channel_for(""))
                    for p, st in snap.partitions.items()}

    return tc.call(run())


def batch_sizes(*queries: Any) -> list[int]:
    return [int(p["numInputRows"]) for q in queries for p in q.recentProgress]


def test_stream_restart_exactly_once_with_limit(spark: Any, youzan_cluster: ThreadedCluster,
                                                tmp_path: Path) -> None:
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, "sp_restart", partition_num=2, replica=1,
            channels=["app"])
    first = [f"r{i}".encode() for i in range(200)]
    publish(tc, "sp_restart", 0, first[:150])
    publish(tc, "sp_restart", 1, first[150:])
    o = opts(tc, "sp_restart", startingOffsets="earliest", maxMessagesPerTrigger=120)
    q1 = start_stream(spark, o, tmp_path, available_now=False)
    wait_rows(q1, 120)
    q1.stop()
    second = [f"s{i}".encode() for i in range(100)]
    publish(tc, "sp_restart", 0, second[:20])
    publish(tc, "sp_restart", 1, second[20:])
    q2 = run_available_now(spark, o, tmp_path)
    got = bodies(spark, tmp_path)
    assert Counter(got) == Counter(first + second), "every message exactly once"
    sizes = batch_sizes(q1, q2)
    assert sizes and max(sizes) <= 120, sizes
    # the second run resumed from the checkpoint, it did not start over
    assert sum(batch_sizes(q2)) == len(first) + len(second) - sum(batch_sizes(q1))
    # commit moved the query's private channel to the committed end (lag shows truthfully)
    assert channel_positions(tc, o) == {p: s.end for p, s in
                                        tc.call(snapshot(parse(o))).partitions.items()}


def test_stream_starting_positions(spark: Any, youzan_cluster: ThreadedCluster,
                                   tmp_path: Path) -> None:
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, "sp_start", partition_num=2, replica=1, channels=["app"])
    early = publish(tc, "sp_start", 0, [f"a{i}".encode() for i in range(10)], traced=True)
    publish(tc, "sp_start", 1, [b"a-p1"])
    # the server's timestamp search has whole-second resolution: a second apart
    time.sleep(1.1)
    stamp = int(time.time())
    time.sleep(0.05)
    publish(tc, "sp_start", 0, [b"b0"])
    publish(tc, "sp_start", 1, [b"b1"])

    latest = tmp_path / "latest"
    run_available_now(spark, opts(tc, "sp_start", startingOffsets="latest"), latest)
    assert bodies(spark, latest) == []
    publish(tc, "sp_start", 1, [b"c1"])
    run_available_now(spark, opts(tc, "sp_start", startingOffsets="latest"), latest)
    assert bodies(spark, latest) == [b"c1"]

    given = json.dumps({"0": early[7].offset, "1": -1})
    js = tmp_path / "json"
    run_available_now(spark, opts(tc, "sp_start", startingOffsets=given), js)
    assert sorted(bodies(spark, js)) == [b"a7", b"a8", b"a9", b"b0"]

    ts = tmp_path / "ts"
    run_available_now(spark, opts(tc, "sp_start", startingTimestamp=stamp), ts)
    assert sorted(bodies(spark, ts)) == [b"b0", b"b1", b"c1"]


def test_stream_survives_leader_move(spark: Any, youzan_cluster: ThreadedCluster,
                                     tmp_path: Path) -> None:
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, "sp_move", partition_num=2, replica=1, channels=["app"])
    first = [f"m{i}".encode() for i in range(300)]
    publish(tc, "sp_move", 0, first[:150])
    publish(tc, "sp_move", 1, first[150:])
    # split ranges too: every partition's range is read as two pieces on their own channels
    q = start_stream(spark, opts(tc, "sp_move", startingOffsets="earliest", minPartitions=4),
                     tmp_path, available_now=False)
    try:
        wait_rows(q, 300)
        before = tc.sync(tc.cluster.leader, "sp_move", 0)
        after = tc.sync(tc.cluster.move_leader, "sp_move", 0)
        assert before != after
        second = [f"n{i}".encode() for i in range(300)]
        publish(tc, "sp_move", 0, second[:200])
        publish(tc, "sp_move", 1, second[200:])
        wait_rows(q, 600)
    finally:
        q.stop()
    assert Counter(bodies(spark, tmp_path)) == Counter(first + second)
    # the pieces' channels are gone; only the query's own channel stays
    left = {c for node in tc.cluster.nodes for p in (0, 1)
            for c in node.store.partition("sp_move", p).channels}
    assert left == {"app", parse(opts(tc, "sp_move", startingOffsets="earliest",
                                      minPartitions=4)).channel_for("")}


def test_fail_on_data_loss_both_ways(spark: Any, youzan_cluster: ThreadedCluster,
                                     tmp_path: Path) -> None:
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, "sp_loss", partition_num=1, replica=1, channels=["app"])
    publish(tc, "sp_loss", 0, [f"old{i}".encode() for i in range(50)])
    o = opts(tc, "sp_loss", startingOffsets="earliest")
    run_available_now(spark, o, tmp_path)
    # the topic is recreated: the checkpointed position lies beyond the new queue's end
    tc.sync(tc.cluster.delete_topic, "sp_loss")
    tc.sync(tc.cluster.create_topic, "sp_loss", partition_num=1, replica=1, channels=["app"])
    publish(tc, "sp_loss", 0, [b"new0", b"new1"])
    q = start_stream(spark, o, tmp_path, available_now=True)
    with pytest.raises(Exception, match="failOnDataLoss"):
        q.awaitTermination(WAIT)
    run_available_now(spark, {**o, "failOnDataLoss": "false"}, tmp_path)
    got = bodies(spark, tmp_path)
    assert Counter(got) == Counter([f"old{i}".encode() for i in range(50)] + [b"new0", b"new1"])


def test_batch_read_of_a_range(spark: Any, youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, "sp_batch", partition_num=2, replica=1,
            channels=["app"])
    p0 = publish(tc, "sp_batch", 0, [f"x{i}".encode() for i in range(40)], traced=True)
    publish(tc, "sp_batch", 1, [f"y{i}".encode() for i in range(10)])
    df = (spark.read.format("nsq")
          .options(**opts(tc, "sp_batch", startingOffsets=json.dumps({"0": p0[10].offset,
                                                                       "1": -2}),
                          endingOffsets=json.dumps({"0": p0[30].offset, "1": -1}),
                          minPartitions=4))
          .load())
    assert df.rdd.getNumPartitions() >= 4
    rows = df.select("body", "partition", "offset", "trace_id", "topic").collect()
    got = sorted(bytes(r.body) for r in rows)
    assert got == sorted([f"x{i}".encode() for i in range(10, 30)] +
                         [f"y{i}".encode() for i in range(10)])
    by_body = {bytes(r.body): r for r in rows}
    assert by_body[b"x12"].offset == p0[12].offset and by_body[b"x12"].trace_id == 13
    assert by_body[b"x12"].partition == 0 and by_body[b"x12"].topic == "sp_batch"
    # non-destructive: the same range again gives the same rows
    assert sorted(bytes(r.body) for r in df.select("body").collect()) == got


def test_stock_stream_at_least_once_across_restart(spark: Any, stock_cluster: ThreadedCluster,
                                                   tmp_path: Path) -> None:
    tc = stock_cluster
    tc.sync(tc.cluster.create_topic, "sp_stock", channels=["spark_q"])
    first = [f"k{i}".encode() for i in range(300)]
    publish(tc, "sp_stock", None, first)
    # a short message timeout: what the stopped run held comes back within seconds
    o = opts(tc, "sp_stock", channel="spark_q", maxMessagesPerTrigger=200,
             messageTimeoutSeconds=2)
    q1 = start_stream(spark, o, tmp_path, available_now=False)
    wait_rows(q1, 200)
    q1.stop()
    second = [f"l{i}".encode() for i in range(100)]
    publish(tc, "sp_stock", None, second)
    q2 = start_stream(spark, o, tmp_path, available_now=False)
    try:
        deadline = time.monotonic() + WAIT
        while not set(first + second) <= set(bodies(spark, tmp_path)):
            assert q2.exception() is None, q2.exception()
            assert time.monotonic() < deadline, "messages lost"
            q2.awaitTermination(1.0)
    finally:
        q2.stop()
    got = Counter(bodies(spark, tmp_path))
    assert set(got) == set(first + second), "nothing lost"
    duplicates = sum(n - 1 for n in got.values())
    print(f"stock at-least-once: {len(got)} distinct, {duplicates} duplicates after restart")
    assert max(batch_sizes(q1, q2)) <= 200


def test_stock_batch_read_needs_consume(spark: Any, stock_cluster: ThreadedCluster) -> None:
    tc = stock_cluster
    tc.sync(tc.cluster.create_topic, "sp_stockb", channels=["drain"])
    publish(tc, "sp_stockb", None, [f"d{i}".encode() for i in range(30)])
    with pytest.raises(Exception, match="option consume"):
        spark.read.format("nsq").options(**opts(tc, "sp_stockb", channel="drain")).load() \
            .collect()
    df = spark.read.format("nsq").options(**opts(
        tc, "sp_stockb", channel="drain", consume="true", maxMessages=20,
        maxWaitSeconds=10)).load()
    assert len(df.collect()) == 20


@pytest.mark.parametrize(("options", "named"), [
    ({"lookupd": "127.0.0.1:4161", "topic": "t", "startingOffset": "earliest"},
     "unknown option 'startingoffset'"),
    ({"lookupd": "127.0.0.1:4161", "topic": "t", "startingOffsets": "{0: 1}"},
     "option startingOffsets='{0: 1}': not valid JSON"),
    ({"lookupd": "127.0.0.1:4161"}, "option topic is required"),
    ({"lookupd": "127.0.0.1:4161", "topic": "t", "maxMessagesPerTrigger": "0"},
     "option maxMessagesPerTrigger='0'"),
])
def test_bad_options_fail_the_query_naming_the_option(spark: Any, options: dict[str, str],
                                                      named: str) -> None:
    with pytest.raises(Exception, match=named):
        spark.read.format("nsq").options(**options).load().collect()
    # a stream checks the same way, at load() (before: at start(), in the query's thread)
    with pytest.raises(Exception, match=named):
        spark.readStream.format("nsq").options(**options).load()

