"""Failing and closing a :class:`~smartnsq.conn.Connection`: one reason per connection
(the first failure), every waiter failed with it, the socket dropped; graceful close (CLS,
outstanding responses, then the socket, all within one timeout); ``on_close`` once. Server
errors that do not fail the connection go to ``on_error`` (:meth:`CloseSequence._report`).

The flags (``_state``, ``_exc``, ``_can_write``, ``_user_closed``, ``_connected_once``)
live on the connection, which the receive and send paths read for every frame.
"""

# Per-call ``timeout`` arguments are deliberate (close() must bound CLS and the drain
# together), see smartnsq.conn.connection.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from smartnsq._checks import check_duration
from smartnsq.config import ConnectionConfig
from smartnsq.conn.state import State
from smartnsq.errors import (
    ClientClosedError,
    CompressionError,
    ConnectionClosedError,
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
    ServerError,
)

if TYPE_CHECKING:
    from smartnsq.conn.handshake import Handshake
    from smartnsq.conn.transport import Wire
    from smartnsq.conn.waiters import ResponseQueue
    from smartnsq.protocol.frames import FrameDecoder

__all__ = ["CloseSequence"]

logger = logging.getLogger("smartnsq.connection")


class CloseSequence:
    """How a connection fails and closes (mixed into ``Connection``)."""

    if TYPE_CHECKING:  # provided by Connection
        address: str
        config: ConnectionConfig
        on_close: Any
        on_error: Any
        _state: State
        _loop: asyncio.AbstractEventLoop | None
        _wire: Wire | None
        _frames: FrameDecoder
        _hs: Handshake | None
        _hs_waiter: asyncio.Future[None] | None
        _fifo: ResponseQueue
        _exc: NSQError | None
        _user_closed: bool
        _connected_once: bool
        _can_write: bool
        _subscribed: bool
        _cls_fut: asyncio.Future[bytes] | None
        _cls_abandoned: bool
        _closed_fut: asyncio.Future[None] | None

        async def _cls(self, timeout: float | None = None) -> None: ...

    def _on_lost(self, exc: Exception | None) -> None:
        if self._exc is None:
            hs = self._hs
            partial = hs.buffered if hs is not None else self._frames.buffered
            if partial:
                err: NSQError = ConnectionClosedError(
                    f"nsqd {self.address} closed the connection in the middle of a frame "
                    f"({partial} bytes of it received)")
            elif exc is not None:
                err = ConnectionClosedError(f"connection to nsqd {self.address} lost: {exc}")
            elif self._user_closed:
                err = ConnectionClosedError(
                    f"connection to nsqd {self.address} closed before nsqd answered")
            else:
                err = ConnectionClosedError(f"nsqd {self.address} closed the connection")
            if exc is not None:
                err.__cause__ = exc
            if not self._user_closed:
                self._exc = err
            self._can_write = False
            self._fail_waiters(err)
        self._finalize(self._exc)

    def _report(self, exc: ServerError) -> None:
        cb = self.on_error
        if cb is None:
            logger.warning("nsqd %s: %s", self.address, exc)
            return
        try:
            cb(self, exc)
        except Exception:
            logger.exception("on_error callback failed (nsqd %s)", self.address)

    def _on_fault(self, exc: CompressionError) -> None:
        self._fail(exc)

    def _on_read_timeout(self, idle: float) -> None:
        self._fail(NSQTimeoutError(
            f"no data from nsqd {self.address} for {idle:.1f}s "
            f"(read_timeout {self.config.read_timeout}s)"))

    def abort(self, exc: NSQError) -> None:
        """Fail the connection now with ``exc``: every command waiting for an answer gets
        it, the socket is dropped, ``on_close`` gets it. For an owner that learnt otherwise
        that the server is gone (another connection to it went silent)."""
        self._fail(exc)

    def _fail(self, exc: NSQError) -> None:
        """Record ``exc`` as the reason, fail every waiter and drop the socket."""
        if self._exc is not None or self._state is State.CLOSED:
            return
        self._exc = exc
        self._can_write = False
        if self._state is not State.INIT:
            self._state = State.CLOSING
        if isinstance(exc, ServerError):
            # the command the error answered already got it; the rest were never processed
            rest: NSQError = ConnectionClosedError(
                f"connection to nsqd {self.address} closed after {exc.server_code}")
            rest.__cause__ = exc
        else:
            rest = exc
        self._fail_waiters(rest)
        if self._state is not State.CLOSED:
            logger.debug("connection to nsqd %s failed: %s", self.address, exc)
        if self._wire is not None:
            self._wire.abort()

    def _fail_waiters(self, exc: NSQError) -> None:
        self._fifo.fail_all(exc)
        hs = self._hs_waiter
        if hs is not None and not hs.done():
            hs.set_exception(exc)

    def _finalize(self, exc: NSQError | None) -> None:
        if self._state is State.CLOSED:
            return
        self._state = State.CLOSED
        self._can_write = False
        self._fifo.cancel_deadlines()
        self._fifo.wake_idle()
        fut = self._closed_fut
        if fut is not None and not fut.done():
            fut.set_result(None)
        if self._connected_once and self.on_close is not None:
            try:
                self.on_close(self, exc)
            except Exception:
                logger.exception("on_close callback failed (nsqd %s)", self.address)

    def _unusable(self) -> NSQError:
        state = self._state
        if self._user_closed:
            return ClientClosedError(f"connection to nsqd {self.address} was closed")
        if self._exc is not None:
            err = ConnectionClosedError(f"connection to nsqd {self.address} is closed: "
                                        f"{self._exc}")
            err.__cause__ = self._exc
            return err
        if state is State.INIT or state is State.CONNECTING:
            return NSQConnectionError(f"connection to nsqd {self.address} is not connected yet")
        return ConnectionClosedError(f"connection to nsqd {self.address} is {state.value}")

    async def close(self, timeout: float | None = None) -> None:
        """Close gracefully within ``timeout`` seconds (default ``config.close_timeout``):
        if subscribed send CLS and wait for CLOSE_WAIT, wait for outstanding responses,
        then close the socket. Commands sent after this raise ClientClosedError; waiters
        still pending at the end fail with ConnectionClosedError. Safe to call more than
        once."""
        limit = self.config.close_timeout if timeout is None else check_duration(
            timeout, "timeout")
        state = self._state
        if state is State.CLOSED:
            return
        if state is State.INIT:
            self._user_closed = True
            self._state = State.CLOSED
            return
        closed = self._closed_fut
        assert closed is not None and self._wire is not None and self._loop is not None
        if self._user_closed or state is State.CLOSING:
            self._user_closed = True
            await self._wait_closed(limit)
            return
        self._user_closed = True
        if state is State.CONNECTING:
            self._fail(ClientClosedError(f"connection to nsqd {self.address} closed while "
                                         "connecting"))
            await self._wait_closed(limit)
            return
        self._state = State.CLOSING
        loop = self._loop
        deadline = loop.time() + limit
        try:
            async with asyncio.timeout_at(deadline):
                if self._subscribed and self._cls_fut is None:
                    await self._cls()
                # waiters whose callers gave up (timeout, cancel) are not worth waiting
                # for, nor is a server that already let a CLS go unanswered
                if not self._cls_abandoned and any(not w[0].done() for w in self._fifo.slots):
                    await self._fifo.wait_idle()
        except (TimeoutError, NSQError) as exc:
            logger.debug("closing nsqd %s: not drained cleanly (%r)", self.address, exc)
        self._can_write = False
        self._wire.close()
        await self._wait_closed(max(0.0, deadline - loop.time()))

    async def _wait_closed(self, timeout: float) -> None:
        closed = self._closed_fut
        if closed is None or closed.done():
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(closed)
        except TimeoutError:
            # the peer does not read what is left in our buffer: give up on it
            if self._wire is not None:
                self._wire.abort()
            if not closed.done():
                err = ConnectionClosedError(f"connection to nsqd {self.address} aborted")
                self._fail_waiters(err)
                self._finalize(self._exc)

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by ``close()``, the server or an error)."""
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)
