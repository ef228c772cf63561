"""Messages → rows of the source schema, as Arrow record batches (Spark's fast path for
Python sources) or as tuples (the simple stream reader's path)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from smartnsq.message import Message
from smartnsq.protocol.messages import RawMessage
from smartnsq.spark.schema import arrow_schema

__all__ = ["ext_map", "stock_row", "to_record_batch"]

_EXT_JSON = 4
_EXT_TAG = 2
#: the JSON header key that carries a dispatch tag; a raw tag (version 2) is shown under it
_TAG_KEY = "##client_dispatch_tag"


def ext_map(raw: RawMessage) -> dict[str, str] | None:
    """The ext header as ``map<string,string>`` (non-string JSON values as JSON text)."""
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
            return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in doc.items()}
    return None


def _signed64(v: int) -> int:
    # ids are unsigned on the wire; Spark's long is signed
    return v - (1 << 64) if v >= 1 << 63 else v


def to_record_batch(messages: Sequence[RawMessage], topic: str, partition: int | None,
                    nsqd: str, *, youzan: bool = True) -> Any:
    """One ``pyarrow.RecordBatch`` of the source schema."""
    import pyarrow as pa

    n = len(messages)
    part = [partition] * n
    internal: list[int | None] = [None] * n
    trace: list[int | None] = [None] * n
    if youzan:
        internal = [_signed64(m.internal_id) for m in messages]
        trace = [_signed64(m.trace_id) for m in messages]
    columns = [
        pa.array([m.body for m in messages], pa.binary()),
        pa.array([topic] * n, pa.string()),
        pa.array(part, pa.int32()),
        pa.array([m.offset for m in messages], pa.int64()),
        pa.array([m.raw_size for m in messages], pa.int32()),
        pa.array(internal, pa.int64()),
        pa.array(trace, pa.int64()),
        pa.array([m.timestamp // 1000 for m in messages], pa.timestamp("us", tz="UTC")),
        pa.array([m.attempts for m in messages], pa.int32()),
        pa.array([_items(ext_map(m)) for m in messages], pa.map_(pa.string(), pa.string())),
        pa.array([nsqd] * n, pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema())


def _items(d: dict[str, str] | None) -> list[tuple[str, str]] | None:
    return None if d is None else list(d.items())


def stock_row(msg: Message) -> tuple[Any, ...]:
    """One stock-nsqd message as a row tuple in schema order (no partitions, offsets, ids)."""
    ts = dt.datetime.fromtimestamp(msg.timestamp / 1e9, tz=dt.UTC)
    return (msg.body, msg.topic, None, None, None, None, None, ts, msg.attempts, None,
            msg.nsqd_address)
