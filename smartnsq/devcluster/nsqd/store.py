"""Message storage of the embedded cluster, one :class:`ClusterStore` per cluster.

It lives outside the nsqd nodes so data survives node restarts and leadership moves:

* youzan data is keyed by ``(topic, partition)``: whichever node leads the partition serves
  the same :class:`PartitionLog` (an append-only log with disk-queue offsets,
  docs/protocol.md §5.7/§13.1) and its
  channels, which are cursors over the log;
* stock data is keyed by ``(node_id, topic)``: a :class:`StockTopic` copies each message into
  every channel (multicast), and holds messages published before any channel existed.

Nothing here is durable; it is all memory.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Iterable

from smartnsq.devcluster.nsqd.delivery import Channel, Record
from smartnsq.protocol.messages import youzan_id

#: timestamp + attempts + 16-byte id (the on-disk record of youzan nsqd, docs/protocol.md §5.8)
_RECORD_HEAD = 26
#: the disk queue prefixes every record with its 4-byte length
_DISK_LENGTH_PREFIX = 4
#: observed on real youzan nsqd (captures/youzan): the first message of a partition gets
#: internal id ``(partition << 50) + 2``, later ones count up by one
_FIRST_ID = 2
_PARTITION_ID_SHIFT = 50


def youzan_raw_size(body_len: int, ext_version: int | None = None, ext_len: int = 0) -> int:
    """Size of a stored youzan record: the serialized message plus the 4-byte length prefix.

    The serialized message is timestamp(8) + attempts(2) + id(8) + trace id(8) [+ ext
    version(1) [+ ext length(2) + ext bytes] on ext topics] + body. Checked against the
    captures: ``ordered-1`` (9 bytes) → 39, ``ordered-2-traced`` (16) → 46, ``traced body``
    (11) → 41, three 8-byte MPUB_TRACE payloads → 114, an ext message with a 43-byte JSON
    header and an 8-byte body → 84.
    """
    n = _RECORD_HEAD + body_len + _DISK_LENGTH_PREFIX
    if ext_version is not None:
        n += 1
        if ext_version != 0:
            n += 2 + ext_len
    return n


def _now_ns() -> int:
    return time.time_ns()


class PartitionLog:
    """youzan: one topic partition's messages and channels."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.records: list[Record] = []
        #: disk-queue offset of the next record (== total stored bytes)
        self.end_offset = 0
        self.message_bytes = 0
        self.channels: dict[str, Channel] = {}
        self._next_id = (partition << _PARTITION_ID_SHIFT) + _FIRST_ID
        #: offsets and timestamps of the records, for seeking
        self._offsets: list[int] = []

    def append(
        self,
        body: bytes,
        *,
        trace_id: int = 0,
        ext_version: int | None = None,
        ext: bytes = b"",
        tag: str = "",
        timestamp: int | None = None,
    ) -> Record:
        """Store one message (the caller then calls :meth:`notify`)."""
        internal_id = self._next_id
        self._next_id += 1
        raw = youzan_raw_size(len(body), ext_version, len(ext))
        rec = Record(
            id=youzan_id(internal_id, trace_id),
            key=internal_id,
            body=body,
            timestamp=_now_ns() if timestamp is None else timestamp,
            trace_id=trace_id,
            offset=self.end_offset,
            raw_size=raw,
            ext_version=ext_version,
            ext=ext,
            tag=tag,
        )
        self.records.append(rec)
        self._offsets.append(self.end_offset)
        self.end_offset += raw
        self.message_bytes += len(body)
        return rec

    def notify(self) -> None:
        for ch in list(self.channels.values()):
            ch.log_grew()

    def channel(self, name: str, *, create: bool = True) -> Channel | None:
        """The named channel; a new one starts at the end of the log (docs/protocol.md §13.1)."""
        ch = self.channels.get(name)
        if ch is None and create:
            n = len(self.records)
            ch = Channel(name, log=self.records, start=n, youzan=True, on_idle=self._idle)
            self.channels[name] = ch
        return ch

    def delete_channel(self, name: str) -> bool:
        ch = self.channels.pop(name, None)
        if ch is None:
            return False
        ch.close()
        return True

    def _idle(self, ch: Channel) -> None:
        if ch.ephemeral and not ch.closed and self.channels.get(ch.name) is ch:
            self.delete_channel(ch.name)

    # --- seeking (SUB_ADVANCED and /channel/setoffset) --------------------------------

    def index_from_offset(self, offset: int) -> int:
        """Index of the first record starting at or after ``offset``; the end when there is
        none. Real nsqd moves a position inside a record on to the next one, and one past
        the end to the end."""
        return bisect.bisect_left(self._offsets, offset)

    def index_of_timestamp(self, seconds: int) -> int:
        """Index of the first record published at or after ``seconds`` (unix time)."""
        limit = seconds * 1_000_000_000
        for i, rec in enumerate(self.records):
            if rec.timestamp >= limit:
                return i
        return len(self.records)

    def total_depth(self) -> int:
        return self.end_offset


