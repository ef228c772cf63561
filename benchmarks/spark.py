"""Rows/s of the Spark sink and the youzan source, beside the hand-written ways users have today.

On local Spark (``local[2]``) or a Spark standalone cluster (``--master spark://HOST:PORT``, or
``--workers 1 2``: a master and that many one-core workers started here from pyspark's
``spark-class`` by ``tests/spark/cluster.py``, one table per count), 100-byte bodies, topics of
1 and 4 partitions:

* sink: ``df.write.format("nsq")`` (batch) and ``df.writeStream.format("nsq")`` (a parquet
  directory read as a stream, ``availableNow``), against a ``foreachPartition`` that publishes
  with gnsq ``multipublish`` in batches of 500 to the partition-0 leader (what users write:
  gnsq knows no partitions, so on youzan that is one partition). Beside them: the sink with a
  ``shard_key`` column (its MPUBs pipelined per partition), and the floor of any Python data
  source sink, an Arrow writer that only counts its rows (what Spark itself costs per query:
  planning and commit workers on the driver, task launch, rows to Arrow to the Python worker).
* source: ``spark.read.format("nsq")`` (batch, counted) and ``spark.readStream.format("nsq")``
  (``availableNow`` into the ``noop`` sink), against a driver-side gnsq consumer collecting the
  messages into a list, then ``createDataFrame`` and ``count`` (one partition: gnsq's plain SUB
  reads partition 0 only).

Against a real youzan cluster with ``--lookupd HOST:PORT`` (e.g. ``../shared/realnsq``'s
``start-youzan.sh 4``); without it an embedded youzan cluster (4 nodes) on a thread of this
process (Spark's Python workers are other processes). On a standalone cluster the executors run
the packed environment of the Spark guide's cluster deployment (``tests/spark/cluster.py``'s,
with gnsq added for the hand-written ways), and this process, the driver, works in a directory
where that archive is unpacked. Spark start-up and the DataFrame's
generation are outside the timings, and every way runs once on a small topic first (Python
worker start-up and imports cost seconds here). Prints one table.

The ``repos`` column sums the youzan source's repositions over the run's range reads (each
read appends its figures to a file named by ``SMARTNSQ_SPARK_READ_STATS``, set here before
Spark starts so the executors inherit it): normally 0, one per positioning beyond the first.

Usage: python benchmarks/spark.py [--lookupd HOST:PORT] [--rows 200000] [--partitions 1 4]
       [--repeat 2] [--sides sink source] [--master URL | --workers 1 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import aiohttp
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from smartnsq.devcluster import DevCluster
from smartnsq.spark import register
from smartnsq.spark.env import java_missing_reason, prepare_spark_environment
from smartnsq.spark.source_youzan import READ_STATS_ENV
from tests.real_servers import HTTP_TIMEOUT, Topic, YouzanCluster
from tests.spark.cluster import (
    DRIVER_PYTHON,
    ENV_NAME,
    StandaloneCluster,
    packed_environment,
    spark_home,
    unpack,
)

T = TypeVar("T")
BODY_SIZE = 100
HAND_BATCH = 500
#: distinct shard keys of the shard_key way
SHARD_KEYS = 1000
CHANNEL = "bench"


class Loop:
    """An event loop on a background thread for the cluster and HTTP administration."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Row:
    side: str
    way: str
    partitions: int
    rows: int
    seconds: float
    #: repositions of the source's range reads (None: not a source way of this library)
    repositions: int | None = None

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t0


def gnsq_publish_partition(addr: str, topic: str) -> Callable[[Any], None]:
    """The hand-written sink: a function for ``foreachPartition``."""

    def publish(rows: Any) -> None:
        import gnsq

        producer = gnsq.Producer(nsqd_tcp_addresses=[addr])
        producer.start()
        batch: list[bytes] = []
        for r in rows:
            batch.append(bytes(r.value))
            if len(batch) == HAND_BATCH:
                producer.multipublish(topic, batch)
                batch = []
        if batch:
            producer.multipublish(topic, batch)
        producer.close()
        producer.join(timeout=5)

    return publish


