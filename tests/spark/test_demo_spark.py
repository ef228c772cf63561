"""The demo's Spark stage (smartnsq.demo_spark) at a small size on the shared SparkSession,
checked against the cluster's store and the Parquet files read with pyarrow; its bad inputs,
its failure reporting, and the demo's ways of skipping it."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from smartnsq import demo, demo_spark
from smartnsq.producer import Producer
from smartnsq.spark.env import java_missing_reason
from tests.spark.conftest import ThreadedCluster

TOPIC = "dsp_orders"
KEYS = [f"k{i:02d}" for i in range(12)]
PER_KEY = 25
LIMIT = 160


def publish_keys(tc: ThreadedCluster, topic: str) -> Counter[str]:
    """``key:seq`` bodies per key in order, plus one body stored twice (as a publish retried
    after a leader move may leave it); returns the records stored per key."""
    async def run() -> None:
        async with Producer(lookupd=tc.cluster.lookupd_http_addresses) as p:
            for seq in range(PER_KEY):
                for key in KEYS:
                    await p.publish_ordered(topic, key, f"{key}:{seq}".encode())
            await p.publish_ordered(topic, KEYS[0], f"{KEYS[0]}:{PER_KEY - 1}".encode())

    tc.call(run())
    stored = Counter(dict.fromkeys(KEYS, PER_KEY))
    stored[KEYS[0]] += 1
    return stored


def test_stage_counts_every_message_once_across_a_stop_inside_a_batch(
        spark: Any, youzan_cluster: ThreadedCluster, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    tc = youzan_cluster
    tc.sync(tc.cluster.create_topic, TOPIC, partition_num=2, ordered=True, channels=["app"])
    stored = publish_keys(tc, TOPIC)
    lines: list[str] = []
    s = tc.call(demo_spark.run_stage(tc.cluster, TOPIC, spark=spark, workdir=tmp_path,
                                     max_per_trigger=LIMIT, stop_after=1,
                                     report=lines.append), timeout=240)
    assert s.ok, s.failures
    assert s.stored == sum(stored.values()) == 301 and s.distinct == 300 and s.keys == 12
    # batch 0 committed, batch 1 stopped after its outputs, replayed by the restart
    first = [b for b in s.batches if b.run == 1]
    assert [(b.batch_id, b.committed) for b in first] == [(0, True), (1, False)]
    assert s.resumed_at == 1 and s.replayed == (1,)
    assert all(b.messages <= LIMIT for b in s.batches)
    assert sum(b.messages for b in s.batches if b.committed) == 301
    # Parquet, read without Spark: one directory per batch id, every message once per key
    table = pq.read_table(tmp_path / "key_counts").to_pydict()
    totals: Counter[str] = Counter()
    for key, n in zip(table["shard_key"], table["count"], strict=True):
        totals[key] += n
    assert totals == stored
    assert sorted({int(b) for b in table["batch"]}) == sorted({b.batch_id for b in s.batches})
    # the second topic, from the cluster's store: the replay republished batch 1's rows with
    # the same trace ids; dropping repeats leaves the same totals
    records = [r for p in (0, 1) for r in
               tc.cluster.store.partition(demo_spark.OUT_TOPIC, p).records]
    stopped = next(b for b in first if not b.committed)
    assert len(records) == s.out_records == s.parquet_rows + stopped.keys
    by_trace = {r.trace_id: json.loads(r.body) for r in records}
    assert len(by_trace) == s.parquet_rows and s.out_duplicates == stopped.keys
    out: Counter[str] = Counter()
    for row in by_trace.values():
        out[row["key"]] += row["count"]
    assert out == stored
    text = demo_spark.render(s)
    print(text)
    assert "replayed: 1" in text and text.rstrip().endswith(
        "every message counted exactly once per key (Parquet and the second topic)")
    assert any("stopping the query before Spark commits it" in ln for ln in lines)


@pytest.mark.parametrize(("kwargs", "topic", "named"), [
    ({"stop_after": 0}, TOPIC, "stop_after must be at least 1, not 0"),
    ({"max_per_trigger": 0}, TOPIC, "max_per_trigger must be at least 1, not 0"),
    ({"max_per_trigger": 301}, TOPIC, "max_per_trigger 301 leaves no batch 1 to stop in"),
    ({}, "dsp_missing", "topic 'dsp_missing' does not exist"),
    ({}, "dsp_empty", "topic 'dsp_empty' holds no messages"),
])
def test_bad_inputs_are_refused_before_spark_runs(youzan_cluster: ThreadedCluster,
                                                  kwargs: dict[str, int], topic: str,
                                                  named: str) -> None:
    tc = youzan_cluster
    if topic == "dsp_empty" and topic not in tc.cluster.meta.topics:
        tc.sync(tc.cluster.create_topic, topic, partition_num=1, channels=["app"])
    if topic == TOPIC and topic not in tc.cluster.meta.topics:
        tc.sync(tc.cluster.create_topic, topic, partition_num=2, ordered=True,
                channels=["app"])
        publish_keys(tc, topic)
    with pytest.raises(ValueError, match=named):
        tc.call(demo_spark.run_stage(tc.cluster, topic, spark=object(),
                                     **{"stop_after": 1, **kwargs}))


def test_a_failed_check_is_reported() -> None:
    o = demo_spark._QueryOutcome(
        batches=[demo_spark.BatchFigures(1, 0, 2, 1, 0.1),
                 demo_spark.BatchFigures(1, 1, 1, 1, 0.1, committed=False),
                 demo_spark.BatchFigures(2, 2, 1, 1, 0.1)],
        totals={"a": 2, "b": 1}, ranges={"a": [(0, 0, 5), (2, 3, 4)]}, parquet_rows=2)
    out = [json.dumps({"batch": 0, "key": "a", "count": 2}).encode(),
           json.dumps({"batch": 2, "key": "b", "count": 1}).encode()]
    s = demo_spark._summarise("t", [b"a:0", b"a:1", b"b:0", b"b:1"],
                              Counter({"a": 2, "b": 2}), 2, 1, o, out, [0, 5], 0.0, 1.0)
    assert not s.ok
    text = "\n".join(s.failures)
    assert "the restarted query ran batches [2]: it should resume" in text
    assert "the restart replayed batch(es) []; the one stopped in was 1" in text
    assert "Parquet counts differ from the topic for 1 key(s), first b: 1 counted, 2" in text
    assert "1 key(s) went back in sequence" in text
    assert "demo_key_counts: 1 trace id(s) name another batch" in text
    assert demo_spark.render(s).splitlines()[-len(s.failures) - 1] == "result: FAILED"
    failed = demo_spark._summarise("t", [b"a:0"], Counter({"a": 1}), 1, 1,
                                   demo_spark._QueryOutcome(error="Boom: no"), [], [], 0.0, 0.1)
    assert failed.failures == ("the query failed: Boom: no",)


def test_short_error_keeps_the_root_cause() -> None:
    exc = RuntimeError("[STREAM_FAILED] Query x terminated\nTraceback (most recent call):\n"
                       "  File 'a.py'\nsmartnsq.errors.ConfigError: column shard_key needs\n"
                       " SQLSTATE: 39000")
    assert demo_spark._short_error(exc) == (
        "RuntimeError: [STREAM_FAILED] Query x terminated ... "
        "smartnsq.errors.ConfigError: column shard_key needs")


@pytest.mark.parametrize(("argv", "missing", "reason"), [
    (["--messages", "40", "--no-spark"], None, "--no-spark was given"),
    (["--messages", "40"], "no Java here", "no Java here"),
    # Spark is there, but two messages cannot be cut into three micro-batches
    (["--messages", "2"], None, "it needs --messages of 3 or more (it stops in the third "
                                "micro-batch)"),
])
def test_the_demo_skips_the_stage_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], missing: str | None, reason: str) -> None:
    monkeypatch.setattr(demo_spark, "spark_missing_reason", lambda: missing)
    assert demo.main(["--keys", "2", "--asyncio", *argv]) == 0
    out = capsys.readouterr().out
    assert "result: OK, every check held" in out
    assert out.rstrip().endswith(f"spark stage skipped: {reason}")
    assert "spark stage\n" not in out and "Traceback" not in out


def test_missing_pyspark_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = demo_spark.importlib.util.find_spec
    monkeypatch.setattr(demo_spark.importlib.util, "find_spec",
                        lambda name: None if name == "pyspark" else real(name))
    assert demo_spark.spark_missing_reason() == (
        "pyspark is not installed (the spark extra: `.venv/bin/pip install -e '.[spark]'`, "
        "which `make demo` does)")


def test_a_spark_failure_is_a_failed_check_not_a_traceback(
        youzan_cluster: ThreadedCluster) -> None:
    tc = youzan_cluster
    if TOPIC not in tc.cluster.meta.topics:
        tc.sync(tc.cluster.create_topic, TOPIC, partition_num=2, ordered=True,
                channels=["app"])
        publish_keys(tc, TOPIC)
    if demo_spark.OUT_TOPIC in tc.cluster.meta.topics:
        tc.sync(tc.cluster.delete_topic, demo_spark.OUT_TOPIC)
    try:
        # not a SparkSession: the first Spark call fails inside the stage
        s = tc.call(demo_spark.run_stage(tc.cluster, TOPIC, spark=object(), stop_after=1))
    finally:
        tc.sync(tc.cluster.delete_topic, demo_spark.OUT_TOPIC)
    assert s.failures == ("the query failed: AttributeError: 'object' object has no "
                          "attribute 'readStream'",)
    assert demo_spark.render(s).splitlines()[-2:] == ["result: FAILED", f"  - {s.failures[0]}"]


def test_the_demo_runs_the_stage_on_its_cluster_and_fails_with_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[int] = []

    async def fake_stage(cluster: Any, topic: str, *, report: Any) -> Any:
        # called while the demo's cluster still serves, with the ordered topic's records
        seen.append(sum(len(cluster.store.partition(topic, p).records) for p in range(4)))
        report("spark: (fake stage)")
        return demo_spark._summarise(topic, [b"a:0"], Counter({"a": 1}), 1, 1,
                                     demo_spark._QueryOutcome(error="Boom: no"), [], [],
                                     0.0, 0.1)

    monkeypatch.setattr(demo_spark, "spark_missing_reason", lambda: None)
    monkeypatch.setattr(demo_spark, "run_stage", fake_stage)
    assert demo.main(["--messages", "40", "--keys", "4", "--asyncio"]) == 1
    out = capsys.readouterr().out
    assert seen == [40]
    # the ordered summary first, then the stage's lines and its summary
    assert out.index("result: OK, every check held") < out.index("spark: (fake stage)") \
        < out.index("spark stage\n")
    assert out.rstrip().endswith("result: FAILED\n  - the query failed: Boom: no")


#: bound on the whole demo run up to the Spark stage's first micro-batch (JVM start included)
DEMO_START_BOUND = 180.0
#: a Ctrl-C during the Spark stage ends the demo within this (the query and session stopped)
INTERRUPT_BOUND = 30.0


def test_ctrl_c_stops_the_spark_stage_promptly(tmp_path: Path) -> None:
    # `make demo` and Ctrl-C while the Spark query runs: the terminal sends SIGINT to the
    # whole process group (the demo, Spark's JVM, its Python workers)
    reason = java_missing_reason() or demo_spark.spark_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    child = subprocess.Popen(
        [sys.executable, "-m", "smartnsq.demo", "--messages", "600", "--keys", "12"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        start_new_session=True, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []

    def read_until(marker: str | None, bound: float) -> bool:
        deadline = time.monotonic() + bound
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                return marker is None
            seen.append(line)
            if marker is not None and line.startswith(marker):
                return True
        return False

    try:
        assert read_until("  spark run 1 batch 0", DEMO_START_BOUND), "".join(seen)[-3000:]
        os.killpg(child.pid, signal.SIGINT)
        interrupted = time.monotonic()
        assert read_until(None, INTERRUPT_BOUND), (
            f"still running {INTERRUPT_BOUND:.0f} s after Ctrl-C: " + "".join(seen)[-3000:])
        rc = child.wait(INTERRUPT_BOUND)
        took = time.monotonic() - interrupted
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    out = "".join(seen)
    after = out[out.index("  spark run 1 batch 0"):]
    # the shell's 130 (128 + SIGINT), without a Python traceback
    assert rc == 130, (rc, after[-3000:])
    assert "Traceback" not in after, after[-3000:]
    assert "spark stage: interrupted: stopping the query and the Spark session" \
        in after, after[-3000:]
    # stopped, not restarted, and without Spark's Java traces
    assert "spark run 2" not in after and "Exception in thread" not in after, after[-3000:]
    print(f"exited {took:.1f} s after Ctrl-C")
