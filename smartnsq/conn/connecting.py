"""Setting a :class:`~smartnsq.conn.Connection` up: dial within ``dial_timeout``, run the
handshake (:mod:`smartnsq.conn.handshake`) within ``handshake_timeout``, adopt what it
negotiated, hand the bytes that came after it to the receive path, and enter the steady
state. Runs once per connection; any failure closes the socket and is raised typed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from smartnsq.config import ConnectionConfig
from smartnsq.conn.handshake import Handshake, negotiate
from smartnsq.conn.state import State
from smartnsq.conn.transport import Wire
from smartnsq.errors import (
    ClientClosedError,
    CompressionError,
    ConfigError,
    Flavour,
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
)
from smartnsq.protocol.responses import AuthResponse, IdentifyResponse

if TYPE_CHECKING:
    from smartnsq.conn.waiters import ResponseQueue

__all__ = ["ConnectSequence"]

logger = logging.getLogger("smartnsq.connection")


class ConnectSequence:
    """``connect()`` (mixed into ``Connection``)."""

    if TYPE_CHECKING:  # provided by Connection
        host: str
        port: int
        address: str
        config: ConnectionConfig
        _state: State
        _loop: asyncio.AbstractEventLoop | None
        _wire: Wire | None
        _write: Callable[[bytes], None]
        _fin_id: Callable[[bytes], None]
        _fin_ids: list[bytes]
        _closed_fut: asyncio.Future[None] | None
        _fifo: ResponseQueue
        _hs: Handshake | None
        _hs_waiter: asyncio.Future[None] | None
        _exc: NSQError | None
        _can_write: bool
        _connected_once: bool
        _identify: IdentifyResponse | None
        _auth: AuthResponse | None
        _flavour: Flavour
        _max_rdy: int

        @property
        def tls(self) -> bool: ...

        @property
        def compression(self) -> Literal["snappy", "deflate"] | None: ...

        def _on_data(self, data: bytes) -> None: ...

        def _on_fault(self, exc: CompressionError) -> None: ...

        def _on_lost(self, exc: Exception | None) -> None: ...

        def _on_read_timeout(self, idle: float) -> None: ...

        def _fail(self, exc: NSQError) -> None: ...

        def _finalize(self, exc: NSQError | None) -> None: ...

        def _unusable(self) -> NSQError: ...

    async def connect(self) -> IdentifyResponse:
        """Dial (``dial_timeout``), then magic, IDENTIFY, upgrades and AUTH
        (``handshake_timeout``). Raises NSQTimeoutError, NSQConnectionError, TLSError,
        ProtocolError/CompressionError or the server's typed error; the socket is then closed.
        """
        if self._state is not State.INIT:
            raise ClientClosedError(f"connect() on a connection that is {self._state.value}")
        cfg = self.config
        if cfg.tls.enabled and not cfg.feature_negotiation:
            raise ConfigError("tls.enabled needs feature_negotiation=True")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._closed_fut = loop.create_future()
        self._fifo.loop = loop
        self._state = State.CONNECTING
        wire = self._wire = Wire(loop, self._on_data, self._on_fault, self._on_lost)
        self._write = wire.write
        self._fin_id = wire.fin
        self._fin_ids = wire.fin_ids
        try:
            try:
                async with asyncio.timeout(cfg.dial_timeout):
                    await loop.create_connection(lambda: wire, self.host, self.port)
            except TimeoutError:
                raise NSQTimeoutError(
                    f"connecting to nsqd {self.address} timed out after {cfg.dial_timeout}s"
                ) from None
            except OSError as exc:
                raise NSQConnectionError(f"cannot connect to nsqd {self.address}: {exc}") from exc
            try:
                async with asyncio.timeout(cfg.handshake_timeout):
                    ident = await self._handshake(wire)
            except TimeoutError:
                raise NSQTimeoutError(
                    f"handshake with nsqd {self.address} did not complete within "
                    f"{cfg.handshake_timeout}s"
                ) from None
        except BaseException as exc:
            if not isinstance(exc, Exception):  # cancelled or interrupted
                err: NSQError = ClientClosedError(
                    f"connect to nsqd {self.address} interrupted: {exc!r}")
            elif self._exc is not None:  # the first failure (bad bytes, close()) is the reason
                err = self._exc
            elif isinstance(exc, NSQError):
                err = exc
            else:
                err = NSQConnectionError(f"connect to nsqd {self.address} failed: {exc!r}")
            self._fail(err)
            # finalize now: after a failed TLS handshake the transport never reports back
            self._finalize(err)
            if err is exc or not isinstance(exc, NSQError):
                raise
            raise err from exc
        # bytes that came with the last handshake frame are ordinary frames
        hs = self._hs
        assert hs is not None
        self._hs = None
        rest = hs.take_buffer()
        if rest and self._exc is None:
            self._on_data(rest)
        if self._state is not State.CONNECTING:  # those bytes were bad, or close() ran
            err = self._exc if self._exc is not None else self._unusable()
            self._fail(err)
            self._finalize(err)
            raise err
        self._state = State.CONNECTED
        self._can_write = True
        self._connected_once = True
        if cfg.heartbeat_interval != -1:
            # without heartbeats an idle connection is legitimately silent
            wire.start_read_timer(cfg.read_timeout, self._on_read_timeout)
        logger.debug("connected to nsqd %s (%s, version %r, tls=%s, compression=%s)",
                     self.address, self._flavour.value, ident.version, self.tls,
                     self.compression)
        return ident

    async def _handshake(self, wire: Wire) -> IdentifyResponse:
        assert self._hs is not None
        done = await negotiate(self._hs, wire, self._hs_data, lambda: self._exc)
        self._identify = done.identify
        self._auth = done.auth
        self._flavour = done.flavour
        self._max_rdy = done.max_rdy
        return done.identify

    async def _hs_data(self) -> None:
        """Return once more handshake bytes arrived; raise the connection's failure."""
        if self._exc is not None:
            raise self._exc
        assert self._loop is not None
        fut: asyncio.Future[None] = self._loop.create_future()
        self._hs_waiter = fut
        try:
            await fut
        finally:
            self._hs_waiter = None
