"""The core of a connection: it owns the transport (:class:`~smartnsq.conn.transport.Wire`),
the receive path with its frame decoder (:class:`~smartnsq.conn.receiver.Receiver`), the
response FIFO (:class:`~smartnsq.conn.waiters.ResponseQueue`), the life-cycle state
(:class:`~smartnsq.conn.state.Lifecycle`) and, once subscribed, the subscriber side.

It sets the connection up (:mod:`smartnsq.conn.connecting`), sends commands (one FIFO slot
per command that gets an answer: many publishes can be in flight on one connection, as
answers come back in command order), fails and closes. A connection that fails for any
reason fails every pending waiter with the error and closes its socket; the delegate hears
of non-fatal errors no caller waits for and of the close.

Owner: :class:`~smartnsq.conn.Connection`, the public face, which forwards to it. Callers
besides: the publisher side (as its :class:`~smartnsq.conn.publisher.PublishHost`), the
subscriber side (as its :class:`~smartnsq.conn.subscriber.SubscriberHost`), the wire.
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from smartnsq._checks import check_duration
from smartnsq.config import DEFAULT_MSG_TIMEOUT, ConnectionConfig
from smartnsq.conn.connecting import Opening, connect_error
from smartnsq.conn.delegate import ConnectionDelegate
from smartnsq.conn.handshake import Handshake, Negotiated
from smartnsq.conn.receiver import Receiver
from smartnsq.conn.state import Lifecycle, State
from smartnsq.conn.subscriber import Subscriber
from smartnsq.conn.transport import Wire, tls_context
from smartnsq.conn.waiters import ResponseQueue
from smartnsq.errors import (
    ClientClosedError,
    CompressionError,
    ConfigError,
    ConnectionClosedError,
    Flavour,
    NSQError,
    NSQTimeoutError,
    ServerError,
    UnsupportedFeatureError,
)
from smartnsq.errors.base import CommandKind
from smartnsq.protocol.messages import MessageLayout
from smartnsq.protocol.responses import IdentifyResponse

__all__ = ["ConnectionCore"]

logger = logging.getLogger("smartnsq.connection")

# enum members bound once: EnumType has a __getattr__, so State.CONNECTED costs ~4x a global
_PUBLISH = CommandKind.PUBLISH
_OTHER = CommandKind.OTHER
_CONNECTED = State.CONNECTED
_CLOSING = State.CLOSING
_CLOSED = State.CLOSED
_INF = math.inf

#: the connection its delegate is told about
C = TypeVar("C")


def _ignore_now(data: bytes, body: bytes | None) -> None:
    """The wire's write_now before connect()."""


def _unbound() -> Any:
    """Stands in for the loop's create_future and time before connect(): unreachable, as
    send_request refuses a connection that is not connected first."""
    raise RuntimeError("the connection has no event loop before connect()")


def _ignore(data: bytes) -> None:
    """Stands in for the wire's write before connect(), and takes the bytes that are still
    being decoded from a read after a failure."""


