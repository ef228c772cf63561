"""The consumer's dispatch: from a decoded delivery to its answer.

Per-message path (kept flat on purpose; a consume+FIN loop spends most of its time here):

1. ``Connection`` decodes the message frames of a read and hands them to
   :meth:`Dispatcher.on_messages` synchronously from its receive path.
2. ``on_message`` wraps each in a :class:`Message`, counts it for RDY (reported once per
   loop turn, see :class:`~smartnsq.consumer.rdy_driver.RdyDriver`), applies the start
   guard and the policy's admission (:mod:`smartnsq.consumer.policy`) and queues it
   (``on_messages`` does the same for a whole read in one loop when only the attempt cap
   is to check).
3. A worker task awaits the handler for each queued message: no task per message. A
   callback scheduled once per batch notices when a handler suspends (inline handlers never
   yield to the loop); the worker then stays with that handler and other workers take over
   the queue, so slow handlers run concurrently (at most ``max_in_flight`` of them, which
   is all RDY can let in anyway).
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
from typing import Any

from smartnsq import trace as _trace
from smartnsq.conn import Connection
from smartnsq.consumer.draining import DrainSteps
from smartnsq.consumer.policy import DeliveryPolicy
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.sub import Sub
from smartnsq.consumer.trace import log_consumed
from smartnsq.message import Message
from smartnsq.protocol.messages import RawMessage

__all__ = ["Dispatcher", "Handler"]

log = logging.getLogger("smartnsq.consumer")

#: ``async def handler(message) -> Any``: returning finishes, raising requeues
Handler = Callable[[Message], Awaitable[object]]

_PENDING = 0  # Message._state values (smartnsq.message)
_FINISHED = 1
_REQUEUED = 2

#: handler messages processed inline before the worker lets the loop run other callbacks
_INLINE_BATCH = 512
#: most workers one stalled handler wakes at once
_WAKE_BURST = 64


class _Stall:
    """A worker's batch, as its stall check sees it."""

    __slots__ = ("batch", "msg", "stalled")

    def __init__(self) -> None:
        self.batch = 0
        self.msg: Message | None = None
        self.stalled = False


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


