"""The consumer's handler workers, held by the dispatcher.

A worker task awaits the handler for each queued message: no task per message. A callback
scheduled once per batch notices when a handler suspends (inline handlers never yield to the
loop); the worker then stays with that handler and other workers take over the queue, so
slow handlers run concurrently (at most the effective ``max_in_flight`` of them, which is all
RDY can let in anyway, or the messages outstanding when more came in before it was lowered).
Returning finishes the message (FIN), raising hands it to the policy.

With metrics on (``timer``), each message's processing time (hand-over to answer) and
end-to-end latency (hand-over time minus the message's timestamp) are measured with one clock
read per message: a worker's messages follow each other, so one answer's time is the next
message's hand-over (re-read after the worker waited or yielded); the wall clock is derived
from it with an offset taken per batch. The values are gathered in two lists and handed to
the histograms together (``observe_many``) when the batch ends, yields or reaches
``_INLINE_BATCH``: that costs a list append per message instead of a histogram update.

Without a policy hook on FIN, a worker gathers the ids of the messages whose handler returned
(a *FIN run*, one subscription's) and hands the run to the dispatcher in one step
(``WorkerHost.fin_run``: the FINs, the counts, the drain check) when the batch ends, the
subscription changes, a handler raises or suspends (the stall check hands it over at the next
loop turn, so the FINs leave no later than one FIN per message would), before the worker yields
every ``_INLINE_BATCH`` messages, and when the application answers a message itself or reads
the counts (:meth:`HandlerWorkers.settle`): the wire sees the same commands in the same order,
for a list append per message instead of four counter updates and a call.

This object owns the worker tasks, the idle workers' futures, their FIN runs and the
pumping/waking counts. It reaches the dispatcher only through :class:`WorkerHost`; what the
per-message loop needs is bound once per worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.sub import Sub
from smartnsq.consumer.work_queue import WorkQueue
from smartnsq.message import FINISHED, PENDING, Message
from smartnsq.protocol.messages import ID, TIMESTAMP

__all__ = ["HandlerWorkers", "WorkerHost"]

#: a histogram's ``observe_many``
Observe = Callable[[list[float]], None]

#: handler messages processed inline before the worker lets the loop run other callbacks
_INLINE_BATCH = 512
#: most workers one stalled handler wakes at once
_WAKE_BURST = 64


class WorkerHost(Protocol):
    """What the workers need from the dispatcher."""

    #: outstanding messages (the inline FIN lowers it)
    outstanding: int
    #: outstanding messages outside the queue that stop() must find
    tracked: set[Message]
    #: stop() waits for the outstanding count to reach 0 (a plain attribute: read per FIN)
    drain_watch: bool

    def finish(self, sub: Sub, msg: Message) -> bool:
        """FIN with the policy's hook."""

    def fin_run(self, sub: Sub, ids: list[bytes]) -> None:
        """FIN ``ids``, messages of ``sub`` whose handler returned (no policy hook)."""

    def failed(self, msg: Message, exc: BaseException) -> None:
        """The handler raised ``exc`` for ``msg``."""

    def settled(self, sub: Sub) -> None:
        """Outstanding counts went down: wake whoever waits for 0."""

    def discard(self, sub: Sub, msg_id: bytes) -> None:
        """A queued message whose subscription closed: nsqd redelivers it."""


class _Stall:
    """A worker's batch, as its stall check sees it, and its FIN run."""

    __slots__ = ("batch", "fin_sub", "fins", "msg", "stalled")

    def __init__(self) -> None:
        self.batch = 0
        self.msg: Message | None = None
        self.stalled = False
        #: ids of ``fin_sub``'s messages whose handler returned, not handed over yet
        self.fins: list[bytes] = []
        self.fin_sub: Sub | None = None


