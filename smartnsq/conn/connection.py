"""One asyncio connection to an nsqd (stock or youzan): handshake, publishing, subscribing.

Life cycle: ``Connection(...)`` → ``await connect()`` (the handshake of
:mod:`smartnsq.conn.handshake`: magic, IDENTIFY, TLS / snappy / deflate upgrades, AUTH) →
publish (:mod:`smartnsq.conn.publishing`) and/or subscribe (:mod:`smartnsq.conn.consuming`)
→ ``close()``.

Responses come back in command order (§2.10), so every command that gets a response (PUB and
friends, SUB, CLS) puts a waiter in a FIFO (:mod:`smartnsq.conn.waiters`) and the receive
path resolves the oldest one. Many publishes can therefore be in flight on one connection.
FIN/REQ/TOUCH/RDY/NOP get no response and are fire-and-forget; their non-fatal errors go to
``on_error``. Messages are decoded and handed to ``on_message`` synchronously from the
receive path: no task per message.

There is no background task: the receive path runs in the protocol's ``data_received``, and
timeouts are loop timers. A connection that fails for any reason fails every pending waiter
with the error and closes its socket. This module keeps the steady state: the receive path,
the send path, failing and closing.
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

from smartnsq._checks import check_duration
from smartnsq.config import ConnectionConfig
from smartnsq.conn.answers import AnswerRouting
from smartnsq.conn.closing import CloseSequence
from smartnsq.conn.connecting import ConnectSequence
from smartnsq.conn.consuming import SubscribeCommands, SubscribeMode
from smartnsq.conn.handshake import DEFAULT_MAX_RDY, Handshake
from smartnsq.conn.publishing import ExtHeader, PublishCommands
from smartnsq.conn.state import ConnectionStats, State
from smartnsq.conn.transport import Wire
from smartnsq.conn.waiters import ResponseQueue
from smartnsq.errors import (
    CommandKind,
    Flavour,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
    ServerError,
)
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    OK_FRAME,
    Frame,
    FrameDecoder,
)
from smartnsq.protocol.messages import (
    STOCK_LAYOUT,
    MessageLayout,
    MessageRecord,
    RawMessage,
    decode_message,
    record_of,
)
from smartnsq.protocol.responses import AuthResponse, IdentifyResponse

__all__ = ["Connection", "ConnectionStats", "ExtHeader", "OnClose", "OnError", "OnMessage",
           "OnMessages", "OnRecords", "State", "SubscribeMode"]

logger = logging.getLogger("smartnsq.connection")

OnMessage = Callable[["Connection", RawMessage], None]
OnMessages = Callable[["Connection", list[RawMessage]], None]
OnRecords = Callable[["Connection", list[MessageRecord]], None]
OnError = Callable[["Connection", ServerError], None]
OnClose = Callable[["Connection", BaseException | None], None]

# enum members bound once: EnumType has a __getattr__, so State.CONNECTED costs ~4x a global
_PUBLISH = CommandKind.PUBLISH
_CONNECTED = State.CONNECTED
_NOP = commands.NOP
_DEFAULT_MSG_TIMEOUT = 60.0


def _ignore_write(data: bytes) -> None:
    """Stands in for the wire's write before connect()."""


