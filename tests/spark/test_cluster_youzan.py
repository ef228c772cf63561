"""The youzan sink and source on a Spark standalone cluster (master + two one-core workers),
executors on a packed environment shipped with ``spark.archives`` — the recipe in
docs/guides/spark.md, "Cluster deployment".

Each test runs its driver in a process of its own (:func:`tests.spark.cluster.run_driver`) in
a fresh working directory, with ``PYSPARK_PYTHON=./environment/bin/python``: the executors
resolve it in their work directories, where Spark unpacks the archive; the driver's data
source planning workers resolve it in the driver's directory, where the recipe unpacks the same
archive. A worker killed and a leader moved during a stream leave its output exactly once.
Run with ``make test-spark-cluster`` (``SMARTNSQ_SPARK_CLUSTER=1`` and a real youzan
lookupd in ``SMARTNSQ_REAL_YOUZAN_LOOKUPD``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.cluster import (
    DRIVER_PYTHON,
    TEST_SECONDS,
    driver_args,
    driver_env,
    driver_session,
    packed_environment,
    run_driver,
    unfinished_tasks_in,
    unpack,
    wait_for_executors,
)

pytestmark = [pytest.mark.spark_cluster, pytest.mark.timeout(TEST_SECONDS)]

ROWS = 3000
PER_TRIGGER = 700
FAULT_ROWS = 8000
FAULT_BATCH = 500


# --- the drivers (run in their own process; they import only pyspark and smartnsq) --------

def drive_pipeline(args: dict[str, Any]) -> dict[str, Any]:
    """Sink -> batch read -> a checkpointed stream stopped and restarted; where each ran."""
    from pyspark.sql import functions as sf

    import smartnsq.spark

    spark = driver_session(args)
    smartnsq.spark.register(spark)  # checks the driver's ./environment/bin/python
    took: dict[str, float] = {}

    def executables(_: Any) -> Any:
        yield sys.executable

    t = time.monotonic()
    ran_on = spark.sparkContext.parallelize(range(4), 4).mapPartitions(executables).collect()
    o = {"lookupd": args["lookupd"], "topic": args["topic"]}
    rows = (spark.range(ROWS, numPartitions=2)
            .selectExpr("cast(id % 2 as int) as partition",
                        "concat('r', cast(id as string)) as value"))
    rows.write.format("nsq").mode("append").options(**o).save()
    took["sink"] = time.monotonic() - t

    t = time.monotonic()
    where = sf.udf(lambda _: sys.executable, "string")
    read = spark.read.format("nsq").options(**o).load()
    got = read.select(sf.col("body").cast("string").alias("b"),
                      where("body").alias("python")).collect()
    took["batch_read"] = time.monotonic() - t

    def stream(available_now: bool) -> Any:
        w = (spark.readStream.format("nsq")
             .options(**o, startingOffsets="earliest",
                      maxMessagesPerTrigger=str(PER_TRIGGER)).load()
             .select(sf.col("body").cast("string").alias("b"), "partition", "offset")
             .writeStream.format("parquet").option("path", args["out"])
             .option("checkpointLocation", args["checkpoint"]))
        return (w.trigger(availableNow=True) if available_now
                else w.trigger(processingTime="0 seconds")).start()

    t = time.monotonic()
    first = stream(False)
    deadline = time.monotonic() + 240
    while not first.recentProgress or first.recentProgress[-1]["numInputRows"] == 0:
        if first.exception() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"first stream: {first.exception()} {first.recentProgress}")
        first.awaitTermination(0.5)
    first.stop()
    rest = stream(True)
    if not rest.awaitTermination(300) or rest.exception() is not None:
        raise RuntimeError(f"restarted stream: {rest.exception()}")
    took["stream"] = time.monotonic() - t
    streamed = [r.b for r in spark.read.parquet(args["out"]).collect()]
    progress = [int(p["numInputRows"]) for p in first.recentProgress + rest.recentProgress]
    spark.stop()
    return {"driver": sys.executable, "ran_on": ran_on,
            "read": sorted(r.b for r in got), "read_on": sorted({r.python for r in got}),
            "streamed": sorted(streamed), "batches": progress,
            "took": {k: round(v, 1) for k, v in took.items()}}


def drive_register(args: dict[str, Any]) -> dict[str, Any]:
    """register(spark), then (when it passes) one write: the errors a user sees."""
    import smartnsq.spark
    from smartnsq.errors import WorkerPythonError

    spark = driver_session(args)
    try:
        smartnsq.spark.register(spark)
    except WorkerPythonError as exc:
        spark.stop()
        return {"register": str(exc)}
    try:
        (spark.createDataFrame([("x",)], ["value"]).write.format("nsq").mode("append")
         .option("lookupd", args["lookupd"]).option("topic", args["topic"]).save())
    except Exception as exc:  # what Spark raises from the executors, as the user gets it
        return {"register": None, "write": f"{type(exc).__name__}: {exc}"}
    finally:
        spark.stop()
    return {"register": None, "write": None}


def drive_faults(args: dict[str, Any]) -> dict[str, Any]:
    """A checkpointed stream over a filled topic, in small batches: a worker is killed after
    the first batch (SIGKILL; its executor goes with it) and partition 0's leader is moved
    after the third; the output is read back."""
    import signal

    import aiohttp
    from pyspark.sql import functions as sf

    import smartnsq.spark
    from tests.real_servers import HTTP_TIMEOUT, YouzanCluster

    async def move_leader() -> None:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            yc = YouzanCluster("real", args["lookupd"], session)
            _, new_id = await yc.move_leader(args["topic"], 0)
            await yc.wait_leader(args["topic"], 0, new_id)

    spark = driver_session(args)
    smartnsq.spark.register(spark)
    # with one executor up, every task of the first batches may run on the other worker and
    # the kill below finds none on the worker to kill
    wait_for_executors(spark, 2)

    def pause(body: str) -> str:
        # each of a batch's two tasks (250 rows) lasts about 0.25 s: the driver's look at the
        # worker's log finds one running there well before the stream ends
        time.sleep(0.001)
        return body

    slow = sf.udf(pause, "string")
    query = (spark.readStream.format("nsq")
             .options(lookupd=args["lookupd"], topic=args["topic"],
                      startingOffsets="earliest", maxMessagesPerTrigger=str(FAULT_BATCH),
                      minPartitions="2")
             .load().select(slow(sf.col("body").cast("string")).alias("b"))
             .writeStream.format("parquet").option("path", args["out"])
             .option("checkpointLocation", args["checkpoint"])
             .trigger(availableNow=True).start())
    app = spark.sparkContext.applicationId
    worker_dir = Path(args["worker_dir"])
    killed_after = moved_after = 0
    deadline = time.monotonic() + 400
    while query.isActive and time.monotonic() < deadline:
        done = len([p for p in query.recentProgress if p["numInputRows"]])
        # the kill lands while a task runs on that worker (per its executor's log: an active
        # stage alone may have its tasks on the other executor only)
        if done >= 1 and not killed_after and unfinished_tasks_in(worker_dir, app):
            os.kill(args["kill_pid"], signal.SIGKILL)
            killed_after = done
        elif done >= 3 and not moved_after:
            asyncio.run(move_leader())
            moved_after = done
        query.awaitTermination(0.05 if done >= 1 and not killed_after else 0.5)
    finished = query.awaitTermination(1)
    error = query.exception()
    batches = [int(p["numInputRows"]) for p in query.recentProgress]
    rows = sorted(r.b for r in spark.read.parquet(args["out"]).collect()) if finished else []
    spark.stop()
    return {"finished": finished, "error": str(error) if error else None, "rows": rows,
            "batches": batches, "killed_after": killed_after, "moved_after": moved_after,
            "app": app}


# --- the tests ------------------------------------------------------------------------------

def _topic(lookupd: str, prefix: str, partitions: int, replicator: int = 1) -> str:
    import aiohttp

    from tests.real_servers import HTTP_TIMEOUT, YouzanCluster

    async def create() -> str:
        async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as session:
            yc = YouzanCluster("real", lookupd, session)
            topic = await yc.create_topic(prefix, partition_num=partitions,
                                          replicator=replicator)
            return str(topic.name)

    return asyncio.run(create())


@pytest.fixture(scope="module")
def lookupd() -> str:
    from tests.real_servers import REAL_YOUZAN_LOOKUPD

    if not REAL_YOUZAN_LOOKUPD:
        pytest.skip("SMARTNSQ_REAL_YOUZAN_LOOKUPD (a youzan nsqlookupd) is not set")
    return str(REAL_YOUZAN_LOOKUPD)


def _args(cluster: Any, archive: Path, lookupd: str, topic: str, app: str,
          **more: Any) -> dict[str, Any]:
    return driver_args(cluster, archive, app, lookupd=lookupd, topic=topic, **more)


def test_sink_batch_read_and_stream_on_the_packed_environment(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    topic = _topic(lookupd, "sparkcl", 2)
    cwd = tmp_path / "driver"
    unpack(spark_packed_env.archive, cwd)
    try:
        got = run_driver(__name__, "drive_pipeline", _args(
            spark_standalone, spark_packed_env.archive, lookupd, topic, "smartnsq-cluster-pipeline",
            out=str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt")), cwd, driver_env())
    except AssertionError:
        print(spark_standalone.executor_logs())
        raise
    print(f"\npipeline on the cluster: {got['took']} (driver process {got['driver_seconds']} s)")
    workers = str(spark_standalone.base)
    # executors: their own Python, unpacked from the archive in the workers' directories
    for python in [*got["ran_on"], *got["read_on"]]:
        assert python.startswith(workers) and python.endswith("/environment/bin/python"), python
    assert got["driver"] != got["ran_on"][0] and sys.prefix not in got["ran_on"][0]
    assert len({p.split("/app-")[0] for p in got["ran_on"]}) == 2, got["ran_on"]  # 2 workers
    want = sorted(f"r{i}" for i in range(ROWS))
    assert got["read"] == want
    assert got["streamed"] == want  # stopped and restarted from its checkpoint: exactly once
    assert max(got["batches"]) <= PER_TRIGGER and len([b for b in got["batches"] if b]) >= 5


def test_driver_without_the_environment_names_the_interpreter(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    # the failure: executors get the archive, the driver's directory does not have it
    cwd = tmp_path / "driver"
    cwd.mkdir()
    got = run_driver(__name__, "drive_register", _args(
        spark_standalone, spark_packed_env.archive, lookupd, "unused", "smartnsq-cluster-noenv"),
        cwd, driver_env())
    text = got["register"]
    assert text is not None, got
    assert f"Spark's Python workers run {DRIVER_PYTHON} (PYSPARK_PYTHON)" in text
    assert "does not exist" in text and f"working directory {cwd}" in text
    assert "tar -xzf <archive> -C environment" in text



def test_executors_without_smartnsq_name_their_interpreter(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    # the driver's directory has smartnsq, the archive shipped to the executors does not:
    # Spark's own error would be a ModuleNotFoundError (pyarrow, then smartnsq) naming no
    # interpreter; register(spark) asks the executors first
    bare = packed_environment("bare", with_smartnsq=False)
    cwd = tmp_path / "driver"
    unpack(spark_packed_env.archive, cwd)
    got = run_driver(__name__, "drive_register", _args(
        spark_standalone, bare.archive, lookupd, "unused", "smartnsq-cluster-bare"),
        cwd, driver_env())
    text = got["register"]
    assert text is not None, got
    executor_python = text.split("Spark's executors run ", 1)[1].split(" ", 1)[0]
    assert executor_python.startswith(str(spark_standalone.base)), text
    assert executor_python.endswith("/environment/bin/python"), text
    assert f"(the path {DRIVER_PYTHON} as they resolve it)" in text
    assert "cannot import smartnsq or pyarrow or numpy" in text


def test_worker_killed_and_leader_moved_during_a_stream(
        spark_standalone: Any, spark_packed_env: Any, lookupd: str, tmp_path: Path) -> None:
    # Spark reschedules the killed worker's tasks on the other; the source follows the new
    # leader from the same offsets; the checkpointed output has every message exactly once
    from smartnsq import Producer
    # one partition with a replica to move to (three nsqd cannot place two such partitions)
    topic = _topic(lookupd, "sparkfault", 1, replicator=2)

    async def fill() -> None:
        async with Producer(lookupd=lookupd) as p:
            for i in range(0, FAULT_ROWS, 500):
                await p.publish_many(topic, [f"f{j}".encode() for j in range(i, i + 500)],
                                     partition=0)

    asyncio.run(fill())
    cwd = tmp_path / "driver"
    unpack(spark_packed_env.archive, cwd)
    worker = spark_standalone.procs["worker1"]
    try:
        got = run_driver(__name__, "drive_faults", _args(
            spark_standalone, spark_packed_env.archive, lookupd, topic, "smartnsq-cluster-faults",
            out=str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
            kill_pid=worker.pid, worker_dir=str(spark_standalone.base / "worker1")), cwd,
            driver_env())
    except AssertionError:
        print(spark_standalone.executor_logs())
        raise
    finally:
        spark_standalone.restart_dead_workers()  # the next tests get two workers again
    assert worker.poll() is not None, f"the worker was not killed: {got}"
    lost = spark_standalone.unfinished_tasks("worker1", got["app"])
    # it died inside a batch: Spark ran that task again on the other executor
    assert lost, "no task was running on the killed worker"
    print(f"\nfaults: {len(got['batches'])} batches, worker killed after "
          f"{got['killed_after']}, leader moved after {got['moved_after']}, "
          f"driver process {got['driver_seconds']} s")
    assert got["finished"] and got["error"] is None, got["error"]
    non_empty = [b for b in got["batches"] if b]
    assert got["killed_after"] and got["moved_after"] and got["moved_after"] < len(non_empty)
    assert got["rows"] == sorted(f"f{i}" for i in range(FAULT_ROWS))  # exactly once
    assert max(got["batches"]) <= FAULT_BATCH