class HandlerWorkers:
    """See the module docstring."""

    def __init__(self, host: WorkerHost, handler: Callable[[Message], Awaitable[object]],
                 queue: WorkQueue, driver: RdyDriver, *, hooked_finish: bool) -> None:
        self._host = host
        #: the user's handler (inside its process span when tracing is on)
        self.handler = handler
        #: (processing duration, latency) observers when metrics are on
        self.timer: tuple[Observe, Observe] | None = None
        self._queue = queue
        self._driver = driver
        #: FIN goes through host.finish (a policy hook on FIN), else it is inlined
        self._hooked_finish = hooked_finish
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._idle: list[asyncio.Future[None]] = []
        #: every running worker's batch state (its FIN run): see settle()
        self._runs: set[_Stall] = set()
        #: workers pumping the queue right now, and a wake-up not answered yet: a new
        #: arrival wakes a worker only when neither is true
        self.pumping = 0
        self.waking = False
        #: no more workers (stop() ended)
        self.closed = False

    def wake(self, count: int = 1) -> None:
        """Get ``count`` more workers going (idle ones first), within the worker cap."""
        while count > 0 and self._idle:
            fut = self._idle.pop()
            if not fut.done():
                self.waking = True
                fut.set_result(None)
                count -= 1
        if count <= 0 or self.closed:
            return
        # the worker cap: the effective max_in_flight (no more can be in flight anyway), or
        # the messages outstanding when more were let in before it was lowered (a pause at
        # 0, stop()), up to the highest it was: those are handled as concurrently as they
        # were admitted
        driver = self._driver
        cap = max(1, driver.budget, min(self._host.outstanding, driver.most))
        room = cap - len(self.tasks)
        assert self.loop is not None
        for _ in range(min(count, room)):
            self.waking = True
            st = _Stall()
            self._runs.add(st)
            task = self.loop.create_task(self._worker(st))
            self.tasks.add(task)
            task.add_done_callback(self._ended(st))

    def wake_if_idle(self) -> None:
        """Caller: the consumer, after raising max_in_flight."""
        if self._queue and not self.pumping:
            self.wake()

    async def stop(self, within: float) -> list[asyncio.Task[None]]:
        """Cancel the workers and wait for them up to ``within`` seconds; return the ones
        still running then (a handler that swallows cancellation)."""
        self.closed = True
        workers = list(self.tasks)
        for w in workers:
            w.cancel()
        for fut in self._idle:
            if not fut.done():
                fut.cancel()
        self._idle.clear()
        if not workers:
            return []
        _, stuck = await asyncio.wait(workers, timeout=max(0.0, within))
        return list(stuck)

    def _ended(self, st: _Stall) -> Callable[[asyncio.Task[None]], None]:
        def ended(task: asyncio.Task[None]) -> None:
            self.tasks.discard(task)
            self._runs.discard(st)
        return ended

    def settle(self) -> None:
        """Hand every worker's FIN run over now (the application answers a message itself,
        or reads the counts)."""
        for st in self._runs:
            if st.fins:
                self._fin_run(st)

    def _fin_run(self, st: _Stall) -> None:
        sub = st.fin_sub
        assert sub is not None
        self._host.fin_run(sub, st.fins)
        st.fins.clear()

    async def _worker(self, st: _Stall) -> None:
        queue = self._queue
        items = queue.items
        popleft = items.popleft
        handler = self.handler
        host = self._host
        # metrics on: the handlers are timed
        timed = self.timer is not None
        inline_slots = range(_INLINE_BATCH)
        # this batch's processing times and latencies, until handed over
        processed: list[float] = []
        latencies: list[float] = []
        add_processed, add_latency = processed.append, latencies.append
        clock = time.perf_counter
        # the wall clock as clock() + wall (nsqd's timestamps are wall-clock nanoseconds)
        wall = t0 = t1 = 0.0
        # with a policy hook on FIN, host.finish runs it; without, the FIN joins the run
        finish = host.finish if self._hooked_finish else None
        failed = host.failed
        tracked = host.tracked
        fins = st.fins
        add_fin = fins.append
        fin_sub = st.fin_sub
        sub: Sub
        msg: Message
        assert self.loop is not None
        loop = self.loop
        me = asyncio.current_task()
        assert me is not None
        while True:
            # whoever woke this worker is answered: the next arrival may wake another
            self.waking = False
            if not items:
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
            self.pumping += 1
            st.batch += 1
            st.stalled = False
            if timed:
                t0 = clock()
                wall = time.time() - t0
            # runs at the next loop turn: if this batch is still going then, a handler
            # suspended (inline handlers never yield to the loop)
            loop.call_soon(self._stall_check, st, st.batch)
            try:
                while True:
                    # at most _INLINE_BATCH messages before the loop gets a turn
                    for _ in inline_slots:
                        try:
                            item = popleft()
                        except IndexError:  # once per batch: cheaper than a test per message
                            break
                        if type(item) is tuple:
                            # a record: its message is made here, and lives only until it
                            # is answered
                            sub = queue.head_owner  # type: ignore[assignment]
                            if sub.closed:
                                host.discard(sub, item[ID])
                                continue
                            msg = Message(item, sub)
                        elif type(item) is Sub:
                            queue.head_owner = item
                            continue
                        else:
                            msg = item  # type: ignore[assignment]
                            sub = msg._owner  # type: ignore[assignment]
                            if sub.closed and msg._state == PENDING:
                                host.discard(sub, msg._raw[ID])
                                continue
                        st.msg = msg
                        if timed:
                            add_latency(t0 + wall - msg._raw[TIMESTAMP] * 1e-9)
                        try:
                            await handler(msg)
                        except asyncio.CancelledError as exc:
                            if me.cancelling():
                                raise
                            if fins:
                                self._fin_run(st)
                            failed(msg, exc)
                        except Exception as exc:
                            if fins:
                                self._fin_run(st)  # the FINs before this message's REQ
                            failed(msg, exc)
                        else:
                            if msg._state == PENDING:
                                if msg._auto:
                                    # Message.finish() without its indirections
                                    msg._state = FINISHED
                                    if sub is fin_sub:
                                        add_fin(msg._raw[ID])
                                    elif finish is not None:
                                        finish(sub, msg)
                                    else:  # another subscription's run begins
                                        if fins:
                                            self._fin_run(st)
                                        st.fin_sub = fin_sub = sub
                                        add_fin(msg._raw[ID])
                                    if tracked:
                                        tracked.discard(msg)
                                else:
                                    tracked.add(msg)
                        if timed:
                            t1 = clock()
                            add_processed(t1 - t0)
                            t0 = t1
                        if st.stalled:
                            # back from a suspension: pumping again, watched again; a slow
                            # handler's timings are not held back until the batch ends
                            st.stalled = False
                            if timed:
                                self._hand_over(processed, latencies)
                            if msg._state != PENDING:
                                tracked.discard(msg)
                            self.pumping += 1
                            st.batch += 1
                            loop.call_soon(self._stall_check, st, st.batch)
                    else:
                        # let I/O in; not a handler suspension, so the check is re-armed
                        if timed:
                            self._hand_over(processed, latencies)
                        if fins:
                            self._fin_run(st)
                        st.batch += 1
                        await asyncio.sleep(0)
                        st.batch += 1
                        loop.call_soon(self._stall_check, st, st.batch)
                        if timed:
                            t0 = clock()
                        continue
                    break  # the queue is empty
            finally:
                st.msg = None
                st.batch += 1
                if not st.stalled:
                    self.pumping -= 1
                if fins:
                    self._fin_run(st)
                if processed or latencies:
                    self._hand_over(processed, latencies)

    def _hand_over(self, processed: list[float], latencies: list[float]) -> None:
        """Give a batch's gathered timings to the histograms; the lists are reused."""
        assert self.timer is not None
        observe_process, observe_latency = self.timer
        if processed:
            observe_process(processed)
            processed.clear()
        if latencies:
            observe_latency(latencies)
            latencies.clear()

    def _stall_check(self, st: _Stall, batch: int) -> None:
        """A worker's handler suspended: let other workers take the queue meanwhile."""
        if st.batch != batch or st.stalled:
            return
        st.stalled = True
        self.pumping -= 1
        if st.fins:
            # the FINs of the handlers that returned before this one suspended
            self._fin_run(st)
        msg = st.msg
        if msg is not None and msg._state == PENDING:
            # outstanding outside the queue: stop() must be able to find it
            self._host.tracked.add(msg)
        if self._queue and not self.waking:
            # handlers that suspend probably all do: start several workers at once rather
            # than one per loop turn (each of them does the same when it stalls)
            self.wake(min(len(self._queue), _WAKE_BURST))
