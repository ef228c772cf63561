"""Messages → rows of the source schema, as Arrow record batches (Spark's fast path for
Python sources) or as tuples (the simple stream reader's path)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from smartnsq.message import Message
from smartnsq.protocol.messages import RawMessage
from smartnsq.spark.schema import arrow_schema

__all__ = ["ext_map", "stock_row", "to_record_batch"]

_EXT_JSON = 4
_EXT_TAG = 2
#: the JSON header key that carries a dispatch tag; a raw tag (version 2) is shown under it
_TAG_KEY = "##client_dispatch_tag"


def ext_map(raw: RawMessage) -> dict[str, str | None] | None:
    """The ext header as ``map<string,string>`` (JSON null as a null value, what the sink
    sends for one; other non-string JSON values as JSON text)."""
    if raw.ext_version is None or raw.ext is None:
        return None
    if raw.ext_version == _EXT_TAG:
        return {_TAG_KEY: raw.ext.decode("utf-8", "replace")}
    if raw.ext_version == _EXT_JSON:
        try:
            doc = json.loads(raw.ext)
        except ValueError:
            return {"": raw.ext.decode("utf-8", "replace")}
        if isinstance(doc, dict):
            return {str(k): v if v is None or isinstance(v, str) else json.dumps(v)
                    for k, v in doc.items()}
    return None


def _signed64(v: int) -> int:
    # ids are unsigned on the wire; Spark's long is signed
    return v - (1 << 64) if v >= 1 << 63 else v


def to_record_batch(messages: Sequence[RawMessage], topic: str, partition: int | None,
                    nsqd: str, *, youzan: bool = True, ext: bool | None = None) -> Any:
    """One ``pyarrow.RecordBatch`` of the source schema (column-wise: this is the read hot
    path, so ids and timestamps go through numpy instead of a Python object per value)."""
    import numpy as np
    import pyarrow as pa

    n = len(messages)
    if youzan:
        # the 16-byte id is [internal id][trace id], big-endian; reading it as signed int64
        # gives Spark's long for ids at or above 2^63 too (two's complement)
        ids = np.frombuffer(b"".join(map(_ID, messages)), dtype=">i8").reshape(n, 2)
        internal = pa.array(ids[:, 0].astype(np.int64), pa.int64())
        trace = pa.array(ids[:, 1].astype(np.int64), pa.int64())
        offsets = pa.array(np.fromiter(map(_OFFSET, messages), np.int64, n), pa.int64())
        sizes = pa.array(np.fromiter(map(_RAW_SIZE, messages), np.int32, n), pa.int32())
    else:
        internal = trace = pa.nulls(n, pa.int64())
        offsets = pa.nulls(n, pa.int64())
        sizes = pa.nulls(n, pa.int32())
    stamps = np.fromiter(map(_TIMESTAMP, messages), np.int64, n) // 1000
    map_type = pa.map_(pa.string(), pa.string())
    if ext is None:
        ext = any(m.ext_version is not None for m in messages)
    if ext:
        ext_col = pa.array([_items(ext_map(m)) for m in messages], map_type)
    else:
        ext_col = pa.nulls(n, map_type)
    columns = [
        pa.array(list(map(_BODY, messages)), pa.binary()),
        _repeat(pa, topic, pa.string(), n),
        _repeat(pa, partition, pa.int32(), n),
        offsets,
        sizes,
        internal,
        trace,
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(np.fromiter(map(_ATTEMPTS, messages), np.int32, n), pa.int32()),
        ext_col,
        _repeat(pa, nsqd, pa.string(), n),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema())


_ID = attrgetter("id")
_BODY = attrgetter("body")
_OFFSET = attrgetter("offset")
_RAW_SIZE = attrgetter("raw_size")
_TIMESTAMP = attrgetter("timestamp")
_ATTEMPTS = attrgetter("attempts")


def _repeat(pa: Any, value: object, type_: Any, n: int) -> Any:
    return pa.repeat(pa.scalar(value, type_), n)


def _items(d: dict[str, str | None] | None) -> list[tuple[str, str | None]] | None:
    return None if d is None else list(d.items())


def stock_row(msg: Message) -> tuple[Any, ...]:
    """One stock-nsqd message as a row tuple in schema order (no partitions, offsets, ids)."""
    ts = dt.datetime.fromtimestamp(msg.timestamp / 1e9, tz=dt.UTC)
    return (msg.body, msg.topic, None, None, None, None, None, ts, msg.attempts, None,
            msg.nsqd_address)