def gnsq_collect(addr: str, topic: str, count: int, timeout: float = 300) -> list[tuple[bytes]]:
    """The hand-written source: a driver-side gnsq consumer collecting ``count`` bodies."""
    import gevent
    import gevent.event
    import gnsq

    got: list[tuple[bytes]] = []
    done = gevent.event.Event()
    consumer = gnsq.Consumer(topic, CHANNEL, nsqd_tcp_addresses=[addr], max_in_flight=2500)

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        got.append((message.body,))
        if len(got) >= count:
            done.set()

    consumer.start(block=False)
    done.wait(timeout)
    consumer.close()
    gevent.sleep(0.1)
    return got


class ReadStats:
    """The figures the executors' range reads append to a file (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        open(path, "w").close()
        os.environ[READ_STATS_ENV] = path
        self._seen = 0

    def since_last(self) -> tuple[int, str]:
        """Repositions of the reads since the last call, and what the reads took in their
        tasks (count, seconds, CPU seconds, summed over the tasks)."""
        with open(self.path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        new, self._seen = [json.loads(x) for x in lines[self._seen:]], len(lines)
        repos = sum(int(d["repositions"]) for d in new)
        secs = sum(float(d.get("seconds", 0.0)) for d in new)
        cpu = sum(float(d.get("cpu", 0.0)) for d in new)
        return repos, f"{len(new)} reads {secs:.2f} s in tasks, {cpu:.2f} s CPU"


class CountWriter(DataSourceArrowWriter):
    """The floor of a Python data source sink: takes the Arrow batches, counts their rows."""

    def write(self, iterator: Any) -> WriterCommitMessage:
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()

    def commit(self, messages: Any) -> None:
        pass


class CountSink(DataSource):
    """``format("bench_count")``; defined here, so Spark pickles it by value to the workers."""

    @classmethod
    def name(cls) -> str:
        return "bench_count"

    def writer(self, schema: Any, overwrite: bool) -> CountWriter:
        return CountWriter()


def spark_session(master: str, archive: str | None, stats_path: str) -> Any:
    """local[2], or a standalone cluster's master with the packed environment shipped to the
    executors (the guide's recipe: this process works where ``archive`` is unpacked)."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("smartnsq-spark-bench")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "2g"))
    if archive is not None:
        builder = (builder.config("spark.archives", f"{archive}#{ENV_NAME}")
                   .config("spark.executor.memory", "512m")
                   .config(f"spark.executorEnv.{READ_STATS_ENV}", stats_path))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(CountSink)
    return spark


def run(args: argparse.Namespace, master: str, archive: str | None) -> list[Row]:
    stats_dir = tempfile.mkdtemp(prefix="smartnsq-spark-bench-stats-")
    stats = ReadStats(os.path.join(stats_dir, "reads.jsonl"))
    spark = spark_session(master, archive, stats.path)
    # executors registered (the driver's own block manager is in the count too)
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    bg = Loop()
    tmp = tempfile.mkdtemp(prefix="smartnsq-spark-bench-")
    cluster: DevCluster | None = None
    session = bg.call(_session())
    try:
        if args.lookupd:
            target = YouzanCluster("real", args.lookupd, session)
            where = f"real youzan cluster (lookupd {args.lookupd})"
        else:
            cluster = DevCluster(nodes=4, flavour="youzan")
            bg.call(cluster.start())
            target = YouzanCluster("double", cluster.lookupd_http_addresses[0], session, cluster)
            where = "embedded youzan cluster (4 nodes, on a thread of the driver process)"
        print(f"target: {where}; {args.rows} rows of {BODY_SIZE}-byte bodies in 2 Spark "
              f"partitions, {master}"
              + (f" ({executors} executor(s))" if master.startswith("spark://") else ""),
              flush=True)
        n = args.rows
        df = spark.range(0, n, 1, numPartitions=2).selectExpr(
            f"cast(repeat('x', {BODY_SIZE}) as binary) as value",
            f"cast(id % {SHARD_KEYS} as string) as shard_key").cache()
        assert df.count() == n
        src = os.path.join(tmp, "input")
        df.select("value").write.parquet(src)
        lookupd = target.lookupd
        rows: list[Row] = []

        def add(side: str, way: str, parts: int, fn: Callable[[], int]) -> None:
            stats.since_last()
            count, secs = timed(fn)
            repos: int | None = None
            note = ""
            if way.startswith("nsq source"):
                repos, reads = stats.since_last()
                note = f"  repositions {repos}; {reads}"
            r = Row(side, way, parts, count, secs, repos)
            rows.append(r)
            print(f"  {side:6} {way:44} p={parts}  {count:>8} rows  {secs:7.2f} s  "
                  f"{r.rate:>10,.0f} rows/s{note}", flush=True)

        def ways(t: Topic, hand: Topic, frame: Any, path: str, count: int,
                 tag: str) -> dict[str, Callable[[], int]]:
            """Each way as a function; ``tag`` keeps checkpoints apart."""

            def sink_batch() -> int:
                frame.select("value").write.format("nsq").mode("append") \
                    .option("lookupd", lookupd).option("topic", t.name).save()
                return count

            def sink_sharded() -> int:
                frame.write.format("nsq").mode("append").option("lookupd", lookupd) \
                    .option("topic", t.name).save()
                return count

            def floor() -> int:
                frame.select("value").write.format("bench_count").mode("append").save()
                return count

            def sink_stream() -> int:
                q = (spark.readStream.schema("value binary").parquet(path)
                     .writeStream.format("nsq").option("lookupd", lookupd)
                     .option("topic", t.name)
                     .option("checkpointLocation", os.path.join(tmp, f"ck-sink-{tag}"))
                     .trigger(availableNow=True).start())
                q.awaitTermination(600)
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))
                return sum(p["numInputRows"] for p in q.recentProgress)

            def hand_sink() -> int:
                frame.select("value").foreachPartition(
                    gnsq_publish_partition(hand.leaders[0].tcp, hand.name))
                return count

            def hand_sink_stream() -> int:
                publish = gnsq_publish_partition(hand.leaders[0].tcp, hand.name)

                def each(batch: Any, batch_id: int) -> None:
                    batch.foreachPartition(publish)

                q = (spark.readStream.schema("value binary").parquet(path)
                     .writeStream.foreachBatch(each)
                     .option("checkpointLocation", os.path.join(tmp, f"ck-hand-{tag}"))
                     .trigger(availableNow=True).start())
                q.awaitTermination(600)
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))
                return sum(p["numInputRows"] for p in q.recentProgress)

            def source_batch() -> int:
                return int(spark.read.format("nsq").option("lookupd", lookupd)
                           .option("topic", t.name).load().count())

            def source_stream() -> int:
                q = (spark.readStream.format("nsq").option("lookupd", lookupd)
                     .option("topic", t.name).option("startingOffsets", "earliest").load()
                     .writeStream.format("noop")
                     .option("checkpointLocation", os.path.join(tmp, f"ck-src-{tag}"))
                     .trigger(availableNow=True).start())
                q.awaitTermination(600)
                if q.exception() is not None:
                    raise RuntimeError(str(q.exception()))
                return sum(p["numInputRows"] for p in q.recentProgress)

            def hand_source() -> int:
                # both hand-written sinks filled the channel: read what one of them wrote
                got = gnsq_collect(hand.leaders[0].tcp, hand.name, count)
                return int(spark.createDataFrame(got, "value binary").count())

            return {"sink_batch": sink_batch, "sink_sharded": sink_sharded, "floor": floor,
                    "sink_stream": sink_stream, "hand_sink": hand_sink,
                    "hand_sink_stream": hand_sink_stream, "source_batch": source_batch,
                    "source_stream": source_stream, "hand_source": hand_source}

        # warm-up: every way once on a small topic, so that Python worker start-up and the
        # imports in the workers (seconds on this machine) are outside every timing
        warm_n = 2000
        warm_df = spark.range(0, warm_n, 1, numPartitions=2).selectExpr(
            f"cast(repeat('x', {BODY_SIZE}) as binary) as value",
            f"cast(id % {SHARD_KEYS} as string) as shard_key").cache()
        warm_src = os.path.join(tmp, "warm")
        warm_df.select("value").write.parquet(warm_src)
        warm: Topic = bg.call(target.create_topic("bench_warm", 1, 1, channels=(CHANNEL,)))
        if "sink" not in args.sides:
            # the source ways read what the sink ways wrote: publish it instead
            bg.call(fill(lookupd, warm.name, warm_n))
        for name, fn in ways(warm, warm, warm_df, warm_src, warm_n, "warm").items():
            if ("source" if "source" in name else "sink") in args.sides:
                fn()
        print("warmed up", flush=True)

        for parts in args.partitions:
            topic: Topic = bg.call(target.create_topic("bench_sink", parts, 1,
                                                       channels=(CHANNEL,)))
            hand: Topic = bg.call(target.create_topic("bench_hand", 1, 1, channels=(CHANNEL,)))
            if "sink" not in args.sides:
                # both source ways read the nsq topic, the hand way the hand topic's channel
                # (which both hand-written sinks would have filled): publish instead
                bg.call(fill(lookupd, topic.name, n * args.repeat))
            for rep in range(args.repeat):
                if "sink" not in args.sides:
                    # the hand way consumes: exactly this repeat's rows, as gnsq goes on
                    # delivering while it closes and would take a later repeat's too
                    bg.call(fill(lookupd, hand.name, n))
                # the ways interleaved, so that each repeat sees the same machine load
                w = ways(topic, hand, df, src, n, f"p{parts}r{rep}")
                if "sink" in args.sides:
                    add("sink", "nsq sink, batch (df.write)", parts, w["sink_batch"])
                    add("sink", "nsq sink, batch, shard_key column", parts, w["sink_sharded"])
                    add("sink", "nsq sink, streaming (availableNow)", parts, w["sink_stream"])
                    if parts == 1:
                        add("sink", "floor: Python Arrow writer, counts only", parts,
                            w["floor"])
                        add("sink", f"hand: foreachPartition gnsq MPUB {HAND_BATCH}", parts,
                            w["hand_sink"])
                        add("sink", "hand: foreachBatch→foreachPartition gnsq", parts,
                            w["hand_sink_stream"])
                if "source" in args.sides:
                    add("source", "nsq source, batch (count)", parts, w["source_batch"])
                    add("source", "nsq source, streaming (availableNow→noop)", parts,
                        w["source_stream"])
                    if parts == 1:
                        add("source", "hand: driver gnsq consumer→createDataFrame", parts,
                            w["hand_source"])
        return rows
    finally:
        try:
            bg.call(target.cleanup())
        except Exception as exc:  # cleanup is best effort: report, do not mask the run
            print(f"topic cleanup failed: {exc}", file=sys.stderr)
        bg.call(session.close())
        if cluster is not None:
            bg.call(cluster.stop())
        bg.close()
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(stats_dir, ignore_errors=True)


