"""An asyncio event loop on a daemon thread, driven by blocking calls from other threads: the
one implementation behind the blocking facades (:mod:`smartnsq.sync`, which share one such
loop) and the pytest plugin's embedded clusters (:mod:`smartnsq.testing`, one per cluster).

A loop belongs to the process that started it: after ``fork`` (gunicorn --preload, Celery
prefork, multiprocessing) the child has no loop thread, and :meth:`BackgroundLoop.run` raises
:class:`EventLoopError` there at once instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from smartnsq.errors import ClientClosedError, EventLoopError

__all__ = ["BackgroundLoop", "check_blocking_allowed"]

T = TypeVar("T")


def check_blocking_allowed(what: str) -> None:
    """Refuse a blocking call made from a thread that runs an event loop: it would block
    that loop (every task on it stops) until the call returns."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise EventLoopError(f"{what} blocks, but was called from inside a running event loop; "
                         "use the asyncio client (smartnsq.Producer / smartnsq.Consumer) "
                         "there, or call it from another thread")


class BackgroundLoop:
    """Runs its own event loop in a daemon thread named ``name`` until :meth:`stop`."""

    def __init__(self, name: str = "smartnsq-loop") -> None:
        #: the process whose thread runs the loop (a forked child has no such thread)
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        #: stop() was called: what the loop cancels from then on was cut short by it
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # what is still running is cancelled and awaited, so closing the loop warns
            # about no pending task
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def alive(self) -> bool:
        """True until :meth:`stop` has ended the loop's thread."""
        return self._thread.is_alive()

    @property
    def in_this_process(self) -> bool:
        """False in a child forked after the loop started: nothing may touch it there (its
        selector and sockets are shared with the parent, which still uses them)."""
        return self.pid == os.getpid()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *,
            from_running_loop: bool = False) -> T:
        """Run ``coro`` on the loop and wait for it, at most ``timeout`` seconds (then
        :class:`TimeoutError`, the coroutine cancelled); not callable from the loop's thread.
        A thread that runs an event loop of its own is refused (it would block that loop)
        unless ``from_running_loop`` says the call is short and meant (a test's fixture)."""
        if not self.in_this_process:
            coro.close()
            raise EventLoopError(
                f"this smartnsq.sync client was made in process {self.pid} before it forked "
                f"this one ({os.getpid()}); its event loop thread and connections stay in "
                "the parent. Make a new client in the child (after the fork, e.g. in a "
                "post-fork hook or the worker's initialiser)")
        if threading.current_thread() is self._thread:
            coro.close()
            raise EventLoopError("a blocking smartnsq call was made from its own event loop "
                                 "thread (use the asyncio API there)")
        if not self.alive:
            coro.close()
            raise EventLoopError("this smartnsq event loop thread has stopped")
        if not from_running_loop:
            try:
                check_blocking_allowed("a smartnsq.sync call")
            except EventLoopError:
                coro.close()
                raise
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.CancelledError:
            if self._stopping:
                # the loop ended under the call (its last user stopped its client meanwhile)
                # and cancelled it: say so, not a bare cancellation from another module
                raise ClientClosedError("the call was cut short: its client was stopped "
                                        "(from another thread) while it ran") from None
            raise
        except BaseException:
            fut.cancel()
            raise

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait for its thread (at most ``timeout`` seconds); idempotent."""
        if self.loop.is_closed() or not self.alive:
            return
        self._stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
