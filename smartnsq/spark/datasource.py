"""The ``nsq`` data source: Spark asks it for readers and writers; it hands out the NSQ ones.

Source side (readers) lives in the ``source_*`` modules, sink side (writers) in ``sink``; this
module only routes. Everything here is pickled to Spark's Python workers, so it holds options
(strings) and nothing live.

Which reader: youzan topics (partitioned, replayable) get the full partition-parallel
``DataSourceStreamReader``; stock nsqd gets the driver-side ``SimpleDataSourceStreamReader``.
The flavour comes from the ``flavour`` option or, by default, from asking the lookupd about
the topic. ``streamReader`` raises pyspark's NotImplemented error on stock, which is Spark's
signal to fall back to ``simpleStreamReader``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import DataSource

from smartnsq.config import LookupConfig
from smartnsq.errors import Flavour
from smartnsq.spark.options import SourceOptions, check_stock_options, parse_source_options
from smartnsq.spark.schema import check_read_schema

__all__ = ["NsqDataSource", "detect_flavour"]


async def _ask_lookup(opts: SourceOptions) -> Flavour:
    from smartnsq.lookup import Lookup

    async with Lookup(LookupConfig(addresses=opts.lookupd)) as lookup:
        view = await lookup.refresh(opts.topic, "r")
        return view.flavour


def detect_flavour(opts: SourceOptions) -> str:
    """``youzan`` or ``stock`` for this topic (the option wins; else the lookupd says).

    The lookupd is asked either way: one that does not answer fails the read here, naming
    it, where a stock read would wait its time and return nothing, as if the queue were
    empty."""
    flavour = asyncio.run(_ask_lookup(opts))
    if opts.flavour != "auto":
        return opts.flavour
    # a topic no stock lookupd knows yet is still a stock topic: consumers wait for it
    return "youzan" if flavour is Flavour.YOUZAN else "stock"


class NsqDataSource(DataSource):
    """``spark.read/readStream.format("nsq")`` and ``df.write/writeStream.format("nsq")``."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> Any:
        """Spark asks for the schema in ``load()`` (reads and streams alike; a write brings
        its DataFrame's): the options are checked here, so that a misspelled or bad one fails
        ``load()`` naming itself instead of the first action or the query's thread later.
        What only a stream or only a batch read refuses is checked again when Spark asks
        for the reader."""
        from smartnsq.spark.schema import SOURCE_SCHEMA

        parse_source_options(self.options, streaming=False)
        return SOURCE_SCHEMA

    def reader(self, schema: Any) -> Any:
        check_read_schema(schema)
        opts = parse_source_options(self.options, streaming=False)
        if detect_flavour(opts) == "youzan":
            from smartnsq.spark.source_youzan import YouzanBatchReader

            return YouzanBatchReader(opts)
        from smartnsq.spark.source_stock import StockBatchReader

        check_stock_options(opts)
        return StockBatchReader(opts)

    def streamReader(self, schema: Any) -> Any:
        check_read_schema(schema)
        opts = parse_source_options(self.options, streaming=True)
        if detect_flavour(opts) != "youzan":
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED",
                messageParameters={"feature": "streamReader on stock nsqd (a queue)"})
        from smartnsq.spark.source_youzan import YouzanStreamReader

        return YouzanStreamReader(opts)

    def simpleStreamReader(self, schema: Any) -> Any:
        check_read_schema(schema)
        opts = parse_source_options(self.options, streaming=True)
        check_stock_options(opts)
        from smartnsq.spark.source_stock import StockStreamReader

        return StockStreamReader(opts)

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from smartnsq.spark.sink import NsqBatchWriter

        return NsqBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from smartnsq.spark.sink import NsqStreamWriter

        return NsqStreamWriter(dict(self.options), schema, overwrite)
