"""The subscriber side of a connection: made by ``Connection.subscribe()`` (SUB /
SUB_ORDERED / SUB_ADVANCED), it owns what follows: RDY, the messages in flight, FIN / REQ /
TOUCH / CLS, the message layout of the subscription, and the RDY check every delivery goes
through (a server that ignores RDY is stopped at once, before it can fill the consumer's
memory). Deliveries go to the connection's delegate (``on_records``).

Owner: :class:`~smartnsq.conn.Connection`. Callers: its receive path (:meth:`Subscriber.receive`,
once per run of message frames in a read), its ``close()`` (CLS), and whoever answers the
messages: the consumer's dispatcher and workers call :meth:`Subscriber.fin` and
:meth:`Subscriber.req` directly, one call per message (``Connection.fin`` & co. forward to
them for everyone else).
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, Literal, Protocol, TypeVar

from smartnsq._checks import check_duration
from smartnsq.conn.delegate import ConnectionDelegate
from smartnsq.conn.state import Lifecycle
from smartnsq.errors import ConfigError, NSQError, NSQTimeoutError, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.frames import CLOSE_WAIT
from smartnsq.protocol.messages import MessageLayout, MessageRecord

__all__ = ["SubscribeMode", "Subscriber", "SubscriberHost", "sub_command"]

SubscribeMode = Literal["plain", "ordered", "advanced"]

logger = logging.getLogger("smartnsq.connection")


class SubscriberHost(Protocol):
    """What the subscriber side needs of its connection."""

    @property
    def address(self) -> str: ...

    @property
    def subscribe_answered(self) -> bool: ...

    def send_closing(self, command: bytes) -> asyncio.Future[bytes]: ...

    def abort(self, exc: NSQError) -> None: ...


#: the connection the delegate is told about
C = TypeVar("C")


def sub_command(topic: str, channel: str, partition: int | None, mode: SubscribeMode,
                offset: OffsetSpec | None, require_youzan: Callable[[str], None]) -> bytes:
    """The subscribe command of ``mode``, its arguments checked (``require_youzan(what)``
    raises for the youzan-only modes on stock nsqd)."""
    if mode == "plain":
        if offset is not None:
            raise ConfigError("an offset needs mode='advanced'")
        return commands.sub(topic, channel, partition)
    if mode == "ordered":
        if offset is not None:
            raise ConfigError("an offset needs mode='advanced'")
        if partition is None:
            raise ConfigError("mode='ordered' needs a partition")
        require_youzan("SUB_ORDERED")
        return commands.sub_ordered(topic, channel, partition)
    if mode == "advanced":
        require_youzan("SUB_ADVANCED")
        return commands.sub_advanced(topic, channel, partition, offset)
    raise ConfigError(f"mode must be 'plain', 'ordered' or 'advanced', got {mode!r}")


def _retrieve(fut: asyncio.Future[bytes]) -> None:
    if not fut.cancelled():
        fut.exception()


class Subscriber(Generic[C]):
    """See the module docstring. ``host`` is the connection's core, ``conn`` the connection
    the delegate is told about, ``write`` / ``fin_id`` / ``fin_ids`` the wire's writes (see
    :class:`~smartnsq.conn.transport.Wire`), ``max_rdy`` and ``msg_timeout`` (seconds) what
    the handshake negotiated."""

    __slots__ = (
        "_busy_since", "_cls_fut", "_conn", "_fin_id", "_fin_ids", "_host", "_life",
        "_max_rdy", "_msg_timeout", "_on_records", "_rdy_max", "_rdy_slack", "_time",
        "_write", "cls_abandoned", "in_flight", "layout", "messages_in", "rdy", "subscribed",
    )

    def __init__(self, host: SubscriberHost, conn: C, delegate: ConnectionDelegate[C],
                 life: Lifecycle, layout: MessageLayout, *, loop: asyncio.AbstractEventLoop,
                 write: Callable[[bytes], None], fin_id: Callable[[bytes], None],
                 fin_ids: list[bytes], max_rdy: int, msg_timeout: float) -> None:
        self._host = host
        self._conn = conn
        #: the delegate's method, bound once: one call per run of messages
        self._on_records = delegate.on_records
        self._life = life
        self._time = loop.time
        self._write = write
        self._fin_id = fin_id
        self._fin_ids = fin_ids
        self._max_rdy = max_rdy
        self._msg_timeout = msg_timeout
        #: the optional parts of this subscription's message frames
        self.layout = layout
        #: the server answered the subscribe command with OK
        self.subscribed = False
        self._cls_fut: asyncio.Future[bytes] | None = None
        #: a cls() call timed out: the server is not answering, close() need not wait
        self.cls_abandoned = False
        #: the last RDY count sent
        self.rdy = 0
        #: the highest RDY ever sent: the server may still act on it after a lower RDY
        #: went out, so in-flight messages are checked against this
        self._rdy_max = 0
        #: messages tolerated beyond RDY (a repositioned youzan channel's read-ahead)
        self._rdy_slack = 0
        #: loop time since which messages have been continuously in flight (None: none)
        self._busy_since: float | None = None
        #: messages received minus FIN/REQ sent (floored at 0); commands, not distinct ids
        self.in_flight = 0
        self.messages_in = 0

    @property
    def cls_sent(self) -> bool:
        """CLS went out: no more deliveries after its CLOSE_WAIT."""
        return self._cls_fut is not None

    # ------------------------------------------------------------------ receiving

    def receive(self, records: list[MessageRecord]) -> None:
        """A run of messages from the receive path: counted against RDY, then handed to
        the delegate. Within RDY as a whole (a consumer's usual read) in one step; else one
        by one, as if each was handed on alone (see :meth:`_receive_counted`)."""
        n = len(records)
        self.messages_in += n
        in_flight = self.in_flight + n
        if in_flight > self._rdy_max:
            self._receive_counted(records)
            return
        if in_flight == n:
            self._busy_since = self._time()
        self.in_flight = in_flight
        try:
            self._on_records(self._conn, records)
        except Exception:
            logger.exception("on_records callback failed (nsqd %s)", self._host.address)

    def _receive_counted(self, records: list[MessageRecord]) -> None:
        """More than RDY allows in this run: counted per message, and a message over RDY
        first hands the run before it to the delegate, which may answer some at once (a
        youzan read-ahead copy). Still over: the connection fails, nothing more is
        delivered."""
        batch: list[MessageRecord] = []
        deliver = self._deliver
        for record in records:
            in_flight = self.in_flight = self.in_flight + 1
            if in_flight > self._rdy_max and not self._may_exceed_rdy():
                deliver(batch)
                batch = []
                if self.in_flight > self._rdy_max and not self._may_exceed_rdy():
                    self._host.abort(self._rdy_violation())
                    return
                in_flight = self.in_flight
            if in_flight == 1:
                self._busy_since = self._time()
            batch.append(record)
        deliver(batch)

    def _deliver(self, batch: list[MessageRecord]) -> None:
        if not batch:
            return
        try:
            self._on_records(self._conn, batch)
        except Exception:
            logger.exception("on_records callback failed (nsqd %s)", self._host.address)

    def _may_exceed_rdy(self) -> bool:
        """More in flight than any RDY granted is legitimate only after the server timed
        messages out (it then frees their slots and may redeliver them to us while we still
        count the first copy): possible once messages have stayed unanswered on this
        connection for the whole msg_timeout."""
        if self._rdy_max == 0 or self._busy_since is None:
            return False
        if self.in_flight <= self._rdy_max + self._rdy_slack:
            return True
        return self._time() - self._busy_since >= self._msg_timeout

    def allow_read_ahead(self) -> None:
        """Tolerate one message beyond the RDY granted: a youzan channel that was just
        repositioned delivers the message it had read ahead outside its RDY accounting
        (seen on ordered channels)."""
        self._rdy_slack = 1

    def _rdy_violation(self) -> ProtocolError:
        address = self._host.address
        if self._rdy_max == 0:
            when = ("before answering SUB with OK" if not self._host.subscribe_answered
                    else "before any RDY was sent")
            return ProtocolError(f"nsqd {address} delivered a message {when}: "
                                 "protocol violation, closing the connection")
        return ProtocolError(
            f"nsqd {address} delivered more messages than RDY allows: {self.in_flight} in "
            f"flight, highest RDY granted {self._rdy_max}: protocol violation, closing the "
            "connection")

    # ------------------------------------------------------------------ commands

    def send_rdy(self, count: int) -> bool:
        """RDY ``count``, capped at the server's max_rdy_count. False if not sent (closed)."""
        if not self.subscribed:
            raise ConfigError("RDY before a successful subscribe() is fatal on nsqd")
        n = min(count, self._max_rdy)
        command = commands.rdy(n, self._max_rdy)
        if not self._life.can_write:
            return False
        self._write(command)
        self.rdy = n
        if n > self._rdy_max:
            self._rdy_max = n
        return True

    def fin(self, msg_id: bytes) -> bool:
        """FIN (fire-and-forget). False if the connection can no longer write."""
        if type(msg_id) is not bytes or len(msg_id) != 16:
            if not self._life.can_write:
                return False  # as for any id: nothing is sent once it cannot write
            commands.fin(msg_id)  # raises the ConfigError that says what is wrong with it
        return self.fin_delivered(msg_id)

    def fin_delivered(self, msg_id: bytes) -> bool:
        """:meth:`fin` of an id that this connection's decoder produced (16 bytes by
        construction): the consumer's per-message path, without the caller's-input check."""
        if not self._life.can_write:
            return False
        fin_ids = self._fin_ids
        if fin_ids:
            fin_ids.append(msg_id)  # the wire's flush is already scheduled
        else:
            self._fin_id(msg_id)
        n = self.in_flight
        if n:
            self.in_flight = n = n - 1
            if not n:
                self._busy_since = None
        return True

    def fin_run(self, ids: list[bytes]) -> bool:
        """:meth:`fin_delivered` of several ids in one step (the consumer's workers gather
        the FINs of the handlers that returned in a run)."""
        if not self._life.can_write:
            return False
        fin_ids = self._fin_ids
        if not fin_ids:
            self._fin_id(ids[0])  # schedules the wire's flush
            fin_ids += ids[1:]
        else:
            fin_ids += ids
        n = self.in_flight
        if n:
            self.in_flight = n = max(0, n - len(ids))
            if not n:
                self._busy_since = None
        return True

    def req(self, msg_id: bytes, delay_ms: int = 0) -> bool:
        """REQ with a redelivery delay (fire-and-forget). False if not sent."""
        if not self._life.can_write:
            return False
        self._write(commands.req(msg_id, delay_ms))
        n = self.in_flight
        if n:
            self.in_flight = n = n - 1
            if not n:
                self._busy_since = None
        return True

    def touch(self, msg_id: bytes) -> bool:
        """TOUCH: restart the message's timeout (fire-and-forget). False if not sent."""
        if not self._life.can_write:
            return False
        self._write(commands.touch(msg_id))
        return True

    async def cls(self, timeout: float | None = None) -> None:
        """Send CLS (once) and wait for CLOSE_WAIT: the server stops delivering; messages
        already sent still arrive and may be FINed/REQed. ``timeout``: seconds (None:
        unbounded); a timeout marks the server as not answering (:attr:`cls_abandoned`)."""
        if timeout is not None:
            timeout = check_duration(timeout, "timeout")
        if not self.subscribed:
            raise ConfigError("CLS needs a subscribed connection")
        fut = self._cls_fut
        if fut is not None:
            await asyncio.shield(fut)
            return
        life = self._life
        # close() calls this after moving the state to CLOSING; cls() only when CONNECTED
        if not life.closing_cleanly:
            raise life.unusable()
        fut = self._cls_fut = self._host.send_closing(commands.CLS)
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
                self.cls_abandoned = True
                raise NSQTimeoutError(f"nsqd {self._host.address} did not answer CLS within "
                                      f"{timeout}s") from None
        if data != CLOSE_WAIT:
            raise ProtocolError(f"nsqd {self._host.address} answered CLS with {data[:32]!r}")
