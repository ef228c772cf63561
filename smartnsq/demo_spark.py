"""The demo's Spark stage: a checkpointed Structured Streaming query over the ordered topic.

After the ordered demo (:mod:`smartnsq.demo`), on the same embedded youzan cluster, a query
reads the ordered topic through the ``nsq`` source in several micro-batches
(``maxMessagesPerTrigger``), counts each batch's messages per shard key, and writes the counts
to Parquet (one directory per batch id, ``mode("overwrite")``) and through the ``nsq`` sink to
a second topic (sharded by key, deterministic trace ids ``batch << 40 | task << 24 | row``).
The first run is stopped inside a batch, after that batch wrote both outputs and before Spark
committed it; the restart from the checkpoint (``availableNow``) runs it again and finishes.
The stage then checks that Parquet counts every stored message exactly once per key, that a
key's sequence numbers move forward from batch to batch, and that the second topic holds the
same counts once repeats are dropped.

How exactly-once comes about: the youzan source is replayable, and Spark logs a batch's offset
range in the checkpoint before running it, so the interrupted batch is run again with the same
batch id over the same messages. Its Parquet write replaces its own directory, so one copy
stays. The NSQ sink is at-least-once (the replay publishes again); the rows are sorted by key
in one task, so the replay carries the same trace ids and a reader drops repeats by trace id.

Spark calls block while Spark's Python workers (other processes) read from the cluster, so
:func:`run_stage` makes them in a worker thread and the cluster keeps serving on its loop.
Cancelled (the demo's Ctrl-C), the stage stops the running query and the session it started
within :data:`INTERRUPT_TIMEOUT` and ends; nothing waits for the blocked Spark calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import math
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from smartnsq.devcluster import DevCluster
from smartnsq.spark.env import java_missing_reason, prepare_spark_environment

__all__ = ["BatchFigures", "SparkStageSummary", "render", "run_stage", "spark_missing_reason",
           "start_session"]

OUT_TOPIC = "demo_key_counts"
OUT_CHANNEL = "key_counts"
#: micro-batches the first run of the query completes before it is stopped in the next one
STOP_AFTER = 2
#: the first run's input is cut into about this many micro-batches
BATCHES = 5
#: bound on each run of the query (seconds)
QUERY_TIMEOUT = 180.0
#: bound on stopping the query and the session once the stage is cancelled (seconds)
INTERRUPT_TIMEOUT = 20.0
#: trace ids: batch id in the high bits (the sink's deterministic layout)
_BATCH_SHIFT = 40

Report = Callable[[str], None]
T = TypeVar("T")


def spark_missing_reason() -> str | None:
    """Why the Spark stage cannot run here (no Java, no pyspark/pyarrow), or None."""
    for module in ("pyspark", "pyarrow"):
        if importlib.util.find_spec(module) is None:
            return (f"{module} is not installed (the spark extra: "
                    "`.venv/bin/pip install -e '.[spark]'`, which `make demo` does)")
    return java_missing_reason()


def _settle(fut: asyncio.Future[T], value: T | None, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)  # type: ignore[arg-type]  # None only with exc


async def _blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking Spark call on a daemon thread of its own. Not ``asyncio.to_thread``:
    ``asyncio.run`` waits for the default executor's threads as it ends, and after a Ctrl-C
    a Spark call may block for minutes (a JVM start, a query's awaitTermination)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            outcome = partial(_settle, done, fn(*args), None)
        except BaseException as exc:  # handed to the awaiting task, which raises it
            outcome = partial(_settle, done, None, exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(outcome)

    threading.Thread(target=run, name="smartnsq-demo-spark", daemon=True).start()
    return await done


def _start_session_unless(interrupted: threading.Event) -> Any:
    session = start_session()
    if interrupted.is_set():
        # the stage was cancelled while the JVM started: nobody else will stop it
        session.stop()
    return session


def _stop_queries(spark: Any) -> None:
    """After the stage was cancelled: Spark's log off, its jobs cancelled, the running
    queries stopped (before the session is: a query whose session stops under it prints
    Java traces). Each step is tried."""
    ctx = spark.sparkContext
    steps: list[Callable[[], Any]] = [partial(ctx.setLogLevel, "OFF"), ctx.cancelAllJobs]
    steps += [q.stop for q in spark.streams.active]
    for step in steps:
        try:
            step()
        except Exception as exc:  # stopping anyway: the next step may still work
            logging.getLogger(__name__).debug("stopping Spark: %r", exc)


async def _bounded(fn: Callable[[], Any]) -> None:
    """A Spark call that stops something, given at most :data:`INTERRUPT_TIMEOUT`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_blocking(fn), INTERRUPT_TIMEOUT)


