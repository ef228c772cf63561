"""One asyncio event loop on a daemon thread, shared by the blocking facades.

``acquire()`` starts it on first use and counts users; ``release()`` stops it (and joins the
thread) when the last user is gone. ``run(coro)`` submits a coroutine and blocks for its
result; if the waiting thread is interrupted (KeyboardInterrupt) the coroutine is cancelled.

After ``fork`` (gunicorn --preload, Celery prefork, multiprocessing) the child has no loop
thread: the shared loop is forgotten there, so the child's first facade starts its own. A
facade the parent made is bound to the parent's loop, whose thread, connections and selector
are the parent's: in the child its calls raise :class:`EventLoopError` at once (see
:meth:`BackgroundLoop.run`) instead of waiting forever, and closing it only lets go of it.
"""

from __future__ import annotations

import asyncio
import os
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
        #: the process whose thread runs the loop (a forked child has no such thread)
        self.pid = os.getpid()
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

    @property
    def in_this_process(self) -> bool:
        """False in a child forked after the loop started: nothing may touch it there (its
        selector and sockets are shared with the parent, which still uses them)."""
        return self.pid == os.getpid()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it (not callable from the loop's thread)."""
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
#: in a forked child, the loops of the parent: kept referenced so that no finaliser runs on
#: them there (they share the parent's selector, self-pipe and sockets)
_parents_loops: list[BackgroundLoop] = []


def _forget_parents_loop() -> None:
    """After fork, in the child: the next facade starts a loop of its own. The lock is new
    too: another thread of the parent may have held it at the fork."""
    global _lock, _shared, _users
    _lock = threading.Lock()
    if _shared is not None:
        _parents_loops.append(_shared)
    _shared = None
    _users = 0


os.register_at_fork(after_in_child=_forget_parents_loop)


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
