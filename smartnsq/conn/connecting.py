"""Setting a connection up: dial within ``dial_timeout``, then run the handshake
(:mod:`smartnsq.conn.handshake`) within ``handshake_timeout``, the stream's bytes going to
the handshake meanwhile.

:class:`Opening` owns that phase: the :class:`~smartnsq.conn.handshake.Handshake`, the
wire's byte stream while it runs (:meth:`Opening.feed`), and the wait for more of it. Owner:
:meth:`smartnsq.conn.Connection.connect`, which builds one, runs it once, maps a failure
with :func:`connect_error` and hands the bytes after the handshake
(:meth:`Opening.take_buffer`) to its receive path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from smartnsq.conn.handshake import Handshake, Negotiated, negotiate
from smartnsq.conn.transport import Wire
from smartnsq.errors import (
    ClientClosedError,
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
)

__all__ = ["Opening", "connect_error"]


class Opening:
    """A connection's dial and handshake (see the module docstring)."""

    __slots__ = ("_hs", "_loop", "_waiter")

    def __init__(self, hs: Handshake, loop: asyncio.AbstractEventLoop) -> None:
        self._hs = hs
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def feed(self, data: bytes) -> None:
        """The wire's stream while the handshake runs."""
        self._hs.feed(data)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def buffered(self) -> int:
        """Bytes received and not read by the handshake yet."""
        return self._hs.buffered

    def take_buffer(self) -> bytes:
        """The bytes after the handshake's last frame: ordinary frames."""
        return self._hs.take_buffer()

    def lost_error(self, exc: BaseException | None) -> NSQError | None:
        """What the connection lost with ``exc`` means at this step, when the handshake
        knows better than "connection lost" (:meth:`Handshake.lost_error`)."""
        return self._hs.lost_error(exc)

    def fail(self, exc: NSQError) -> None:
        """The connection failed: the handshake waiting for bytes gets ``exc``."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def run(self, wire: Wire, host: str, port: int,
                  failure: Callable[[], NSQError | None]) -> Negotiated:
        """Dial, then negotiate; ``failure()`` is the connection's failure so far (bad
        bytes, ``close()``), raised as soon as it is known."""
        hs = self._hs
        cfg = hs.config
        address = hs.address
        try:
            async with asyncio.timeout(cfg.dial_timeout):
                await self._loop.create_connection(lambda: wire, host, port)
        except TimeoutError:
            raise NSQTimeoutError(f"connecting to nsqd {address} timed out after "
                                  f"{cfg.dial_timeout}s") from None
        except OSError as exc:
            raise NSQConnectionError(f"cannot connect to nsqd {address}: {exc}") from exc
        try:
            async with asyncio.timeout(cfg.handshake_timeout):
                return await negotiate(hs, wire, self._more, failure)
        except TimeoutError:
            raise NSQTimeoutError(f"handshake with nsqd {address} did not complete within "
                                  f"{cfg.handshake_timeout}s (waiting for "
                                  f"{hs.waiting_for})") from None

    async def _more(self) -> None:
        """Return once more handshake bytes arrived (:meth:`fail` raises instead)."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiter = fut
        try:
            await fut
        finally:
            self._waiter = None


def connect_error(exc: BaseException, failure: NSQError | None, address: str) -> NSQError:
    """The reason ``connect()`` failed with ``exc``: the connection's first failure when it
    had one (bad bytes, ``close()``), else ``exc`` made an :class:`NSQError`."""
    if not isinstance(exc, Exception):  # cancelled or interrupted
        return ClientClosedError(f"connect to nsqd {address} interrupted: {exc!r}")
    if failure is not None:
        return failure
    if isinstance(exc, NSQError):
        return exc
    return NSQConnectionError(f"connect to nsqd {address} failed: {exc!r}")