async def fill(lookupd: str, topic: str, n: int) -> None:
    """Publish ``n`` bodies of BODY_SIZE bytes round-robin over the topic's partitions."""
    from smartnsq.producer import Producer

    body = b"x" * BODY_SIZE
    async with Producer(lookupd=[lookupd]) as p:
        for i in range(0, n, HAND_BATCH):
            await p.publish_many(topic, [body] * min(HAND_BATCH, n - i))


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=HTTP_TIMEOUT)


def print_table(rows: list[Row]) -> None:
    """The best of the repeats per (side, way, partitions), and each repeat's rate."""
    best: dict[tuple[str, str, int], list[Row]] = {}
    for r in rows:
        best.setdefault((r.side, r.way, r.partitions), []).append(r)
    def mode(way: str) -> str:
        return "stream" if "stream" in way or "foreachBatch" in way else "batch"

    # each way against the hand-written way of its side and mode (the source has one)
    hand = {(side, mode(way)): max(x.rate for x in rs) for (side, way, _), rs in best.items()
            if way.startswith("hand")}
    print()
    print(f"{'side':6} {'way':44} {'parts':>5} {'rows':>8} {'best rows/s':>11} {'× hand':>7}"
          f" {'repos':>5}  every repeat")
    for (side, way, parts), rs in sorted(best.items(), key=lambda kv: (kv[0][0] == "source",
                                                                     kv[0][2], kv[0][1])):
        top = max(rs, key=lambda x: x.rate)
        ref = hand.get((side, mode(way))) or hand.get((side, "batch"))
        ratio = top.rate / ref if ref else 0.0
        every = " ".join(f"{x.rate:,.0f}" for x in rs)
        counted = [x.repositions for x in rs if x.repositions is not None]
        repos = str(sum(counted)) if counted else "-"
        print(f"{side:6} {way:44} {parts:>5} {top.rows:>8} {top.rate:>11,.0f} "
              f"{ratio:>6.1f}× {repos:>5}  {every}")
    print("\nrepos: the source's repositions, summed over the repeats (0: each range read "
          "positioned once)")
    print("target: the nsq sink and source each >= 3× the hand-written way; the source "
          "scaling with partitions")


