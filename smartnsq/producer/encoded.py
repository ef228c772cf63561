"""Batches the caller encoded: :meth:`Producer.publish_encoded` and
:meth:`Producer.publish_ext_batch`.

``publish_many`` takes one ``bytes`` object per message. A caller that already holds its
messages in one buffer (the Spark sink builds MPUB bodies straight from Arrow buffers) can
hand over the MPUB body as is — ``[count]([size][data])*``, big-endian uint32s, with MPUB_TRACE
each ``data`` being an 8-byte trace id then the message, so every message has its own trace
id — and skip building a Python object per message. :func:`encode_batch` builds such a body
from Python objects (for tests, and for callers who want per-message trace ids).

The producer walks the body's element sizes before any I/O (one ``unpack`` per message, no
copy): nsqd reads an MPUB's elements straight off the socket, trusting their sizes, so a body
whose sizes do not add up would make it read into the next command and desynchronise the
connection; such a body raises ConfigError naming the first bad element. Each batch is
atomic and goes through the producer's retry loop like any MPUB; the returned
:class:`~smartnsq.producer.types.BatchReceipt` says which partition took it.
"""

# Per-call ``timeout`` arguments are the API (they bound the whole call, retries included).
# ruff: noqa: ASYNC109

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from smartnsq.conn import Connection
from smartnsq.errors import ConfigError, Flavour
from smartnsq.errors.base import CommandKind
from smartnsq.producer.checks import check_body
from smartnsq.producer.ops import MPub, MPubExt, MPubTrace, Op, check_trace_id
from smartnsq.producer.types import PublishReceipt
from smartnsq.protocol.commands import encode_ext_header, mpub_body, mpub_encoded, mpub_head
from smartnsq.protocol.responses import decode_trace_response

__all__ = ["Encoded", "EncodedMPub", "EncodedMPubTrace", "ExtBatch", "ExtItem", "check_encoded",
           "check_ext_items", "encode_batch", "mpub_op"]

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
#: the smallest element: a size field and a 1-byte message (MPUB_TRACE: + the trace id)
_MIN_ELEMENT = 5
_MIN_TRACE_ELEMENT = 13

ExtItem = tuple[Mapping[str, Any] | bytes, bytes]


def encode_batch(bodies: Sequence[bytes], trace_ids: Sequence[int] | None = None) -> bytes:
    """The MPUB body of ``bodies`` (with ``trace_ids``, one per body: the MPUB_TRACE body),
    as :meth:`Producer.publish_encoded` takes it."""
    if isinstance(bodies, bytes | str) or not isinstance(bodies, Sequence) or not bodies:
        raise ConfigError("bodies must be a non-empty sequence of bytes")
    if trace_ids is not None and (not isinstance(trace_ids, Sequence)
                                  or len(trace_ids) != len(bodies)):
        raise ConfigError(f"trace_ids must be a sequence of {len(bodies)} ints (one per body)")
    parts = [_U32.pack(len(bodies))]
    for i, b in enumerate(bodies):
        if type(b) is not bytes or not b:
            raise ConfigError(f"bodies[{i}] must be non-empty bytes, got {b!r:.40}")
        if trace_ids is None:
            parts += (_U32.pack(len(b)), b)
        else:
            tid = check_trace_id(trace_ids[i])
            parts += (_U32.pack(8 + len(b)), _U64.pack(tid), b)
    return b"".join(parts)


Encoded = bytes | bytearray | memoryview


def check_encoded(body: object, traced: object, max_msg_size: int,
                  max_body_size: int) -> tuple[Encoded, int]:
    """An encoded MPUB body (a memoryview as flat bytes) and its message count, or
    ConfigError naming what is wrong."""
    if not isinstance(traced, bool):
        raise ConfigError(f"traced must be a bool, got {traced!r}")
    if not isinstance(body, bytes | bytearray | memoryview):
        raise ConfigError(f"body must be bytes (an encoded MPUB body), got "
                          f"{type(body).__name__}")
    if isinstance(body, memoryview) and (body.format != "B" or body.ndim != 1):
        if not body.c_contiguous:
            raise ConfigError("body must be a contiguous buffer")
        body = body.cast("B")  # len() then counts bytes
    n = len(body)
    if n < 4:
        raise ConfigError(f"body of {n} bytes has no message count (an encoded MPUB body "
                          "starts with a 4-byte count)")
    if n > max_body_size:
        raise ConfigError(f"body of {n} bytes exceeds max_body_size ({max_body_size})")
    count: int = _U32.unpack_from(body)[0]
    if count == 0:
        raise ConfigError("body holds 0 messages (its count field is 0)")
    smallest = 4 + count * (_MIN_TRACE_ELEMENT if traced else _MIN_ELEMENT)
    if n < smallest:
        raise ConfigError(f"body of {n} bytes is too short for the {count} messages its count "
                          f"field says (at least {smallest} bytes)")
    _walk(body, count, traced, max_msg_size)
    return body, count


