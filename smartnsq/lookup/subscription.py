"""Delivery of :class:`TopicChange` batches to one subscriber."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from smartnsq.lookup.events import TopicChange
from smartnsq.lookup.view import Access

log = logging.getLogger("smartnsq.lookup")

ChangeCallback = Callable[[TopicChange], None]


class Subscription:
    """Changes of one ``(topic, access)``: iterate it, ``await get()``, or use a callback.

    With a callback, each change is passed to it synchronously right after the round that
    produced it (exceptions are logged and swallowed). Without one, changes are queued; if
    more than ``maxsize`` pile up, the oldest are dropped with a warning — every change
    carries the full new view, so a late reader still sees the current state.
    Iteration ends when the subscription or the Lookup is closed.
    """

    def __init__(self, topic: str, access: Access, *, callback: ChangeCallback | None = None,
                 maxsize: int = 1000, on_close: Callable[[Subscription], None] | None = None
                 ) -> None:
        self.topic = topic
        self.access: Access = access
        self._callback = callback
        self._maxsize = max(1, maxsize)
        self._queue: asyncio.Queue[TopicChange | None] = asyncio.Queue()
        self._closed = False
        self._on_close = on_close
        self.dropped = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def deliver(self, change: TopicChange) -> None:
        if self._closed:
            return
        if self._callback is not None:
            try:
                self._callback(change)
            except Exception:
                log.exception("subscriber callback for topic %r (access=%s) failed",
                              self.topic, self.access)
            return
        if self._queue.qsize() >= self._maxsize:
            self._queue.get_nowait()
            self.dropped += 1
            log.warning("subscriber of topic %r (access=%s) is not keeping up; dropped the "
                        "oldest change (%d so far)", self.topic, self.access, self.dropped)
        self._queue.put_nowait(change)

    async def get(self) -> TopicChange:
        """The next change; raises :class:`StopAsyncIteration` once closed and drained."""
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # wake any other waiter too
            raise StopAsyncIteration
        return item

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> TopicChange:
        return await self.get()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put_nowait(None)
        if self._on_close is not None:
            self._on_close(self)