def cluster_driver() -> str:
    """Make this process a cluster driver as the Spark guide's recipe does: the packed
    environment (with gnsq for the hand-written ways) unpacked in a fresh working directory,
    the workers' Python named relative to it. Returns the archive for ``spark.archives``.
    Before the first SparkSession: Spark's JVM keeps the directory it started in."""
    env = packed_environment("bench", extra=("gnsq>=1.0",))
    print(f"packed executor environment {env.archive.name}: "
          f"{env.archive.stat().st_size / 2**20:.0f} MiB"
          + (f", built in {env.seconds:.0f} s" if env.seconds else ""), flush=True)
    work = Path(tempfile.mkdtemp(prefix="smartnsq-spark-bench-driver-"))
    unpack(env.archive, work)
    os.chdir(work)
    for name in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON"):
        os.environ.pop(name, None)
    os.environ.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(spark_home()),
                      PYSPARK_PYTHON=DRIVER_PYTHON)
    return str(env.archive)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lookupd", help="HOST:PORT of a real youzan nsqlookupd's HTTP port "
                    "(default: an embedded youzan cluster)")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs of every way per partition count; the table shows the best")
    ap.add_argument("--sides", nargs="+", choices=("sink", "source"),
                    default=["sink", "source"],
                    help="which side's ways to run (source alone publishes its input)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--master", default="local[2]",
                       help="local[N], or spark://HOST:PORT of a standalone cluster whose "
                       "workers run on this machine (default local[2])")
    where.add_argument("--workers", type=int, nargs="+",
                       help="start a standalone cluster with this many one-core workers "
                       "(tests/spark/cluster.py) and run the table on it; one table per count")
    args = ap.parse_args()
    if args.rows <= 0 or args.repeat <= 0 or any(p <= 0 for p in args.partitions) or \
            any(w <= 0 for w in args.workers or ()):
        ap.error("--rows, --repeat, --partitions and --workers must be positive")
    reason = java_missing_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    if args.workers is None and not args.master.startswith("spark://"):
        prepare_spark_environment()
        print_table(run(args, args.master, None))
        return 0
    archive = cluster_driver()
    if args.workers is None:
        print_table(run(args, args.master, archive))
        return 0
    for n in args.workers:
        cluster = StandaloneCluster(Path(tempfile.mkdtemp(prefix="smartnsq-spark-bench-sa-")))
        try:
            cluster.start(workers=n)
            print(f"\n== standalone cluster: {n} one-core worker(s) at {cluster.url}, up in "
                  f"{cluster.started_in:.1f} s; load average {os.getloadavg()[0]:.2f} ==",
                  flush=True)
            print_table(run(args, cluster.url, archive))
        finally:
            cluster.stop()
            shutil.rmtree(cluster.base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
