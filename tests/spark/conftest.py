"""Fixtures for the Spark tests: one local SparkSession for the whole run, and embedded NSQ
clusters that live on a background thread (Spark's Python workers are separate processes that
connect to them over loopback while the test thread blocks in Spark calls)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from smartnsq.devcluster import DevCluster
from smartnsq.spark.env import java_missing_reason, prepare_spark_environment
from tests.spark.cluster import (  # noqa: F401  (the cluster tests' fixtures)
    spark_packed_env,
    spark_standalone,
)

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark_cluster: runs on a Spark standalone cluster "
                            "when SMARTNSQ_SPARK_CLUSTER=1 (make test-spark-cluster)")


class ThreadedCluster:
    """A DevCluster running on its own event loop thread; ``call`` runs a coroutine there."""

    def __init__(self, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="devcluster",
                                        daemon=True)
        self._thread.start()
        self.cluster = DevCluster(**kwargs)
        self.call(self.cluster.start())

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def sync(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a plain (non-coroutine) cluster call on the cluster's loop thread."""
        async def _run() -> Any:
            return fn(*args, **kwargs)
        return self.call(_run())

    def close(self) -> None:
        try:
            self.call(self.cluster.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()


# package scope: the JVM (1 GB heap, its threads) ends with tests/spark instead of running
# beside the rest of the suite
@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    reason = java_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pyspark_sql = pytest.importorskip("pyspark.sql",
                                      reason="pyspark (the spark extra) is not installed")
    prepare_spark_environment()
    session = (
        pyspark_sql.SparkSession.builder.master("local[2]")
        .appName("smartnsq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from smartnsq.spark import register

    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def youzan_cluster() -> Iterator[ThreadedCluster]:
    tc = ThreadedCluster(nodes=2, flavour="youzan")
    try:
        yield tc
    finally:
        tc.close()


@pytest.fixture(scope="module")
def stock_cluster() -> Iterator[ThreadedCluster]:
    tc = ThreadedCluster(nodes=1, flavour="stock")
    try:
        yield tc
    finally:
        tc.close()