class Connection(ConnectSequence, PublishCommands, SubscribeCommands, AnswerRouting,
                 CloseSequence):
    """See the module docstring.

    Callbacks (also settable as attributes before they are needed):

    * ``on_message(conn, raw_message)``: every delivered message, synchronously from the
      receive path; keep it short (hand the message on, or FIN it). Exceptions are logged.
    * ``on_messages(conn, raw_messages)``: instead of ``on_message`` when set: one call per
      run of message frames in a read (a consumer's: one call instead of one per message).
      Each message is counted against RDY first; frames between runs are handled in order.
    * ``on_records(conn, records)``: instead of both when set: ``on_messages`` with each
      message as a :data:`~smartnsq.protocol.messages.MessageRecord` tuple (the consumer's:
      no object per message; ``RawMessage(*record)`` makes one).
    * ``on_error(conn, server_error)``: non-fatal error frames no caller is waiting for
      (``E_FIN_FAILED``, ``E_REQ_FAILED``, ``E_TOUCH_FAILED``, errors answering a publish
      whose caller timed out or was cancelled).
    * ``on_close(conn, exc)``: once, after a connection whose ``connect()`` succeeded is
      closed; ``exc`` is None after a clean ``close()``, else the reason.

    ``answer_timeout``: see :class:`~smartnsq.conn.waiters.ResponseQueue` (None: never).
    """

    def __init__(
        self,
        host: str,
        port: int,
        config: ConnectionConfig | None = None,
        *,
        on_message: OnMessage | None = None,
        on_messages: OnMessages | None = None,
        on_records: OnRecords | None = None,
        on_error: OnError | None = None,
        on_close: OnClose | None = None,
        answer_timeout: float | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.config = config if config is not None else ConnectionConfig()
        self.on_message = on_message
        self.on_messages = on_messages
        self.on_records = on_records
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
        self._max_rdy = DEFAULT_MAX_RDY

        # the handshake until connect() is done: it gets the bytes meanwhile (frames are
        # taken one at a time so an upgrade starts exactly at a frame boundary, §2.1.1)
        self._hs: Handshake | None = Handshake(self.config, self.address, host,
                                               self._frames.max_size)
        self._hs_waiter: asyncio.Future[None] | None = None

        self._fifo = ResponseQueue(self.address, answer_timeout, self._fail)
        #: the FIFO's deque, bound once: the send and receive paths use it for every command
        self._waiters = self._fifo.slots
        #: the wire's write, bound once: it is called for every command
        self._write: Callable[[bytes], None] = _ignore_write
        #: the wire's fin (FIN by message id), bound once: a consumer calls it per message
        self._fin_id: Callable[[bytes], None] = _ignore_write
        #: the wire's queued FIN ids (see Wire.fin_ids)
        self._fin_ids: list[bytes] = []

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
        return self._state is _CONNECTED

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

    # ------------------------------------------------------------------ receive path

    def _on_data(self, data: bytes) -> None:
        if self._exc is not None:
            return
        hs = self._hs
        if hs is not None:
            hs.feed(data)
            waiter = self._hs_waiter
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            return
        layout = self._layout
        records = self.on_records is not None
        frames: Sequence[Frame | RawMessage | MessageRecord]
        decoder = self._frames
        try:
            # stock layout, or youzan's position prefix: the decoder decodes message frames
            # itself (the per-message path); ext headers (variable length) take decode_message
            if layout.ext:
                frames = decoder.feed(data)
            elif records:
                frames = decoder.feed_records(data, layout.position)
                n = decoder.records
                if n == len(frames) and n:
                    in_flight = self._in_flight + n
                    if in_flight <= self._rdy_max:
                        # the common read of a consumer: messages only, within RDY (so each
                        # one on its own was too), handed on as they are
                        if in_flight == n:
                            self._busy_since = self._loop.time()  # type: ignore[union-attr]
                        self._in_flight = in_flight
                        self._frames_in += n
                        self._messages_in += n
                        self._deliver(frames)
                        return
            else:
                n = decoder.feed_oks(data)
                if n:  # the common read of a publisher
                    self._frames_in += n
                    self._on_response(OK, n)
                    return
                frames = decoder.feed_messages(data, layout.position)
        except ProtocolError as exc:
            self._fail(exc)
            return
        self._frames_in += len(frames)
        on_message = None if records else self.on_message
        batching = records or self.on_messages is not None
        # with on_records / on_messages: this run of messages
        batch: list[Any] = []
        n_messages = 0
        for frame in frames:
            if frame is OK_FRAME:
                if batch:
                    self._deliver(batch)
                    batch = []
                self._on_response(OK)
                if self._exc is not None:
                    break
                continue
            msg: Any
            if type(frame) is not Frame:
                msg = frame  # decoded by the decoder: a record or a RawMessage
            else:
                ftype, payload = frame
                if ftype != FRAME_MESSAGE and batch:
                    # the messages before this frame first: callbacks see the stream's order
                    self._deliver(batch)
                    batch = []
                if ftype == FRAME_RESPONSE:
                    if payload == HEARTBEAT:
                        self._write(_NOP)
                        continue
                    self._on_response(payload)
                    if self._exc is not None:
                        break
                    continue
                if ftype != FRAME_MESSAGE:
                    self._on_error_frame(payload)
                    if self._exc is not None:
                        break
                    continue
                try:
                    msg = decode_message(payload, layout)
                except ProtocolError as exc:
                    self._deliver(batch)
                    self._fail(exc)
                    return
                if records:
                    msg = record_of(msg)
            n_messages += 1
            if not batching and on_message is None:
                self._fail(ProtocolError(
                    f"nsqd {self.address} delivered a message on a connection without "
                    "a subscriber"))
                return
            # counted per message so a server ignoring RDY is stopped at once, before
            # it can fill the consumer's memory
            in_flight = self._in_flight = self._in_flight + 1
            if in_flight > self._rdy_max and not self._may_exceed_rdy():
                if self._rdy_exceeded(batch):
                    return
                batch = []
                in_flight = self._in_flight
            if in_flight == 1:
                self._busy_since = self._loop.time()  # type: ignore[union-attr]
            if batching:
                batch.append(msg)
                continue
            try:
                on_message(self, msg)  # type: ignore[misc]
            except Exception:
                logger.exception("on_message callback failed (nsqd %s)", self.address)
        if batch:
            self._deliver(batch)
        if n_messages:
            self._messages_in += n_messages

    # ------------------------------------------------------------------ requests (FIFO)

    def _send(self, command: bytes, kind: CommandKind, timeout: float | None,
              topic: str | None = None, partition: int | None = None,
              close_on_error: bool = False) -> asyncio.Future[bytes]:
        """Write ``command`` and queue its waiter; the future resolves with the response data
        or the typed error. A timed-out or cancelled waiter keeps its FIFO slot."""
        if self._state is not _CONNECTED:
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
            if deadline < self._fifo.deadline_at:
                self._fifo.arm(deadline)
        self._waiters.append((fut, deadline, kind, timeout, topic, partition, close_on_error))
        self._write(command)
        self._requests += 1
        if kind is _PUBLISH:
            self._publishes += 1
        return fut

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
