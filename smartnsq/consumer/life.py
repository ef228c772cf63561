"""A consumer's life: new → starting → running → stopping → closed, the error that ended it,
and what callers wait on (a start another call runs, the close).

Owner: :class:`~smartnsq.consumer.Consumer`, which moves it on; its parts read it through
the consumer. Every transition is here, so a state cannot be half set.
"""

from __future__ import annotations

import asyncio

from smartnsq.errors import ClientClosedError, NotStartedError

__all__ = ["ConsumerLife"]


class ConsumerLife:
    """See the module docstring. ``name``: ``topic/channel``, for the errors it raises."""

    __slots__ = ("_closed_event", "_start_done", "closed", "error", "name", "started",
                 "starting", "stopping")

    def __init__(self, name: str) -> None:
        self.name = name
        self.started = False
        #: the first start() is still running
        self.starting = False
        self.stopping = False
        self.closed = False
        #: the configuration error that ended the consumer, if any
        self.error: BaseException | None = None
        self._closed_event: asyncio.Event | None = None
        #: set when the first start() ended, for the calls that came meanwhile
        self._start_done: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        return self.started and not self.stopping and not self.closed

    @property
    def state(self) -> str:
        return "closed" if self.closed else "stopping" if self.stopping else \
            "running" if self.started else "new"

    def check_open(self) -> None:
        if self.closed or self.stopping:
            raise ClientClosedError(f"consumer of {self.name} is closed")

    def check_started(self, doing: str) -> None:
        if not self.started:
            raise NotStartedError(f"consumer of {self.name} is not started{doing}")

    def begin_start(self) -> None:
        """The first start(), on the running loop."""
        self.started = self.starting = True
        self._closed_event = asyncio.Event()
        self._start_done = asyncio.Event()

    def start_ended(self) -> None:
        """The first start() is done, or about to fail (then stopping is set before the
        calls waiting for it run). Idempotent."""
        self.starting = False
        assert self._start_done is not None
        self._start_done.set()

    async def join_start(self) -> None:
        """A start() while the first runs waits for it and ends as it did (a bare return
        would tell the caller it started before anything was subscribed, or when the
        start failed); after it, returns at once."""
        if not self.starting:
            return
        assert self._start_done is not None
        await self._start_done.wait()
        if not self.running:
            if self.error is not None:
                raise self.error
            raise ClientClosedError(f"consumer of {self.name} was stopped while starting")

    def failed(self, exc: BaseException) -> bool:
        """Keep ``exc`` as the error that ends the consumer unless one is kept; True when
        it is the first."""
        if self.error is not None:
            return False
        self.error = exc
        return True

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def set_closed(self) -> None:
        self.closed = True
        if self._closed_event is not None:
            self._closed_event.set()

    async def wait_closed(self) -> None:
        """Until closed; raise the error that ended it, if any."""
        self.check_started("")
        assert self._closed_event is not None
        await self._closed_event.wait()
        self.raise_error()
