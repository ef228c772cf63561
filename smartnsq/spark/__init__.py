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
    """
    from smartnsq.spark.datasource import NsqDataSource
    from smartnsq.spark.env import check_worker_python

    if check_workers:
        check_worker_python(spark)

    spark.dataSource.register(NsqDataSource)


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        from smartnsq.spark.datasource import NsqDataSource

        return NsqDataSource
    raise AttributeError(name)
