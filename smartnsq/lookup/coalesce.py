"""Coalescing of concurrent refresh requests into rounds.

At most one round runs and at most one is queued. A caller joins the queued round, so its
result always comes from a round that *started after the call* (a caller that saw a stale
leader never gets an answer older than its own observation), and any number of callers
arriving together share one round. A queued round also waits until ``min_spacing`` seconds
after the previous round started, which bounds the request rate when many connections
report problems in a burst.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _consume(fut: asyncio.Future[Any]) -> None:
    # Mark the exception retrieved: every caller may have been cancelled meanwhile.
    if not fut.cancelled():
        fut.exception()


class Coalescer(Generic[T]):
    def __init__(self, run: Callable[[], Awaitable[T]], *, min_spacing: float = 0.0) -> None:
        self._run = run
        self._spacing = min_spacing
        self._queued: asyncio.Future[T] | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_start: float | None = None
        #: number of rounds started, for observability and tests
        self.rounds = 0

    @property
    def busy(self) -> bool:
        return self._task is not None

    @property
    def queued(self) -> bool:
        """A round is queued and has not started: a caller joining now shares it."""
        return self._queued is not None

    def request(self) -> asyncio.Future[T]:
        """Join (or queue) the next round at once; its result, without waiting for it."""
        if self._queued is None:
            fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(_consume)
            self._queued = fut
        queued = self._queued
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        return queued

    async def __call__(self) -> T:
        return await asyncio.shield(self.request())

    async def _loop(self) -> None:
        try:
            while self._queued is not None:
                if self._last_start is not None and self._spacing > 0:
                    wait = self._last_start + self._spacing - asyncio.get_running_loop().time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                # From here on, new callers queue for the next round.
                fut, self._queued = self._queued, None
                self._last_start = asyncio.get_running_loop().time()
                self.rounds += 1
                try:
                    result = await self._run()
                except asyncio.CancelledError:
                    fut.cancel()
                    raise
                except Exception as exc:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
        finally:
            if self._queued is not None:
                # cancelled while waiting: callers of the queued round must not hang
                self._queued.cancel()
                self._queued = None
            self._task = None

    async def close(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def until_answered(run: Callable[[], Awaitable[object]],
                         waiters: list[asyncio.Event]) -> None:
    """Start (or queue) a coalesced pass with ``run`` and wait until it sets the event put
    in ``waiters`` (its first answer) or ends; the pass itself goes on."""
    answered = asyncio.Event()
    waiters.append(answered)
    task = asyncio.ensure_future(run())
    waiter = asyncio.ensure_future(answered.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()  # only this wait: the coalescer shields the pass
    if task.done() and not task.cancelled():
        task.result()
