"""An asyncio event loop on a daemon thread, driven by blocking calls from other threads: the
one implementation behind the blocking facades (:mod:`smartnsq.sync`, which share one such
loop) and the pytest plugin's embedded clusters (:mod:`smartnsq.testing`, one per cluster).

A loop belongs to the process that started it: after ``fork`` (gunicorn --preload, Celery
prefork, multiprocessing) the child has no loop thread, and :meth:`BackgroundLoop.run` raises
:class:`EventLoopError` there at once instead of waiting forever.

The thread can also end without :meth:`~BackgroundLoop.stop`: code on the loop calls
``loop.stop()``, or a task lets ``SystemExit`` / ``KeyboardInterrupt`` through (asyncio
re-raises both out of ``run_forever``). The loop records why (:attr:`~BackgroundLoop.ended_by`,
logged once), every call waits with the thread's end in view (one submitted as the thread
ends is dropped with the loop, and would be waited for ever), and each call made or cut
short afterwards names that cause in its :class:`EventLoopError`. The clients it was told
to :meth:`~BackgroundLoop.track` are stopped then (their connections closed, not left to the
garbage collector: nobody can stop them any more).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol, TypeVar

from smartnsq.errors import ClientClosedError, EventLoopError

__all__ = ["BackgroundLoop", "check_blocking_allowed"]

T = TypeVar("T")

log = logging.getLogger("smartnsq.loop_thread")

#: seconds a call cut short by the thread's own end waits for the loop's clean-up
_CLEANUP_WAIT = 2.0


class Client(Protocol):
    """What :meth:`BackgroundLoop.track` stops: an asyncio client, whose ``stop(0)`` closes
    its connections without waiting for work in progress."""

    def stop(self, timeout: float | None = None, /) -> Awaitable[None]: ...


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
    """Runs its own event loop in a daemon thread named ``name`` until :meth:`stop`.
    ``label`` names the thread in errors and the log, ``remedy`` ends the error of a call
    made after the thread ended by itself (what its user can do then)."""

    def __init__(self, name: str = "smartnsq-loop", *,
                 label: str = "this smartnsq event loop thread", remedy: str = "") -> None:
        #: the process whose thread runs the loop (a forked child has no such thread)
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._label = label
        self._remedy = remedy
        #: stop() was called: what the loop cancels from then on was cut short by it
        self._stopping = False
        #: why the thread ended without stop() (set as it ends), else None
        self.ended_by: str | None = None
        #: done once the thread has ended, for whatever reason
        self._end: concurrent.futures.Future[None] = concurrent.futures.Future()
        #: the clients stopped if the thread ends by itself (weak: a client dropped is gone)
        self._clients: weakref.WeakSet[Client] = weakref.WeakSet()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        except BaseException as exc:  # the thread ends here either way: keep why
            self._ended(f"{exc!r} was raised on it (by a task or callback on the loop that "
                        "let it through)", exc)
        else:
            if not self._stopping:
                self._ended("loop.stop() was called by code running on it", None)
        try:
            if self.ended_by is not None:
                self._stop_clients()
            self._finish_tasks()
            self.loop.close()
        finally:
            self._end.set_result(None)

    def track(self, client: Client) -> None:
        """Stop ``client`` (``stop(0)``) if the thread ends by itself with it still open."""
        self._clients.add(client)

    def _stop_clients(self) -> None:
        """The thread ended by itself: close the tracked clients' connections now, within
        :data:`_CLEANUP_WAIT` (the work they had in progress fails, as it would anyway)."""
        clients = list(self._clients)
        if not clients:
            return

        async def stop_all() -> None:
            async with asyncio.timeout(_CLEANUP_WAIT):
                await asyncio.gather(*(c.stop(0) for c in clients), return_exceptions=True)

        task = self.loop.create_task(stop_all())
        for _ in range(2):  # a loop.stop() still queued ends the first wait early
            try:
                self.loop.run_until_complete(task)
                return
            except TimeoutError:
                log.warning("%s: its clients did not stop within %ss; their connections are "
                            "left to the garbage collector", self._label, _CLEANUP_WAIT)
                return
            except RuntimeError as exc:
                log.debug("%s: stopping its clients cut short (%s), once more", self._label, exc)

    def _finish_tasks(self) -> None:
        """Cancel and await what still runs, so that closing the loop warns about no pending
        task. A ``loop.stop()`` still queued (code on the loop that called it twice, or a
        task that ended the loop meanwhile) ends a wait early: one more try then."""
        for _ in range(2):
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            try:
                if pending:
                    self.loop.run_until_complete(
                        asyncio.gather(*pending, return_exceptions=True))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                return
            except RuntimeError as exc:  # "Event loop stopped before Future completed."
                log.debug("%s: clean-up cut short (%s), once more", self._label, exc)

    def _ended(self, why: str, exc: BaseException | None) -> None:
        self.ended_by = why
        log.error("%s ended: %s; the clients on it stop working", self._label, why,
                  exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def alive(self) -> bool:
        """True until the loop's thread has ended (:meth:`stop`, or by itself)."""
        return self._thread.is_alive()

    @property
    def ended(self) -> bool:
        """True once the thread has ended without :meth:`stop` (a client on it then has
        nothing left to stop)."""
        return self.ended_by is not None

    @property
    def in_this_process(self) -> bool:
        """False in a child forked after the loop started: nothing may touch it there (its
        selector and sockets are shared with the parent, which still uses them)."""
        return self.pid == os.getpid()

    def _gone(self, cut_short: bool) -> BaseException:
        """The error of a call made (or, ``cut_short``, running) when the thread ended."""
        if self.ended_by is not None:
            # the loop's clean-up first: what its cancelled tasks record on their way out (a
            # consumer's error) is there when the caller looks
            concurrent.futures.wait((self._end,), _CLEANUP_WAIT)
            remedy = f". {self._remedy}" if self._remedy else ""
            return EventLoopError(f"{self._label} has stopped: {self.ended_by}{remedy}")
        if cut_short and self._stopping:
            # the loop ended under the call (its last user stopped its client meanwhile)
            return ClientClosedError("the call was cut short: its client was stopped (from "
                                     "another thread) while it ran")
        return EventLoopError(f"{self._label} has stopped")

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *,
            from_running_loop: bool = False, hold_interrupt: bool = False) -> T:
        """Run ``coro`` on the loop and wait for it, at most ``timeout`` seconds (then
        :class:`TimeoutError`, the coroutine cancelled); not callable from the loop's thread.
        A thread that runs an event loop of its own is refused (it would block that loop)
        unless ``from_running_loop`` says the call is short and meant (a test's fixture).
        ``hold_interrupt``: see :meth:`_wait`."""
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
        if self.ended_by is not None or not self.alive:
            coro.close()
            raise self._gone(cut_short=False)
        if not from_running_loop:
            try:
                check_blocking_allowed("a smartnsq.sync call")
            except EventLoopError:
                coro.close()
                raise
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError:  # the loop closed meanwhile: its thread ends (why is recorded)
            coro.close()
            raise self._gone(cut_short=False) from None
        try:
            held = self._wait(fut, timeout, hold_interrupt)
            if fut.done():
                if held is not None:
                    raise held
                return fut.result()
        except concurrent.futures.CancelledError:
            # the thread's end cancels what still runs on the loop, after recording why
            if self._stopping or self.ended_by is not None:
                raise self._gone(cut_short=True) from None
            raise
        except BaseException:
            fut.cancel()
            raise
        fut.cancel()
        if self._end.done():  # the thread ended with the call dropped, not answered
            coro.close()  # never started: no "never awaited" warning
            raise self._gone(cut_short=True)
        raise TimeoutError(f"the call did not complete within {timeout}s")

    def _wait(self, fut: concurrent.futures.Future[Any], timeout: float | None,
              hold_interrupt: bool) -> KeyboardInterrupt | None:
        """Wait for ``fut`` or the thread's end, at most ``timeout`` seconds. With
        ``hold_interrupt`` a first Ctrl-C (KeyboardInterrupt, only ever raised in the main
        thread) lets the call end, and is returned to be raised then: a client's stop cut in
        the middle leaves its connections to the garbage collector. A second one cuts the
        call short."""
        held: KeyboardInterrupt | None = None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                concurrent.futures.wait((fut, self._end), left,
                                        return_when=concurrent.futures.FIRST_COMPLETED)
                return held
            except KeyboardInterrupt as exc:
                if not hold_interrupt or held is not None:
                    raise
                held = exc
                log.warning("%s: Ctrl-C held back until the stop under way ends (press it "
                            "again to cut the stop short)", self._label)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait for its thread (at most ``timeout`` seconds); idempotent."""
        if self.loop.is_closed() or not self.alive:
            return
        self._stopping = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
