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

The thread can also end without ``release()``: code on the loop calls ``loop.stop()``, or a
task lets ``SystemExit`` / ``KeyboardInterrupt`` through (asyncio re-raises both out of
``run_forever``; a sync handler's own are caught, a task it starts is not). The loop
records why (:attr:`SharedLoop.ended_by`, logged once): every client left on it names that
cause in its :class:`EventLoopError`, and the next ``acquire()`` starts a new loop, so
clients made afterwards work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from smartnsq.errors import ClientClosedError, EventLoopError
from smartnsq.loop_thread import BackgroundLoop, check_blocking_allowed

__all__ = ["SharedLoop", "acquire", "release"]

T = TypeVar("T")

log = logging.getLogger("smartnsq.sync")

#: seconds a call cut short by the thread's end waits for the thread to record why
_RECORD_WAIT = 2.0

_lock = threading.Lock()
_shared: SharedLoop | None = None
_users = 0
#: in a forked child, the loops of the parent: kept referenced so that no finaliser runs on
#: them there (they share the parent's selector, self-pipe and sockets)
_parents_loops: list[BackgroundLoop] = []


class SharedLoop(BackgroundLoop):
    """The loop the facades share. It records what ended its thread when no ``stop()`` did,
    and its calls wait with the thread's end in view: one submitted as the thread ends is
    dropped with the loop (and waited for ever in :meth:`BackgroundLoop.run`)."""

    def __init__(self) -> None:
        #: why the thread ended without stop() (set as it ends), else None
        self.ended_by: str | None = None
        #: done once the thread has ended, for whatever reason
        self._end: concurrent.futures.Future[None] = concurrent.futures.Future()
        super().__init__()

    def _main(self) -> None:
        try:
            super()._main()
        except BaseException as exc:  # the thread ends here either way: keep why
            self._ended(f"{exc!r} was raised on it (by a task or callback on the loop that "
                        "let it through)", exc)
        else:
            if not self._stopping:
                self._ended("loop.stop() was called by code running on it", None)
        finally:
            self._end.set_result(None)

    @property
    def ended(self) -> bool:
        """True once the thread has ended without ``stop()`` (a client on it then has
        nothing left to stop)."""
        return self.ended_by is not None

    def _ended(self, why: str, exc: BaseException | None) -> None:
        self.ended_by = why
        log.error("the smartnsq.sync event loop thread ended: %s; the sync clients on it stop "
                  "working, new ones start another loop", why,
                  exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)

    def _ended_error(self) -> BaseException:
        if self.ended_by is None:  # stop(): its last user stopped its client meanwhile
            return ClientClosedError("the call was cut short: its client was stopped (from "
                                     "another thread) while it ran")
        return EventLoopError(
            f"the smartnsq.sync event loop thread has stopped: {self.ended_by}. The sync "
            "clients that ran on it cannot be used any more; make new ones (they start a new "
            "loop thread)")

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *,
            from_running_loop: bool = False) -> T:
        """:meth:`BackgroundLoop.run`, whose wait also ends with the thread; once the
        thread has ended without ``stop()``, the error says why."""
        if not self.in_this_process or threading.current_thread() is self.thread:
            return super().run(coro, timeout, from_running_loop=from_running_loop)  # refused
        if self._end.done() or self.ended_by is not None:
            coro.close()
            raise self._ended_error()
        if not from_running_loop:
            try:
                check_blocking_allowed("a smartnsq.sync call")
            except EventLoopError:
                coro.close()
                raise
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop closed meanwhile: its thread is ending
            coro.close()
            self._end.exception(_RECORD_WAIT)
            raise self._ended_error() from None
        try:
            either: tuple[concurrent.futures.Future[Any], ...] = (fut, self._end)
            concurrent.futures.wait(either, timeout, return_when=concurrent.futures.FIRST_COMPLETED)
            if fut.done():
                return fut.result()
        except concurrent.futures.CancelledError:
            # the thread's end cancels what runs on the loop: give it time to say why
            concurrent.futures.wait((self._end,), _RECORD_WAIT)
            if self._end.done():
                raise self._ended_error() from None
            raise
        except BaseException:
            fut.cancel()
            raise
        fut.cancel()
        if self._end.done():  # the thread ended with the call dropped, not answered
            coro.close()  # never started: no "never awaited" warning
            raise self._ended_error()
        raise TimeoutError(f"the call did not complete within {timeout}s")


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


def acquire() -> SharedLoop:
    """The shared loop, started if needed (also when the last one's thread ended without
    :func:`release`: its clients are let go of); pair every call with :func:`release`."""
    global _shared, _users
    with _lock:
        if _shared is None or _shared.ended_by is not None:
            _shared = SharedLoop()
            _users = 0
        _users += 1
        return _shared


def release(loop: SharedLoop) -> None:
    global _shared, _users
    with _lock:
        if loop is not _shared:
            return
        _users -= 1
        if _users > 0:
            return
        _shared = None
    loop.stop()
