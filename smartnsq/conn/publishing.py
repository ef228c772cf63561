"""Publishing commands of :class:`~smartnsq.conn.Connection`: PUB, MPUB, DPUB and youzan's
PUB_TRACE, MPUB_TRACE, PUB_EXT and MPUB_EXT. Each encodes its command, queues it in the
response FIFO and checks or decodes the answer; the connection owns the FIFO and the socket.
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from smartnsq.errors import (
    CommandKind,
    Flavour,
    NSQError,
    ProtocolError,
    UnsupportedFeatureError,
)
from smartnsq.protocol import commands
from smartnsq.protocol.frames import OK
from smartnsq.protocol.responses import TraceResponse, decode_trace_response

if TYPE_CHECKING:
    from smartnsq.conn.transport import Wire

__all__ = ["ExtHeader", "PublishCommands"]

ExtHeader = Mapping[str, Any] | bytes

_PUBLISH = CommandKind.PUBLISH


class PublishCommands:
    """The publishing side of a connection (mixed into ``Connection``)."""

    if TYPE_CHECKING:  # provided by Connection
        address: str
        _flavour: Flavour
        _wire: Wire | None
        _write: Callable[[bytes], None]

        def _send(self, command: bytes, kind: CommandKind, timeout: float | None,
                  topic: str | None = None, partition: int | None = None,
                  close_on_error: bool = False) -> asyncio.Future[bytes]: ...

        async def _drain(self) -> None: ...

        async def request(self, command: bytes, kind: CommandKind = CommandKind.PUBLISH,
                          timeout: float | None = None, *, topic: str | None = None,
                          partition: int | None = None,
                          close_on_error: bool = False) -> bytes: ...

        def _fail(self, exc: NSQError) -> None: ...

    async def publish(self, topic: str, body: bytes, partition: int | None = None,
                      timeout: float | None = None) -> None:
        """PUB (youzan: to ``partition`` when given; stock ignores it)."""
        command = commands.pub(topic, body, partition)
        if self._wire is not None and self._wire.paused:
            await self._drain()
        self._check_ok(await self._send(command, _PUBLISH, timeout, topic, partition), "PUB")

    def send_pub(self, topic: str, body: bytes, timeout: float) -> asyncio.Future[bytes]:
        """PUB without a coroutine of its own (the producer's hot path): the caller made sure
        the write buffer is below its high-water mark (:attr:`write_paused`), awaits the
        answer and hands it to :meth:`check_publish_answer`."""
        return self._send(commands.pub(topic, body), _PUBLISH, timeout, topic, None)

    def send_publish(self, command: bytes, timeout: float, topic: str,
                     body: bytes | None = None) -> asyncio.Future[bytes]:
        """An encoded plain publish (PUB or MPUB, no partition) like :meth:`send_pub`;
        ``body``: the rest of the command, written right after ``command`` as a piece of its
        own (so a large MPUB body is copied once, into the socket write)."""
        fut = self._send(command, _PUBLISH, timeout, topic, None)
        if body is not None:
            self._write(body)
        return fut

    def check_publish_answer(self, data: bytes, what: str) -> None:
        """Fail the connection (and raise) unless ``data`` is the OK a plain publish gets."""
        if data is not OK and data != OK:
            self._check_ok(data, what)

    async def publish_many(self, topic: str, bodies: Sequence[bytes],
                           partition: int | None = None, timeout: float | None = None) -> None:
        """MPUB: all bodies atomically, one response."""
        command = commands.mpub(topic, bodies, partition)
        if self._wire is not None and self._wire.paused:
            await self._drain()
        self._check_ok(await self._send(command, _PUBLISH, timeout, topic, partition), "MPUB")

    async def publish_deferred(self, topic: str, body: bytes, delay_ms: int,
                               timeout: float | None = None) -> None:
        """DPUB (stock only; youzan nsqd has no DPUB)."""
        if self._flavour is Flavour.YOUZAN:
            raise UnsupportedFeatureError("youzan nsqd has no DPUB (deferred publish)")
        command = commands.dpub(topic, delay_ms, body)
        self._check_ok(await self.request(command, _PUBLISH, timeout, topic=topic), "DPUB")

    async def publish_trace(self, topic: str, partition: int, trace_id: int, body: bytes,
                            timeout: float | None = None) -> TraceResponse:
        """PUB_TRACE (youzan); returns the stored message's id, offset and raw size."""
        self._require_youzan("PUB_TRACE")
        command = commands.pub_trace(topic, partition, trace_id, body)
        data = await self.request(command, _PUBLISH, timeout, topic=topic, partition=partition)
        return decode_trace_response(data)

    async def publish_many_trace(self, topic: str, partition: int,
                                 items: Sequence[tuple[int, bytes]],
                                 timeout: float | None = None) -> TraceResponse:
        """MPUB_TRACE (youzan) with ``(trace_id, body)`` items; the reply describes the batch
        (first id and offset, trace id 0, total raw size)."""
        self._require_youzan("MPUB_TRACE")
        command = commands.mpub_trace(topic, partition, items)
        data = await self.request(command, _PUBLISH, timeout, topic=topic, partition=partition)
        return decode_trace_response(data)

    async def publish_ext(self, topic: str, partition: int, header: ExtHeader, body: bytes,
                          timeout: float | None = None) -> TraceResponse | None:
        """PUB_EXT (youzan) with a JSON header; returns the trace reply when the header has a
        valid ``##trace_id``, else None."""
        self._require_youzan("PUB_EXT")
        command = commands.pub_ext(topic, partition, header, body)
        data = await self.request(command, _PUBLISH, timeout, topic=topic, partition=partition)
        if data == OK:
            return None
        return decode_trace_response(data)

    async def publish_many_ext(self, topic: str, partition: int,
                               items: Sequence[tuple[ExtHeader | None, bytes]],
                               timeout: float | None = None) -> None:
        """MPUB_EXT (youzan) with ``(header, body)`` items. Any error answer closes the
        connection: the server may have left the rest of the body unread (§11.3)."""
        self._require_youzan("MPUB_EXT")
        command = commands.mpub_ext(topic, partition, items)
        data = await self.request(command, _PUBLISH, timeout, topic=topic, partition=partition,
                                  close_on_error=True)
        self._check_ok(data, "MPUB_EXT")

    def _check_ok(self, data: bytes, what: str) -> None:
        """A plain publish is answered with exactly OK (§7.2). Anything else means responses
        and commands no longer line up, so no later answer on this connection can be trusted."""
        if data != OK:
            exc = ProtocolError(f"nsqd {self.address} answered {what} with {data[:32]!r}, "
                                "expected OK")
            self._fail(exc)
            raise exc

    def _require_youzan(self, what: str) -> None:
        if self._flavour is Flavour.STOCK:
            raise UnsupportedFeatureError(f"{what} needs youzan nsqd; {self.address} is stock "
                                          "nsqd")
