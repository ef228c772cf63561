"""Arrow record batches → NSQ publish units, without a Python object per row on the main path.

A Spark task hands the sink ``pyarrow.RecordBatch``es. :func:`check_schema` validates the
columns once on the driver; :class:`BatchPlan` splits one batch by topic and target partition
(``partition`` column, else the ``shard_key``'s partition under the ``shardHash`` rule of
:mod:`smartnsq.sharding`, hashed once per distinct key, else the producer's
round-robin) and encodes each group into MPUB (or MPUB_TRACE) bodies straight from the Arrow
buffers: the ``[size][body]`` elements come from one vectorised ``binary_join_element_wise`` of
a prefix column (each MPUB's first prefix also holds the body's count) and the value column, so
the bytes are assembled in C and every MPUB body is a view of the joined buffer. Only the
``ext`` column (JSON headers) and ``delay_ms`` rows (one DPUB each) go through Python per row.

Row order is kept inside each (topic, partition) group, so per shard key order holds within a
task when groups of one partition are published one after another.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smartnsq.errors import ConfigError
from smartnsq.producer.checks import check_body
from smartnsq.protocol.commands import encode_ext_header
from smartnsq.protocol.validation import MAX_DELAY_MS, MAX_PARTITION, check_topic
from smartnsq.sharding import shard_partitions
from smartnsq.spark.sink_options import BATCH_BITS, PARTITION_BITS, ROW_BITS, SinkOptions

__all__ = [
    "SINK_COLUMNS",
    "BatchPlan",
    "DeferredRows",
    "EncodedBatch",
    "ExtBatch",
    "Unit",
    "check_schema",
    "deterministic_trace_base",
]

#: the columns the sink understands, and what each does
SINK_COLUMNS: Mapping[str, str] = {
    "value": "the message body (binary or string, required)",
    "topic": "the row's topic (used only when the topic option is absent)",
    "partition": "youzan partition (wins over shard_key)",
    "shard_key": "sharded ordered publish: the key's partition under the shardHash rule "
                 "(string, binary or integer; binary keys only with murmur3)",
    "trace_id": "youzan PUB_TRACE trace id (long, >= 0)",
    "ext": "youzan PUB_EXT header (map<string,string>)",
    "delay_ms": "stock DPUB delay in milliseconds",
}

_TRACE_FIELDS = 12  # [4-byte element size][8-byte trace id]
_PLAIN_FIELDS = 4  # [4-byte element size]
#: joined MPUB bytes from which the join needs 64-bit offsets
_BIG_JOIN = 1 << 31


def _pa() -> Any:
    return importlib.import_module("pyarrow")


def _pc() -> Any:
    return importlib.import_module("pyarrow.compute")


# ---------------------------------------------------------------------------- schema (driver)

def check_schema(schema: Any, opts: SinkOptions) -> tuple[str, ...]:
    """Check a Spark ``StructType`` against the sink's columns; return the column names.

    Raises ConfigError naming unknown columns, a missing ``value``, a column of the wrong type
    or a combination that cannot be published."""
    from pyspark.sql import types as t

    names = tuple(f.name for f in schema.fields)
    unknown = [n for n in names if n not in SINK_COLUMNS]
    if "value" not in names:
        # the one required column first: a table written as it is lacks it, and its other
        # columns are unknown only because nothing says which one is the body
        stray = f" (not sink columns: {', '.join(unknown)})" if unknown else ""
        raise ConfigError(
            "column value is required by the nsq sink (the message body, binary or string); "
            f"columns given: {', '.join(names) or 'none'}{stray}; e.g. "
            "df.selectExpr(\"to_json(struct(*)) AS value\") writes each row as JSON")
    if unknown:
        # Kafka's sink takes a key column; a Kafka user's DataFrame has one
        kafka = "; Kafka's key: NSQ messages have none, a shard_key column picks a youzan " \
            "partition per key as Kafka's key does" if "key" in unknown else ""
        raise ConfigError(f"unknown column(s) for the nsq sink: {', '.join(unknown)} "
                          f"(known: {', '.join(SINK_COLUMNS)}{kafka})")
    types = {f.name: f.dataType for f in schema.fields}
    ints = (t.ByteType, t.ShortType, t.IntegerType, t.LongType)
    wanted: dict[str, tuple[tuple[type, ...], str]] = {
        "value": ((t.BinaryType, t.StringType), "binary or string"),
        "topic": ((t.StringType,), "string"),
        "partition": (ints, "an integer type"),
        "shard_key": ((t.StringType, t.BinaryType, *ints), "string, binary or an integer type"),
        "trace_id": (ints, "an integer type (long)"),
        "ext": ((t.MapType,), "map<string,string>"),
        "delay_ms": (ints, "an integer type"),
    }
    for name, dtype in types.items():
        kinds, what = wanted[name]
        ok = isinstance(dtype, kinds)
        if ok and name == "ext":
            ok = isinstance(dtype.keyType, t.StringType) and \
                isinstance(dtype.valueType, t.StringType)
        if not ok:
            raise ConfigError(f"column {name} must be {what} for the nsq sink, got "
                              f"{dtype.simpleString()}")
    if opts.shardHash == "java" and isinstance(types.get("shard_key"), t.BinaryType):
        raise ConfigError("column shard_key is binary, but shardHash=java hashes strings "
                          "(String.hashCode) and integers (Long.hashCode): give a string or "
                          "integer column, or shardHash=murmur3")
    if "topic" not in names and opts.topic is None:
        raise ConfigError("the nsq sink needs the topic option or a topic column")
    if "delay_ms" in names:
        youzan = [n for n in ("partition", "shard_key", "trace_id", "ext") if n in names]
        if youzan:
            raise ConfigError(f"column delay_ms (stock DPUB) cannot be combined with the youzan "
                              f"column(s) {', '.join(youzan)}")
    if opts.deterministicTraceIds and "trace_id" in names:
        raise ConfigError("option deterministicTraceIds=true and a trace_id column both set "
                          "trace ids: use one of them")
    if opts.nsqd is not None:
        youzan = [n for n in ("partition", "shard_key") if n in names]
        if youzan:
            raise ConfigError(f"column(s) {', '.join(youzan)} need youzan partitions found "
                              "through the lookupd option, not the nsqd option")
    return names


def deterministic_trace_base(batch_id: int, task_partition: int) -> int:
    """The high bits of a task's deterministic trace ids; a row adds its index in the task.

    Layout (64 bits): batch id modulo 2**40 (``BATCH_BITS``) | task partition (16 bits) | row
    index within the task (24 bits). Replaying a batch in a retried task gives the same ids."""
    if not 0 <= task_partition < 1 << PARTITION_BITS:
        raise ConfigError(f"deterministic trace ids cover {1 << PARTITION_BITS} Spark "
                          f"partitions; task partition {task_partition} is beyond")
    batch = batch_id % (1 << BATCH_BITS)
    return (batch << (PARTITION_BITS + ROW_BITS)) | (task_partition << ROW_BITS)


# ---------------------------------------------------------------------------- publish units

@dataclass(slots=True)
class EncodedBatch:
    """One MPUB (``traced``: MPUB_TRACE) whose body is already encoded (count + elements);
    the body is a view of the Arrow buffer it was joined into."""

    topic: str
    partition: int | None
    body: bytes | memoryview
    count: int
    traced: bool


@dataclass(slots=True)
class ExtBatch:
    """One MPUB_EXT: ``(header JSON, body)`` per message."""

    topic: str
    partition: int | None
    items: list[tuple[bytes, bytes]]

    @property
    def count(self) -> int:
        return len(self.items)


@dataclass(slots=True)
class DeferredRows:
    """Rows with a ``delay_ms``: one DPUB each (stock nsqd)."""

    topic: str
    rows: list[tuple[bytes, int]] = field(default_factory=list)

    @property
    def partition(self) -> None:
        return None

    @property
    def count(self) -> int:
        return len(self.rows)


Unit = EncodedBatch | ExtBatch | DeferredRows


# ---------------------------------------------------------------------------- one batch

def _first_true(mask: Any) -> int:
    """Index of the first true value of a boolean Arrow array (which has one)."""
    return int(np.flatnonzero(mask.to_numpy(zero_copy_only=False))[0])


def _cut(ends: Any, limit: int) -> Any:
    """The first row of each MPUB: greedily the most rows whose elements (``ends``: their
    cumulative byte sizes) take at most ``limit`` bytes, and at least one row each."""
    starts: list[int] = []
    n = len(ends)
    start = 0
    while start < n:
        base = int(ends[start - 1]) if start else 0
        end = int(np.searchsorted(ends, base + limit, side="right"))
        starts.append(start)
        start = max(end, start + 1)
    return np.array(starts, dtype=np.int64)


class BatchPlan:
    """One Arrow record batch, checked, with its rows grouped by topic and partition.

    ``row_base`` is the index (within the task) of the batch's first row, for deterministic
    trace ids (``trace_base`` not None)."""

    def __init__(self, batch: Any, opts: SinkOptions, *, row_base: int = 0,
                 trace_base: int | None = None) -> None:
        pa, pc = _pa(), _pc()
        self.opts = opts
        self.rows = batch.num_rows
        names = set(batch.schema.names)
        self._cols = {n: batch.column(n) for n in batch.schema.names}
        self._row_base = row_base
        self._trace_base = trace_base
        if trace_base is not None and row_base + self.rows > 1 << ROW_BITS:
            raise ConfigError(f"deterministic trace ids cover {1 << ROW_BITS} rows per Spark "
                              "task; repartition the DataFrame into more partitions")
        values = self._cols["value"]
        if not pa.types.is_binary(values.type):
            values = values.cast(pa.binary())
        if values.null_count:
            raise ConfigError(f"row {row_base + _first_true(values.is_null())} of the task has "
                              "a null value (NSQ messages need a body)")
        self.values = values
        lengths = pc.binary_length(values)
        self.lengths = lengths
        # nsqd counts an MPUB_TRACE element's trace id in the message size (an MPUB_EXT
        # row carries its trace id in the header instead)
        traced = (trace_base is not None or "trace_id" in names) and "ext" not in names
        limit = opts.maxMessageBytes - (8 if traced else 0)
        if self.rows:
            mm = pc.min_max(lengths).as_py()
            if mm["min"] == 0 or mm["max"] > limit:
                bad = pc.or_(pc.equal(lengths, 0), pc.greater(lengths, limit))
                i = _first_true(bad)
                try:
                    check_body(values[i].as_py(), limit)
                except ConfigError as exc:
                    why = (f" (maxMessageBytes {opts.maxMessageBytes} less the 8-byte trace id "
                           "nsqd counts in)") if traced and mm["min"] else ""
                    raise ConfigError(f"row {row_base + i} of the task: {exc}{why}") from exc
        # topics: the option wins; else the column, checked once per distinct name
        self.topic_col = None
        if opts.topic is None:
            tcol = self._cols["topic"]
            if tcol.null_count:
                raise ConfigError(f"row {row_base + _first_true(tcol.is_null())} of the task "
                                  "has no topic (null topic column and no topic option)")
            self.topic_col = tcol
            self.topics: list[str] = [check_topic(x) for x in pc.unique(tcol).to_pylist()]
        else:
            self.topics = [opts.topic]
        self.needs_partition_num = "shard_key" in names
        #: a partition column is checked against the topic's count when it is known
        self.checks_partitions = "partition" in names
        for name in ("partition", "trace_id", "delay_ms"):
            col = self._cols.get(name)
            if col is not None and col.null_count < len(col):
                mm = pc.min_max(col).as_py()
                top = {"partition": MAX_PARTITION, "trace_id": (1 << 63) - 1,
                       "delay_ms": MAX_DELAY_MS}[name]
                if mm["min"] < 0 or mm["max"] > top:
                    bad = pc.or_(pc.less(col, 0), pc.greater(col, top))
                    i = _first_true(pc.fill_null(bad, False))
                    raise ConfigError(f"row {row_base + i} of the task: {name} "
                                      f"{col[i].as_py()} out of range 0..{top}")

    # -- grouping

    def _targets(self, topic: str, idx: Any, partition_num: int | None) -> Any:
        """Target partition per row of ``idx`` (-1: the producer picks), or None if none."""
        pa, pc = _pa(), _pc()
        part = self._cols.get("partition")
        key = self._cols.get("shard_key")
        out = None
        if key is not None and partition_num:
            k = key.take(idx) if idx is not None else key
            enc = pc.dictionary_encode(k)
            uniq = enc.dictionary.to_pylist()
            # the rule once per distinct key (Producer.publish_ordered's rule, in one call)
            parts = pa.array(shard_partitions(uniq, partition_num, self.opts.shardHash),
                             pa.int64())
            out = pc.take(parts, enc.indices)  # null keys stay null
        elif key is not None and not partition_num:
            raise ConfigError("column shard_key needs a youzan partitioned topic (its partition "
                              "count from lookupd); this topic has none")
        if part is not None:
            p = (part.take(idx) if idx is not None else part).cast(pa.int64())
            if partition_num:
                self._check_partitions(topic, p, idx, partition_num)
            out = p if out is None else pc.coalesce(p, out)
        if out is None:
            return None
        return pc.fill_null(out, -1)

    def _check_partitions(self, topic: str, parts: Any, idx: Any, partition_num: int) -> None:
        """A row whose partition the topic does not have fails naming the row, before any
        row of its batch goes out (the producer would refuse its MPUB naming no row)."""
        pc = _pc()
        top = pc.max(parts).as_py()
        if top is None or top < partition_num:
            return
        i = _first_true(pc.fill_null(pc.greater_equal(parts, partition_num), False))
        raise ConfigError(f"row {self._row_base + self._row(i, idx)} of the task: partition "
                          f"{parts[i].as_py()} out of range: topic {topic!r} has "
                          f"{partition_num} partitions")

    def units(self, partition_nums: Mapping[str, int]) -> list[Unit]:
        """The publish units of this batch, in row order per (topic, partition)."""
        pc = _pc()
        out: list[Unit] = []
        for topic in self.topics:
            if self.topic_col is None:
                idx = None
            else:
                idx = pc.indices_nonzero(pc.equal(self.topic_col, topic))
            targets = self._targets(topic, idx, partition_nums.get(topic))
            if targets is None:
                out.extend(self._encode(topic, None, idx))
                continue
            for p in sorted(pc.unique(targets).to_pylist()):
                sel = pc.indices_nonzero(pc.equal(targets, p))
                rows = sel if idx is None else pc.take(idx, sel)
                out.extend(self._encode(topic, None if p < 0 else int(p), rows))
        return out

    # -- encoding

    def _encode(self, topic: str, partition: int | None, idx: Any) -> list[Unit]:
        pc = _pc()
        values = self.values if idx is None else self.values.take(idx)
        lengths = self.lengths if idx is None else self.lengths.take(idx)
        units: list[Unit] = []
        delay = self._cols.get("delay_ms")
        if delay is not None:
            d = delay if idx is None else delay.take(idx)
            has = pc.is_valid(d)
            if pc.any(has).as_py():
                rows = pc.indices_nonzero(has)
                deferred = DeferredRows(topic, list(zip(values.take(rows).to_pylist(),
                                                        d.take(rows).to_pylist(), strict=True)))
                keep = pc.indices_nonzero(pc.invert(has))
                values, lengths = values.take(keep), lengths.take(keep)
                units.extend(self._plain(topic, partition, values, lengths, None))
                units.append(deferred)
                return units
        ext = self._cols.get("ext")
        if ext is not None:
            e = ext if idx is None else ext.take(idx)
            if e.null_count < len(e):
                return self._ext(topic, partition, values, e, self._trace_ids(idx), idx)
        return self._plain(topic, partition, values, lengths, self._trace_ids(idx))

    def _trace_ids(self, idx: Any) -> Any:
        """uint64 trace ids per row (Arrow), or None when the rows carry none."""
        pa, pc = _pa(), _pc()
        col = self._cols.get("trace_id")
        if col is not None:
            c = col if idx is None else col.take(idx)
            return pc.fill_null(c.cast(pa.int64()), 0).cast(pa.uint64())
        if self._trace_base is None:
            return None
        base = self._trace_base + self._row_base
        rows = pa.array(np.arange(self.rows, dtype=np.uint64)) if idx is None else \
            idx.cast(pa.uint64())
        return pc.add(rows, pa.scalar(base, pa.uint64()))

    def _plain(self, topic: str, partition: int | None, values: Any, lengths: Any,
               trace_ids: Any) -> list[Unit]:
        """MPUB / MPUB_TRACE bodies, split at ``maxBatchBytes``.

        Each body is a view of one joined Arrow buffer, not a copy: the MPUBs are cut from the
        element sizes first, and the first row of each carries the body's count field in front
        of its own prefix, so ``[count]([size][data])*`` lies contiguous in the join's output
        (a copy of a 1 MiB body costs as much as encoding it: fresh pages fault in)."""
        pa, pc = _pa(), _pc()
        n = len(values)
        if n == 0:
            return []
        lens = lengths.to_numpy(zero_copy_only=False).astype(np.int64)
        traced = trace_ids is not None
        width = _TRACE_FIELDS if traced else _PLAIN_FIELDS
        starts = _cut(np.cumsum(lens + width), self.opts.maxBatchBytes - 4)
        counts = np.diff(np.append(starts, n))
        if traced:
            pre = np.empty(n, dtype=[("s", ">u4"), ("t", ">u8")])
            pre["s"] = lens + 8
            pre["t"] = trace_ids.to_numpy(zero_copy_only=False)
        else:
            pre = lens.astype(">u4")
        # the count fields go in front of the prefix of each MPUB's first row
        data = np.insert(pre.view(np.uint8), np.repeat(starts * width, 4),
                         counts.astype(">u4").view(np.uint8))
        sizes = np.full(n, width, dtype=np.int64)
        sizes[starts] += 4
        total = 4 * len(starts) + int(lens.sum()) + width * n
        # 64-bit offsets only when the joined bytes pass 2 GiB (batches of large bodies)
        big = total >= _BIG_JOIN
        typ, off_type = (pa.large_binary(), np.int64) if big else (pa.binary(), np.int32)
        offs = np.zeros(n + 1, dtype=off_type)
        np.cumsum(sizes, out=offs[1:])
        prefix = pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offs), pa.py_buffer(data)])
        joined = pc.binary_join_element_wise(prefix, values.cast(typ) if big else values,
                                             pa.scalar(b"", typ))
        offsets = np.frombuffer(joined.buffers()[1], dtype=off_type, count=n + 1,
                                offset=joined.offset * offs.itemsize)
        view = memoryview(joined.buffers()[2]).cast("B")  # keeps the Arrow buffer alive
        units: list[Unit] = []
        for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
            body = view[int(offsets[start]):int(offsets[start + count])]
            units.append(EncodedBatch(topic, partition, body, count, traced))
        return units

    def _ext(self, topic: str, partition: int | None, values: Any, ext: Any,
             trace_ids: Any, idx: Any) -> list[Unit]:
        """MPUB_EXT items (one JSON header per row), split at ``maxBatchBytes``; ``idx``:
        the rows' indices in the batch (None: all of them), to name a bad header's row."""
        bodies = values.to_pylist()
        headers = ext.to_pylist()
        tids = trace_ids.to_pylist() if trace_ids is not None else None
        units: list[Unit] = []
        cur = ExtBatch(topic, partition, [])
        size = 4
        for i, (body, pairs) in enumerate(zip(bodies, headers, strict=True)):
            # a null value (map('k', col) with a null col) means the key is absent: sent as
            # JSON null it read back as the string "null"
            hdr: dict[str, Any] = {k: v for k, v in pairs or () if v is not None}
            if tids is not None:
                hdr["##trace_id"] = str(tids[i])
            try:
                # an empty header is refused (docs/protocol.md §5.7)
                h = encode_ext_header(hdr) or b"{}"
            except ConfigError as exc:
                raise ConfigError(f"row {self._row_base + self._row(i, idx)} of the task: "
                                  f"{exc}") from None
            # nsqd counts the header and its 2-byte length in the message size
            if 2 + len(h) + len(body) > self.opts.maxMessageBytes:
                raise ConfigError(
                    f"row {self._row_base + self._row(i, idx)} of the task: message body of "
                    f"{len(body)} bytes with its ext header of {len(h)} bytes (and 2 for its "
                    f"length, which nsqd counts in) exceeds maxMessageBytes "
                    f"{self.opts.maxMessageBytes}")
            item = 6 + len(h) + len(body)
            if cur.items and size + item > self.opts.maxBatchBytes:
                units.append(cur)
                cur = ExtBatch(topic, partition, [])
                size = 4
            cur.items.append((h, body))
            size += item
        if cur.items:
            units.append(cur)
        return units

    @staticmethod
    def _row(i: int, idx: Any) -> int:
        """The batch index of the ``i``-th row of a group (``idx``: the group's indices)."""
        return i if idx is None else int(idx[i].as_py())


def plan_batches(batches: Sequence[Any], opts: SinkOptions,
                 partition_nums: Callable[[str], int]) -> list[Unit]:
    """Every unit of ``batches`` (a helper for tests and benchmarks; the sink streams)."""
    units: list[Unit] = []
    row = 0
    for b in batches:
        plan = BatchPlan(b, opts, row_base=row)
        units.extend(plan.units({t: partition_nums(t) for t in plan.topics}))
        row += plan.rows
    return units
