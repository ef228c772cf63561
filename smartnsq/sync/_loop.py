"""One asyncio event loop on a daemon thread, shared by the blocking facades.

``acquire()`` starts it on first use and counts users; ``release()`` stops it (and joins the
thread) when the last user is gone. ``run(coro)`` submits a coroutine and blocks for its
result; if the waiting thread is interrupted (KeyboardInterrupt) the coroutine is cancelled.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from smartnsq.errors import EventLoopError

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
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="smartnsq-loop", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it (not callable from the loop's thread)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise EventLoopError("a blocking smartnsq call was made from its own event loop "
                                 "thread (use the asyncio API there)")
        try:
            check_blocking_allowed("a smartnsq.sync call")
        except EventLoopError:
            coro.close()
            raise
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join()


_lock = threading.Lock()
_shared: BackgroundLoop | None = None
_users = 0


def acquire() -> BackgroundLoop:
    """The shared loop, started if needed; pair every call with :func:`release`."""
    global _shared, _users
    with _lock:
        if _shared is None:
            _shared = BackgroundLoop()
        _users += 1
        return _shared


def release(loop: BackgroundLoop) -> None:
    global _shared, _users
    with _lock:
        if loop is not _shared:
            return
        _users -= 1
        if _users > 0:
            return
        _shared = None
    loop.stop()
