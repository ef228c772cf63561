"""What a Spark user runs into with the nsq sink and source: a map with null values in
``ext``, writes from another thread, and the stream options as users type them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import smartnsq.spark
from tests.spark.conftest import ThreadedCluster
from tests.spark.test_hunt_user_patterns import WAIT, lookupd, topic

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

from smartnsq.spark.sink_arrow import BatchPlan, ExtBatch  # noqa: E402
from smartnsq.spark.sink_options import parse_sink_options  # noqa: E402


def test_a_null_ext_value_leaves_its_key_out() -> None:
    # map('tenant', tenant_col) with a null tenant_col: the header said "tenant": null, which
    # consumers read back as the string "null"; a null value means the key is absent
    ext = pa.array([[("tenant", None), ("k", "v")], [("tenant", None)]],
                   pa.map_(pa.string(), pa.string()))
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()), "ext": ext})
    (u,) = BatchPlan(batch, parse_sink_options({"nsqd": "127.0.0.1:1", "topic": "t"})
                     ).units({})
    assert isinstance(u, ExtBatch)
    assert u.items == [(b'{"k":"v"}', b"a"), (b"{}", b"b")]


def test_a_write_from_another_thread_finds_nsq_after_register(
        spark: Any, youzan_cluster: ThreadedCluster) -> None:
    # a thread pool writing DataFrames: Spark looks Python data sources up in the thread's
    # active session, which a new thread lacks (DATA_SOURCE_NOT_FOUND); register(spark) in
    # that thread is the documented way (it did not set the thread's session)
    tc = youzan_cluster
    name = topic(tc, "hunt_thread_write")
    df = spark.range(3).selectExpr("cast(id as string) as value")

    def write() -> None:
        df.write.format("nsq").mode("append").option("lookupd", lookupd(tc)) \
            .option("topic", name).save()

    def registered_write() -> None:
        smartnsq.spark.register(df.sparkSession, check_workers=False)
        write()

    with ThreadPoolExecutor(1) as pool:
        failed = pool.submit(write).exception(WAIT)
        assert failed is not None and "DATA_SOURCE_NOT_FOUND" in str(failed)
        pool.submit(registered_write).result(WAIT)
    got = spark.read.format("nsq").option("lookupd", lookupd(tc)).option("topic", name) \
        .load().selectExpr("cast(body as string) as v").collect()
    assert sorted(r.v for r in got) == ["0", "1", "2"]
