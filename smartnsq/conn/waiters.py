"""The connection's response FIFO: one slot per command that gets a response (PUB and
friends, SUB, CLS), answered in order (responses come back in command order), and the
routing of answers to it: a response frame resolves the oldest slot, an error frame fails it
or, for FIN/REQ/TOUCH, which have no slot, goes to the connection's ``report`` (its
delegate's ``on_error``).

Invariant: a timed-out or cancelled waiter keeps its slot, since the server still answers
that command and the answer must not go to the next one. Deadlines share one loop timer for
the earliest of them. Owner: :class:`~smartnsq.conn.Connection`. Callers: its send path
(:meth:`ResponseQueue.arm`, appending to :attr:`ResponseQueue.slots`), its receive path
(:meth:`ResponseQueue.answer`, :meth:`ResponseQueue.error_frame`), close
(:meth:`ResponseQueue.wait_idle`) and failure (:meth:`ResponseQueue.fail_all`).

With an :attr:`~ResponseQueue.answer_timeout` (the producer's ``request_timeout``), a server
that leaves the oldest slot unanswered longer than that is given up: the connection's
failure path gets the error, whoever's timeout the slot had. Its age is known
from its own deadline and timeout, so only slots with a timeout are judged; the timer sweep
judges it, which comes in time when no slot's timeout exceeds the answer timeout (the
producer caps each attempt's timeout to it).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from itertools import repeat, starmap
from operator import itemgetter

from smartnsq._checks import check_duration
from smartnsq.errors import Flavour, NSQError, NSQTimeoutError, ProtocolError, ServerError
from smartnsq.errors.base import CommandKind
from smartnsq.errors.server import error_from_frame

__all__ = ["ResponseQueue", "Waiter"]

logger = logging.getLogger("smartnsq.connection")

#: One FIFO slot, for a command that gets exactly one response frame:
#: (future, deadline, kind, timeout, topic, partition, close_on_error). A plain tuple because
#: every publish makes one (a slotted class costs ~4x as much to build).
Waiter = tuple[asyncio.Future[bytes], float, CommandKind, float | None, str | None,
               int | None, bool]

#: minimum seconds between two sweeps for timed-out waiters
_SWEEP_GAP = 0.01
#: float slack when a slot's age is rebuilt from its deadline and timeout
_EPSILON = 1e-6

#: bound once (EnumType's __getattr__ makes CommandKind.SUBSCRIBE slow on a hot path)
_SUBSCRIBE = CommandKind.SUBSCRIBE

#: a run of answers is resolved with these mapped over its slots (C iterators)
_future = itemgetter(0)
_kind = itemgetter(2)
_done = asyncio.Future.done
_set_result = asyncio.Future.set_result

#: errors answering FIN/REQ/TOUCH, which have no waiter
_NO_WAITER_CODES = {
    b"E_FIN_FAILED": CommandKind.FIN,
    b"E_REQ_FAILED": CommandKind.OTHER,
    b"E_TOUCH_FAILED": CommandKind.OTHER,
}


class ResponseQueue:
    """Waiters in command order, their deadlines, the answers to them, and "all answered"
    waiting.

    ``fail`` is the connection's failure path: it gets a response nothing waits for, a fatal
    error frame, and, with an ``answer_timeout`` (seconds; the producer's
    ``request_timeout``; None: no limit), an :class:`NSQTimeoutError` once the oldest slot
    sent with a timeout has waited that long (see the module docstring). ``report`` gets the
    non-fatal errors no caller is waiting for."""

    def __init__(self, address: str, answer_timeout: float | None,
                 fail: Callable[[NSQError], None],
                 report: Callable[[ServerError], None]) -> None:
        self._address = address
        self._fail = fail
        self._report = report
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the server's flavour (error frames are typed by it), known after the handshake
        self.flavour = Flavour.UNKNOWN
        #: a SUB / SUB_ORDERED / SUB_ADVANCED was answered (the RDY check's wording)
        self.subscribe_answered = False
        #: error frames received
        self.error_frames = 0
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
        #: the oldest slot outlived :attr:`answer_timeout` once (the connection was given up)
        self._stalled = False

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
        if self._stalled:
            return math.inf
        self._stalled = True
        self._fail(NSQTimeoutError(
            f"nsqd {self._address} left a command unanswered for {now - sent:.1f}s "
            f"(answer timeout {self.answer_timeout}s): the connection is given up"))
        return -1.0

    # -- answers -------------------------------------------------------------------------

    def answer(self, payload: bytes, n: int = 1) -> None:
        """``n`` response frames with ``payload`` in a row (more than one: a publisher's run
        of OKs, ``FrameDecoder.feed_oks``) answer the ``n`` oldest slots; a response nothing
        waits for fails the connection."""
        slots = self.slots
        if n == 1 and slots:
            # one answer per read (one request at a time): no run to take
            fut, _, kind, _, _, _, _ = slots.popleft()
            if kind is _SUBSCRIBE:
                self.subscribe_answered = True
            if not fut.done():
                fut.set_result(payload)
            if not slots and self.idle_fut is not None:
                self.wake_idle()
            return
        waiting = len(slots)
        if n >= waiting:
            taken = list(slots)
            slots.clear()
        else:
            taken = list(starmap(slots.popleft, repeat((), n)))
        if taken:
            # a run of answers is taken and resolved by C iterators: no Python step per slot
            if _SUBSCRIBE in map(_kind, taken):
                self.subscribe_answered = True
            futures = list(map(_future, taken))
            if any(map(_done, futures)):  # some callers gave up (timeout, cancel)
                for fut in futures:
                    if not fut.done():
                        fut.set_result(payload)
            else:
                deque(map(_set_result, futures, repeat(payload)), maxlen=0)
        if n > waiting:
            self._fail(ProtocolError(f"nsqd {self._address} sent a response nothing waits "
                                     f"for: {payload[:32]!r}"))
            return
        if n == waiting and self.idle_fut is not None:
            self.wake_idle()

    def error_frame(self, payload: bytes) -> None:
        """An error frame: it answers the oldest slot, or FIN/REQ/TOUCH (no slot). Fatal
        errors, and any error answering a ``close_on_error`` slot, fail the connection."""
        self.error_frames += 1
        address = self._address
        code = payload.split(b" ", 1)[0]
        kind = _NO_WAITER_CODES.get(code)
        if kind is not None:
            self._report(error_from_frame(payload, self.flavour, kind, address=address))
            return
        slots = self.slots
        if not slots:
            exc = error_from_frame(payload, self.flavour, CommandKind.OTHER, address=address)
            if exc.fatal:
                self._fail(exc)
            else:
                self._report(exc)
            return
        fut, _, kind, _, topic, partition, close_on_error = slots.popleft()
        exc = error_from_frame(payload, self.flavour, kind, address=address, topic=topic,
                               partition=partition)
        if not fut.done():
            fut.set_exception(exc)
        elif not exc.fatal:
            self._report(exc)
        if exc.fatal or close_on_error:
            if not exc.fatal:
                logger.warning("closing connection to nsqd %s after %s: the server may have "
                               "left part of the command unread", address, exc.server_code)
            self._fail(exc)
        elif not slots and self.idle_fut is not None:
            self.wake_idle()

    # -- ending --------------------------------------------------------------------------

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
