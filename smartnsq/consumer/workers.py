"""The consumer's handler workers (mixed into :class:`~smartnsq.consumer.dispatch.Dispatcher`).

A worker task awaits the handler for each queued message: no task per message. A callback
scheduled once per batch notices when a handler suspends (inline handlers never yield to the
loop); the worker then stays with that handler and other workers take over the queue, so
slow handlers run concurrently (at most ``max_in_flight`` of them, which is all RDY can let
in anyway). Returning finishes the message (FIN), raising hands it to the policy.

The queue holds messages, and records (``MessageRecord`` tuples) behind a marker, their
subscription; a worker makes a record's :class:`~smartnsq.message.Message` when it takes it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from smartnsq.consumer.policy import DeliveryPolicy
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.sub import Sub
from smartnsq.message import Message
from smartnsq.protocol.messages import ID, MessageRecord

__all__ = ["HandlerWorkers"]

_PENDING = 0  # Message._state values (smartnsq.message)
_FINISHED = 1

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


class HandlerWorkers:
    """See the module docstring."""

    if TYPE_CHECKING:  # provided by Dispatcher
        loop: asyncio.AbstractEventLoop | None
        queue: deque[Message | MessageRecord | Sub]
        head_owner: Sub | None
        tracked: set[Message]
        workers: set[asyncio.Task[None]]
        _driver: RdyDriver
        closed: bool
        outstanding: int
        _handler: Callable[[Message], Awaitable[object]] | None
        _finished: Callable[[Sub, Message, bool], None] | None
        _policy: DeliveryPolicy
        _idle: list[asyncio.Future[None]]
        _pumping: int
        _waking: bool
        _drained: asyncio.Event | None

        def finish(self, sub: Sub, msg: Message) -> bool: ...

        def _discard(self, sub: Sub, msg_id: bytes) -> None: ...

        def _mark(self, sub: Sub) -> None: ...

        def _settled(self, sub: Sub) -> None: ...

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
        # the worker cap: the effective max_in_flight (no more can be in flight anyway)
        room = max(1, self._driver.budget) - len(self.workers)
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
        new_message = Message.__new__
        sub: Sub
        msg: Message
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
                    item = popleft()
                    if type(item) is tuple:
                        # a record (see on_records): its message is made here, and lives
                        # only until it is answered (Message.of_record without its calls)
                        sub = self.head_owner  # type: ignore[assignment]
                        if sub.closed:
                            self._discard(sub, item[ID])
                            continue
                        msg = new_message(Message)
                        msg._raw = item
                        msg._owner = sub
                        msg._state = _PENDING
                        msg._auto = True
                        msg._ext = None
                    elif type(item) is Sub:
                        self.head_owner = item
                        continue
                    else:
                        msg = item  # type: ignore[assignment]
                        sub = msg._owner  # type: ignore[assignment]
                        if sub.closed and msg._state == _PENDING:
                            self._discard(sub, msg._raw[ID])
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
                                        conn.fin(msg._raw[ID])
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

