"""The publisher side of a connection: PUB, MPUB, DPUB and youzan's PUB_TRACE, MPUB_TRACE,
PUB_EXT and MPUB_EXT. Each encodes its command, sends it through the connection's request
path (the response FIFO) and checks or decodes the answer.

Owner: :class:`~smartnsq.conn.Connection`, which builds one :class:`Publisher` and exposes
its methods as its own (``conn.publish``, ``conn.send_pub``, …), bound once. It holds no
state: the FIFO, the socket and the counters are the connection's, reached through
:class:`PublishHost`; it owns the commands and the rule for their answers. Callers: the
producer (``send_pub``, ``send_publish`` and ``check_publish_answer`` on its hot path; the
others per operation).
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from smartnsq.errors import Flavour, NSQError, ProtocolError, UnsupportedFeatureError
from smartnsq.errors.base import CommandKind
from smartnsq.protocol import commands
from smartnsq.protocol.frames import OK
from smartnsq.protocol.responses import TraceResponse, decode_trace_response

__all__ = ["ExtHeader", "PublishHost", "Publisher"]

ExtHeader = Mapping[str, Any] | bytes

_PUBLISH = CommandKind.PUBLISH
#: bound once: the producer's hot path encodes a PUB per call
_pub = commands.pub


class PublishHost(Protocol):
    """What the publisher side needs of its connection."""

    @property
    def address(self) -> str: ...

    @property
    def flavour(self) -> Flavour: ...

    @property
    def write_paused(self) -> bool: ...

    def send_request(self, command: bytes, kind: CommandKind, timeout: float | None,
                     topic: str | None, partition: int | None, close_on_error: bool,
                     body: bytes | None) -> asyncio.Future[bytes]: ...

    async def drain(self) -> None: ...

    def abort(self, exc: NSQError) -> None: ...

    def require_youzan(self, what: str) -> None: ...


class Publisher:
    """See the module docstring."""

    __slots__ = ("_host", "_send")

    def __init__(self, host: PublishHost) -> None:
        self._host = host
        #: the host's send path, bound once (called with every argument: see send_pub)
        self._send = host.send_request

    async def publish(self, topic: str, body: bytes, partition: int | None = None,
                      timeout: float | None = None) -> None:
        """PUB (youzan: to ``partition`` when given; stock ignores it)."""
        command = commands.pub(topic, body, partition)
        host = self._host
        if host.write_paused:
            await host.drain()
        self.check_publish_answer(
            await self._send(command, _PUBLISH, timeout, topic, partition, False, None), "PUB")

    def send_pub(self, topic: str, body: bytes, timeout: float) -> asyncio.Future[bytes]:
        """PUB without a coroutine of its own (the producer's hot path): the caller made sure
        the write buffer is below its high-water mark (``write_paused``), awaits the answer
        and hands it to :meth:`check_publish_answer`."""
        # every parameter passed: a bound method called with exactly its arguments takes
        # the interpreter's fast call path
        return self._send(_pub(topic, body), _PUBLISH, timeout, topic, None, False, None)

    def send_publish(self, command: bytes, timeout: float, topic: str,
                     body: bytes | None = None) -> asyncio.Future[bytes]:
        """An encoded plain publish (PUB or MPUB, no partition) like :meth:`send_pub`;
        ``body``: the rest of the command, written right after ``command`` as a piece of its
        own (so a large MPUB body is copied once, into the socket write)."""
        return self._send(command, _PUBLISH, timeout, topic, None, False, body)

    def check_publish_answer(self, data: bytes, what: str) -> None:
        """Fail the connection (and raise) unless ``data`` is the OK a plain publish gets.
        A plain publish is answered with exactly OK: anything else means responses and
        commands no longer line up, so no later answer on this connection can be trusted."""
        if data is not OK and data != OK:
            host = self._host
            exc = ProtocolError(f"nsqd {host.address} answered {what} with {data[:32]!r}, "
                                "expected OK")
            host.abort(exc)
            raise exc

    async def publish_many(self, topic: str, bodies: Sequence[bytes],
                           partition: int | None = None, timeout: float | None = None) -> None:
        """MPUB: all bodies atomically, one response."""
        command = commands.mpub(topic, bodies, partition)
        host = self._host
        if host.write_paused:
            await host.drain()
        self.check_publish_answer(
            await self._send(command, _PUBLISH, timeout, topic, partition, False, None),
            "MPUB")

    async def publish_deferred(self, topic: str, body: bytes, delay_ms: int,
                               timeout: float | None = None) -> None:
        """DPUB (stock only; youzan nsqd has no DPUB)."""
        if self._host.flavour is Flavour.YOUZAN:
            raise UnsupportedFeatureError("youzan nsqd has no DPUB (deferred publish)")
        command = commands.dpub(topic, delay_ms, body)
        self.check_publish_answer(await self._request(command, timeout, topic, None), "DPUB")

    async def publish_trace(self, topic: str, partition: int, trace_id: int, body: bytes,
                            timeout: float | None = None) -> TraceResponse:
        """PUB_TRACE (youzan); returns the stored message's id, offset and raw size."""
        self._host.require_youzan("PUB_TRACE")
        command = commands.pub_trace(topic, partition, trace_id, body)
        return decode_trace_response(await self._request(command, timeout, topic, partition))

    async def publish_many_trace(self, topic: str, partition: int,
                                 items: Sequence[tuple[int, bytes]],
                                 timeout: float | None = None) -> TraceResponse:
        """MPUB_TRACE (youzan) with ``(trace_id, body)`` items; the reply describes the batch
        (first id and offset, trace id 0, total raw size)."""
        self._host.require_youzan("MPUB_TRACE")
        command = commands.mpub_trace(topic, partition, items)
        return decode_trace_response(await self._request(command, timeout, topic, partition))

    async def publish_ext(self, topic: str, partition: int, header: ExtHeader, body: bytes,
                          timeout: float | None = None) -> TraceResponse | None:
        """PUB_EXT (youzan) with a JSON header; returns the trace reply when the header has a
        valid ``##trace_id``, else None."""
        self._host.require_youzan("PUB_EXT")
        command = commands.pub_ext(topic, partition, header, body)
        data = await self._request(command, timeout, topic, partition)
        if data == OK:
            return None
        return decode_trace_response(data)

    async def publish_many_ext(self, topic: str, partition: int,
                               items: Sequence[tuple[ExtHeader | None, bytes]],
                               timeout: float | None = None) -> None:
        """MPUB_EXT (youzan) with ``(header, body)`` items. Any error answer closes the
        connection: the server may have left the rest of the body unread."""
        self._host.require_youzan("MPUB_EXT")
        command = commands.mpub_ext(topic, partition, items)
        data = await self._request(command, timeout, topic, partition, close_on_error=True)
        self.check_publish_answer(data, "MPUB_EXT")

    async def _request(self, command: bytes, timeout: float | None, topic: str,
                       partition: int | None, close_on_error: bool = False) -> bytes:
        """Send a publish once the write buffer has room; its answer."""
        host = self._host
        if host.write_paused:
            await host.drain()
        return await self._send(command, _PUBLISH, timeout, topic, partition, close_on_error,
                                None)
