"""One publish command each: what to send on a connection once a target is chosen.

An op knows its topic, the partition the caller asked for (None: the producer chooses) and how
to send itself on a :class:`~smartnsq.conn.Connection` to a given partition. The retry engine
(:mod:`smartnsq.producer.engine`) may call :meth:`Op.send` several times (another node, another
leader). :class:`Publish` is what the engine and the routing need of any publish, the TCP ops
here and the HTTP producer's requests alike.
"""

# Per-call ``timeout`` arguments are the API (they bound the whole call, retries included);
# asyncio.timeout() around the call could not keep a timed-out publish's FIFO slot.
# ruff: noqa: ASYNC109

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

from smartnsq.conn import Connection
from smartnsq.errors import ConfigError, Flavour, UnsupportedFeatureError
from smartnsq.producer.types import PublishReceipt
from smartnsq.protocol.commands import encode_ext_header
from smartnsq.protocol.commands import pub as pub_command
from smartnsq.sharding import ShardKey, ShardRule

_MAX_U64 = (1 << 64) - 1
_STOCK = Flavour.STOCK

C_contra = TypeVar("C_contra", contravariant=True)


class Publish(Protocol[C_contra]):
    """One publish as the retry engine runs it, sent on channels of type ``C_contra``."""

    topic: str
    #: the partition asked for (None: the producer chooses); a shard key pins it once known
    partition: int | None
    #: ordered publishing: the shard key whose partition this publish is pinned to
    shard: ShardKey | None
    rule: ShardRule

    @property
    def what(self) -> str:
        """The command's name, for errors and logs."""
        ...

    @property
    def command(self) -> str:
        """The command, as metrics and spans name it (PUB, MPUB, HTTP_PUB ...)."""
        ...

    @property
    def count(self) -> int:
        """Messages it publishes."""
        ...

    @property
    def youzan_only(self) -> bool:
        """Needs a partitioned youzan topic."""
        ...

    @property
    def stock_only(self) -> bool:
        """Stock nsqd only (deferred publishing)."""
        ...

    def send(self, channel: C_contra, partition: int | None,
             timeout: float) -> Awaitable[PublishReceipt | None]:
        """One attempt on ``channel`` to ``partition``, waiting ``timeout`` at most for the
        answer."""
        ...


def check_trace_id(trace_id: int) -> int:
    if isinstance(trace_id, bool) or not isinstance(trace_id, int) or \
            not 0 <= trace_id <= _MAX_U64:
        raise ConfigError(f"trace_id must be an int in 0..2**64-1, got {trace_id!r}")
    return trace_id


def ext_header_bytes(ext: Mapping[str, Any], trace_id: int | None) -> bytes:
    """The JSON header of PUB_EXT/MPUB_EXT (validated now, before any I/O); a ``trace_id``
    travels as the reserved ``##trace_id`` key (a decimal string, docs/protocol.md §5.7)."""
    if not isinstance(ext, Mapping):
        raise ConfigError(f"ext must be a dict of header fields, got {type(ext).__name__}")
    if trace_id is not None:
        ext = {**ext, "##trace_id": str(check_trace_id(trace_id))}
    data = encode_ext_header(ext)
    return data or b"{}"


def one_op(topic: str, partition: int | None, body: bytes, trace_id: int | None,
           ext: Mapping[str, Any] | None, traced: bool = False, *,
           max_msg_size: int) -> Op:
    """The op of one :meth:`Producer.publish`: PUB_EXT with ``ext`` (``trace_id`` as its
    ``##trace_id``), PUB_TRACE with ``trace_id``, else a PUB (``traced``: the trace switch
    is on for the topic). ConfigError when the body and what it carries besides exceed
    ``max_msg_size`` (:func:`check_carried`)."""
    if ext is not None:
        header = ext_header_bytes(ext, trace_id)
        check_carried(len(body), 2 + len(header), "ext header and its 2-byte length",
                      max_msg_size)
        return PubExt(topic, partition, body, header, trace_id is not None)
    if trace_id is not None:
        check_carried(len(body), 8, "8-byte trace id", max_msg_size)
        return PubTrace(topic, partition, body, check_trace_id(trace_id))
    return Pub(topic, partition, body, traced)


