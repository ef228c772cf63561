"""One subscription: a connection to one (nsqd, partition) endpoint and its counters.

A :class:`Sub` is its connection's delegate (:class:`~smartnsq.conn.ConnectionDelegate`),
what a :class:`~smartnsq.message.Message` answers through
(:class:`~smartnsq.message.MessageOwner`) and what the connection set runs
(:class:`smartnsq.consumer.conns.Session`). It holds no logic of its own: deliveries and
answers go to the dispatcher (:class:`Answers`), retiring and the end of the connection to
the subscription set. The dispatcher FINs and REQs through the connection's subscriber side
(:attr:`Sub.subscriber`). The counters are written by the dispatcher (per message) and read
by the flow-control driver (once per loop turn).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from smartnsq._checks import check_loop
from smartnsq.conn import Connection, Subscriber
from smartnsq.consumer.discovery import NO_PARTITION, Endpoint
from smartnsq.consumer.meters import SubMeters
from smartnsq.consumer.positions import StartGuard
from smartnsq.errors import ServerError
from smartnsq.message import Message
from smartnsq.protocol.messages import MessageRecord

__all__ = ["Answers", "Sub"]

log = logging.getLogger("smartnsq.consumer")

#: answers to FIN / REQ / TOUCH that came too late (the message had timed out on nsqd)
_ANSWER_FAILED = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class Answers(Protocol):
    """Where a subscription's messages are answered (the dispatcher)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    def on_records(self, sub: Sub, records: list[MessageRecord]) -> None: ...

    def finish(self, sub: Sub, msg: Message) -> bool: ...

    def requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool) -> bool: ...

    def settle(self) -> None: ...


class Sub:
    """One subscription: a connection to one endpoint, with its message counters."""

    __slots__ = (
        "_ended", "_retire", "address", "answers", "channel", "closed", "conn", "dirty",
        "drained", "endpoint", "error", "fin_pending", "finished", "given_up", "guard",
        "local_address", "meters", "outstanding", "partition", "received", "recv_pending",
        "registered", "requeued", "retiring", "seeked", "subscriber", "topic", "youzan",
    )

    def __init__(self, endpoint: Endpoint, topic: str, channel: str, answers: Answers,
                 retire: Callable[[Sub], Awaitable[None]],
                 ended: Callable[[Sub, BaseException | None], None]) -> None:
        self.endpoint = endpoint
        self.answers = answers
        self._retire = retire
        self._ended = ended
        self.conn: Connection | None = None
        #: the connection's subscriber side, once subscribed: FIN / REQ / TOUCH go there
        self.subscriber: Subscriber[Connection] | None = None
        self.topic = topic
        self.channel = channel
        self.address = endpoint.address
        self.partition: int | None = (
            endpoint.partition if endpoint.partition != NO_PARTITION else None)
        self.youzan = False
        self.local_address: str | None = None
        self.closed = False
        self.retiring = False
        self.registered = False
        #: its start position was set explicitly (start_at)
        self.seeked = False
        #: keeps deliveries from before the start position away from the handler
        self.guard: StartGuard | None = None
        self.error: BaseException | None = None
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        #: handed out and not answered yet
        self.outstanding = 0
        #: received / finished since the last flush: reported to the flow control and then
        #: added to ``received`` / ``finished`` (one counter per message, see RdyDriver.flush)
        self.recv_pending = 0
        self.fin_pending = 0
        self.dirty = False
        #: set while retiring, once nothing is outstanding
        self.drained: asyncio.Event | None = None
        #: its counters when the consumer's metrics are on
        self.meters: SubMeters | None = None

    def __repr__(self) -> str:
        return f"<subscription {self.endpoint}>"

    # -- ConnectionDelegate: the connection's reports
    def on_records(self, conn: Connection, records: list[MessageRecord]) -> None:
        """The messages of one read of this subscription's connection."""
        self.answers.on_records(self, records)

    def on_error(self, conn: Connection, exc: ServerError) -> None:
        # E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED: the message timed out on the
        # server and went to someone else; nothing to do but count it
        log.debug("nsqd %s: %s", conn.address, exc)
        if self.meters is not None and exc.server_code in _ANSWER_FAILED:
            self.meters.fin_failed.inc()

    def on_close(self, conn: Connection, exc: BaseException | None) -> None:
        """The connection is closed: this subscription is over (the subscription set moves
        its counts to its totals)."""
        self.closed = True
        self.error = exc
        self._ended(self, exc)

    # -- MessageOwner (user calls: the dispatch path answers without them)
    # (the workers' FIN runs go first: the wire keeps the order of the answers)
    def finish(self, msg: Message) -> bool:
        check_loop(self.answers.loop, "this message's consumer")
        self.answers.settle()
        return self.answers.finish(self, msg)

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> bool:
        check_loop(self.answers.loop, "this message's consumer")
        self.answers.settle()
        return self.answers.requeue(self, msg, delay, backoff)

    def touch(self, msg: Message) -> bool:
        check_loop(self.answers.loop, "this message's consumer")
        self.answers.settle()
        subscriber = self.subscriber
        sent = subscriber is not None and subscriber.touch(msg.id)
        if sent and self.meters is not None:
            self.meters.touched.inc()
        return sent

    # -- Session
    async def wait_closed(self) -> None:
        if self.conn is not None:
            await self.conn.wait_closed()

    async def retire(self) -> None:
        await self._retire(self)

    @property
    def stale_leader(self) -> bool:
        err = self.error
        return isinstance(err, ServerError) and err.refresh_lookup
