"""Subscriber commands of :class:`~smartnsq.conn.Connection`: SUB / SUB_ORDERED /
SUB_ADVANCED, RDY, FIN, REQ, TOUCH, CLS, and the RDY accounting the receive path checks every
delivery against (a server that ignores RDY is stopped at once, PROTOCOL.md §2.4).

The state lives on the connection (``_subscribed``, ``_rdy``, ``_rdy_max``, ``_in_flight``,
…) so that FIN and the receive path cost no extra hop per message.
"""

# Per-call ``timeout`` arguments are deliberate: a timed-out request must keep its FIFO slot,
# which wrapping the call in asyncio.timeout() cannot do.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from smartnsq._checks import check_duration
from smartnsq.config import ConnectionConfig
from smartnsq.conn.state import State
from smartnsq.errors import (
    CommandKind,
    ConfigError,
    Flavour,
    NSQError,
    NSQTimeoutError,
    ProtocolError,
)
from smartnsq.protocol import commands
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.frames import CLOSE_WAIT
from smartnsq.protocol.messages import STOCK_LAYOUT, MessageLayout

if TYPE_CHECKING:
    from smartnsq.conn.transport import Wire
    from smartnsq.conn.waiters import Waiter

__all__ = ["SubscribeCommands", "SubscribeMode"]

SubscribeMode = Literal["plain", "ordered", "advanced"]

logger = logging.getLogger("smartnsq.connection")


def _retrieve(fut: asyncio.Future[bytes]) -> None:
    if not fut.cancelled():
        fut.exception()


class SubscribeCommands:
    """The subscriber side of a connection (mixed into ``Connection``)."""

    if TYPE_CHECKING:  # provided by Connection
        address: str
        config: ConnectionConfig
        on_message: Any
        on_messages: Any
        on_records: Any

        @property
        def msg_timeout(self) -> float: ...

        _state: State
        _loop: asyncio.AbstractEventLoop | None
        _wire: Wire | None
        _exc: NSQError | None
        _user_closed: bool
        _flavour: Flavour
        _layout: MessageLayout
        _max_rdy: int
        _can_write: bool
        _write: Callable[[bytes], None]
        _fin_id: Callable[[bytes], None]
        _fin_ids: list[bytes]
        _waiters: deque[Waiter]
        _requests: int
        _subscribed: bool
        _sub_pending: bool
        _sub_answered: bool
        _cls_fut: asyncio.Future[bytes] | None
        _cls_abandoned: bool
        _rdy: int
        _rdy_max: int
        _rdy_slack: int
        _busy_since: float | None
        _in_flight: int

        def _send(self, command: bytes, kind: CommandKind, timeout: float | None,
                  topic: str | None = None, partition: int | None = None,
                  close_on_error: bool = False) -> asyncio.Future[bytes]: ...

        def _fail(self, exc: NSQError) -> None: ...

        def _unusable(self) -> NSQError: ...

        def _require_youzan(self, what: str) -> None: ...

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
        if self.on_message is None and self.on_messages is None and self.on_records is None:
            raise ConfigError("set on_message (or on_messages, on_records) before subscribe()")
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
        if len(msg_id) != 16 or type(msg_id) is not bytes:
            commands.fin(msg_id)  # raises the ConfigError that says what is wrong with it
        fin_ids = self._fin_ids
        if fin_ids:
            fin_ids.append(msg_id)  # the wire's flush is already scheduled
        else:
            self._fin_id(msg_id)
        n = self._in_flight
        if n:
            self._in_flight = n = n - 1
            if not n:
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

    def _deliver(self, batch: list[Any]) -> None:
        """Hand a run of received messages (already counted against RDY) to ``on_records``
        (records) or ``on_messages`` (RawMessage objects); the receive path calls it before
        handling the next non-message frame, so the callback sees the stream's order. Its
        errors are logged."""
        if not batch:
            return
        callback = self.on_records
        if callback is None:
            callback = self.on_messages
            if callback is None:
                return
        try:
            callback(self, batch)
        except Exception:
            logger.exception("%s callback failed (nsqd %s)",
                             "on_records" if callback is self.on_records else "on_messages",
                             self.address)

    # ------------------------------------------------------------------ RDY accounting

    def _rdy_exceeded(self, batch: list[Any]) -> bool:
        """A message took in_flight over RDY. As if each was handed on alone, the run before
        it goes to the callback first (``_deliver``): it may answer some at once (a youzan
        read-ahead copy, PROTOCOL.md §13.1). True, the connection failed, if still over."""
        self._deliver(batch)
        if self._in_flight > self._rdy_max and not self._may_exceed_rdy():
            self._fail(self._rdy_violation())
            return True
        return False

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

