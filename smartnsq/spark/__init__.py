"""NSQ as a Spark data source and sink (PySpark Python Data Source API, Spark 4.2+).

``smartnsq.spark.register(spark)`` registers :class:`NsqDataSource` under the short name
``nsq``. pyspark is imported only when these names are used (the ``spark`` extra).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.spark.datasource import NsqDataSource

__all__ = ["NsqDataSource", "register"]


def register(spark: Any) -> None:
    """Register the ``nsq`` format with ``spark`` (a SparkSession)."""
    from smartnsq.spark.datasource import NsqDataSource

    spark.dataSource.register(NsqDataSource)


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        from smartnsq.spark.datasource import NsqDataSource

        return NsqDataSource
    raise AttributeError(name)
