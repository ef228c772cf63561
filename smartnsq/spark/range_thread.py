"""A range read's event loop on its own thread, its rows handed to Spark through a bounded
queue.

Spark pulls a reader's batches from a plain iterator and may hold on to each for as long as
its downstream takes. Driven from that iterator, the read's loop would run only while Spark
asks for the next batch: in between, the connection answered no heartbeat (nsqd closes a
silent client after two or three intervals) and the read positioned again. On its own thread
the loop keeps the connection alive all along; the queue bounds how far the read runs ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Coroutine, Iterator
from types import TracebackType
from typing import Any, TypeVar

from smartnsq.protocol.messages import RawMessage
from smartnsq.spark.fetch import RangeFetcher

__all__ = ["RangeThread"]

log = logging.getLogger(__name__)

#: seconds the reader waits for its loop to clean up (CLS, channel deletion) after the read
_CLOSE_TIMEOUT = 30.0

Batch = tuple[list[RawMessage], str]
T = TypeVar("T")


class _End:
    """The read finished: nothing more comes."""


class RangeThread:
    """``with RangeThread(fetcher, rows) as batches: for messages, leader in batches: ...``.

    Each batch holds about ``rows`` messages (the last fewer) and the leader it was read from;
    at most ``depth`` batches wait for the iterator. An error of the read is raised by the
    iterator; leaving the ``with`` early stops the read (its connection closed, its channel
    cleaned up as the fetcher does).
    """

    def __init__(self, fetcher: RangeFetcher, rows: int, *, depth: int = 2) -> None:
        self._fetcher = fetcher
        self._rows = rows
        self._queue: asyncio.Queue[Batch | BaseException | _End] = asyncio.Queue(depth)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name=f"smartnsq-range-{fetcher.task.partition}",
                                        daemon=True)
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> Iterator[Batch]:
        self._thread.start()
        self._task = self._call(self._start())
        return self._batches()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._call(self._stop(), _CLOSE_TIMEOUT)
        except TimeoutError:
            log.warning("%s partition %d: the read did not clean up within %.0fs",
                        self._fetcher.task.topic, self._fetcher.task.partition,
                        _CLOSE_TIMEOUT)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(_CLOSE_TIMEOUT)
            if not self._thread.is_alive():
                self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(self._pump())

    async def _stop(self) -> None:
        task = self._task
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _batches(self) -> Iterator[Batch]:
        while True:
            item = self._call(self._queue.get())
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def _pump(self) -> None:
        fetcher, put = self._fetcher, self._queue.put
        chunks = fetcher.chunks()
        pending: list[RawMessage] = []
        try:
            async for chunk in chunks:
                pending.extend(chunk)
                if len(pending) >= self._rows:
                    # waits while the queue is full; the connection's I/O goes on meanwhile
                    await put((pending, fetcher.leader))
                    pending = []
            if pending:
                await put((pending, fetcher.leader))
            await put(_End())
        except Exception as exc:  # handed to Spark's thread, which raises it
            await put(exc)
        finally:
            await chunks.aclose()
