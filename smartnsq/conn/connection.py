"""One asyncio connection to an nsqd (stock or youzan): handshake, publishing, subscribing.

Life cycle: ``Connection(...)`` → ``await connect()`` (magic, IDENTIFY, TLS / snappy / deflate
upgrades in the order of PROTOCOL.md §2.1.1, AUTH) → publish and/or subscribe → ``close()``.

Responses come back in command order (§2.10), so every command that gets a response (PUB and
friends, SUB, CLS) puts a waiter in a FIFO and the receive path resolves the oldest one. Many
publishes can therefore be in flight on one connection. FIN/REQ/TOUCH/RDY/NOP get no response
and are fire-and-forget; their non-fatal errors go to ``on_error``. Messages are decoded and
handed to ``on_message`` synchronously from the receive path: no task per message.

There is no background task: the receive path runs in the protocol's ``data_received``, and
timeouts are loop timers. A connection that fails for any reason fails every pending waiter
with the error and closes its socket.
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import enum
import logging
import math
import ssl
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from smartnsq._checks import check_duration
from smartnsq.config import ConnectionConfig
from smartnsq.conn.transport import Wire, tls_context
from smartnsq.errors import (
    ClientClosedError,
    CommandKind,
    CompressionError,
    ConfigError,
    ConnectionClosedError,
    Flavour,
    NSQConnectionError,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
    TLSError,
    UnsupportedFeatureError,
    error_from_frame,
)
from smartnsq.protocol import commands
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.compression import (
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
)
from smartnsq.protocol.frames import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    Frame,
    FrameDecoder,
)
from smartnsq.protocol.messages import STOCK_LAYOUT, MessageLayout, RawMessage, decode_message
from smartnsq.protocol.responses import (
    AuthResponse,
    IdentifyResponse,
    TraceResponse,
    decode_trace_response,
    parse_auth_response,
    parse_identify_response,
)

logger = logging.getLogger("smartnsq.connection")

OnMessage = Callable[["Connection", RawMessage], None]
OnError = Callable[["Connection", ServerError], None]
OnClose = Callable[["Connection", BaseException | None], None]
SubscribeMode = Literal["plain", "ordered", "advanced"]
ExtHeader = Mapping[str, Any] | bytes

_PUBLISH = CommandKind.PUBLISH
_NOP = commands.NOP
#: errors answering FIN/REQ/TOUCH, which have no waiter
_NO_WAITER_CODES = {
    b"E_FIN_FAILED": CommandKind.FIN,
    b"E_REQ_FAILED": CommandKind.OTHER,
    b"E_TOUCH_FAILED": CommandKind.OTHER,
}
_DEFAULT_MAX_RDY = 2500
_DEFAULT_MSG_TIMEOUT = 60.0
#: minimum seconds between two sweeps for timed-out waiters
_SWEEP_GAP = 0.01


class State(enum.Enum):
    INIT = "init"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """A snapshot of a connection's counters."""

    #: bytes received from / written to the socket layer (compressed when compression is on)
    bytes_in: int
    bytes_out: int
    #: frames received (responses, errors, messages, heartbeats)
    frames_in: int
    messages_in: int
    #: publish-type commands sent (PUB, MPUB, DPUB, PUB_TRACE, …; an MPUB counts once)
    publishes: int
    #: commands sent that expect a response (publishes, SUB, CLS)
    requests: int
    #: of those, still waiting for their response
    pending: int
    error_frames: int
    in_flight: int
    rdy: int


#: One FIFO slot, for a command that gets exactly one response frame:
#: (future, deadline, kind, timeout, topic, partition, close_on_error). A plain tuple because
#: every publish makes one (a slotted class costs ~4x as much to build).
_Waiter = tuple[asyncio.Future[bytes], float, CommandKind, float | None, str | None,
                int | None, bool]


def _ignore_write(data: bytes) -> None:
    """Stands in for the wire's write before connect()."""


