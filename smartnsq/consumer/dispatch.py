"""The consumer's dispatch: from a decoded delivery to its answer.

Per-message path (kept flat on purpose; a consume+FIN loop spends most of its time here):

1. The connection decodes the message frames of a read into records (plain tuples) and
   hands them to :meth:`Dispatcher.on_records` synchronously from its receive path.
2. ``on_records`` counts them for RDY (reported once per loop turn, see
   :class:`~smartnsq.consumer.rdy_driver.RdyDriver`) and, in the common case, queues them
   as they are behind a marker, their subscription (:mod:`.work_queue`): the
   :class:`Message` is made by the worker that takes one, so nothing per message waits in
   the queue for the garbage collector to scan. With tracing, a start guard, the policy's
   admission (:mod:`smartnsq.consumer.policy`) or a message over the attempt cap, each
   becomes a :class:`Message` at once and goes through those checks (``_receive``).
3. A worker task (:mod:`.workers`) awaits the handler for each queued message: no task per
   message.
4. Returning finishes the message (FIN), raising requeues it (REQ with the policy's delay);
   FIN/REQ writes of one loop iteration go out in one socket write.

Without a handler, messages go to the iterators' buffer (:mod:`.iteration`).

The dispatcher owns the outstanding count and ``tracked`` (outstanding messages outside the
queue: what stop() requeues), and holds the parts that own the rest: the work queue, the
handler workers, the iterator buffer. Callers: subscriptions (``on_records``), messages
(through their :class:`~smartnsq.consumer.sub.Sub`), the policy (as its
:class:`~smartnsq.consumer.policy.PolicyHost`), the workers (as their
:class:`~smartnsq.consumer.workers.WorkerHost`) and the consumer's stop, whose steps are
the last section here.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from smartnsq import trace as _trace
from smartnsq.consumer.handed import HandedOut
from smartnsq.consumer.iteration import IteratorBuffer
from smartnsq.consumer.meters import APPLICATION, CLOSED, STOP, ConsumerMeters, RequeueReason
from smartnsq.consumer.policy import DeliveryPolicy
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.sub import Sub
from smartnsq.consumer.trace import log_consumed
from smartnsq.consumer.unseen import unseen
from smartnsq.consumer.work_queue import WorkQueue
from smartnsq.consumer.workers import HandlerWorkers
from smartnsq.message import FINISHED, PENDING, REQUEUED, Message
from smartnsq.protocol.messages import ATTEMPTS, ID, MessageRecord

if TYPE_CHECKING:

    from smartnsq.consumer.process_spans import ProcessSpans

__all__ = ["Dispatcher", "Handler"]

log = logging.getLogger("smartnsq.consumer")

#: ``async def handler(message) -> Any``: returning finishes, raising requeues
Handler = Callable[[Message], Awaitable[object]]

#: a record's attempts count
_attempts = itemgetter(ATTEMPTS)
#: seconds into the drain after which messages ``async for`` handed out and nothing answered
#: are worth a warning (a loop left with ``break`` before ``finish()``)
_HINT_AFTER = 1.0


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


class Dispatcher:
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
        self._max_attempts = policy.max_attempts
        self._tracing = False
        #: on_records has admission work beyond the start guard (see _admit)
        self._checking = self._screen is not None or bool(self._max_attempts)
        self.queue = WorkQueue()
        self.iterator = IteratorBuffer(self._discard_buffered)
        #: handler workers (with a handler)
        self.workers: HandlerWorkers | None = None
        if handler is not None:
            self.workers = HandlerWorkers(self, handler, self.queue, driver,
                                          hooked_finish=policy.screens)
        #: outstanding messages not in the queue and not being handled inline: handlers
        #: that suspended, messages held after disable_auto_response, iterated messages
        self.tracked: set[Message] = set()
        self.outstanding = 0
        self._drained: asyncio.Event | None = None
        #: stop() waits for the outstanding count to reach 0 (see WorkerHost)
        self.drain_watch = False
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
        #: stop() ended
        self.closed = False
        #: the consumer's metrics, when it started with them on (observe())
        self.meters: ConsumerMeters | None = None
        #: iterated messages handed out and not answered yet (while metrics or spans are on)
        self._handed = HandedOut()
        policy.attach(self)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        if self.workers is not None:
            self.workers.loop = loop

    def observe(self, meters: ConsumerMeters | None, spans: ProcessSpans | None) -> None:
        """Caller: the consumer's start, with what is on. The handler workers time each
        message and run the handler inside its span; iterated messages are timed and
        spanned from hand-over to answer."""
        self.meters = meters
        self._handed.observe(meters, spans)
        workers = self.workers
        if workers is None:
            return
        if spans is not None:
            workers.handler = spans.wrap(workers.handler)
        if meters is not None:
            workers.timer = (meters.process.observe_many, meters.latency.observe_many)

    # ------------------------------------------------------------------ receiving

    def on_records(self, sub: Sub, records: list[MessageRecord]) -> None:
        """The messages of one read. In the common case (a handler, no tracing, start
        guard or admission hook, nothing over the attempt cap) the records join the queue
        as they are (see the module docstring); otherwise each goes through
        :meth:`_receive` as a message."""
        if not sub.dirty:
            self.mark(sub)  # first: it may switch tracing on, which needs the slow path
        cap = self._max_attempts
        workers = self.workers
        if (workers is None or self._tracing or self._screen is not None
                or sub.guard is not None or (cap and max(map(_attempts, records)) > cap)):
            for rec in records:
                self._receive(sub, Message(rec, sub))
            return
        n = len(records)
        sub.recv_pending += n
        self.outstanding += n
        sub.outstanding += n
        self.queue.add_records(sub, records)
        if not workers.pumping and not workers.waking:
            workers.wake()

    def _receive(self, sub: Sub, msg: Message) -> None:
        """One delivery: counted, traced, screened, then queued (or iterated)."""
        sub.recv_pending += 1
        if not sub.dirty:
            self.mark(sub)
        if (self._checking or sub.guard is not None) and not self._admit(sub, msg):
            return
        self.outstanding += 1
        sub.outstanding += 1
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

    def mark(self, sub: Sub) -> None:
        """``sub`` has counts to report this loop turn (see RdyDriver.mark)."""
        if self._driver.mark(sub):
            # the trace switch is read once per loop iteration, not per message
            self._tracing = self._trace.is_on(self.topic)
            self._checking = self._tracing or self._screen is not None or bool(
                self._max_attempts)

    # ------------------------------------------------------------------ PolicyHost

    def deliver(self, msg: Message) -> None:
        """Hand an outstanding message to the handler or the iterator."""
        self.tracked.discard(msg)
        workers = self.workers
        if workers is not None:
            self.queue.add(msg)
            if not workers.pumping and not workers.waking:
                workers.wake()
        elif self.returning:
            self.return_unseen(msg)
        else:
            # also while stopping: RDY 0 went out first, so what still arrives is returned
            # once, after CLS (requeue_buffered), rather than bounced back and forth
            self.tracked.add(msg)
            self.iterator.put(msg)

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
        if sub.meters is not None:
            sub.meters.dropped.inc()
        self.outstanding += 1
        sub.outstanding += 1
        msg._state = FINISHED
        self._fin(sub, msg)

    def answer_copy(self, sub: Sub, msg: Message, *, fin: bool,
                    reason: RequeueReason) -> None:
        self.dropped_before_start += 1
        if sub.meters is not None:
            sub.meters.dropped.inc()
        msg._state = FINISHED if fin else REQUEUED
        if fin:
            self._fin(sub, msg)
        else:
            subscriber = sub.subscriber
            if subscriber is not None:
                subscriber.req(msg.id, 0)
            self._requeued(sub, msg, False, reason)

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
        subscriber = sub.subscriber
        ok = subscriber is not None and subscriber.fin_delivered(msg._raw[ID])
        sub.outstanding -= 1
        sub.fin_pending += 1
        if not sub.dirty:
            self.mark(sub)
        self.outstanding -= 1
        if self.tracked:
            self.tracked.discard(msg)
        if self.drain_watch or sub.drained is not None:
            self.settled(sub)
        if self._handed:
            self._handed.answered(msg)
        return ok

    def finish(self, sub: Sub, msg: Message) -> bool:
        ok = self._fin(sub, msg)
        self._policy.finished(sub, msg, ok)
        return ok

    def fin_run(self, sub: Sub, ids: list[bytes]) -> None:
        """The workers' FINs of ``sub``'s messages whose handler returned, in one step."""
        n = len(ids)
        subscriber = sub.subscriber
        if subscriber is not None:
            subscriber.fin_run(ids)
        sub.outstanding -= n
        sub.fin_pending += n
        if not sub.dirty:
            self.mark(sub)
        self.outstanding -= n
        if self.drain_watch or sub.drained is not None:
            self.settled(sub)

    def settle(self) -> None:
        """The workers' FIN runs handed over now: before an answer of the application's
        (the wire keeps the order of the answers) and before the counts are read."""
        if self.workers is not None:
            self.workers.settle()

    def failed(self, msg: Message, exc: BaseException) -> None:
        self._policy.failed(msg, exc)

    def requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool) -> bool:
        """The application's ``message.requeue()``."""
        return self._policy.requeue(sub, msg, delay, backoff, APPLICATION)

    def requeue_as(self, msg: Message, reason: RequeueReason, delay: float | None = None,
                   backoff: bool = True) -> bool:
        """``message.requeue()`` on the library's behalf, for ``reason``."""
        if msg._state != PENDING:
            return False
        msg._state = REQUEUED
        return self._policy.requeue(msg._owner, msg, delay, backoff,  # type: ignore[arg-type]
                                    reason)

    def req(self, sub: Sub, msg: Message, delay_ms: int, backoff: bool,
            reason: RequeueReason) -> bool:
        subscriber = sub.subscriber
        ok = subscriber is not None and subscriber.req(msg._raw[ID], delay_ms)
        self._requeued(sub, msg, backoff, reason)
        return ok

    def _requeued(self, sub: Sub, msg: Message, backoff: bool, reason: RequeueReason) -> None:
        sub.requeued += 1
        if sub.meters is not None:
            sub.meters.requeued[reason].inc()
        sub.outstanding -= 1
        self.outstanding -= 1
        self.tracked.discard(msg)
        self._driver.requeued(sub, backoff)
        self.settled(sub)
        if self._handed:
            self._handed.answered(msg, given_back=reason is STOP)

    def return_unseen(self, msg: Message) -> None:
        """REQ 0 for a message the application never saw (see :mod:`.unseen`)."""
        self.returned_unseen += 1
        unseen.returned(self.topic, self.channel, msg._raw[ID])
        self.requeue_as(msg, STOP, 0, backoff=False)

    def discard(self, sub: Sub, msg_id: bytes) -> None:
        """A queued message whose connection is gone: the server redelivers it, unseen."""
        self.returned_unseen += 1
        unseen.returned(self.topic, self.channel, msg_id)
        if sub.meters is not None:
            sub.meters.requeued[CLOSED].inc()
        sub.outstanding -= 1
        self.outstanding -= 1
        self.settled(sub)

    def _discard_buffered(self, msg: Message) -> None:
        self.tracked.discard(msg)
        self.discard(msg._owner, msg._raw[ID])  # type: ignore[arg-type]

    def settled(self, sub: Sub) -> None:
        if self._drained is not None and not self.outstanding:
            self._drained.set()
        if sub.drained is not None and not sub.outstanding:
            sub.drained.set()

    # ------------------------------------------------------------------ iteration

    async def next_message(self) -> Message | None:
        """The next iterated message; None once stop() began and the buffer is empty."""
        assert self.loop is not None
        msg = await self.iterator.next(self.loop, lambda: self.stopping or self.closed)
        if msg is not None and self._handed.on:
            self._handed.hand_over(msg)
        return msg

    # ------------------------------------------------------------------ stop steps

    def requeue_buffered(self) -> None:
        """Caller: stop(), after CLS. Iterated messages nobody took yet go back at once, and
        so does anything arriving later (RDY 0 went out first: nothing comes back to us)."""
        self.returning = True
        for msg in self.iterator.take_all():
            self.return_unseen(msg)
        self._policy.before_drain()

    async def drain(self, within: float) -> None:
        """Caller: stop(). Wait up to ``within`` seconds for outstanding messages to be
        answered; requeue the rest."""
        if self.outstanding and within > 0:
            self._drained = asyncio.Event()
            self.drain_watch = True
            now = asyncio.get_running_loop().time()
            end = now + within
            try:
                if self.workers is None:
                    await self._hint_unanswered(min(end, now + _HINT_AFTER), within)
                async with asyncio.timeout_at(end):
                    await self._drained.wait()
            except TimeoutError:
                pass
            finally:
                self._drained = None
                self.drain_watch = False
        if self.outstanding:
            log.warning("consumer of %s/%s: %d message(s) still unanswered after the drain "
                        "timeout; requeueing them", self.topic, self.channel,
                        self.outstanding)
            self.requeue_outstanding()

    async def _hint_unanswered(self, until: float, within: float) -> None:
        """Iteration: what is outstanding at stop was handed out by ``async for`` (the
        buffer went back already). Unanswered a moment into the drain, it is most likely
        a loop left with ``break`` before ``finish()``: say why stop() is waiting."""
        assert self._drained is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(until):
                await self._drained.wait()
        if self.outstanding:
            log.warning("consumer of %s/%s: stop() waits up to %.1fs (drain_timeout) for %d "
                        "message(s) that async for handed out and nothing answered yet; "
                        "call finish() or requeue() on each, before leaving the loop",
                        self.topic, self.channel, within, self.outstanding)

    def requeue_outstanding(self) -> None:
        """Queued messages (never seen) and tracked ones go back to nsqd."""
        for owner, msg in self.queue.take_all():
            if owner.closed:
                self.discard(owner, msg._raw[ID])
            else:
                self.return_unseen(msg)
        for msg in list(self.tracked):
            self.requeue_as(msg, STOP, 0, backoff=False)

    async def stop_workers(self, deadline: float) -> None:
        """Caller: stop(), last. Cancel the workers and wait for them until ``deadline``
        (loop time): a handler that swallows CancelledError must not hold stop() forever,
        so what still runs then is left behind (its message was requeued)."""
        self.closed = True
        self.iterator.wake_all()
        if self.workers is None:
            return
        assert self.loop is not None
        stuck = await self.workers.stop(deadline - self.loop.time())
        if stuck:
            log.warning("consumer of %s/%s: %d handler(s) ignored cancellation; stopped "
                        "without them", self.topic, self.channel, len(stuck))