def check_carried(size: int, extra: int, what: str, max_msg_size: int) -> None:
    """youzan's nsqd holds a message's body and what it carries besides (a PUB_TRACE's trace
    id, a PUB_EXT's header) to ``max_msg_size`` together, as one size on the wire: refuse
    before any I/O what nsqd would refuse with ``E_BAD_MESSAGE message too big``."""
    if size + extra > max_msg_size:
        raise ConfigError(f"message body of {size} bytes with its {what} ({extra} bytes) "
                          f"exceeds max_msg_size ({max_msg_size} bytes): nsqd counts both")


class Op:
    """Base of the publish commands."""

    __slots__ = ("partition", "rule", "sent_to", "shard", "topic")

    what: ClassVar[str] = "publish"
    #: needs a partitioned youzan topic (PUB_TRACE, PUB_EXT ...)
    youzan_only: ClassVar[bool] = False
    #: stock nsqd only (DPUB)
    stock_only: ClassVar[bool] = False

    def __init__(self, topic: str, partition: int | None) -> None:
        self.topic = topic
        self.partition = partition
        #: ordered publishing: the shard key whose partition this op is pinned to
        self.shard: ShardKey | None = None
        self.rule: ShardRule = "murmur3"
        #: the partition of the last attempt (batches report it; None: stock or unknown)
        self.sent_to: int | None = None

    @property
    def count(self) -> int:
        """Messages this op publishes."""
        return 1

    @property
    def command(self) -> str:
        return self.what

    def send(self, conn: Connection, partition: int | None,
             timeout: float) -> Awaitable[PublishReceipt | None]:
        raise NotImplementedError

    def plain_command(self) -> tuple[bytes, bytes | None] | None:
        """The command, as its head and the rest (None: all in the head), when this op is a
        plain publish that any node answers with OK (no partition, nothing traced), so that
        the executor's first attempt can send it without the op's coroutine; None
        otherwise."""
        return None

    def _on_stock(self, conn: Connection, partition: int) -> UnsupportedFeatureError:
        """A partition given for a directly addressed stock nsqd, which has none."""
        return UnsupportedFeatureError(f"partition={partition} needs youzan nsqd; "
                                       f"{conn.address} is stock nsqd")

    def _youzan_partition(self, conn: Connection, partition: int | None) -> int:
        if conn.flavour is Flavour.STOCK:
            raise UnsupportedFeatureError(f"{self.what} needs youzan nsqd; {conn.address} is "
                                          "stock nsqd")
        if partition is None:
            raise ConfigError(f"{self.what} to a directly addressed youzan nsqd needs "
                              "partition= (or use lookupd)")
        return partition

    def _receipt(self, resp: Any, conn: Connection, partition: int,
                 count: int = 1) -> PublishReceipt:
        return PublishReceipt.from_response(resp, self.topic, partition, conn.address, count)


class Pub(Op):
    __slots__ = ("body", "traced")
    what = "PUB"

    def __init__(self, topic: str, partition: int | None, body: bytes, traced: bool) -> None:
        # the hot path: no super().__init__ call
        self.topic = topic
        self.partition = partition
        self.shard = None
        self.rule = "murmur3"
        self.body = body
        #: tracing is on for the topic: use PUB_TRACE (trace id 0) where the server has it
        self.traced = traced

    def plain_command(self) -> tuple[bytes, bytes | None] | None:
        # a PUB made as an op (a traced producer's) takes the engine's fast path too
        return None if self.partition is not None else (pub_command(self.topic, self.body),
                                                        None)

    def send(self, conn: Connection, partition: int | None,
             timeout: float) -> Awaitable[PublishReceipt | None]:
        if partition is not None:
            # a partition asked of a directly addressed nsqd (routed ones lead partitions)
            if self.partition is not None and conn.flavour is _STOCK:
                raise self._on_stock(conn, partition)
            if self.traced and conn.flavour is Flavour.YOUZAN:
                return self._send_traced(conn, partition, timeout)
        return conn.publish(self.topic, self.body, partition, timeout)

    async def _send_traced(self, conn: Connection, partition: int,
                           timeout: float) -> PublishReceipt:
        resp = await conn.publish_trace(self.topic, partition, 0, self.body, timeout)
        return self._receipt(resp, conn, partition)


