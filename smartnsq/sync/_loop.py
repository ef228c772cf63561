"""One asyncio event loop on a daemon thread (:class:`~smartnsq.loop_thread.BackgroundLoop`),
shared by the blocking facades.

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

import os
import threading

from smartnsq.loop_thread import BackgroundLoop

__all__ = ["acquire", "release"]

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
