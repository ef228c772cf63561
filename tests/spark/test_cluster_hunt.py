"""The nsq source and sink on a Spark standalone cluster under what a data team's pipeline
meets: a Python worker killed inside a sink task (shard keys under the java rule), a driver
killed inside a micro-batch and restarted from its checkpoint, a topic with more partitions
than executor cores, and a lookupd address only the driver can resolve.

The drivers run in their own process as in test_cluster_youzan.py (``make
test-spark-cluster``: ``SMARTNSQ_SPARK_CLUSTER=1`` and a real youzan lookupd in
``SMARTNSQ_REAL_YOUZAN_LOOKUPD``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.spark.cluster import (
    ENV_NAME,
    TEST_SECONDS,
    driver_args,
    driver_env,
    driver_session,
    run_driver,
    unpack,
)

pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(TEST_SECONDS)]

KEYS = 12
SINK_ROWS = 400_000
#: seconds into the read-back when its Python workers are killed
READ_KILL_AFTER = 3.0
PARTITIONS = 3
STREAM_ROWS = 3000  # per partition
PER_TRIGGER = 900
#: the most partitions of the many-partition topic: one per nsqd, as youzan places them with
#: replicator 1 (`make test-spark-cluster` starts 3: still more than the cluster's 2 cores)
MANY = 8
MANY_ROWS = 1000  # per partition
#: a lookupd host name only the driver's interpreter resolves (tests its planning workers)
DRIVER_ONLY_HOST = "nsq-driver-only"


# --- helpers run inside the drivers -----------------------------------------------------

def python_workers(worker_dir: Path) -> list[int]:
    """The pids of the Python workers (children of pyspark's daemon) that run in the
    executors of a Spark worker's directory."""
    procs: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmd = (entry / "cmdline").read_bytes()
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if cwd.startswith(str(worker_dir)) and b"pyspark" in cmd:
            procs[int(entry.name)] = ppid
    return [pid for pid, ppid in procs.items() if ppid in procs]


def stored(lookupd: str, topic: str) -> int:
    """How many messages the leaders of ``topic`` hold (their ``/stats``)."""
    def get(url: str) -> Any:
        with urllib.request.urlopen(url, timeout=2) as answer:
            doc = json.load(answer)
        return doc.get("data", doc)

    total = 0
    leaders = get(f"http://{lookupd}/lookup?topic={topic}&access=r")["partitions"]
    for p, node in leaders.items():
        stats = get(f"http://127.0.0.1:{node['http_port']}/stats?format=json&topic={topic}")
        total += sum(int(t.get("message_count", 0)) for t in stats.get("topics") or ()
                     if str(t.get("topic_partition")) == p)
    return total


def kill_when(ready: Any, worker_dirs: list[Path], stop: threading.Event,
              killed: list[int]) -> None:
    """Until ``stop``: once ``ready()``, SIGKILL the executors' Python workers (the
    executors' logs come too late to tell which ones run a task)."""
    deadline = time.monotonic() + 120
    while not stop.is_set() and time.monotonic() < deadline:
        if ready():
            for pid in [p for d in worker_dirs for p in python_workers(d)]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            return
        stop.wait(0.05)


# --- the drivers ------------------------------------------------------------------------

def _killing(args: dict[str, Any], ready: Any, action: Any) -> list[int]:
    """Run ``action()`` while a thread kills the executors' Python workers once ``ready()``;
    the pids killed."""
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=kill_when, args=(
        ready, [Path(d) for d in args["worker_dirs"]], stop, killed))
    killer.start()
    try:
        action()
    finally:
        stop.set()
        killer.join()
    return killed