class StockTopic:
    """stock: one nsqd's topic, multicasting to its channels."""

    def __init__(self, store: ClusterStore, node_id: str, name: str) -> None:
        self._store = store
        self.node_id = node_id
        self.name = name
        self.ephemeral = name.endswith("#ephemeral")
        self.channels: dict[str, Channel] = {}
        #: messages published while the topic had no channel (the first channel gets them)
        #: or was paused (its channels get them when it is unpaused)
        self.backlog: list[Record] = []
        self.message_count = 0
        self.message_bytes = 0
        self.paused = False

    def publish(self, records: list[Record]) -> None:
        self.message_count += len(records)
        self.message_bytes += sum(len(r.body) for r in records)
        if self.paused or not self.channels:
            self.backlog.extend(records)
            return
        for ch in list(self.channels.values()):
            ch.put(records)

    def set_paused(self, paused: bool) -> None:
        """``/topic/pause``: what is published stays in the topic (its depth), off the
        channels, until unpaused."""
        self.paused = paused
        if not paused and self.channels and self.backlog:
            backlog, self.backlog = self.backlog, []
            for ch in list(self.channels.values()):
                ch.put(backlog)

    def channel(self, name: str, *, create: bool = True) -> Channel | None:
        ch = self.channels.get(name)
        if ch is None and create:
            ch = Channel(name, on_idle=self._idle)
            self.channels[name] = ch
            if self.backlog and not self.paused:
                backlog, self.backlog = self.backlog, []
                ch.put(backlog)
        return ch

    def delete_channel(self, name: str) -> bool:
        ch = self.channels.pop(name, None)
        if ch is None:
            return False
        ch.close()
        if self.ephemeral and not self.channels:
            self._store.delete_stock_topic(self.node_id, self.name)
        return True

    def _idle(self, ch: Channel) -> None:
        if ch.ephemeral and not ch.closed and self.channels.get(ch.name) is ch:
            self.delete_channel(ch.name)

    def depth(self) -> int:
        return len(self.backlog)

    def close(self) -> None:
        for ch in list(self.channels.values()):
            ch.close()
        self.channels.clear()
        self.backlog.clear()


class ClusterStore:
    """All messages of one embedded cluster (see the module docstring)."""

    def __init__(self) -> None:
        self._stock: dict[tuple[str, str], StockTopic] = {}
        self._partitions: dict[tuple[str, int], PartitionLog] = {}
        self._stock_ids = itertools.count(1)

    # --- stock ---------------------------------------------------------------------------

    def stock_topic(self, node_id: str, topic: str, *, create: bool = False) -> StockTopic | None:
        t = self._stock.get((node_id, topic))
        if t is None and create:
            t = StockTopic(self, node_id, topic)
            self._stock[(node_id, topic)] = t
        return t

    def stock_topics(self, node_id: str) -> dict[str, StockTopic]:
        return {name: t for (n, name), t in self._stock.items() if n == node_id}

    def delete_stock_topic(self, node_id: str, topic: str) -> bool:
        t = self._stock.pop((node_id, topic), None)
        if t is None:
            return False
        t.close()
        return True

    def new_stock_record(self, body: bytes, *, defer: float = 0.0) -> Record:
        """A stock message with a fresh id (16 ASCII hex digits, unique in the cluster)."""
        mid = b"%016x" % next(self._stock_ids)
        return Record(id=mid, key=mid, body=body, timestamp=_now_ns(), defer=defer)

    # --- youzan --------------------------------------------------------------------------

    def partition(self, topic: str, partition: int) -> PartitionLog:
        """The partition's log, created empty on first use."""
        p = self._partitions.get((topic, partition))
        if p is None:
            p = PartitionLog(topic, partition)
            self._partitions[(topic, partition)] = p
        return p

    def existing_partition(self, topic: str, partition: int) -> PartitionLog | None:
        return self._partitions.get((topic, partition))

    def partitions_of(self, topic: str) -> dict[int, PartitionLog]:
        return {p: log for (t, p), log in self._partitions.items() if t == topic}

    def delete_topic(self, topic: str) -> None:
        """youzan: forget every partition of ``topic`` (its consumers are disconnected)."""
        for key in [k for k in self._partitions if k[0] == topic]:
            log = self._partitions.pop(key)
            for name in list(log.channels):
                log.delete_channel(name)

    def all_partitions(self) -> Iterable[PartitionLog]:
        return list(self._partitions.values())
