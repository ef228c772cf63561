"""NSQ as a Spark data source and sink (PySpark Python Data Source API, Spark 4.2+).

``smartnsq.spark.register(spark)`` registers :class:`NsqDataSource` under the short name
``nsq``. pyspark is imported only when these names are used (the ``spark`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.spark.datasource import NsqDataSource

__all__ = ["NsqDataSource", "register"]


def register(spark: Any, *, check_workers: bool = True) -> None:
    """Register the ``nsq`` format with ``spark`` (a SparkSession).

    First checks that Spark's Python workers can import smartnsq
    (:func:`smartnsq.spark.env.check_worker_python`): if they cannot, it raises
    :class:`~smartnsq.spark.env.WorkerPythonError` naming their interpreter and the fix,
    where the first query would fail with ``ModuleNotFoundError`` inside a Java trace.
    ``check_workers=False`` skips that check.

    It also makes ``spark`` the calling thread's active session: Spark looks Python data
    sources up in the thread's active session only, so a write or read started on another
    thread (a thread pool writing DataFrames) fails with ``DATA_SOURCE_NOT_FOUND`` until that
    thread calls ``register(spark, check_workers=False)``.
    """
    from smartnsq.spark.datasource import NsqDataSource
    from smartnsq.spark.env import check_worker_python

    if check_workers:
        check_worker_python(spark)

    spark.dataSource.register(NsqDataSource)
    _make_active(spark)


def _make_active(spark: Any) -> None:
    """Make ``spark`` the calling thread's active session in the JVM, as pyspark's own
    ``createDataFrame`` does (Spark Connect sessions have no JVM here and need nothing)."""
    try:
        jvm, session = spark._jvm, spark._jsparkSession
    except AttributeError:
        return
    if jvm is not None:
        jvm.SparkSession.setActiveSession(session)


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        from smartnsq.spark.datasource import NsqDataSource

        return NsqDataSource
    raise AttributeError(name)