def drive_sink_killed(args: dict[str, Any]) -> dict[str, Any]:
    """Rows with shard keys (java rule) in order within their task, written while the
    executors' Python workers are killed; then read back on the executors, killed again."""
    import smartnsq.spark

    spark = driver_session(args)
    smartnsq.spark.register(spark)
    # Spark hands a Python sink its task's rows once they are all computed: tasks big
    # enough to publish for seconds are killed while they publish
    df = (spark.range(SINK_ROWS, numPartitions=2)
          .selectExpr(f"concat('k', cast(id % {KEYS} as string)) as shard_key", "id")
          .repartition(2, "shard_key").sortWithinPartitions("id")
          .selectExpr("shard_key",
                      "format_string('%s:%07d:%s', shard_key, id, repeat('x', 200)) as value"))
    out: dict[str, Any] = {"killed_at": 0}

    def publishing() -> bool:
        out["killed_at"] = stored(args["lookupd"], args["topic"])
        return bool(out["killed_at"] >= SINK_ROWS // 10)

    def write() -> None:
        # on this thread: a thread without an active session does not find Python sinks
        (df.write.format("nsq").mode("append")
         .options(lookupd=args["lookupd"], topic=args["topic"], shardHash="java",
                  deterministicTraceIds="true", traceBatchId="7").save())

    began = time.monotonic()
    out["write_killed"] = _killing(args, publishing, write)
    out["write_seconds"] = round(time.monotonic() - began, 1)
    out["stored"] = stored(args["lookupd"], args["topic"])
    (spark.read.format("nsq").options(lookupd=args["lookupd"], topic=args["topic"],
                                      minPartitions="6").load()
     .selectExpr("partition", "offset", "trace_id", "split(cast(body as string), ':') as f")
     .selectExpr("partition", "offset", "trace_id", "f[0] as k", "cast(f[1] as long) as seq")
     .createOrReplaceTempView("got"))
    spark.createDataFrame(list(zip(args["keys"], args["want_partition"], strict=True)),
                          "k string, want int").createOrReplaceTempView("want")
    checks = spark.sql("""
        WITH last AS (SELECT k, seq, max(offset) AS at, count(DISTINCT trace_id) AS traces
                      FROM got GROUP BY k, seq),
             ordered AS (SELECT seq, lag(seq) OVER (PARTITION BY k ORDER BY at) AS prev
                         FROM last)
        SELECT (SELECT count(*) FROM got) AS messages,
               (SELECT count(*) FROM last) AS distinct_rows,
               (SELECT count(*) FROM got JOIN want USING (k) WHERE partition != want)
                   AS misplaced,
               (SELECT count(*) FROM last WHERE traces > 1) AS mixed_traces,
               (SELECT count(*) FROM ordered WHERE seq < prev) AS out_of_order,
               (SELECT min(seq) FROM last) AS first_seq, (SELECT max(seq) FROM last) AS last_seq
        """)
    reading = time.monotonic() + READ_KILL_AFTER

    def check() -> None:
        out.update(checks.collect()[0].asDict())

    out["read_killed"] = _killing(args, lambda: time.monotonic() > reading, check)
    spark.stop()
    return out


def drive_stream(args: dict[str, Any]) -> dict[str, Any]:
    """A checkpointed stream into Parquet, in batches of PER_TRIGGER messages. ``crash``:
    the driver kills itself (SIGKILL) while a batch runs, after two were done; else the
    stream runs until nothing is left (availableNow) and the output is read back."""
    from pyspark.sql import functions as sf

    import smartnsq.spark

    spark = driver_session(args)
    smartnsq.spark.register(spark)

    def pause(body: str) -> str:
        time.sleep(0.001)  # a batch's tasks last about half a second each
        return body

    slow = sf.udf(pause, "string")
    writer = (spark.readStream.format("nsq")
              .options(lookupd=args["lookupd"], topic=args["topic"],
                       startingOffsets="earliest", maxMessagesPerTrigger=str(PER_TRIGGER),
                       **args.get("options", {}))
              .load().select(slow(sf.col("body").cast("string")).alias("b"), "partition",
                             "offset")
              .writeStream.format("parquet").option("path", args["out"])
              .option("checkpointLocation", args["checkpoint"]))
    if args.get("crash"):
        query = writer.trigger(processingTime="0 seconds").start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and query.exception() is None:
            if len([p for p in query.recentProgress if p["numInputRows"]]) >= 2 and \
                    query.status["isTriggerActive"]:
                time.sleep(0.3)  # inside the next batch's tasks
                os.kill(os.getpid(), signal.SIGKILL)
            query.awaitTermination(0.05)
        raise RuntimeError(f"no crash: {query.exception()} {query.recentProgress}")
    query = writer.trigger(availableNow=True).start()
    finished = query.awaitTermination(240)
    error = query.exception()
    rows = [] if not finished or error else [
        r.b for r in spark.read.parquet(args["out"]).collect()]
    batches = [int(p["numInputRows"]) for p in query.recentProgress]
    spark.stop()
    return {"finished": finished, "error": str(error) if error else None, "rows": rows,
            "batches": batches}


def drive_many(args: dict[str, Any]) -> dict[str, Any]:
    """More partitions than executor cores, split further by minPartitions: a batch read and
    a limited stream into Parquet."""
    import smartnsq.spark

    spark = driver_session(args)
    smartnsq.spark.register(spark)
    o = {"lookupd": args["lookupd"], "topic": args["topic"]}
    began = time.monotonic()
    many = args["partitions"]
    read = (spark.read.format("nsq").options(**o, minPartitions=str(3 * many)).load()
            .selectExpr("cast(body as string) as b"))
    tasks = read.rdd.getNumPartitions()
    rows = [r.b for r in read.collect()]
    read_seconds = time.monotonic() - began
    began = time.monotonic()
    query = (spark.readStream.format("nsq")
             .options(**o, startingOffsets="earliest", minPartitions=str(2 * many),
                      maxMessagesPerTrigger=str(many * MANY_ROWS // 3)).load()
             .selectExpr("cast(body as string) as b")
             .writeStream.format("parquet").option("path", args["out"])
             .option("checkpointLocation", args["checkpoint"])
             .trigger(availableNow=True).start())
    finished = query.awaitTermination(240)
    error = query.exception()
    streamed = [] if not finished or error else [
        r.b for r in spark.read.parquet(args["out"]).collect()]
    batches = [int(p["numInputRows"]) for p in query.recentProgress]
    spark.stop()
    return {"tasks": tasks, "read": rows, "read_seconds": round(read_seconds, 1),
            "finished": finished, "error": str(error) if error else None,
            "streamed": streamed, "batches": batches,
            "stream_seconds": round(time.monotonic() - began, 1)}


def _cause(exc: Exception) -> str:
    """What a user reads of a failed action: the exception lines of a Spark error."""
    lines = [ln.strip() for ln in str(exc).splitlines()]
    causes = [ln for ln in lines if "Error" in ln.split(":", 1)[0] and ln[:1] != "a"]
    return " | ".join(causes[-3:]) or lines[0]


def drive_driver_only_address(args: dict[str, Any]) -> dict[str, Any]:
    """A lookupd address only the driver's interpreter resolves: a batch read, a write."""
    import smartnsq.spark

    spark = driver_session(args)
    smartnsq.spark.register(spark)
    o = {"lookupd": args["address"], "topic": args["topic"]}
    out: dict[str, Any] = {}
    began = time.monotonic()
    try:
        out["read"] = spark.read.format("nsq").options(**o).load().count()
    except Exception as exc:
        out["read_error"] = _cause(exc)
    out["read_seconds"] = round(time.monotonic() - began, 1)
    began = time.monotonic()
    try:
        (spark.range(10).selectExpr("cast(id as string) as value").write.format("nsq")
         .mode("append").options(**o, publishTimeout="3").save())
    except Exception as exc:
        out["write_error"] = _cause(exc)
    out["write_seconds"] = round(time.monotonic() - began, 1)
    spark.stop()
    return out


# --- the tests --------------------------------------------------------------------------

def _topic(lookupd: str, prefix: str, partitions: int, replicator: int = 1) -> str:
    import aiohttp

    from tests.real_servers import HTTP_TIMEOUT, YouzanCluster

    async def create() -> str:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            yc = YouzanCluster("real", lookupd, session)
            return str((await yc.create_topic(prefix, partition_num=partitions,
                                              replicator=replicator)).name)

    return asyncio.run(create())


@pytest.fixture(scope="module")
def lookupd() -> str:
    from tests.real_servers import REAL_YOUZAN_LOOKUPD

    if not REAL_YOUZAN_LOOKUPD:
        pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD (a youzan nsqlookupd) is not set")
    return str(REAL_YOUZAN_LOOKUPD)


def _run(cluster: Any, archive: Path, tmp_path: Path, function: str,
         **args: Any) -> dict[str, Any]:
    cwd = tmp_path / "driver"
    if not cwd.exists():
        unpack(archive, cwd)
    dirs = [str(cluster.base / name) for name in cluster.worker_ui]
    try:
        return run_driver(__name__, function, driver_args(
            cluster, archive, f"smartnsq-hunt-{function}", worker_dirs=dirs,
            out=str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"), **args), cwd,
            driver_env())
    except AssertionError:
        print(cluster.executor_logs())
        raise


def test_sink_and_read_tasks_killed_keep_keys_on_their_java_partition_in_order(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    # killed while publishing, the tasks run again: every row is there, each key on its
    # java-rule partition, the last copy of each row in the key's order, and a repeat
    # carries its first copy's trace id (at-least-once, as documented); the read-back,
    # killed too, reads every stored message once
    from smartnsq.sharding import shard_partitions

    topic = _topic(lookupd, "hsink", PARTITIONS)
    keys = [f"k{i}" for i in range(KEYS)]
    got = _run(spark_standalone, spark_packed_env.archive, tmp_path, "drive_sink_killed",
               lookupd=lookupd, topic=topic, keys=keys,
               want_partition=shard_partitions(keys, PARTITIONS, "java"))
    print(f"\nsink killed at {got['killed_at']} of {SINK_ROWS} stored "
          f"({len(got['write_killed'])} Python workers): {got['stored'] - SINK_ROWS} "
          f"duplicates, write {got['write_seconds']} s; read-back killed "
          f"({len(got['read_killed'])}): {got['messages']} messages; driver "
          f"{got['driver_seconds']} s")
    assert got["write_killed"] and got["killed_at"] < SINK_ROWS, "not killed while publishing"
    assert got["read_killed"], "the read-back was not killed"
    assert got["stored"] > SINK_ROWS  # the killed tasks' rows, published again
    assert got["messages"] == got["stored"]  # the read-back: every message once
    assert got["distinct_rows"] == SINK_ROWS and (got["first_seq"], got["last_seq"]) == \
        (0, SINK_ROWS - 1)
    assert got["misplaced"] == 0 and got["mixed_traces"] == 0 and got["out_of_order"] == 0


def _fill(lookupd: str, topic: str, partitions: int, rows: int) -> None:
    from smartnsq import Producer

    async def fill() -> None:
        async with Producer(lookupd=lookupd) as p:
            for part in range(partitions):
                for i in range(0, rows, 500):
                    await p.publish_many(topic, [f"p{part}-{j}".encode()
                                                 for j in range(i, i + 500)], partition=part)

    asyncio.run(fill())


def _nodes(lookupd: str) -> int:
    with urllib.request.urlopen(f"http://{lookupd}/nodes", timeout=2) as answer:
        doc = json.load(answer)
    return len(doc.get("data", doc).get("producers") or ())


def _channels(lookupd: str, topic: str) -> dict[str, list[int]]:
    """Per channel of ``topic``: each partition's depth (messages left), from the leaders."""
    def get(url: str) -> Any:
        with urllib.request.urlopen(url, timeout=2) as answer:
            doc = json.load(answer)
        return doc.get("data", doc)

    out: dict[str, list[int]] = {}
    leaders = get(f"http://{lookupd}/lookup?topic={topic}&access=r")["partitions"]
    for p, node in sorted(leaders.items()):
        stats = get(f"http://127.0.0.1:{node['http_port']}/stats?format=json&topic={topic}")
        for t in stats.get("topics") or ():
            if str(t.get("topic_partition")) == p:
                for c in t.get("channels") or ():
                    out.setdefault(c["channel_name"], []).append(int(c.get("depth", -1)))
    return out


def test_driver_killed_inside_a_batch_restarts_from_its_checkpoint(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    topic = _topic(lookupd, "hcrash", PARTITIONS)
    _fill(lookupd, topic, PARTITIONS, STREAM_ROWS)
    archive = spark_packed_env.archive
    with pytest.raises(AssertionError, match=r"failed \(-9\)"):
        _run(spark_standalone, archive, tmp_path, "drive_stream", lookupd=lookupd,
             topic=topic, crash=True)
    after_crash = _channels(lookupd, topic)
    got = _run(spark_standalone, archive, tmp_path, "drive_stream", lookupd=lookupd,
               topic=topic)
    channels = _channels(lookupd, topic)
    print(f"\ncrash and restart: {got['batches']}, channels after the crash {after_crash}, "
          f"at the end {channels}, driver {got['driver_seconds']} s")
    assert got["finished"] and got["error"] is None, got["error"]
    want = sorted(f"p{p}-{i}" for p in range(PARTITIONS) for i in range(STREAM_ROWS))
    assert sorted(got["rows"]) == want  # exactly once across the crash
    # the query's channel stays, at the committed end (commitToChannel); its probe channel
    # (for the limited batches' ends) does not: left behind, its depth would grow with every
    # message published, forever (Spark does not call the reader's stop())
    assert [name for name in channels if name.endswith("_probe")] == [], channels
    query_channel = [name for name in channels if name.startswith("spark_")]
    assert len(query_channel) == 1 and channels[query_channel[0]] == [0] * PARTITIONS


def test_more_partitions_than_cores_split_by_min_partitions(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    many = min(MANY, _nodes(lookupd))
    topic = _topic(lookupd, "hmany", many)
    _fill(lookupd, topic, many, MANY_ROWS)
    got = _run(spark_standalone, spark_packed_env.archive, tmp_path, "drive_many",
               lookupd=lookupd, topic=topic, partitions=many)
    channels = _channels(lookupd, topic)
    print(f"\n{many} partitions: batch read in {got['tasks']} tasks, {got['read_seconds']} s; "
          f"stream {got['batches']} in {got['stream_seconds']} s; channels {channels}")
    want = sorted(f"p{p}-{i}" for p in range(many) for i in range(MANY_ROWS))
    assert got["tasks"] >= 3 * many and sorted(got["read"]) == want
    assert got["finished"] and got["error"] is None, got["error"]
    assert sorted(got["streamed"]) == want
    assert max(got["batches"]) <= many * MANY_ROWS // 3
    # the pieces' and the probe's channels are deleted; the query's own channel stays
    left = [c for c in channels if c != "ch"]
    assert len(left) == 1 and left[0].startswith("spark_") and "_" not in left[0][6:], channels


def test_lookupd_address_only_the_driver_resolves(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    topic = _topic(lookupd, "haddr", 2)
    _fill(lookupd, topic, 2, 500)
    cwd = tmp_path / "driver"
    unpack(spark_packed_env.archive, cwd)
    # the driver's copy of the environment resolves the name (its planning workers run it);
    # the executors' copies do not
    site = next((cwd / ENV_NAME / "lib").glob("python3*/site-packages"))
    # (a .pth line runs in site's namespace: the original goes in as an argument)
    (site / "driver_only_host.pth").write_text(
        "import functools, socket; socket.getaddrinfo = functools.partial(lambda g, h, *a, "
        f"**k: g('127.0.0.1' if h == {DRIVER_ONLY_HOST!r} else h, *a, **k), "
        "socket.getaddrinfo)\n")
    port = lookupd.rsplit(":", 1)[1]
    got = _run(spark_standalone, spark_packed_env.archive, tmp_path, "drive_driver_only_address",
               topic=topic, address=f"{DRIVER_ONLY_HOST}:{port}")
    print(f"\ndriver-only address: {got}")
    # the executors read at the leaders the driver planned with; a write needs the lookupd
    # there: it fails naming the address and why, within its attempts' publishTimeouts
    assert got["read"] == 1000, got
    assert f"http://{DRIVER_ONLY_HOST}:{port}: cannot connect: Name or service not known" in \
        got["write_error"], got["write_error"]
    assert got["write_seconds"] < 60
