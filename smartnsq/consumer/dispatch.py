"""The consumer's dispatch: from a decoded delivery to its answer.

Per-message path (kept flat on purpose; a consume+FIN loop spends most of its time here):

1. ``Connection`` decodes the message frames of a read into records (plain tuples) and
   hands them to :meth:`Dispatcher.on_records` synchronously from its receive path.
2. ``on_records`` counts them for RDY (reported once per loop turn, see
   :class:`~smartnsq.consumer.rdy_driver.RdyDriver`) and, in the common case, queues them
   as they are behind a marker, their subscription: the :class:`Message` is made by the
   worker that takes one, so nothing per message waits in the queue for the garbage
   collector to scan. With tracing, a start guard, the policy's admission
   (:mod:`smartnsq.consumer.policy`) or a message over the attempt cap, each becomes a
   :class:`Message` at once and goes through those checks (:meth:`Dispatcher._receive`).
3. A worker task (:mod:`smartnsq.consumer.workers`) awaits the handler for each queued
   message: no task per message.
4. Returning finishes the message (FIN), raising requeues it (REQ with the policy's delay);
   FIN/REQ writes of one loop iteration go out in one socket write.

Without a handler, messages go to a buffer that ``async for`` reads (:meth:`next_message`).
It owns the queue, the workers, the outstanding count and ``tracked`` (outstanding outside
the queue: what stop() requeues). Callers: connections (``on_message``), messages (through
their :class:`~smartnsq.consumer.sub.Sub`), the policy (its
:class:`~smartnsq.consumer.policy.PolicyHost`) and the consumer's stop (its steps:
:mod:`smartnsq.consumer.draining`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from operator import itemgetter
from typing import Any

from smartnsq import trace as _trace
from smartnsq.conn import Connection
from smartnsq.consumer.draining import DrainSteps
from smartnsq.consumer.policy import DeliveryPolicy
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.sub import Sub
from smartnsq.consumer.trace import log_consumed
from smartnsq.consumer.unseen import unseen
from smartnsq.consumer.workers import HandlerWorkers
from smartnsq.message import Message
from smartnsq.protocol.messages import ATTEMPTS, ID, MessageRecord, RawMessage, record_of

__all__ = ["Dispatcher", "Handler"]

log = logging.getLogger("smartnsq.consumer")

#: ``async def handler(message) -> Any``: returning finishes, raising requeues
Handler = Callable[[Message], Awaitable[object]]

#: a record's attempts count
_attempts = itemgetter(ATTEMPTS)

_PENDING = 0  # Message._state values (smartnsq.message)
_FINISHED = 1
_REQUEUED = 2

def _call_user(cb: Callable[..., object], args: tuple[Any, ...], what: str,
               spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
    """Run a user callback that may be sync or async; errors are logged."""
    try:
        result = cb(*args)
    except Exception:
        log.exception("%s failed", what)
        return
    if inspect.isawaitable(result):
        async def run(aw: Awaitable[object]) -> None:
            try:
                await aw
            except Exception:
                log.exception("%s failed", what)
        spawn(run(result))


class Dispatcher(HandlerWorkers, DrainSteps):
    """Queue, workers and answers of one consumer (see the module docstring)."""

    def __init__(self, topic: str, channel: str, handler: Handler | None,
                 policy: DeliveryPolicy, driver: RdyDriver, trace: _trace.TraceToggle,
                 fatal: Callable[[BaseException], None]) -> None:
        self.topic = topic
        self.channel = channel
        self._handler = handler
        self._policy = policy
        self._driver = driver
        self._trace = trace
        self._fatal = fatal
        self.loop: asyncio.AbstractEventLoop | None = None
        self._screen = policy.admit if policy.screens else None
        self._finished = policy.finished if policy.screens else None
        self._max_attempts = policy.max_attempts
        self._tracing = False
        #: on_message has admission work beyond the start guard (see _admit)
        self._checking = self._screen is not None or bool(self._max_attempts)
        #: handler work in arrival order: messages, and records behind a marker, their
        #: subscription (see on_records); the owner of the last marker queued and taken
        self.queue: deque[Message | MessageRecord | Sub] = deque()
        self._tail_owner: Sub | None = None
        self.head_owner: Sub | None = None
        self.workers: set[asyncio.Task[None]] = set()
        self._idle: list[asyncio.Future[None]] = []
        self._pumping = 0
        self._waking = False
        #: outstanding messages not in the queue and not being handled inline: handlers
        #: that suspended, messages held after disable_auto_response, iterated messages
        self.tracked: set[Message] = set()
        self._buffer: deque[Message] = deque()
        self._iter_waiters: deque[asyncio.Future[None]] = deque()
        self.outstanding = 0
        self._drained: asyncio.Event | None = None
        self._background: set[asyncio.Task[Any]] = set()
        #: deliveries finished without the handler: from before the start position, or a
        #: repositioned channel's read-ahead again (ConsumerStats.dropped_before_start)
        self.dropped_before_start = 0
        #: stop() began: what arrives now waits in the buffer until :meth:`requeue_buffered`
        self.stopping = False
        #: stop() returned the buffer (after CLS): a late arrival goes straight back
        self.returning = False
        #: deliveries handed back to nsqd without the application seeing them
        self.returned_unseen = 0
        #: no more workers (stop() ended)
        self.closed = False
        policy.attach(self)

    # ------------------------------------------------------------------ receiving

    def on_records(self, sub: Sub, conn: Connection | None,
                   records: list[MessageRecord]) -> None:
        """The messages of one read (``Connection.on_records``). In the common case (a
        handler, no tracing, start guard or admission hook, nothing over the attempt cap)
        the records join the queue as they are, behind their subscription as a marker:
        a :class:`Message` is made by the worker that takes one (see the module
        docstring). Otherwise each goes through :meth:`_receive` as a message."""
        if not sub.dirty:
            self._mark(sub)  # first: it may switch tracing on, which needs the slow path
        cap = self._max_attempts
        if (self._handler is None or self._tracing or self._screen is not None
                or sub.guard is not None or (cap and max(map(_attempts, records)) > cap)):
            of_record = Message.of_record
            for rec in records:
                self._receive(sub, of_record(rec, sub))
            return
        n = len(records)
        sub.recv_pending += n
        self.outstanding += n
        sub.outstanding += n
        queue = self.queue
        if self._tail_owner is not sub:
            queue.append(sub)
            self._tail_owner = sub
        queue.extend(records)
        if not self._pumping and not self._waking:
            self._wake()

    def on_messages(self, sub: Sub, conn: Connection | None, raws: list[RawMessage]) -> None:
        """:meth:`on_records` for messages in object form."""
        self.on_records(sub, conn, list(map(record_of, raws)))

    def on_message(self, sub: Sub, conn: Connection | None, raw: RawMessage) -> None:
        """One message in object form: :meth:`_receive`."""
        self._receive(sub, Message(raw, sub))

    def _receive(self, sub: Sub, msg: Message) -> None:
        """One delivery: counted, traced, screened, then queued (or iterated)."""
        sub.recv_pending += 1
        if not sub.dirty:
            self._mark(sub)
        if (self._checking or sub.guard is not None) and not self._admit(sub, msg):
            return
        self.outstanding += 1
        sub.outstanding += 1
        if self._handler is not None:
            self.queue.append(msg)
            if not self._pumping and not self._waking:
                self._wake()
        else:
            self.deliver(msg)

    def _admit(self, sub: Sub, msg: Message) -> bool:
        """Trace, start guard, admission: False when the message went elsewhere."""
        if self._tracing:
            log_consumed(self.topic, self.channel, sub, msg)
        guard = sub.guard
        if guard is not None and not guard.admit(msg):
            self.drop(sub, msg)
            return False
        if self._screen is not None:
            if not self._screen(sub, msg):
                return False
        elif self._max_attempts and msg.attempts > self._max_attempts and \
                unseen.handled_attempts(self.topic, self.channel, msg._raw[ID],
                                        msg.attempts) > self._max_attempts:
            # only deliveries the application handled count (consumer.unseen)
            self._policy.give_up(sub, msg)
            return False
        return True

    def _mark(self, sub: Sub) -> None:
        if self._driver.mark(sub):
            # the trace switch is read once per loop iteration, not per message
            self._tracing = self._trace.is_on(self.topic)
            self._checking = self._tracing or self._screen is not None or bool(
                self._max_attempts)

    def deliver(self, msg: Message) -> None:
        """Hand an outstanding message to the handler or the iterator."""
        self.tracked.discard(msg)
        if self._handler is not None:
            self.queue.append(msg)
            if not self._pumping and not self._waking:
                self._wake()
        elif self.returning:
            self.return_unseen(msg)
        else:
            # also while stopping: RDY 0 went out first, so what still arrives is returned
            # once, after CLS (requeue_buffered), rather than bounced back and forth
            self.tracked.add(msg)
            self._buffer.append(msg)
            self._wake_iterator()

    def hold(self, sub: Sub, msg: Message, *, track: bool) -> None:
        self.outstanding += 1
        sub.outstanding += 1
        if track:
            self.tracked.add(msg)

    def track(self, msg: Message) -> None:
        self.tracked.add(msg)

    def drop(self, sub: Sub, msg: Message) -> None:
        """Finish a delivery from before the start position without the handler and without
        the policy's hook, so an ordered partition's position does not move to it."""
        log.debug("%s/%s partition %s: finished message at offset %s before the start "
                  "position quietly", self.topic, self.channel, sub.partition, msg.offset)
        self.dropped_before_start += 1
        self.outstanding += 1
        sub.outstanding += 1
        msg._state = _FINISHED
        self._fin(sub, msg)

    def answer_copy(self, sub: Sub, msg: Message, *, fin: bool) -> None:
        self.dropped_before_start += 1
        msg._state = _FINISHED if fin else _REQUEUED
        if fin:
            self._fin(sub, msg)
        else:
            conn = sub.conn
            if conn is not None:
                conn.req(msg.id, 0)
            self._requeued(sub, msg, False)

    # ------------------------------------------------------------------ background work

    def fatal(self, exc: BaseException) -> None:
        self._fatal(exc)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        assert self.loop is not None
        task = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def call_user(self, cb: Callable[..., object], *args: Any, what: str) -> None:
        _call_user(cb, args, what, self.spawn)

    # ------------------------------------------------------------------ answering

    def _fin(self, sub: Sub, msg: Message) -> bool:
        conn = sub.conn
        ok = conn is not None and conn.fin(msg._raw[ID])
        sub.outstanding -= 1
        sub.fin_pending += 1
        if not sub.dirty:
            self._mark(sub)
        self.outstanding -= 1
        if self.tracked:
            self.tracked.discard(msg)
        if self._drained is not None or sub.drained is not None:
            self._settled(sub)
        return ok

    def finish(self, sub: Sub, msg: Message) -> bool:
        ok = self._fin(sub, msg)
        if self._finished is not None:
            self._finished(sub, msg, ok)
        return ok

    def requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool) -> bool:
        return self._policy.requeue(sub, msg, delay, backoff)

    def req(self, sub: Sub, msg: Message, delay_ms: int, backoff: bool) -> bool:
        conn = sub.conn
        ok = conn is not None and conn.req(msg._raw[ID], delay_ms)
        self._requeued(sub, msg, backoff)
        return ok

    def _requeued(self, sub: Sub, msg: Message, backoff: bool) -> None:
        sub.requeued += 1
        sub.outstanding -= 1
        self.outstanding -= 1
        self.tracked.discard(msg)
        self._driver.requeued(sub, backoff)
        self._settled(sub)

    def return_unseen(self, msg: Message) -> None:
        """REQ 0 for a message the application never saw (see :mod:`.unseen`)."""
        self.returned_unseen += 1
        unseen.returned(self.topic, self.channel, msg._raw[ID])
        msg.requeue(0, backoff=False)

    def _discard(self, sub: Sub, msg_id: bytes) -> None:
        """A queued message whose connection is gone: the server redelivers it, unseen."""
        self.returned_unseen += 1
        unseen.returned(self.topic, self.channel, msg_id)
        sub.outstanding -= 1
        self.outstanding -= 1
        self._settled(sub)

    def _settled(self, sub: Sub) -> None:
        if self._drained is not None and not self.outstanding:
            self._drained.set()
        if sub.drained is not None and not sub.outstanding:
            sub.drained.set()

    # ------------------------------------------------------------------ iteration

    async def next_message(self) -> Message | None:
        """The next iterated message; None once stop() began and the buffer is empty."""
        while True:
            buf = self._buffer
            while buf:
                msg = buf.popleft()
                owner: Sub = msg._owner  # type: ignore[assignment]
                if owner.closed and msg._state == _PENDING:
                    self.tracked.discard(msg)
                    self._discard(owner, msg._raw[ID])
                    continue
                return msg
            if self.stopping or self.closed:
                return None
            assert self.loop is not None
            fut: asyncio.Future[None] = self.loop.create_future()
            waiters = self._iter_waiters
            waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                # woken and cancelled in the same turn (``asyncio.timeout`` around
                # ``anext``): the wake-up belongs to the next waiter, not to nobody
                if fut.done() and not fut.cancelled() and self._buffer:
                    self._wake_iterator()
                raise
            finally:
                if not fut.done():
                    fut.cancel()
                if fut in waiters:
                    waiters.remove(fut)

    def _wake_iterator(self) -> None:
        """Wake one waiting ``next_message`` (a cancelled waiter does not count)."""
        waiters = self._iter_waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def wake_iterators(self) -> None:
        while self._iter_waiters:
            fut = self._iter_waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.wake_iterators()
