"""The row schema of the ``nsq`` source, as a Spark schema and as the Arrow schema that
``read()`` yields (the two must agree column for column)."""

from __future__ import annotations

from typing import Any

__all__ = ["SOURCE_COLUMNS", "SOURCE_DDL", "arrow_schema", "check_read_schema", "source_schema"]

#: (name, Spark DDL type); fields a flavour does not have are null
SOURCE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("body", "binary"),
    ("topic", "string"),
    ("partition", "int"),
    ("offset", "bigint"),
    ("raw_size", "int"),
    ("internal_id", "bigint"),
    ("trace_id", "bigint"),
    ("timestamp", "timestamp"),
    ("attempts", "int"),
    ("ext", "map<string,string>"),
    ("nsqd", "string"),
)

SOURCE_DDL = ", ".join(f"`{n}` {t}" for n, t in SOURCE_COLUMNS)


def source_schema() -> Any:
    """The schema as a ``pyspark.sql.types.StructType``."""
    from pyspark.sql import types as t

    return t.StructType([
        t.StructField("body", t.BinaryType()),
        t.StructField("topic", t.StringType()),
        t.StructField("partition", t.IntegerType()),
        t.StructField("offset", t.LongType()),
        t.StructField("raw_size", t.IntegerType()),
        t.StructField("internal_id", t.LongType()),
        t.StructField("trace_id", t.LongType()),
        t.StructField("timestamp", t.TimestampType()),
        t.StructField("attempts", t.IntegerType()),
        t.StructField("ext", t.MapType(t.StringType(), t.StringType())),
        t.StructField("nsqd", t.StringType()),
    ])


def check_read_schema(schema: Any) -> None:
    """Refuse a schema given with ``.schema(...)`` that is not the source's: the rows are
    built in this one, and Spark would check them only on the executors, after the read,
    naming no column ("Expected: 1 columns, Found: 11")."""
    from smartnsq.errors import SourceOptionError

    def columns(s: Any) -> list[tuple[str, Any]]:
        return [(f.name, f.dataType) for f in s.fields]

    if columns(schema) == columns(source_schema()):
        return
    fixed = ", ".join(f"{n} {t}" for n, t in SOURCE_COLUMNS)
    raise SourceOptionError(
        f"the nsq source has a fixed schema ({fixed}), not {schema.simpleString()}: leave "
        ".schema(...) out and select or cast columns after load(), e.g. "
        "selectExpr(\"cast(body AS string) AS body\")")


def arrow_schema() -> Any:
    """The same schema in Arrow types (timestamps in microseconds, UTC, as Spark expects)."""
    import pyarrow as pa

    return pa.schema([
        ("body", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("raw_size", pa.int32()),
        ("internal_id", pa.int64()),
        ("trace_id", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("attempts", pa.int32()),
        ("ext", pa.map_(pa.string(), pa.string())),
        ("nsqd", pa.string()),
    ])


def __getattr__(name: str) -> Any:
    # SOURCE_SCHEMA is built on first use so importing this module needs no pyspark
    if name == "SOURCE_SCHEMA":
        return source_schema()
    raise AttributeError(name)
