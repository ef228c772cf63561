"""A client's ``stop()`` as one run, however many callers wait for it: graceful, unless a
caller is cancelled while it waits (a timeout around ``stop()``, ``asyncio.run`` ending on
Ctrl-C in ``async with``). Then, rather than a graceful stop left unwatched or half done, the
stop is cut short: the graceful run is cancelled and the client's cut-short steps run once,
to their end; the cancellation then goes on. Another caller's wait ends there too and, not
cancelled itself, returns: the client is stopped.

Owners: :meth:`smartnsq.Consumer.stop` and :meth:`smartnsq.Producer.stop`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["StopRun"]


class StopRun:
    """See the module docstring. ``cut_short``: the steps that end a cancelled stop at once
    (called after the graceful run was cancelled and has ended)."""

    __slots__ = ("_cut", "_cut_short", "_graceful")

    def __init__(self, cut_short: Callable[[], Awaitable[None]]) -> None:
        self._cut_short = cut_short
        self._graceful: asyncio.Task[None] | None = None
        self._cut: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        """The stop ran to its end, gracefully or cut short."""
        last = self._cut if self._cut is not None else self._graceful
        return last is not None and last.done()

    def start(self, graceful: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start the graceful run (``graceful()``), unless a stop was started already."""
        if self._graceful is None:
            self._graceful = asyncio.ensure_future(graceful())

    async def wait(self) -> None:
        """Wait for the stop :meth:`start` began; cancelled meanwhile, cut it short first."""
        assert self._graceful is not None
        try:
            await asyncio.shield(self._graceful)
        except asyncio.CancelledError:
            if self._cut is None:
                self._cut = asyncio.ensure_future(self._cut_short_run())
            await asyncio.shield(self._cut)
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise

    async def _cut_short_run(self) -> None:
        graceful = self._graceful
        if graceful is not None and not graceful.done():
            graceful.cancel()
            await asyncio.wait((graceful,))
        await self._cut_short()