def _retrieve(fut: asyncio.Future[bytes]) -> None:
    if not fut.cancelled():
        fut.exception()


class Connection:
    """See the module docstring.

    Callbacks (also settable as attributes before they are needed):

    * ``on_message(conn, raw_message)``: every delivered message, synchronously from the
      receive path; keep it short (hand the message on, or FIN it). Exceptions are logged.
    * ``on_error(conn, server_error)``: non-fatal error frames no caller is waiting for
      (``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``, errors answering a publish
      whose caller timed out or was cancelled).
    * ``on_close(conn, exc)``: once, after a connection whose ``connect()`` succeeded is
      closed; ``exc`` is None after a clean ``close()``, else the reason.
    """

    def __init__(
        self,
        host: str,
        port: int,
        config: ConnectionConfig | None = None,
        *,
        on_message: OnMessage | None = None,
        on_error: OnError | None = None,
        on_close: OnClose | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.config = config if config is not None else ConnectionConfig()
        self.on_message = on_message
        self.on_error = on_error
        self.on_close = on_close

        self._state = State.INIT
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wire: Wire | None = None
        self._frames = FrameDecoder(self.config.effective_max_frame_size)
        self._identify: IdentifyResponse | None = None
        self._auth: AuthResponse | None = None
        self._flavour = Flavour.UNKNOWN
        self._layout = STOCK_LAYOUT
        self._max_rdy = _DEFAULT_MAX_RDY

        # handshake: frames are taken one at a time so that an upgrade starts exactly at a
        # frame boundary (§2.1.1); bytes after it stay here and go to the new layer
        self._handshaking = True
        self._hs_buf = bytearray()
        self._hs_waiter: asyncio.Future[Frame] | None = None

        self._waiters: deque[_Waiter] = deque()
        #: the wire's write, bound once: it is called for every command
        self._write: Callable[[bytes], None] = _ignore_write
        self._deadline_handle: asyncio.TimerHandle | None = None
        self._deadline_at = math.inf
        self._idle_fut: asyncio.Future[None] | None = None

        self._exc: NSQError | None = None
        self._user_closed = False
        self._connected_once = False
        #: fire-and-forget commands are written only while this is True
        self._can_write = False
        self._subscribed = False
        self._sub_pending = False
        self._cls_fut: asyncio.Future[bytes] | None = None
        #: a cls() call timed out: the server is not answering, close() need not wait
        self._cls_abandoned = False
        self._closed_fut: asyncio.Future[None] | None = None

        self._rdy = 0
        #: the highest RDY ever sent: the server may still act on it after a lower RDY
        #: went out, so in-flight messages are checked against this (PROTOCOL.md §2.4)
        self._rdy_max = 0
        #: messages tolerated beyond RDY (a repositioned youzan channel's read-ahead)
        self._rdy_slack = 0
        #: loop time since which messages have been continuously in flight (None: none)
        self._busy_since: float | None = None
        self._sub_answered = False
        self._in_flight = 0
        self._frames_in = 0
        self._messages_in = 0
        self._requests = 0
        self._publishes = 0
        self._error_frames = 0

    def __repr__(self) -> str:
        return (f"<Connection {self.address} {self._state.value} flavour={self._flavour.value}"
                f" rdy={self._rdy} in_flight={self._in_flight} pending={len(self._waiters)}>")

    # ------------------------------------------------------------------ state and stats

    @property
    def state(self) -> State:
        return self._state

    @property
    def is_connected(self) -> bool:
        """Handshake done and not closing: commands can be sent."""
        return self._state is State.CONNECTED

    @property
    def is_closing(self) -> bool:
        """``close()`` started, a fatal error arrived, or CLS was sent (no more deliveries)."""
        return self._state is State.CLOSING or self._cls_fut is not None

    @property
    def is_closed(self) -> bool:
        return self._state is State.CLOSED

    @property
    def error(self) -> NSQError | None:
        """Why the connection failed (None while healthy or after a clean close)."""
        return self._exc

    @property
    def identify(self) -> IdentifyResponse | None:
        """The server's IDENTIFY answer (``negotiated`` False when it said a plain OK)."""
        return self._identify

    @property
    def auth(self) -> AuthResponse | None:
        return self._auth

    @property
    def flavour(self) -> Flavour:
        """STOCK or YOUZAN from the IDENTIFY ``version``; UNKNOWN without negotiation."""
        return self._flavour

    @property
    def tls(self) -> bool:
        return self._wire is not None and self._wire.tls

    @property
    def local_address(self) -> str | None:
        """Our end of the socket as ``host:port`` (``[host]:port`` for IPv6): the client
        address nsqd sees and reports for this connection. Set once the TCP connection is
        made (so already during the handshake); None before ``connect()`` and once the
        connection is closed."""
        wire = self._wire
        if wire is None or self._state is State.CLOSED:
            return None
        return wire.local_address

    @property
    def compression(self) -> Literal["snappy", "deflate"] | None:
        ident = self._identify
        if ident is None or self._wire is None or self._wire.decoder is None:
            return None
        return "snappy" if ident.snappy else "deflate"

    @property
    def max_rdy_count(self) -> int:
        return self._max_rdy

    @property
    def msg_timeout(self) -> float:
        """Seconds the server waits for FIN/REQ/TOUCH before redelivering (negotiated)."""
        ident = self._identify
        if ident is not None and ident.msg_timeout > 0:
            return ident.msg_timeout / 1000.0
        return self.config.msg_timeout or _DEFAULT_MSG_TIMEOUT

    @property
    def max_msg_timeout(self) -> float | None:
        """Seconds; the largest TOUCH-extended lifetime the server allows (None if unknown)."""
        ident = self._identify
        if ident is not None and ident.max_msg_timeout > 0:
            return ident.max_msg_timeout / 1000.0
        return None

    @property
    def layout(self) -> MessageLayout:
        return self._layout

    @property
    def subscribed(self) -> bool:
        return self._subscribed

    @property
    def rdy(self) -> int:
        """The last RDY count sent."""
        return self._rdy

    @property
    def in_flight(self) -> int:
        """Messages received minus FIN/REQ sent on this connection (floored at 0). Counted
        here so every consumer gets it for free; it counts commands, not distinct ids."""
        return self._in_flight

    @property
    def pending(self) -> int:
        """Commands still waiting for their response."""
        return len(self._waiters)

    @property
    def write_paused(self) -> bool:
        """The socket's send buffer is above its high-water mark."""
        return self._wire is not None and self._wire.paused

    def stats(self) -> ConnectionStats:
        wire = self._wire
        return ConnectionStats(
            bytes_in=wire.bytes_in if wire else 0,
            bytes_out=wire.bytes_out if wire else 0,
            frames_in=self._frames_in,
            messages_in=self._messages_in,
            publishes=self._publishes,
            requests=self._requests,
            pending=len(self._waiters),
            error_frames=self._error_frames,
            in_flight=self._in_flight,
            rdy=self._rdy,
        )

    # ------------------------------------------------------------------ connect

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
        self._state = State.CONNECTING
        wire = self._wire = Wire(loop, self._on_data, self._on_fault, self._on_lost)
        self._write = wire.write
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
        self._handshaking = False
        rest = bytes(self._hs_buf)
        self._hs_buf.clear()
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
        cfg = self.config
        wire.write(MAGIC_V2 + commands.identify(cfg.identify_body()))
        frame = await self._hs_frame()
        if frame.type == FRAME_ERROR:
            raise error_from_frame(frame.data, Flavour.UNKNOWN, CommandKind.OTHER,
                                   address=self.address)
        if frame.type != FRAME_RESPONSE:
            raise ProtocolError(f"nsqd {self.address} answered IDENTIFY with a frame of "
                                f"type {frame.type}")
        ident = parse_identify_response(frame.data)
        self._identify = ident
        self._flavour = ident.flavour
        if ident.max_rdy_count > 0:
            self._max_rdy = ident.max_rdy_count
        self._check_negotiation(ident)

        if ident.tls_v1:
            if self._hs_buf:
                raise ProtocolError(f"nsqd {self.address} sent data before the TLS handshake")
            tls = cfg.tls
            server_hostname = tls.server_hostname or self.host
            try:
                await wire.start_tls(tls_context(tls), server_hostname,
                                     cfg.handshake_timeout)
            except (ssl.SSLError, ssl.CertificateError, OSError, EOFError) as exc:
                raise TLSError(f"TLS handshake with nsqd {self.address} failed: {exc}") from exc
            await self._expect_ok("the TLS upgrade")
        if ident.snappy:
            self._upgrade(wire, "snappy")
            await self._expect_ok("the snappy upgrade")
        elif ident.deflate:
            self._upgrade(wire, "deflate")
            await self._expect_ok("the deflate upgrade")
        if ident.auth_required:
            await self._authenticate(wire)
        return ident

    def _check_negotiation(self, ident: IdentifyResponse) -> None:
        cfg = self.config
        if ident.snappy and ident.deflate:
            raise ProtocolError(f"nsqd {self.address} enabled both snappy and deflate")
        for name, asked, got in (("tls_v1", cfg.tls.enabled, ident.tls_v1),
                                 ("snappy", cfg.snappy, ident.snappy),
                                 ("deflate", cfg.deflate, ident.deflate)):
            if got and not asked:
                raise ProtocolError(f"nsqd {self.address} enabled {name}, which was not asked for")
        if cfg.tls.enabled and not ident.tls_v1:
            # never fall back to plain text silently
            raise TLSError(f"nsqd {self.address} did not agree to TLS (is TLS configured "
                           "on the server?)")

    def _upgrade(self, wire: Wire, kind: Literal["snappy", "deflate"]) -> None:
        if kind == "snappy":
            wire.set_compression(SnappyEncoder(), SnappyDecoder())
        else:
            ident = self._identify
            level = self.config.deflate_level
            if ident is not None and 1 <= ident.deflate_level < level:
                level = ident.deflate_level
            wire.set_compression(DeflateEncoder(level), DeflateDecoder())
        # bytes that arrived after the IDENTIFY frame are already compressed (§2.1.1)
        rest = bytes(self._hs_buf)
        self._hs_buf.clear()
        decoder = wire.decoder
        if rest and decoder is not None:
            for piece in decoder.feed(rest):
                self._hs_buf += piece

    async def _authenticate(self, wire: Wire) -> None:
        secret = self.config.auth_secret
        if secret is None:
            raise ConfigError(f"nsqd {self.address} requires AUTH but no auth_secret is "
                              "configured")
        wire.write(commands.auth(secret.get_secret_value().encode()))
        frame = await self._hs_frame()
        if frame.type == FRAME_ERROR:
            raise error_from_frame(frame.data, self._flavour, CommandKind.OTHER,
                                   address=self.address)
        if frame.type != FRAME_RESPONSE:
            raise ProtocolError(f"nsqd {self.address} answered AUTH with a frame of type "
                                f"{frame.type}")
        self._auth = parse_auth_response(frame.data)

    async def _expect_ok(self, step: str) -> None:
        frame = await self._hs_frame()
        if frame.type == FRAME_ERROR:
            raise error_from_frame(frame.data, self._flavour, CommandKind.OTHER,
                                   address=self.address)
        if frame.type != FRAME_RESPONSE or frame.data != OK:
            raise ProtocolError(f"expected OK from nsqd {self.address} after {step}, got "
                                f"frame type {frame.type}: {frame.data[:32]!r}")

    async def _hs_frame(self) -> Frame:
        if self._exc is not None:
            raise self._exc
        frame = self._take_hs_frame()
        if frame is not None:
            return frame
        assert self._loop is not None
        fut: asyncio.Future[Frame] = self._loop.create_future()
        self._hs_waiter = fut
        try:
            return await fut
        finally:
            self._hs_waiter = None

    def _take_hs_frame(self) -> Frame | None:
        """The next whole frame of the handshake buffer, or None (heartbeats are answered)."""
        buf = self._hs_buf
        max_size = self._frames.max_size
        while len(buf) >= 8:
            size = int.from_bytes(buf[:4], "big", signed=True)
            # a bad header is handed over alone so the frame decoder reports it
            n = 4 + size if 4 <= size <= max_size else 8
            if len(buf) < n:
                return None
            frames = self._frames.feed(bytes(buf[:n]))
            del buf[:n]
            frame = frames[0]
            if frame.type == FRAME_RESPONSE and frame.data == HEARTBEAT:
                self._write(_NOP)
                continue
            return frame
        return None

    # ------------------------------------------------------------------ receive path

    def _on_data(self, data: bytes) -> None:
        if self._exc is not None:
            return
        if self._handshaking:
            self._hs_buf += data
            waiter = self._hs_waiter
            if waiter is not None and not waiter.done():
                try:
                    frame = self._take_hs_frame()
                except ProtocolError as exc:
                    self._fail(exc)
                    return
                if frame is not None:
                    waiter.set_result(frame)
            return
        try:
            frames = self._frames.feed(data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self._frames_in += len(frames)
        on_message = self.on_message
        layout = self._layout
        n_messages = 0
        for ftype, payload in frames:
            if ftype == FRAME_MESSAGE:
                try:
                    msg = decode_message(payload, layout)
                except ProtocolError as exc:
                    self._fail(exc)
                    return
                n_messages += 1
                if on_message is None:
                    self._fail(ProtocolError(
                        f"nsqd {self.address} delivered a message on a connection without "
                        "a subscriber"))
                    return
                # counted per message so a server ignoring RDY is stopped at once, before
                # it can fill the consumer's memory
                self._in_flight += 1
                if self._in_flight > self._rdy_max and not self._may_exceed_rdy():
                    self._fail(self._rdy_violation())
                    return
                if self._in_flight == 1:
                    self._busy_since = self._loop.time()  # type: ignore[union-attr]
                try:
                    on_message(self, msg)
                except Exception:
                    logger.exception("on_message callback failed (nsqd %s)", self.address)
            elif ftype == FRAME_RESPONSE:
                if payload == HEARTBEAT:
                    self._write(_NOP)
                    continue
                self._on_response(payload)
                if self._exc is not None:
                    break
            else:
                self._on_error_frame(payload)
                if self._exc is not None:
                    break
        if n_messages:
            self._messages_in += n_messages

    def _may_exceed_rdy(self) -> bool:
        """More in flight than any RDY granted is legitimate only after the server timed
        messages out (it then frees their slots and may redeliver them to us while we still
        count the first copy): possible once messages have stayed unanswered on this
        connection for the whole msg_timeout."""
        if self._rdy_max == 0 or self._busy_since is None:
            return False
        if self._in_flight <= self._rdy_max + self._rdy_slack:
            return True
        assert self._loop is not None
        return self._loop.time() - self._busy_since >= self.msg_timeout

    def allow_read_ahead(self) -> None:
        """Tolerate one message beyond the RDY granted: a youzan channel that was just
        repositioned delivers the message it had read ahead outside its RDY accounting
        (PROTOCOL.md §13.1; seen on ordered channels)."""
        self._rdy_slack = 1

    def _rdy_violation(self) -> ProtocolError:
        n = self._in_flight
        if self._rdy_max == 0:
            when = ("before answering SUB with OK" if not self._sub_answered
                    else "before any RDY was sent")
            return ProtocolError(f"nsqd {self.address} delivered a message {when}: "
                                 "protocol violation, closing the connection")
        return ProtocolError(
            f"nsqd {self.address} delivered more messages than RDY allows: {n} in flight, "
            f"highest RDY granted {self._rdy_max}: protocol violation, closing the connection")

    def _on_response(self, payload: bytes) -> None:
        waiters = self._waiters
        if not waiters:
            self._fail(ProtocolError(f"nsqd {self.address} sent a response nothing waits for: "
                                     f"{payload[:32]!r}"))
            return
        w = waiters.popleft()
        fut = w[0]
        if w[2] is CommandKind.SUBSCRIBE:
            self._sub_answered = True
        if not fut.done():
            fut.set_result(payload)
        if not waiters and self._idle_fut is not None:
            self._wake_idle()

    def _on_error_frame(self, payload: bytes) -> None:
        self._error_frames += 1
        code = payload.split(b" ", 1)[0]
        kind = _NO_WAITER_CODES.get(code)
        if kind is not None:
            self._report(error_from_frame(payload, self._flavour, kind, address=self.address))
            return
        waiters = self._waiters
        if not waiters:
            exc = error_from_frame(payload, self._flavour, CommandKind.OTHER,
                                   address=self.address)
            if exc.fatal:
                self._fail(exc)
            else:
                self._report(exc)
            return
        fut, _, kind, _, topic, partition, close_on_error = waiters.popleft()
        exc = error_from_frame(payload, self._flavour, kind, address=self.address,
                               topic=topic, partition=partition)
        if not fut.done():
            fut.set_exception(exc)
        elif not exc.fatal:
            self._report(exc)
        if exc.fatal or close_on_error:
            if not exc.fatal:
                logger.warning("closing connection to nsqd %s after %s: the server may have "
                               "left part of the command unread", self.address, exc.server_code)
            self._fail(exc)
        elif not waiters and self._idle_fut is not None:
            self._wake_idle()

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

    def _on_lost(self, exc: Exception | None) -> None:
        if self._exc is None:
            partial = len(self._hs_buf) if self._handshaking else self._frames.buffered
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

    # ------------------------------------------------------------------ failing and closing

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
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()[0]
            if not fut.done():
                fut.set_exception(exc)
        hs = self._hs_waiter
        if hs is not None and not hs.done():
            hs.set_exception(exc)
        self._wake_idle()
        self._cancel_deadlines()

    def _finalize(self, exc: NSQError | None) -> None:
        if self._state is State.CLOSED:
            return
        self._state = State.CLOSED
        self._can_write = False
        self._cancel_deadlines()
        self._wake_idle()
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
                if not self._cls_abandoned and any(not w[0].done() for w in self._waiters):
                    await self._wait_idle()
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

    async def _wait_idle(self) -> None:
        if not self._waiters:
            return
        if self._idle_fut is None:
            assert self._loop is not None
            self._idle_fut = self._loop.create_future()
        await asyncio.shield(self._idle_fut)

    def _wake_idle(self) -> None:
        fut = self._idle_fut
        if fut is not None:
            self._idle_fut = None
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ requests (FIFO)

    def _send(self, command: bytes, kind: CommandKind, timeout: float | None,
              topic: str | None = None, partition: int | None = None,
              close_on_error: bool = False) -> asyncio.Future[bytes]:
        """Write ``command`` and queue its waiter; the future resolves with the response data
        or the typed error. A timed-out or cancelled waiter keeps its FIFO slot."""
        if self._state is not State.CONNECTED:
            raise self._unusable()
        loop = self._loop
        assert loop is not None and self._wire is not None
        fut = loop.create_future()
        if timeout is None:
            deadline = math.inf
        else:
            if timeout.__class__ is not float or not 0 < timeout < math.inf:
                # the common case (a positive finite float) skips the full check
                timeout = check_duration(timeout, "timeout", positive=True)
            deadline = loop.time() + timeout
            if deadline < self._deadline_at:
                self._arm_deadline(deadline)
        self._waiters.append((fut, deadline, kind, timeout, topic, partition, close_on_error))
        self._write(command)
        self._requests += 1
        if kind is _PUBLISH:
            self._publishes += 1
        return fut

    def _arm_deadline(self, when: float) -> None:
        # One timer for the earliest deadline; mostly deadlines only grow, so a publish with
        # a timeout rarely touches the timer heap.
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
        assert self._loop is not None
        self._deadline_at = when
        self._deadline_handle = self._loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._deadline_handle = None
        self._deadline_at = math.inf
        assert self._loop is not None
        now = self._loop.time()
        nxt = math.inf
        for w in self._waiters:
            d = w[1]
            if d <= now:
                fut = w[0]
                if not fut.done():
                    fut.set_exception(NSQTimeoutError(
                        f"nsqd {self.address} did not answer within {w[3]}s"))
            elif d < nxt:
                nxt = d
        if nxt < math.inf:
            # sweeps at most every _SWEEP_GAP: with many stalled waiters each sweep is O(n)
            self._arm_deadline(max(nxt, now + _SWEEP_GAP))

    def _cancel_deadlines(self) -> None:
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        self._deadline_at = math.inf

    async def _drain(self) -> None:
        wire = self._wire
        assert wire is not None
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
        ``timeout`` seconds, or the connection's error if it fails first. ``topic`` and
        ``partition`` only label errors. ``close_on_error`` closes the connection after any
        error answer (for commands whose error may leave the server mid-body)."""
        if self._wire is not None and self._wire.paused:
            await self._drain()
        return await self._send(command, kind, timeout, topic, partition, close_on_error)

    # ------------------------------------------------------------------ publishing

    async def publish(self, topic: str, body: bytes, partition: int | None = None,
                      timeout: float | None = None) -> None:
        """PUB (youzan: to ``partition`` when given; stock ignores it)."""
        command = commands.pub(topic, body, partition)
        if self._wire is not None and self._wire.paused:
            await self._drain()
        self._check_ok(await self._send(command, _PUBLISH, timeout, topic, partition), "PUB")

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

    # ------------------------------------------------------------------ consuming

    async def subscribe(self, topic: str, channel: str, partition: int | None = None,
                        mode: SubscribeMode = "plain", offset: OffsetSpec | None = None, *,
                        ext: bool = False, timeout: float | None = None) -> None:
        """SUB / SUB_ORDERED / SUB_ADVANCED; returns once the server said OK.

        ``ext`` says the topic is a youzan ext topic: message frames then carry the ext
        header when the connection identified with ``extend_support``. ``ordered`` and
        ``advanced`` frames carry the 12-byte position. Delivery starts after ``send_rdy``.
        """
        if self._subscribed or self._sub_pending:
            raise ConfigError(f"connection to nsqd {self.address} is already subscribed "
                              "(one subscription per connection)")
        if self.on_message is None:
            raise ConfigError("set on_message before subscribe()")
        if mode == "plain":
            if offset is not None:
                raise ConfigError("an offset needs mode='advanced'")
            command = commands.sub(topic, channel, partition)
        elif mode == "ordered":
            if offset is not None:
                raise ConfigError("an offset needs mode='advanced'")
            if partition is None:
                raise ConfigError("mode='ordered' needs a partition")
            self._require_youzan("SUB_ORDERED")
            command = commands.sub_ordered(topic, channel, partition)
        elif mode == "advanced":
            self._require_youzan("SUB_ADVANCED")
            command = commands.sub_advanced(topic, channel, partition, offset)
        else:
            raise ConfigError(f"mode must be 'plain', 'ordered' or 'advanced', got {mode!r}")
        ext_frames = ext and self.config.extend_support and self._flavour is not Flavour.STOCK
        layout = MessageLayout(ext=ext_frames, position=mode != "plain")
        fut = self._send(command, CommandKind.SUBSCRIBE, timeout, topic, partition)
        # set before the answer: nothing is delivered before OK and RDY, but be exact anyway
        self._layout = layout
        self._sub_pending = True
        try:
            await fut
        except NSQTimeoutError as exc:
            # the server may still subscribe us: the connection's state is unknown now
            self._fail(exc)
            raise
        except BaseException:
            self._layout = STOCK_LAYOUT
            raise
        finally:
            self._sub_pending = False
        self._subscribed = True

    def send_rdy(self, count: int) -> bool:
        """RDY ``count``, capped at the server's max_rdy_count. False if not sent (closed)."""
        if not self._subscribed:
            raise ConfigError("RDY before a successful subscribe() is fatal on nsqd")
        n = min(count, self._max_rdy)
        command = commands.rdy(n, self._max_rdy)
        if not self._can_write:
            return False
        self._write(command)
        self._rdy = n
        if n > self._rdy_max:
            self._rdy_max = n
        return True

    def fin(self, msg_id: bytes) -> bool:
        """FIN (fire-and-forget). False if the connection can no longer write."""
        if not self._can_write:
            return False
        self._write(commands.fin(msg_id))
        if self._in_flight:
            self._in_flight -= 1
            if not self._in_flight:
                self._busy_since = None
        return True

    def req(self, msg_id: bytes, delay_ms: int = 0) -> bool:
        """REQ with a redelivery delay (fire-and-forget). False if not sent."""
        if not self._can_write:
            return False
        self._write(commands.req(msg_id, delay_ms))
        if self._in_flight:
            self._in_flight -= 1
            if not self._in_flight:
                self._busy_since = None
        return True

    def touch(self, msg_id: bytes) -> bool:
        """TOUCH: restart the message's timeout (fire-and-forget). False if not sent."""
        if not self._can_write:
            return False
        self._write(commands.touch(msg_id))
        return True

    async def cls(self, timeout: float | None = None) -> None:
        """Send CLS and wait for CLOSE_WAIT: the server stops delivering; messages already
        sent still arrive and may be FINed/REQed. Then call ``close()``."""
        if timeout is not None:
            timeout = check_duration(timeout, "timeout")
        if not self._subscribed:
            raise ConfigError("CLS needs a subscribed connection")
        if self._cls_fut is None:
            await self._cls(timeout)
        else:
            await asyncio.shield(self._cls_fut)

    async def _cls(self, timeout: float | None = None) -> None:
        # close() calls this after moving the state to CLOSING; cls() only when CONNECTED
        usable = self._state is State.CONNECTED or (
            self._state is State.CLOSING and self._user_closed and self._exc is None)
        if not usable:
            raise self._unusable()
        assert self._loop is not None and self._wire is not None
        # enqueue directly: close() already moved the state to CLOSING
        fut: asyncio.Future[bytes] = self._loop.create_future()
        self._waiters.append((fut, math.inf, CommandKind.OTHER, None, None, None, False))
        self._write(commands.CLS)
        self._requests += 1
        self._cls_fut = fut
        # shielded, so a caller that gives up leaves it pending; when the connection then
        # fails, its exception must count as seen (no "never retrieved" at exit)
        fut.add_done_callback(_retrieve)
        if timeout is None:
            data = await asyncio.shield(fut)
        else:
            try:
                async with asyncio.timeout(timeout):
                    data = await asyncio.shield(fut)
            except TimeoutError:
                self._cls_abandoned = True
                raise NSQTimeoutError(f"nsqd {self.address} did not answer CLS within "
                                      f"{timeout}s") from None
        if data != CLOSE_WAIT:
            raise ProtocolError(f"nsqd {self.address} answered CLS with {data[:32]!r}")