class PubTrace(Op):
    __slots__ = ("body", "trace_id")
    what = "PUB_TRACE"
    youzan_only = True

    def __init__(self, topic: str, partition: int | None, body: bytes, trace_id: int) -> None:
        super().__init__(topic, partition)
        self.body = body
        self.trace_id = trace_id

    async def send(self, conn: Connection, partition: int | None,
                   timeout: float) -> PublishReceipt:
        p = self._youzan_partition(conn, partition)
        resp = await conn.publish_trace(self.topic, p, self.trace_id, self.body, timeout)
        return self._receipt(resp, conn, p)


class PubExt(Op):
    __slots__ = ("body", "header", "traced")
    what = "PUB_EXT"
    youzan_only = True

    def __init__(self, topic: str, partition: int | None, body: bytes, header: bytes,
                 traced: bool) -> None:
        super().__init__(topic, partition)
        self.body = body
        self.header = header
        self.traced = traced

    async def send(self, conn: Connection, partition: int | None,
                   timeout: float) -> PublishReceipt | None:
        p = self._youzan_partition(conn, partition)
        resp = await conn.publish_ext(self.topic, p, self.header, self.body, timeout)
        return None if resp is None else self._receipt(resp, conn, p)


class MPub(Op):
    __slots__ = ("bodies", "traced")
    what = "MPUB"

    def __init__(self, topic: str, partition: int | None, bodies: list[bytes],
                 traced: bool) -> None:
        super().__init__(topic, partition)
        self.bodies = bodies
        self.traced = traced

    @property
    def count(self) -> int:
        return len(self.bodies)

    def send(self, conn: Connection, partition: int | None,
             timeout: float) -> Awaitable[PublishReceipt | None]:
        self.sent_to = partition
        if partition is not None:
            if self.partition is not None and conn.flavour is _STOCK:
                raise self._on_stock(conn, partition)
            if self.traced and conn.flavour is Flavour.YOUZAN:
                return self._send_traced(conn, partition, timeout)
        return conn.publish_many(self.topic, self.bodies, partition, timeout)

    async def _send_traced(self, conn: Connection, partition: int,
                           timeout: float) -> PublishReceipt:
        items = [(0, b) for b in self.bodies]
        resp = await conn.publish_many_trace(self.topic, partition, items, timeout)
        return self._receipt(resp, conn, partition, len(items))


class MPubTrace(Op):
    __slots__ = ("bodies", "trace_id")
    what = "MPUB_TRACE"
    youzan_only = True

    def __init__(self, topic: str, partition: int | None, bodies: list[bytes],
                 trace_id: int) -> None:
        super().__init__(topic, partition)
        self.bodies = bodies
        self.trace_id = trace_id

    @property
    def count(self) -> int:
        return len(self.bodies)

    async def send(self, conn: Connection, partition: int | None,
                   timeout: float) -> PublishReceipt:
        p = self.sent_to = self._youzan_partition(conn, partition)
        items = [(self.trace_id, b) for b in self.bodies]
        resp = await conn.publish_many_trace(self.topic, p, items, timeout)
        return self._receipt(resp, conn, p, len(items))


class MPubExt(Op):
    __slots__ = ("bodies", "header")
    what = "MPUB_EXT"
    youzan_only = True

    def __init__(self, topic: str, partition: int | None, bodies: list[bytes],
                 header: bytes) -> None:
        super().__init__(topic, partition)
        self.bodies = bodies
        self.header = header

    @property
    def count(self) -> int:
        return len(self.bodies)

    async def send(self, conn: Connection, partition: int | None, timeout: float) -> None:
        p = self.sent_to = self._youzan_partition(conn, partition)
        items: list[tuple[bytes | None, bytes]] = [(self.header, b) for b in self.bodies]
        await conn.publish_many_ext(self.topic, p, items, timeout)


class DPub(Op):
    __slots__ = ("body", "delay_ms")
    what = "DPUB"
    stock_only = True

    def __init__(self, topic: str, partition: int | None, body: bytes, delay_ms: int) -> None:
        super().__init__(topic, partition)
        self.body = body
        self.delay_ms = delay_ms

    async def send(self, conn: Connection, partition: int | None, timeout: float) -> None:
        await conn.publish_deferred(self.topic, self.body, self.delay_ms, timeout)
