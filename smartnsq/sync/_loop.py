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

The thread can also end without ``release()`` (code on the loop calls ``loop.stop()``, or a
task lets ``SystemExit`` through; a sync handler's own are caught, a task it starts is not):
the loop records why (:attr:`BackgroundLoop.ended_by`), every client left on it names that
cause in its :class:`EventLoopError`, and the next ``acquire()`` starts a new loop, so
clients made afterwards work.
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


#: the loop's errors after its thread ended by itself say what its clients can do
_REMEDY = ("The sync clients that ran on it cannot be used any more; make new ones (they "
           "start a new loop thread)")


def _new_loop() -> BackgroundLoop:
    return BackgroundLoop(label="the smartnsq.sync event loop thread", remedy=_REMEDY)


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
    """The shared loop, started if needed (also when the last one's thread ended without
    :func:`release`: its clients are let go of); pair every call with :func:`release`."""
    global _shared, _users
    with _lock:
        if _shared is None or _shared.ended_by is not None:
            _shared = _new_loop()
            _users = 0
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
