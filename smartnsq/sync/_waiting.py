"""A message waiting for a free handler thread is still in flight on nsqd, whose
``msg_timeout`` runs meanwhile: with fewer threads than ``max_in_flight`` and slow handlers
it ran out, and nsqd delivered the message again while it was still queued here (handled
twice: 22 handler calls for 10 messages with 2 threads, 0.6 s handlers and a 1 s timeout).
:class:`WaitingTouch` touches it every half timeout until a thread takes it, and once more
then if it waited, so that its handler has the whole timeout (the last periodic touch may
have been half a timeout before); from then on the handler answers it, or touches it, as any
handler does.
"""

from __future__ import annotations

import asyncio
import time

from smartnsq.message import Message

__all__ = ["WaitingTouch"]


class WaitingTouch:
    """Touches ``msg`` every ``every`` seconds until :attr:`started` is set (by the handler
    thread, first thing) or :meth:`cancel` is called."""

    __slots__ = ("_every", "_handle", "_loop", "_msg", "_since", "started")

    def __init__(self, msg: Message, loop: asyncio.AbstractEventLoop, every: float) -> None:
        self._msg = msg
        self._loop = loop
        self._every = every
        self._since = time.monotonic()
        #: set in the handler thread when it takes the message (a plain attribute: the loop
        #: reading it a touch late only restarts the timeout of a message being handled)
        self.started = False
        self._handle: asyncio.TimerHandle | None = loop.call_later(every, self._touch)

    def start(self) -> None:
        """The handler thread takes the message: no more periodic touches, and one now if
        it waited more than a tenth of the timeout (a 0.6 s handler under a 1 s timeout,
        taken 0.45 s after the last touch, ran past it and was delivered again)."""
        self.started = True
        if time.monotonic() - self._since > self._every / 5:
            self._loop.call_soon_threadsafe(self._msg.touch)

    def _touch(self) -> None:
        self._handle = None
        if self.started:
            return
        self._msg.touch()
        self._handle = self._loop.call_later(self._every, self._touch)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