def _walk(body: Encoded, count: int, traced: bool, max_msg_size: int) -> None:
    """The element sizes must cover the body exactly, each message within 1..max_msg_size."""
    unpack = _U32.unpack_from
    extra = 8 if traced else 0  # an MPUB_TRACE element's trace id
    end = len(body)
    off = 4
    for i in range(count):
        if off + 4 > end:
            raise ConfigError(f"body ends inside the size field of message {i} of {count}")
        size: int = unpack(body, off)[0] - extra
        if not 0 < size <= max_msg_size:
            what = "shorter than its trace id" if size < 0 else f"{size} bytes"
            raise ConfigError(f"message {i} of the body is {what}; messages must be 1.."
                              f"{max_msg_size} bytes (max_msg_size)")
        off += 4 + extra + size
        if off > end:
            raise ConfigError(f"message {i} of {count} ({size} bytes) runs past the end of "
                              f"the body ({end} bytes)")
    if off != end:
        raise ConfigError(f"the {count} messages of the body take {off} bytes, the body has "
                          f"{end}")


def check_ext_items(items: object, max_msg_size: int,
                    max_body_size: int) -> list[tuple[bytes, bytes]]:
    """``(header, body)`` items as ``(JSON bytes, body)``, or ConfigError naming the bad one."""
    if isinstance(items, bytes | str) or not isinstance(items, Sequence) or not items:
        raise ConfigError("items must be a non-empty sequence of (header, body) pairs")
    out: list[tuple[bytes, bytes]] = []
    size = 4
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise ConfigError(f"items[{i}] must be a (header, body) pair, got {item!r:.60}")
        header, body = item
        if not isinstance(header, Mapping | bytes):
            raise ConfigError(f"items[{i}]: the header must be a dict or JSON bytes, got "
                              f"{type(header).__name__}")
        h = encode_ext_header(header) or b"{}"  # an empty header is refused (docs/protocol.md §5.7)
        b = check_body(body, max_msg_size)
        size += 6 + len(h) + len(b)
        out.append((h, b))
    if size > max_body_size:
        raise ConfigError(f"MPUB_EXT body of {size} bytes exceeds max_body_size "
                          f"({max_body_size}): send fewer items")
    return out


class EncodedMPub(Op):
    """MPUB of a caller-encoded body; ``sent_to`` is the partition of the last attempt."""

    __slots__ = ("_count", "body")
    what: ClassVar[str] = "MPUB"
    traced: ClassVar[bool] = False

    def __init__(self, topic: str, partition: int | None, body: Encoded, count: int) -> None:
        super().__init__(topic, partition)
        self.body = body
        self._count = count

    @property
    def count(self) -> int:
        return self._count

    async def send(self, conn: Connection, partition: int | None,
                   timeout: float) -> PublishReceipt | None:
        if self.traced:
            partition = self._youzan_partition(conn, partition)
        elif self.partition is not None and conn.flavour is Flavour.STOCK:
            assert partition is not None
            raise self._on_stock(conn, partition)
        self.sent_to = partition
        command = mpub_encoded(self.topic, self.body, partition, traced=self.traced)
        data = await conn.request(command, CommandKind.PUBLISH, timeout, topic=self.topic,
                                  partition=partition)
        if self.traced:
            assert partition is not None
            return self._receipt(decode_trace_response(data), conn, partition, self.count)
        # anything but OK: answers and commands no longer line up, the connection fails
        conn.check_publish_answer(data, self.what)
        return None

    def plain_command(self) -> tuple[bytes, bytes | None] | None:
        if self.traced or self.partition is not None:
            return None
        body = self.body
        if type(body) is bytes:
            # immutable: written after the head as it is
            return mpub_head(self.topic, len(body)), body
        return mpub_encoded(self.topic, body), None  # a snapshot of a mutable buffer


class EncodedMPubTrace(EncodedMPub):
    """MPUB_TRACE of a caller-encoded body (every element carries its trace id)."""

    __slots__ = ()
    what = "MPUB_TRACE"
    traced = True
    youzan_only = True


class ExtBatch(Op):
    """MPUB_EXT with one JSON header per message; ``sent_to`` as :class:`EncodedMPub`."""

    __slots__ = ("items",)
    what = "MPUB_EXT"
    youzan_only = True

    def __init__(self, topic: str, partition: int | None,
                 items: list[tuple[bytes, bytes]]) -> None:
        super().__init__(topic, partition)
        self.items = items

    @property
    def count(self) -> int:
        return len(self.items)

    async def send(self, conn: Connection, partition: int | None, timeout: float) -> None:
        p = self._youzan_partition(conn, partition)
        self.sent_to = p
        items: list[tuple[bytes | None, bytes]] = list(self.items)
        await conn.publish_many_ext(self.topic, p, items, timeout)


def mpub_op(topic: str, partition: int | None, chunk: list[bytes], *, header: bytes | None,
            trace_id: int | None, traced: bool) -> Op:
    """The op that publishes one :meth:`Producer.publish_many` chunk: MPUB_EXT with an ext
    ``header``, MPUB_TRACE with ``trace_id``, an MPUB that may go out traced, or a plain MPUB
    encoded once here, whatever the retries."""
    if header is not None:
        return MPubExt(topic, partition, chunk, header)
    if trace_id is not None:
        return MPubTrace(topic, partition, chunk, trace_id)
    if traced:
        return MPub(topic, partition, chunk, traced)
    return EncodedMPub(topic, partition, mpub_body(chunk), len(chunk))
