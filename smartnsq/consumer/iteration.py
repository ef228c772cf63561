"""``async for message in consumer``: the buffer of delivered messages nobody took yet, and
the iterators waiting for one.

Owned by the dispatcher (which puts messages in and, at stop, takes the rest out); read by
``Consumer.__anext__`` through the dispatcher. A waiter cancelled by its caller (``async
with asyncio.timeout(t): await anext(it)``) leaves the queue of waiters at once, and one
woken in the same turn it was cancelled passes the wake-up on, so no message stays in the
buffer while another iterator sleeps.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from smartnsq.message import PENDING, Message

__all__ = ["IteratorBuffer"]


class IteratorBuffer:
    """Delivered messages for the iterators, and the iterators waiting."""

    def __init__(self, discard: Callable[[Message], None]) -> None:
        #: called for a buffered message whose subscription closed before anyone took it
        self._discard = discard
        self._buffer: deque[Message] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._buffer)

    def put(self, msg: Message) -> None:
        self._buffer.append(msg)
        self._wake_one()

    def take_all(self) -> list[Message]:
        """Caller: the dispatcher's stop. Empties the buffer and wakes every waiter."""
        out = list(self._buffer)
        self._buffer.clear()
        self.wake_all()
        return out

    async def next(self, loop: asyncio.AbstractEventLoop,
                   ended: Callable[[], bool]) -> Message | None:
        """The next message; None once ``ended()`` and the buffer is empty."""
        buf = self._buffer
        while True:
            while buf:
                msg = buf.popleft()
                owner = msg._owner
                if owner.closed and msg._state == PENDING:  # type: ignore[attr-defined]
                    self._discard(msg)
                    continue
                return msg
            if ended():
                return None
            fut: asyncio.Future[None] = loop.create_future()
            waiters = self._waiters
            waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled() and buf:
                    self._wake_one()
                raise
            finally:
                if not fut.done():
                    fut.cancel()
                if fut in waiters:
                    waiters.remove(fut)

    def _wake_one(self) -> None:
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def wake_all(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