class ConnectionCore(Generic[C]):
    """See the module docstring. ``conn`` is what the delegate is told about."""

    def __init__(self, conn: C, host: str, port: int, config: ConnectionConfig,
                 delegate: ConnectionDelegate[C] | None, answer_timeout: float | None) -> None:
        self.conn = conn
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.config = config
        #: who is told of messages, errors and the close
        self.delegate = delegate
        self.life = Lifecycle(self.address)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wire: Wire | None = None
        #: what the handshake settled
        self.negotiated: Negotiated | None = None
        #: the dial and handshake while they run
        self._opening: Opening | None = None
        self.fifo = ResponseQueue(self.address, answer_timeout, self._fail, self._report)
        #: the FIFO's deque, bound once: the send path appends to it for every command
        self._waiters = self.fifo.slots
        #: the frame decoder and what the frames go to
        self.receiver: Receiver[C] = Receiver(config.effective_max_frame_size, self.fifo,
                                              self.life, self._fail, self.address)
        #: the wire's write, bound once: it is called for every command
        self._write = _ignore
        self._write_now: Callable[[bytes, bytes | None], None] = _ignore_now
        #: the loop's create_future and time, bound once by connect(): the send path calls
        #: them for every command
        self._new_future: Callable[[], asyncio.Future[bytes]] = _unbound
        self._time: Callable[[], float] = _unbound
        self._closed_fut: asyncio.Future[None] | None = None
        #: commands sent that get an answer: publish-type ones, and the others
        self.publishes = 0
        self.other_requests = 0

    # ------------------------------------------------------------------ facts (the hosts')

    @property
    def sub(self) -> Subscriber[C] | None:
        """The subscriber side, from subscribe() on (its deliveries: the receiver's)."""
        return self.receiver.sub

    @property
    def flavour(self) -> Flavour:
        """STOCK or YOUZAN from the IDENTIFY ``version``; UNKNOWN without negotiation."""
        n = self.negotiated
        return n.flavour if n is not None else Flavour.UNKNOWN

    @property
    def write_paused(self) -> bool:
        wire = self.wire
        return wire is not None and wire.paused

    @property
    def subscribe_answered(self) -> bool:
        return self.fifo.subscribe_answered

    @property
    def msg_timeout(self) -> float:
        """Seconds the server waits for FIN/REQ/TOUCH before redelivering (negotiated)."""
        n = self.negotiated
        if n is not None and n.identify.msg_timeout > 0:
            return n.identify.msg_timeout / 1000.0
        return self.config.msg_timeout or DEFAULT_MSG_TIMEOUT

    def require_youzan(self, what: str) -> None:
        """Raise UnsupportedFeatureError unless the server may be youzan nsqd."""
        if self.flavour is Flavour.STOCK:
            raise UnsupportedFeatureError(f"{what} needs youzan nsqd; {self.address} is stock "
                                          "nsqd")

    # ------------------------------------------------------------------ connecting

    async def connect(self) -> IdentifyResponse:
        """:meth:`Connection.connect`: dial and handshake, then the receive path gets the
        stream (the bytes after the handshake first); a failure closes the socket."""
        cfg = self.config
        if cfg.tls.enabled:
            if not cfg.feature_negotiation:
                raise ConfigError("tls.enabled needs feature_negotiation=True")
            # unusable TLS files are a ConfigError before any I/O (the context is cached)
            tls_context(cfg.tls)
        loop = asyncio.get_running_loop()
        life = self.life
        life.connecting()
        self.loop = loop
        self._new_future = loop.create_future
        self._time = loop.time
        self._closed_fut = loop.create_future()
        self.fifo.loop = loop
        opening = self._opening = Opening(
            Handshake(cfg, self.address, self.host, self.receiver.frames.max_size), loop)
        wire = self.wire = Wire(loop, opening.feed, self._on_fault, self._on_lost)
        self._write = wire.write
        self._write_now = wire.write_now
        try:
            done = await opening.run(wire, self.host, self.port, lambda: life.error)
        except BaseException as exc:
            err = connect_error(exc, life.error, self.address)
            self._fail(err)
            # finalize now: after a failed TLS handshake the transport never reports back
            self._finalize(err)
            if err is exc or not isinstance(exc, NSQError):
                raise
            raise err from exc
        self.negotiated = done
        self.fifo.flavour = done.flavour
        self._opening = None
        # bytes that came with the last handshake frame are ordinary frames
        rest = opening.take_buffer()
        if life.error is None:
            receiver = self.receiver
            receiver.write = self._write
            wire.on_data = receiver.on_data
            if rest:
                receiver.on_data(rest)
        if life.state is not State.CONNECTING:  # those bytes were bad, or close() ran
            err = life.error if life.error is not None else life.unusable()
            self._fail(err)
            self._finalize(err)
            raise err
        life.connected()
        if cfg.heartbeat_interval != -1:
            # without heartbeats an idle connection is legitimately silent
            wire.start_read_timer(cfg.read_timeout, self._on_read_timeout)
        logger.debug("connected to nsqd %s (%s, version %r, tls=%s, compression=%s)",
                     self.address, done.flavour.value, done.identify.version, wire.tls,
                     wire.decoder is not None)
        return done.identify

    # ------------------------------------------------------------------ requests (FIFO)

    def send_request(self, command: bytes, kind: CommandKind, timeout: float | None,
                     topic: str | None = None, partition: int | None = None,
                     close_on_error: bool = False, body: bytes | None = None
                     ) -> asyncio.Future[bytes]:
        """Write ``command`` (and ``body`` right after it, as a piece of its own) and queue
        its waiter; the future resolves with the response data or the typed error. A
        timed-out or cancelled waiter keeps its FIFO slot. ``topic`` and ``partition`` only
        label errors; ``close_on_error`` closes the connection after any error answer (for
        commands whose error may leave the server mid-body)."""
        if self.life.state is not _CONNECTED:
            raise self.life.unusable()
        fut = self._new_future()
        if timeout is None:
            deadline = _INF
        else:
            if timeout.__class__ is not float or not 0 < timeout < _INF:
                # the common case (a positive finite float) skips the full check
                timeout = check_duration(timeout, "timeout", positive=True)
            deadline = self._time() + timeout
            if deadline < self.fifo.deadline_at:
                self.fifo.arm(deadline)
        waiters = self._waiters
        alone = not waiters
        waiters.append((fut, deadline, kind, timeout, topic, partition, close_on_error))
        if alone:
            # nothing else awaited (one request at a time): no loop turn to wait for
            self._write_now(command, body)
        else:
            # others in flight: this one joins the loop turn's single write
            self._write(command)
            if body is not None:
                self._write(body)
        # one count per command: requests are publishes plus the others
        if kind is _PUBLISH:
            self.publishes += 1
        else:
            self.other_requests += 1
        return fut

    def send_closing(self, command: bytes) -> asyncio.Future[bytes]:
        """Queue a command that ``close()`` itself sends (CLS): it may go out while the
        connection closes cleanly; no deadline. The caller checked that it may."""
        assert self.loop is not None
        fut: asyncio.Future[bytes] = self.loop.create_future()
        self._waiters.append((fut, _INF, _OTHER, None, None, None, False))
        self._write(command)
        self.other_requests += 1
        return fut

    async def drain(self) -> None:
        """Wait until the socket takes more data (``write_timeout``; the connection fails
        when it does not)."""
        wire = self.wire
        if wire is None:
            return
        try:
            await wire.drain(self.config.write_timeout, self.address)
        except NSQTimeoutError as exc:
            self._fail(exc)
            raise

    async def request(self, command: bytes, kind: CommandKind = CommandKind.PUBLISH,
                      timeout: float | None = None, *, topic: str | None = None,
                      partition: int | None = None, close_on_error: bool = False) -> bytes:
        """Send an encoded command that gets one response; return the response data.

        Raises the typed ServerError the server answered with, NSQTimeoutError after
        ``timeout`` seconds, or the connection's error if it fails first (see
        :meth:`send_request` for the rest)."""
        if self.wire is not None and self.wire.paused:
            await self.drain()
        return await self.send_request(command, kind, timeout, topic, partition,
                                       close_on_error, None)

    # ------------------------------------------------------------------ subscribing

    async def subscribe(self, command: bytes, layout: MessageLayout, timeout: float | None,
                        topic: str, partition: int | None) -> Subscriber[C]:
        """Send ``command`` (SUB / SUB_ORDERED / SUB_ADVANCED, checked by the caller) and
        make the subscriber side for frames of ``layout``; return it once the server said
        OK. It is made before the answer: nothing is delivered before OK and RDY, but a
        server that does deliver is caught by its RDY check."""
        delegate = self.delegate
        if delegate is None:
            raise ConfigError("subscribe() needs a delegate: Connection(..., delegate=...)")
        fut = self.send_request(command, CommandKind.SUBSCRIBE, timeout, topic, partition,
                                False, None)
        wire, done, loop = self.wire, self.negotiated, self.loop
        assert wire is not None and done is not None and loop is not None
        sub = self.receiver.sub = Subscriber(
            self, self.conn, delegate, self.life, layout, loop=loop, write=wire.write,
            fin_id=wire.fin, fin_ids=wire.fin_ids, max_rdy=done.max_rdy,
            msg_timeout=self.msg_timeout)
        try:
            await fut
        except BaseException as exc:
            self.receiver.sub = None
            if isinstance(exc, NSQTimeoutError):
                # the server may still subscribe us: the connection's state is unknown now
                self._fail(exc)
            raise
        sub.subscribed = True
        return sub

    # ------------------------------------------------------------------ failing

    def _report(self, exc: ServerError) -> None:
        """A non-fatal server error no caller waits for: to the delegate."""
        delegate = self.delegate
        if delegate is None:
            logger.warning("nsqd %s: %s", self.address, exc)
            return
        try:
            delegate.on_error(self.conn, exc)
        except Exception:
            logger.exception("on_error callback failed (nsqd %s)", self.address)

    def _on_fault(self, exc: CompressionError) -> None:
        self._fail(exc)

    def _on_read_timeout(self, idle: float) -> None:
        self._fail(NSQTimeoutError(
            f"no data from nsqd {self.address} for {idle:.1f}s "
            f"(read_timeout {self.config.read_timeout}s)"))

    def abort(self, exc: NSQError) -> None:
        """:meth:`Connection.abort` (and the sides' way to fail the connection)."""
        self._fail(exc)

    def _fail(self, exc: NSQError) -> None:
        """Record ``exc`` as the reason, fail every waiter and drop the socket."""
        if not self.life.fail(exc):
            return
        if isinstance(exc, ServerError):
            # the command the error answered already got it; the rest were never processed
            rest: NSQError = ConnectionClosedError(
                f"connection to nsqd {self.address} closed after {exc.server_code}")
            rest.__cause__ = exc
        else:
            rest = exc
        self._fail_waiters(rest)
        logger.debug("connection to nsqd %s failed: %s", self.address, exc)
        wire = self.wire
        if wire is not None:
            wire.on_data = _ignore  # what is still being decoded from a read
            wire.abort()

    def _fail_waiters(self, exc: NSQError) -> None:
        self.fifo.fail_all(exc)
        if self._opening is not None:
            self._opening.fail(exc)

    def _on_lost(self, exc: Exception | None) -> None:
        life = self.life
        if life.error is None:
            opening = self._opening
            partial = opening.buffered if opening is not None else self.receiver.frames.buffered
            known = opening.lost_error(exc) if opening is not None and not partial else None
            if partial:
                err: NSQError = ConnectionClosedError(
                    f"nsqd {self.address} closed the connection in the middle of a frame "
                    f"({partial} bytes of it received)")
            elif known is not None:
                err = known
            elif exc is not None:
                err = ConnectionClosedError(f"connection to nsqd {self.address} lost: {exc}")
            elif life.user_closed:
                err = ConnectionClosedError(
                    f"connection to nsqd {self.address} closed before nsqd answered")
            else:
                err = ConnectionClosedError(f"nsqd {self.address} closed the connection")
            if exc is not None:
                err.__cause__ = exc
            life.lost(err)
            self._fail_waiters(err)
        self._finalize(life.error)

    def _finalize(self, exc: NSQError | None) -> None:
        life = self.life
        if not life.closed():
            return
        fifo = self.fifo
        fifo.cancel_deadlines()
        fifo.wake_idle()
        fut = self._closed_fut
        if fut is not None and not fut.done():
            fut.set_result(None)
        delegate = self.delegate
        if life.connected_once and delegate is not None:
            try:
                delegate.on_close(self.conn, exc)
            except Exception:
                logger.exception("on_close callback failed (nsqd %s)", self.address)

    # ------------------------------------------------------------------ closing

    async def close(self, timeout: float | None = None) -> None:
        """:meth:`Connection.close`: CLS if subscribed, the answers still awaited, then the
        socket, all within ``timeout``."""
        limit = self.config.close_timeout if timeout is None else check_duration(
            timeout, "timeout")
        life = self.life
        already = life.user_closed or life.state is _CLOSING
        state = life.close_requested()
        if state is _CLOSED or state is State.INIT:
            return
        wire, loop = self.wire, self.loop
        assert wire is not None and loop is not None
        if already:
            await self._wait_closed(limit)
            return
        if state is State.CONNECTING:
            self._fail(ClientClosedError(f"connection to nsqd {self.address} closed while "
                                         "connecting"))
            await self._wait_closed(limit)
            return
        deadline = loop.time() + limit
        sub = self.sub
        try:
            async with asyncio.timeout_at(deadline):
                if sub is not None and sub.subscribed and not sub.cls_sent:
                    await sub.cls()
                # waiters whose callers gave up (timeout, cancel) are not worth waiting
                # for, nor is a server that already let a CLS go unanswered
                if not (sub is not None and sub.cls_abandoned) and any(
                        not w[0].done() for w in self._waiters):
                    await self.fifo.wait_idle()
        except (TimeoutError, NSQError) as exc:
            logger.debug("closing nsqd %s: not drained cleanly (%r)", self.address, exc)
        life.stop_writing()
        wire.close()
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
            if self.wire is not None:
                self.wire.abort()
            if not closed.done():
                err = ConnectionClosedError(f"connection to nsqd {self.address} aborted")
                self._fail_waiters(err)
                self._finalize(self.life.error)

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by ``close()``, the server or an error)."""
        if self._closed_fut is not None:
            await asyncio.shield(self._closed_fut)