def start_session() -> Any:
    """A local SparkSession (``local[2]``, loopback only, no UI) with ``nsq`` registered."""
    prepare_spark_environment()
    from pyspark.sql import SparkSession

    from smartnsq.spark import register

    session = (SparkSession.builder.master("local[2]").appName("smartnsq-demo")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


@dataclass(frozen=True, slots=True)
class BatchFigures:
    """One completed micro-batch (a replayed batch appears once per run of it)."""

    run: int
    batch_id: int
    #: input messages (sum of the batch's per-key counts)
    messages: int
    #: output rows (keys seen in the batch)
    keys: int
    seconds: float
    #: False for the batch the first run was stopped in (Spark never committed it)
    committed: bool = True


@dataclass(frozen=True, slots=True)
class SparkStageSummary:
    topic: str
    out_topic: str
    #: input records in the topic (what must be counted exactly once)
    stored: int
    #: distinct bodies among them (a publish retried after a leader move may store twice)
    distinct: int
    keys: int
    max_per_trigger: int
    batches: tuple[BatchFigures, ...]
    #: batch ids of the first run that ran again after the restart
    replayed: tuple[int, ...]
    resumed_at: int | None
    parquet_rows: int
    parquet_messages: int
    #: records in the output topic, and those repeating a trace id (republished by a replay)
    out_records: int
    out_duplicates: int
    spark_start_seconds: float
    first_run_seconds: float
    second_run_seconds: float
    check_seconds: float
    #: seconds Spark reported per phase over both runs (latestOffset, addBatch, ...)
    phases: tuple[tuple[str, float], ...]
    elapsed: float
    failures: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def steady_rate(self) -> float:
        """Messages per second of the batches after the first (which starts Spark's workers)."""
        later = [b for b in self.batches if (b.run, b.batch_id) != (1, 0)]
        seconds = sum(b.seconds for b in later)
        return sum(b.messages for b in later) / seconds if seconds > 0 else 0.0

    @property
    def rate(self) -> float:
        seconds = self.first_run_seconds + self.second_run_seconds
        return self.parquet_messages / seconds if seconds > 0 else 0.0


# ---------------------------------------------------------------------------- Spark side


@dataclass(slots=True)
class _QueryOutcome:
    batches: list[BatchFigures] = field(default_factory=list)
    first_run_seconds: float = 0.0
    second_run_seconds: float = 0.0
    check_seconds: float = 0.0
    #: from the Parquet output: per key, total count and the (batch, min_seq, max_seq) ranges
    totals: dict[str, int] = field(default_factory=dict)
    ranges: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    parquet_rows: int = 0
    #: Spark's own per-phase times (durationMs of every progress report), milliseconds
    phases: Counter[str] = field(default_factory=Counter)
    error: str | None = None


class _PlannedStop(Exception):
    """The first run's stop in the middle of a micro-batch."""


_PLANNED = "planned stop of the demo's first run"


def _short_error(exc: BaseException) -> str:
    """Spark's error text nests the Python traceback: keep its first line and the last
    ``SomeError: why`` line (the root cause)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    head = lines[0][:200] if lines else ""
    causes = [ln for ln in lines if _CAUSE.match(ln)]
    text = f"{type(exc).__name__}: {head}"
    if causes and causes[-1] not in head:
        text += f" ... {causes[-1][:300]}"
    return text


_CAUSE = re.compile(r"^[\w.]+(Error|Exception): ")


def _add_phases(outcome: _QueryOutcome, q: Any) -> None:
    for progress in q.recentProgress:
        outcome.phases.update(progress["durationMs"])


def _await(q: Any, what: str, *, planned: bool) -> str | None:
    """Wait (bounded) for a run of the query to end; its error, or None. A ``planned`` run
    must end with the planned stop, which is no error."""
    try:
        if not q.awaitTermination(QUERY_TIMEOUT):
            return f"{what} did not end within {QUERY_TIMEOUT:g} s"
        failure = q.exception()
    except Exception as exc:  # awaitTermination raises the query's failure
        failure = exc
    if failure is None:
        return f"{what} ended without its planned stop" if planned else None
    return None if planned and _PLANNED in str(failure) else _short_error(failure)


def _run_queries(spark: Any, lookupds: Sequence[str], topic: str, out_topic: str,
                 workdir: Path, max_per_trigger: int, stop_after: int,
                 say: Report, interrupted: threading.Event) -> _QueryOutcome:
    """The two runs of the query and the read-back of its Parquet output (blocking); once
    ``interrupted`` is set nothing more is started."""
    from pyspark.sql import functions as F

    outcome = _QueryOutcome()
    lock = threading.Lock()
    run = [1]
    lookupd = ",".join(lookupds)
    parquet = workdir / "key_counts"

    def write_batch(batch_df: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        # one task, keys sorted: a replay of the batch yields the same rows in the same
        # order, so the sink's deterministic trace ids repeat exactly
        counts = (batch_df.groupBy("shard_key")
                  .agg(F.count(F.lit(1)).alias("count"), F.min("seq").alias("min_seq"),
                       F.max("seq").alias("max_seq"))
                  .repartition(1).sortWithinPartitions("shard_key").persist())
        try:
            # overwrite the batch's own directory: a replayed batch replaces its first copy
            counts.write.mode("overwrite").parquet(str(parquet / f"batch={batch_id}"))
            (counts.select(
                "shard_key",
                F.to_json(F.struct(F.lit(batch_id).alias("batch"),
                                   F.col("shard_key").alias("key"), "count", "min_seq",
                                   "max_seq")).alias("value"))
             .write.format("nsq").mode("append").option("lookupd", lookupd)
             .option("topic", out_topic).option("deterministicTraceIds", "true")
             .option("traceBatchId", str(batch_id)).save())
            rows = counts.select("count").collect()
        finally:
            counts.unpersist()
        stopping = run[0] == 1 and batch_id == stop_after
        fig = BatchFigures(run[0], batch_id, sum(int(r[0]) for r in rows), len(rows),
                           time.perf_counter() - t0, committed=not stopping)
        with lock:
            outcome.batches.append(fig)
        say(f"  spark run {fig.run} batch {batch_id}: {fig.messages:,} messages -> "
            f"{fig.keys} key counts ({fig.seconds:.2f} s)"
            + (": outputs written, stopping the query before Spark commits it"
               if stopping else ""))
        if stopping:
            raise _PlannedStop(f"{_PLANNED} in batch {batch_id}")

    def start(available_now: bool) -> Any:
        source = (spark.readStream.format("nsq").option("lookupd", lookupd)
                  .option("topic", topic).option("startingOffsets", "earliest")
                  .option("maxMessagesPerTrigger", str(max_per_trigger)).load())
        parsed = source.select(
            F.substring_index(F.col("body").cast("string"), ":", 1).alias("shard_key"),
            F.substring_index(F.col("body").cast("string"), ":", -1).cast("long").alias("seq"))
        writer = (parsed.writeStream.foreachBatch(write_batch)
                  .option("checkpointLocation", str(workdir / "checkpoint")))
        writer = (writer.trigger(availableNow=True) if available_now
                  else writer.trigger(processingTime="0 seconds"))
        q = writer.start()
        if interrupted.is_set():
            # the stage was cancelled while this query started: stop it at once
            q.stop()
        return q

    # first run: batches 0 .. stop_after-1 complete; batch stop_after writes both outputs
    # and then fails, as a driver killed at that point would leave it (offsets logged, the
    # batch not committed); Spark logs that failure at ERROR, so its log is off meanwhile
    t0 = time.perf_counter()
    q = start(available_now=False)
    spark.sparkContext.setLogLevel("OFF")
    try:
        outcome.error = _await(q, "the first run", planned=True)
    finally:
        q.stop()
        spark.sparkContext.setLogLevel("ERROR")
        outcome.first_run_seconds = time.perf_counter() - t0
        _add_phases(outcome, q)
    if interrupted.is_set():
        outcome.error = "interrupted"
    if outcome.error is not None:
        return outcome
    say(f"spark: query stopped in batch {stop_after} ({outcome.first_run_seconds:.2f} s); "
        "restarting it from the checkpoint")

    t0 = time.perf_counter()
    run[0] = 2
    q = start(available_now=True)
    try:
        outcome.error = _await(q, "the restarted run", planned=False)
    finally:
        q.stop()
        outcome.second_run_seconds = time.perf_counter() - t0
        _add_phases(outcome, q)
    if interrupted.is_set():
        outcome.error = "interrupted"
    if outcome.error is not None:
        return outcome

    t0 = time.perf_counter()
    rows = spark.read.parquet(str(parquet)).select(
        "batch", "shard_key", "count", "min_seq", "max_seq").collect()
    outcome.parquet_rows = len(rows)
    for r in rows:
        key = str(r["shard_key"])
        outcome.totals[key] = outcome.totals.get(key, 0) + int(r["count"])
        outcome.ranges.setdefault(key, []).append(
            (int(r["batch"]), int(r["min_seq"]), int(r["max_seq"])))
    outcome.check_seconds = time.perf_counter() - t0
    return outcome


# ---------------------------------------------------------------------------- the stage


def _stored(cluster: DevCluster, topic: str) -> list[Any]:
    """The topic's records in the cluster's store (independent of the client's code)."""
    return [rec for p in cluster.meta.topics[topic].partitions
            for rec in cluster.store.partition(topic, p).records]


async def run_stage(cluster: DevCluster, topic: str, *, spark: Any = None,
                    workdir: Path | None = None, max_per_trigger: int | None = None,
                    stop_after: int = STOP_AFTER, report: Report | None = None
                    ) -> SparkStageSummary:
    """Run the Spark stage over ``topic`` (bodies ``key:seq``) of a running youzan cluster.

    ``spark`` is an existing SparkSession with ``nsq`` registered (else one is started and
    stopped here); ``workdir`` holds the checkpoint and the Parquet output (else a temporary
    directory). ``max_per_trigger`` defaults to the stored messages over :data:`BATCHES`.
    Must be awaited on the cluster's event loop.
    """
    for name, value in (("stop_after", stop_after), ("max_per_trigger", max_per_trigger)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1, not {value}")
    if topic not in cluster.meta.topics:
        raise ValueError(f"topic {topic!r} does not exist on the cluster")
    say: Report = report if report is not None else (lambda _line: None)
    started = time.perf_counter()
    bodies = [rec.body for rec in _stored(cluster, topic)]
    if not bodies:
        raise ValueError(f"topic {topic!r} holds no messages")
    # what the query must count, straight from the cluster's store
    expected = Counter(b.decode("utf-8", "replace").partition(":")[0] for b in bodies)
    limit = max_per_trigger or max(1, math.ceil(len(bodies) / BATCHES))
    if limit * stop_after >= len(bodies):
        raise ValueError(f"max_per_trigger {limit} leaves no batch {stop_after} to stop in: "
                         f"{len(bodies)} messages need max_per_trigger * stop_after below them")
    # a youzan topic is writable once it has a channel
    cluster.create_topic(OUT_TOPIC, partition_num=2, replica=1, ordered=True,
                         channels=(OUT_CHANNEL,))
    # py4j logs a failing foreachBatch's whole traceback; the summary names the error
    logging.getLogger("py4j").setLevel(logging.CRITICAL)

    interrupted = threading.Event()
    async with contextlib.AsyncExitStack() as stack:
        if workdir is None:
            # a cancelled stage leaves its query thread writing here for a moment
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(
                prefix="smartnsq-demo-spark-", ignore_cleanup_errors=True)))
        spark_start = 0.0
        owned = spark is None
        # a Spark failure (even at start) is a failed check, not a traceback
        try:
            if spark is None:
                say("spark: starting a local session (local[2])")
                t0 = time.perf_counter()
                spark = await _blocking(_start_session_unless, interrupted)
                spark_start = time.perf_counter() - t0
                stack.push_async_callback(_bounded, spark.stop)
            say(f"spark: streaming {len(bodies):,} messages of {topic} through the nsq source "
                f"(maxMessagesPerTrigger {limit:,}), counting per shard key into Parquet and "
                f"topic {OUT_TOPIC}; the first run stops in batch {stop_after}")
            outcome = await _blocking(
                _run_queries, spark, cluster.lookupd_http_addresses, topic, OUT_TOPIC,
                workdir, limit, stop_after, say, interrupted)
        except asyncio.CancelledError:
            interrupted.set()
            say("spark stage: interrupted: stopping the query"
                + (" and the Spark session" if owned else ""))
            if spark is not None:
                # the queries first; the session (if the stage started it) on the way out
                await _bounded(partial(_stop_queries, spark))
            raise
        except Exception as exc:
            outcome = _QueryOutcome(error=_short_error(exc))

    out = _stored(cluster, OUT_TOPIC)
    return _summarise(topic, bodies, expected, limit, stop_after, outcome,
                      [r.body for r in out], [r.trace_id for r in out], spark_start,
                      time.perf_counter() - started)


def _summarise(topic: str, bodies: list[bytes], expected: Mapping[str, int], limit: int,
               stop_at: int, o: _QueryOutcome, out_bodies: list[bytes], out_traces: list[int],
               spark_start: float, elapsed: float) -> SparkStageSummary:
    problems: list[str] = []
    if o.error is not None:
        problems.append(f"the query failed: {o.error}")
    first = [b.batch_id for b in o.batches if b.run == 1]
    second = [b.batch_id for b in o.batches if b.run == 2]
    replayed = tuple(sorted(set(first) & set(second)))
    over = [b.batch_id for b in o.batches if b.messages > limit]
    if over:
        problems.append(f"micro-batch(es) {over} took more than {limit:,} messages")
    if o.error is None:
        if first != list(range(stop_at + 1)):
            problems.append(f"the first run ran batches {first}, planned 0..{stop_at}")
        if replayed != (stop_at,):
            problems.append(f"the restart replayed batch(es) {list(replayed)}; the one "
                            f"stopped in was {stop_at}")
        again = [(b.messages, b.keys) for b in o.batches if b.batch_id == stop_at]
        if len(set(again)) > 1:
            problems.append(f"batch {stop_at} replayed over other messages: {again}")
        if not second or min(second) != stop_at:
            problems.append(f"the restarted query ran batches {second}: it should resume "
                            f"from the checkpoint at batch {stop_at}")
        wrong = sorted(k for k in expected.keys() | o.totals.keys()
                       if o.totals.get(k, 0) != expected.get(k, 0))
        if wrong:
            k = wrong[0]
            problems.append(f"Parquet counts differ from the topic for {len(wrong)} key(s), "
                            f"first {k}: {o.totals.get(k, 0)} counted, {expected.get(k, 0)} "
                            "stored")
        backwards = [k for k, rs in o.ranges.items()
                     if any(b[1] < a[2] for a, b in zip(sorted(rs), sorted(rs)[1:],
                                                        strict=False))]
        if backwards:
            problems.append(f"{len(backwards)} key(s) went back in sequence from one batch to "
                            f"the next, first {backwards[0]}")
    # the second topic: drop repeats of a trace id (a replayed batch republishes its rows
    # with the same ids), then the same (batch, key) rows and totals as Parquet
    by_trace: dict[int, tuple[int, str, int]] = {}
    duplicates = bad_traces = 0
    for body, trace in zip(out_bodies, out_traces, strict=True):
        row = json.loads(body)
        content = (int(row["batch"]), str(row["key"]), int(row["count"]))
        if trace >> _BATCH_SHIFT != content[0]:
            bad_traces += 1
        if trace in by_trace:
            duplicates += 1
            if by_trace[trace] != content:
                problems.append(f"topic {OUT_TOPIC}: trace id {trace} carried "
                                f"{by_trace[trace]} and then {content}")
        by_trace[trace] = content
    if o.error is None:
        out_totals = Counter[str]()
        for _, key, n in by_trace.values():
            out_totals[key] += n
        if dict(out_totals) != dict(expected):
            problems.append(f"topic {OUT_TOPIC}: counts per key (after dropping "
                            f"{duplicates} repeat(s)) differ from the topic")
        distinct_rows = {(b, k) for b, k, _ in by_trace.values()}
        if len(distinct_rows) != len(by_trace) or len(by_trace) != o.parquet_rows:
            problems.append(f"topic {OUT_TOPIC} holds {len(by_trace)} distinct trace ids for "
                            f"{len(distinct_rows)} (batch, key) rows, Parquet {o.parquet_rows}")
    if bad_traces:
        problems.append(f"topic {OUT_TOPIC}: {bad_traces} trace id(s) name another batch")
    return SparkStageSummary(
        topic=topic, out_topic=OUT_TOPIC, stored=len(bodies), distinct=len(set(bodies)),
        keys=len(expected), max_per_trigger=limit, batches=tuple(o.batches), replayed=replayed,
        resumed_at=min(second) if second else None, parquet_rows=o.parquet_rows,
        parquet_messages=sum(o.totals.values()), out_records=len(out_bodies),
        out_duplicates=duplicates, spark_start_seconds=spark_start,
        first_run_seconds=o.first_run_seconds, second_run_seconds=o.second_run_seconds,
        check_seconds=o.check_seconds, elapsed=elapsed, failures=tuple(problems),
        phases=tuple((k, v / 1000) for k, v in o.phases.most_common() if v >= 100))


def render(s: SparkStageSummary) -> str:
    """The human summary of the Spark stage."""
    first = [b for b in s.batches if b.run == 1]
    second = [b for b in s.batches if b.run == 2]
    stopped = [b.batch_id for b in first if not b.committed]
    replayed = ", ".join(map(str, s.replayed)) or "none"
    lines = [
        "",
        "spark stage",
        f"  input          {s.topic}: {s.stored:,} messages ({s.distinct:,} distinct bodies) "
        f"over {s.keys:,} shard keys",
        f"  query          nsq source, maxMessagesPerTrigger {s.max_per_trigger:,}; "
        "foreachBatch: count per key -> Parquet (overwrite per batch id) + nsq sink "
        f"({s.out_topic})",
        f"  first run      micro-batches {[b.batch_id for b in first]}, stopped in batch "
        f"{stopped[0] if stopped else '-'} after its outputs were written and before Spark "
        f"committed it ({s.first_run_seconds:.2f} s)",
        f"  restart        from the checkpoint at batch {s.resumed_at}: micro-batches "
        f"{[b.batch_id for b in second]} ({s.second_run_seconds:.2f} s); replayed: {replayed}",
        "  batch          run  messages  keys  seconds",
    ]
    lines += [f"  {b.batch_id:>9}  {b.run:>4}  {b.messages:>8,}  {b.keys:>4}  {b.seconds:>7.2f}"
              + ("  (stopped here)" if not b.committed else "") for b in s.batches]
    lines += [
        f"  parquet        {s.parquet_rows:,} rows counting {s.parquet_messages:,} messages "
        "(the replayed batch overwrote its own directory)",
        f"  output topic   {s.out_topic}: {s.out_records:,} records; {s.out_duplicates:,} "
        "republished by the replay, dropped by trace id",
        f"  throughput     {s.parquet_messages:,} messages in "
        f"{s.first_run_seconds + s.second_run_seconds:.2f} s of query (both runs): "
        f"{s.rate:,.0f} msg/s; after the first batch {s.steady_rate:,.0f} msg/s (Spark start "
        f"{f'{s.spark_start_seconds:.2f} s' if s.spark_start_seconds else 'not here'}, "
        f"read-back {s.check_seconds:.2f} s)",
        "  spark phases   " + (", ".join(f"{k} {v:.2f} s" for k, v in s.phases) or "-"),
        f"  elapsed        {s.elapsed:.2f} s",
    ]
    if s.ok:
        lines.append("result: OK, every message counted exactly once per key "
                     "(Parquet and the second topic)")
    else:
        lines.append("result: FAILED")
        lines += [f"  - {problem}" for problem in s.failures]
    return "\n".join(lines)
