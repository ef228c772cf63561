"""An asyncio event loop on a daemon thread, driven by blocking calls from any other thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs its own event loop in a daemon thread until :meth:`close`.

    The embedded cluster lives on this loop, so it outlives the event loops that
    pytest-asyncio makes per test (or per module, class, session) and serves sync tests too.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # whatever the cluster left running is cancelled and awaited, so closing the
            # loop warns about no pending task
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def alive(self) -> bool:
        """True until :meth:`close` has stopped the loop."""
        return self._thread.is_alive()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` seconds for its result
        (:class:`TimeoutError` after that, the coroutine cancelled)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking cluster call was made on the cluster's own thread")
        if not self.alive:
            coro.close()
            raise RuntimeError("the cluster's event loop is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"the embedded cluster did not answer within {timeout} s") from None

    def call(self, fn: Callable[[], T], timeout: float) -> T:
        """Run the plain function ``fn`` on the loop (the cluster's state belongs to it)."""

        async def on_loop() -> T:
            return fn()

        return self.run(on_loop(), timeout)

    def close(self, timeout: float) -> None:
        """Stop the loop, wait for the thread (at most ``timeout`` seconds); idempotent."""
        if self.alive:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
