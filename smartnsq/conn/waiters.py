"""The connection's response FIFO: one slot per command that gets a response (PUB and
friends, SUB, CLS), resolved in order by the receive path (PROTOCOL.md §2.10).

Invariant: a timed-out or cancelled waiter keeps its slot, since the server still answers
that command and the answer must not go to the next one. Deadlines share one loop timer for
the earliest of them. Callers: the connection's send path (:meth:`ResponseQueue.arm`,
appending to :attr:`ResponseQueue.slots`), its receive path (popping, :meth:`wake_idle`),
close (:meth:`wait_idle`) and failure (:meth:`fail_all`).

With an :attr:`~ResponseQueue.answer_timeout` (the producer's ``request_timeout``), a server
that leaves the oldest slot unanswered longer than that is given up: :attr:`on_stall` (the
connection's failure path) gets the error, whoever's timeout the slot had. Its age is known
from its own deadline and timeout, so only slots with a timeout are judged; the timer sweep
judges it, which comes in time when no slot's timeout exceeds the answer timeout (the
producer caps each attempt's timeout to it).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from smartnsq._checks import check_duration
from smartnsq.errors import CommandKind, NSQError, NSQTimeoutError

__all__ = ["ResponseQueue", "Waiter"]

#: One FIFO slot, for a command that gets exactly one response frame:
#: (future, deadline, kind, timeout, topic, partition, close_on_error). A plain tuple because
#: every publish makes one (a slotted class costs ~4x as much to build).
Waiter = tuple[asyncio.Future[bytes], float, CommandKind, float | None, str | None,
               int | None, bool]

#: minimum seconds between two sweeps for timed-out waiters
_SWEEP_GAP = 0.01
#: float slack when a slot's age is rebuilt from its deadline and timeout
_EPSILON = 1e-6


class ResponseQueue:
    """Waiters in command order, their deadlines, and "all answered" waiting.

    ``answer_timeout`` (seconds; the producer's ``request_timeout``; None: no limit): once
    the oldest slot sent with a timeout has waited that long, ``on_stall`` (the connection's
    failure path) gets an :class:`NSQTimeoutError` saying so (see the module docstring)."""

    def __init__(self, address: str, answer_timeout: float | None = None,
                 on_stall: Callable[[NSQError], None] | None = None) -> None:
        self._address = address
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the FIFO itself; the connection appends and pops directly on its hot paths
        self.slots: deque[Waiter] = deque()
        self._deadline_handle: asyncio.TimerHandle | None = None
        #: the earliest armed deadline (inf: no timer)
        self.deadline_at = math.inf
        #: set while close() waits for every slot to be answered
        self.idle_fut: asyncio.Future[None] | None = None
        #: seconds the oldest slot may go unanswered (inf: no limit)
        self.answer_timeout = math.inf if answer_timeout is None else check_duration(
            answer_timeout, "answer_timeout", positive=True)
        #: called once with the error when the oldest slot outlives :attr:`answer_timeout`
        self.on_stall = on_stall

    def arm(self, when: float) -> None:
        """Make sure the timer fires by ``when`` (loop time)."""
        # One timer for the earliest deadline; mostly deadlines only grow, so a publish with
        # a timeout rarely touches the timer heap.
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
        assert self.loop is not None
        self.deadline_at = when
        self._deadline_handle = self.loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self._deadline_handle = None
        self.deadline_at = math.inf
        assert self.loop is not None
        now = self.loop.time()
        nxt = math.inf
        if self.answer_timeout < math.inf and self.slots:
            nxt = self._judge_oldest(now)
            if nxt < 0:
                return
        for w in self.slots:
            d = w[1]
            if d <= now:
                fut = w[0]
                if not fut.done():
                    fut.set_exception(NSQTimeoutError(
                        f"nsqd {self._address} did not answer within {w[3]}s"))
            elif d < nxt:
                nxt = d
        if nxt < math.inf:
            # sweeps at most every _SWEEP_GAP: with many stalled waiters each sweep is O(n)
            self.arm(max(nxt, now + _SWEEP_GAP))

    def _judge_oldest(self, now: float) -> float:
        """When the oldest slot's answer timeout ends (loop time; inf: not judged), or -1
        after giving the connection up because it has ended."""
        _, deadline, _, timeout, _, _, _ = self.slots[0]
        if timeout is None:
            return math.inf
        sent = deadline - timeout
        if now - sent < self.answer_timeout - _EPSILON:
            return sent + self.answer_timeout
        stalled = self.on_stall
        if stalled is None:
            return math.inf
        self.on_stall = None
        stalled(NSQTimeoutError(
            f"nsqd {self._address} left a command unanswered for {now - sent:.1f}s "
            f"(answer timeout {self.answer_timeout}s): the connection is given up"))
        return -1.0

    def cancel_deadlines(self) -> None:
        if self._deadline_handle is not None:
            self._deadline_handle.cancel()
            self._deadline_handle = None
        self.deadline_at = math.inf

    def fail_all(self, exc: NSQError) -> None:
        """Fail every waiting slot with ``exc`` and empty the FIFO."""
        slots = self.slots
        while slots:
            fut = slots.popleft()[0]
            if not fut.done():
                fut.set_exception(exc)
        self.wake_idle()
        self.cancel_deadlines()

    async def wait_idle(self) -> None:
        """Return once every slot was answered (or failed)."""
        if not self.slots:
            return
        if self.idle_fut is None:
            assert self.loop is not None
            self.idle_fut = self.loop.create_future()
        await asyncio.shield(self.idle_fut)

    def wake_idle(self) -> None:
        fut = self.idle_fut
        if fut is not None:
            self.idle_fut = None
            if not fut.done():
                fut.set_result(None)