class Dispatcher(DrainSteps):
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
        #: the worker cap (the consumer's max_in_flight)
        self.max_workers = 1
        self._screen = policy.admit if policy.screens else None
        self._finished = policy.finished if policy.screens else None
        self._max_attempts = policy.max_attempts
        self._tracing = False
        #: on_message has admission work beyond the start guard (see _admit)
        self._checking = self._screen is not None or bool(self._max_attempts)
        self.queue: deque[Message] = deque()
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
        #: no more handing out to the iterator (stop() began)
        self.stopping = False
        #: no more workers (stop() ended)
        self.closed = False
        policy.attach(self)

    # ------------------------------------------------------------------ receiving

    def on_message(self, sub: Sub, conn: Connection, raw: RawMessage) -> None:
        sub.recv_pending += 1
        if not sub.dirty:
            self._mark(sub)
        msg = Message(raw, sub)
        # one test on the common path: no tracing, start guard, admission hook or attempt cap
        if (self._checking or sub.guard is not None) and not self._admit(sub, msg):
            return
        self.outstanding += 1
        sub.outstanding += 1
        # deliver() inlined: this runs for every message
        if self._handler is not None:
            self.queue.append(msg)
            if not self._pumping and not self._waking:
                self._wake()
        else:
            self.deliver(msg)

    def on_messages(self, sub: Sub, conn: Connection, raws: list[RawMessage]) -> None:
        """The messages of one read (``Connection.on_messages``): :meth:`on_message` for
        each, with the common case (a handler, at most the attempt cap to check) in one
        loop."""
        if not sub.dirty:
            self._mark(sub)  # first: it may switch tracing on, which needs the slow path
        if (self._handler is None or self._tracing or self._screen is not None
                or sub.guard is not None):
            for raw in raws:
                self.on_message(sub, conn, raw)
            return
        n = len(raws)
        sub.recv_pending += n
        self.outstanding += n
        sub.outstanding += n
        append = self.queue.append
        cap = self._max_attempts
        for raw in raws:
            msg = Message(raw, sub)
            if cap and raw.attempts > cap:
                # not outstanding through the queue after all: give_up() holds it
                self.outstanding -= 1
                sub.outstanding -= 1
                self._policy.give_up(sub, msg)
            else:
                append(msg)
        if not self._pumping and not self._waking:
            self._wake()

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
        elif self._max_attempts and msg._raw.attempts > self._max_attempts:
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
        elif self.stopping:
            msg.requeue(0, backoff=False)
        else:
            self.tracked.add(msg)
            self._buffer.append(msg)
            if self._iter_waiters:
                fut = self._iter_waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

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
                conn.req(msg._raw.id, 0)
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
        ok = conn is not None and conn.fin(msg._raw.id)
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
        ok = conn is not None and conn.req(msg._raw.id, delay_ms)
        self._requeued(sub, msg, backoff)
        return ok

    def _requeued(self, sub: Sub, msg: Message, backoff: bool) -> None:
        sub.requeued += 1
        sub.outstanding -= 1
        self.outstanding -= 1
        self.tracked.discard(msg)
        self._driver.requeued(sub, backoff)
        self._settled(sub)

    def _discard(self, sub: Sub) -> None:
        """A queued message whose connection is gone: the server redelivers it."""
        sub.outstanding -= 1
        self.outstanding -= 1
        self._settled(sub)

    def _settled(self, sub: Sub) -> None:
        if self._drained is not None and not self.outstanding:
            self._drained.set()
        if sub.drained is not None and not sub.outstanding:
            sub.drained.set()

    # ------------------------------------------------------------------ handler workers

    def _wake(self, count: int = 1) -> None:
        """Get ``count`` more workers going (idle ones first), within the worker cap."""
        while count > 0 and self._idle:
            fut = self._idle.pop()
            if not fut.done():
                self._waking = True
                fut.set_result(None)
                count -= 1
        if count <= 0 or self.closed:
            return
        room = max(1, self.max_workers) - len(self.workers)
        assert self.loop is not None
        for _ in range(min(count, room)):
            self._waking = True
            task = self.loop.create_task(self._worker())
            self.workers.add(task)
            task.add_done_callback(self.workers.discard)

    def wake_if_idle(self) -> None:
        """Caller: the consumer, after raising max_in_flight."""
        if self.queue and not self._pumping:
            self._wake()

    async def _worker(self) -> None:
        queue = self.queue
        popleft = queue.popleft
        handler = self._handler
        # with a policy hook on FIN, finish() runs it; without, _fin() is inlined below
        finish = None if self._finished is None else self.finish
        failed = self._policy.failed
        tracked = self.tracked
        assert handler is not None and self.loop is not None
        loop = self.loop
        me = asyncio.current_task()
        assert me is not None
        st = _Stall()
        while True:
            # whoever woke this worker is answered: the next arrival may wake another
            self._waking = False
            if not queue:
                if self.closed:
                    return
                fut: asyncio.Future[None] = loop.create_future()
                self._idle.append(fut)
                try:
                    await fut
                finally:
                    if fut in self._idle:
                        self._idle.remove(fut)
                continue
            self._pumping += 1
            st.batch += 1
            st.stalled = False
            # runs at the next loop turn: if this batch is still going then, a handler
            # suspended (inline handlers never yield to the loop)
            loop.call_soon(self._stall_check, st, st.batch)
            inline = 0
            try:
                while queue:
                    msg = popleft()
                    sub: Sub = msg._owner  # type: ignore[assignment]
                    if sub.closed and msg._state == _PENDING:
                        self._discard(sub)
                        continue
                    st.msg = msg
                    try:
                        await handler(msg)
                    except asyncio.CancelledError as exc:
                        if me.cancelling():
                            raise
                        failed(msg, exc)
                    except Exception as exc:
                        failed(msg, exc)
                    else:
                        if msg._state == _PENDING:
                            if msg._auto:
                                # Message.finish() without its indirections
                                msg._state = _FINISHED
                                if finish is not None:
                                    finish(sub, msg)
                                else:
                                    # _fin() inlined: one call less per message
                                    conn = sub.conn
                                    if conn is not None:
                                        conn.fin(msg._raw.id)
                                    sub.outstanding -= 1
                                    sub.fin_pending += 1
                                    if not sub.dirty:
                                        self._mark(sub)
                                    self.outstanding -= 1
                                    if tracked:
                                        tracked.discard(msg)
                                    if self._drained is not None or sub.drained is not None:
                                        self._settled(sub)
                            else:
                                tracked.add(msg)
                    if st.stalled:
                        # back from a suspension: pumping again, watched again
                        st.stalled = False
                        if msg._state != _PENDING:
                            tracked.discard(msg)
                        self._pumping += 1
                        st.batch += 1
                        loop.call_soon(self._stall_check, st, st.batch)
                    inline += 1
                    if inline >= _INLINE_BATCH:
                        # let I/O in; not a handler suspension, so the check is re-armed
                        inline = 0
                        st.batch += 1
                        await asyncio.sleep(0)
                        st.batch += 1
                        loop.call_soon(self._stall_check, st, st.batch)
            finally:
                st.msg = None
                st.batch += 1
                if not st.stalled:
                    self._pumping -= 1

    def _stall_check(self, st: _Stall, batch: int) -> None:
        """A worker's handler suspended: let other workers take the queue meanwhile."""
        if st.batch != batch or st.stalled:
            return
        st.stalled = True
        self._pumping -= 1
        msg = st.msg
        if msg is not None and msg._state == _PENDING:
            # outstanding outside the queue: stop() must be able to find it
            self.tracked.add(msg)
        if self.queue and not self._waking:
            # handlers that suspend probably all do: start several workers at once rather
            # than one per loop turn (each of them does the same when it stalls)
            self._wake(min(len(self.queue), _WAKE_BURST))

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
                    self._discard(owner)
                    continue
                return msg
            if self.stopping or self.closed:
                return None
            assert self.loop is not None
            fut: asyncio.Future[None] = self.loop.create_future()
            self._iter_waiters.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    fut.cancel()

    def wake_iterators(self) -> None:
        while self._iter_waiters:
            fut = self._iter_waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.wake_iterators()
