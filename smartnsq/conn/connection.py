"""One asyncio connection to an nsqd (stock or youzan): publishing, subscribing, closing.

Life cycle: ``Connection(...)`` → ``await connect()`` (dial and handshake:
:mod:`smartnsq.conn.connecting`, :mod:`smartnsq.conn.handshake`) → publish and/or
``subscribe()`` → ``close()``.

:class:`Connection` is the public face of three parts it holds: the core
(:class:`~smartnsq.conn.core.ConnectionCore`: the socket, the receive path, the response
FIFO, the life-cycle state, setting up, failing and closing), the publisher side
(:class:`~smartnsq.conn.publisher.Publisher`: the PUB family, whose methods it exposes as
its own, bound once) and, made by :meth:`Connection.subscribe`, the subscriber side
(:class:`~smartnsq.conn.subscriber.Subscriber`: RDY, FIN/REQ/TOUCH/CLS, messages in
flight). It reports to its owner through a delegate (:mod:`smartnsq.conn.delegate`):
messages, errors no caller waits for, the close.
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from smartnsq._checks import check_duration
from smartnsq.config import ConnectionConfig
from smartnsq.conn.core import ConnectionCore
from smartnsq.conn.delegate import ConnectionCallbacks, ConnectionDelegate
from smartnsq.conn.handshake import DEFAULT_MAX_RDY
from smartnsq.conn.publisher import Publisher
from smartnsq.conn.state import ConnectionStats, State
from smartnsq.conn.subscriber import SubscribeMode, Subscriber, sub_command
from smartnsq.errors import ConfigError, Flavour, NSQError, ServerError
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.messages import STOCK_LAYOUT, MessageLayout, MessageRecord
from smartnsq.protocol.responses import AuthResponse, IdentifyResponse

__all__ = ["Connection"]

# enum members bound once: EnumType has a __getattr__, so State.CONNECTED costs ~4x a global
_CONNECTED = State.CONNECTED
_CLOSING = State.CLOSING
_CLOSED = State.CLOSED


class Connection:
    """See the module docstring.

    ``delegate`` (also settable as an attribute before ``subscribe()``): a
    :class:`~smartnsq.conn.delegate.ConnectionDelegate` told of the messages (once
    subscribed), of non-fatal errors no caller is waiting for (without a delegate they are
    logged) and of the close; or, for an owner without an object of its own, the loose
    functions ``on_records``, ``on_error`` and ``on_close``, which make one
    (:class:`~smartnsq.conn.delegate.ConnectionCallbacks`). ``answer_timeout``: see
    :class:`~smartnsq.conn.waiters.ResponseQueue` (None: never).

    The publishing methods (``publish``, ``send_pub``, ``send_publish``,
    ``check_publish_answer``, ``publish_many``, ``publish_deferred``, ``publish_trace``,
    ``publish_many_trace``, ``publish_ext``, ``publish_many_ext``) are the publisher side's;
    ``request`` and ``drain`` the core's: see there.
    """

    def __init__(
        self,
        host: str,
        port: int,
        config: ConnectionConfig | None = None,
        *,
        delegate: ConnectionDelegate[Connection] | None = None,
        on_records: Callable[[Connection, list[MessageRecord]], None] | None = None,
        on_error: Callable[[Connection, ServerError], None] | None = None,
        on_close: Callable[[Connection, BaseException | None], None] | None = None,
        answer_timeout: float | None = None,
    ) -> None:
        if on_records is not None or on_error is not None or on_close is not None:
            if delegate is not None:
                raise ConfigError("give a delegate or callbacks (on_records, on_error, "
                                  "on_close), not both")
            delegate = ConnectionCallbacks(on_records, on_error, on_close)
        core = self._core = ConnectionCore(
            self, host, port, config if config is not None else ConnectionConfig(), delegate,
            answer_timeout)
        self.request = core.request
        self.drain = core.drain
        pub = Publisher(core)
        # the publisher side's methods as the connection's own, bound once (the producer
        # calls send_pub / send_publish / check_publish_answer per publish)
        self.publish = pub.publish
        self.send_pub = pub.send_pub
        self.send_publish = pub.send_publish
        self.check_publish_answer = pub.check_publish_answer
        self.publish_many = pub.publish_many
        self.publish_deferred = pub.publish_deferred
        self.publish_trace = pub.publish_trace
        self.publish_many_trace = pub.publish_many_trace
        self.publish_ext = pub.publish_ext
        self.publish_many_ext = pub.publish_many_ext

    def __repr__(self) -> str:
        return (f"<Connection {self.address} {self.state.value} flavour={self.flavour.value}"
                f" rdy={self.rdy} in_flight={self.in_flight} pending={self.pending}>")

    @property
    def host(self) -> str:
        return self._core.host

    @property
    def port(self) -> int:
        return self._core.port

    @property
    def address(self) -> str:
        """``host:port`` of the nsqd."""
        return self._core.address

    @property
    def config(self) -> ConnectionConfig:
        return self._core.config

    @property
    def delegate(self) -> ConnectionDelegate[Connection] | None:
        """Who is told of messages, errors and the close (settable before subscribe())."""
        return self._core.delegate

    @delegate.setter
    def delegate(self, delegate: ConnectionDelegate[Connection] | None) -> None:
        self._core.delegate = delegate

    # ------------------------------------------------------------------ state and facts

    @property
    def state(self) -> State:
        return self._core.life.state

    @property
    def is_connected(self) -> bool:
        """Handshake done and not closing: commands can be sent."""
        return self._core.life.state is _CONNECTED

    @property
    def is_closing(self) -> bool:
        """``close()`` started, a fatal error arrived, or CLS was sent (no more deliveries)."""
        sub = self._core.sub
        return self._core.life.state is _CLOSING or (sub is not None and sub.cls_sent)

    @property
    def is_closed(self) -> bool:
        return self._core.life.state is _CLOSED

    @property
    def error(self) -> NSQError | None:
        """Why the connection failed (None while healthy or after a clean close)."""
        return self._core.life.error

    @property
    def identify(self) -> IdentifyResponse | None:
        """The server's IDENTIFY answer (``negotiated`` False when it said a plain OK)."""
        n = self._core.negotiated
        return n.identify if n is not None else None

    @property
    def auth(self) -> AuthResponse | None:
        n = self._core.negotiated
        return n.auth if n is not None else None

    @property
    def flavour(self) -> Flavour:
        """STOCK or YOUZAN from the IDENTIFY ``version``; UNKNOWN without negotiation."""
        return self._core.flavour

    @property
    def tls(self) -> bool:
        wire = self._core.wire
        return wire is not None and wire.tls

    @property
    def local_address(self) -> str | None:
        """Our end of the socket as ``host:port`` (``[host]:port`` for IPv6): the client
        address nsqd sees and reports for this connection. Set once the TCP connection is
        made (so already during the handshake); None before ``connect()`` and once the
        connection is closed."""
        wire = self._core.wire
        if wire is None or self._core.life.state is _CLOSED:
            return None
        return wire.local_address

    @property
    def compression(self) -> Literal["snappy", "deflate"] | None:
        n = self._core.negotiated
        wire = self._core.wire
        if n is None or wire is None or wire.decoder is None:
            return None
        return "snappy" if n.identify.snappy else "deflate"

    @property
    def max_rdy_count(self) -> int:
        n = self._core.negotiated
        return n.max_rdy if n is not None else DEFAULT_MAX_RDY

    @property
    def msg_timeout(self) -> float:
        """Seconds the server waits for FIN/REQ/TOUCH before redelivering (negotiated)."""
        return self._core.msg_timeout

    @property
    def max_msg_timeout(self) -> float | None:
        """Seconds; the largest TOUCH-extended lifetime the server allows (None if unknown)."""
        n = self._core.negotiated
        if n is not None and n.identify.max_msg_timeout > 0:
            return n.identify.max_msg_timeout / 1000.0
        return None

    @property
    def pending(self) -> int:
        """Commands still waiting for their response."""
        return len(self._core.fifo.slots)

    @property
    def write_paused(self) -> bool:
        """The socket's send buffer is above its high-water mark."""
        wire = self._core.wire
        return wire is not None and wire.paused

    def stats(self) -> ConnectionStats:
        core = self._core
        wire = core.wire
        sub = core.sub
        return ConnectionStats(
            bytes_in=wire.bytes_in if wire else 0,
            bytes_out=wire.bytes_out if wire else 0,
            frames_in=core.receiver.frames_in,
            messages_in=sub.messages_in if sub else 0,
            publishes=core.publishes,
            requests=core.publishes + core.other_requests,
            pending=len(core.fifo.slots),
            error_frames=core.fifo.error_frames,
            in_flight=sub.in_flight if sub else 0,
            rdy=sub.rdy if sub else 0,
        )

    # ------------------------------------------------------------------ life cycle

    async def connect(self) -> IdentifyResponse:
        """Dial (``dial_timeout``), then magic, IDENTIFY, upgrades and AUTH
        (``handshake_timeout``). Raises NSQTimeoutError, NSQConnectionError, TLSError,
        ProtocolError/CompressionError or the server's typed error; the socket is then closed.
        """
        return await self._core.connect()

    def abort(self, exc: NSQError) -> None:
        """Fail the connection now with ``exc``: every command waiting for an answer gets
        it, the socket is dropped, the delegate's ``on_close`` gets it. For an owner that
        learnt otherwise that the server is gone (another connection to it went silent)."""
        self._core.abort(exc)

    async def close(self, timeout: float | None = None) -> None:
        """Close gracefully within ``timeout`` seconds (default ``config.close_timeout``):
        if subscribed send CLS and wait for CLOSE_WAIT, wait for outstanding responses,
        then close the socket. Commands sent after this raise ClientClosedError; waiters
        still pending at the end fail with ConnectionClosedError. Safe to call more than
        once."""
        await self._core.close(timeout)

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (by ``close()``, the server or an error)."""
        await self._core.wait_closed()

    # ------------------------------------------------------------------ subscribing

    async def subscribe(self, topic: str, channel: str, partition: int | None = None,
                        mode: SubscribeMode = "plain", offset: OffsetSpec | None = None, *,
                        ext: bool = False, timeout: float | None = None
                        ) -> Subscriber[Connection]:
        """SUB / SUB_ORDERED / SUB_ADVANCED; returns the subscriber side once the server
        said OK (also :attr:`subscriber`). Its deliveries go to the delegate's
        ``on_records``.

        ``ext`` says the topic is a youzan ext topic: message frames then carry the ext
        header when the connection identified with ``extend_support``. ``ordered`` and
        ``advanced`` frames carry the 12-byte position. Delivery starts after ``send_rdy``.
        """
        core = self._core
        if core.sub is not None:
            raise ConfigError(f"connection to nsqd {self.address} is already subscribed "
                              "(one subscription per connection)")
        delegate = core.delegate
        if delegate is None or (isinstance(delegate, ConnectionCallbacks)
                                and not delegate.takes_records):
            raise ConfigError("subscribe() needs a delegate whose on_records takes the "
                              "messages: Connection(..., delegate=...)")
        command = sub_command(topic, channel, partition, mode, offset, core.require_youzan)
        ext_frames = ext and self.config.extend_support and self.flavour is not Flavour.STOCK
        layout = MessageLayout(ext=ext_frames, position=mode != "plain")
        return await core.subscribe(command, layout, timeout, topic, partition)

    @property
    def subscriber(self) -> Subscriber[Connection] | None:
        """The subscriber side, from ``subscribe()`` on (None before, or after it failed)."""
        return self._core.sub

    @property
    def subscribed(self) -> bool:
        sub = self._core.sub
        return sub is not None and sub.subscribed

    @property
    def layout(self) -> MessageLayout:
        sub = self._core.sub
        return sub.layout if sub is not None else STOCK_LAYOUT

    @property
    def rdy(self) -> int:
        """The last RDY count sent."""
        sub = self._core.sub
        return sub.rdy if sub is not None else 0

    @property
    def in_flight(self) -> int:
        """Messages received minus FIN/REQ sent on this connection (floored at 0). Counted
        here so every consumer gets it for free; it counts commands, not distinct ids."""
        sub = self._core.sub
        return sub.in_flight if sub is not None else 0

    def _subscriber(self, what: str) -> Subscriber[Connection]:
        sub = self._core.sub
        if sub is None:
            raise ConfigError(f"{what} before a successful subscribe() is fatal on nsqd")
        return sub

    def send_rdy(self, count: int) -> bool:
        """RDY ``count``, capped at the server's max_rdy_count. False if not sent (closed)."""
        return self._subscriber("RDY").send_rdy(count)

    def fin(self, msg_id: bytes) -> bool:
        """FIN (fire-and-forget). False if the connection can no longer write."""
        if not self._core.life.can_write:
            return False
        return self._subscriber("FIN").fin(msg_id)

    def req(self, msg_id: bytes, delay_ms: int = 0) -> bool:
        """REQ with a redelivery delay (fire-and-forget). False if not sent."""
        if not self._core.life.can_write:
            return False
        return self._subscriber("REQ").req(msg_id, delay_ms)

    def touch(self, msg_id: bytes) -> bool:
        """TOUCH: restart the message's timeout (fire-and-forget). False if not sent."""
        if not self._core.life.can_write:
            return False
        return self._subscriber("TOUCH").touch(msg_id)

    async def cls(self, timeout: float | None = None) -> None:
        """Send CLS and wait for CLOSE_WAIT: the server stops delivering; messages already
        sent still arrive and may be FINed/REQed. Then call ``close()``."""
        if timeout is not None:
            timeout = check_duration(timeout, "timeout")
        sub = self._core.sub
        if sub is None:
            raise ConfigError("CLS needs a subscribed connection")
        await sub.cls(timeout)

    def allow_read_ahead(self) -> None:
        """See :meth:`Subscriber.allow_read_ahead`."""
        self._subscriber("read-ahead").allow_read_ahead()
