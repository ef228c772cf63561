"""The sync consumer's handler threads: an :class:`~concurrent.futures.Executor` of daemon
threads that nothing joins behind its owner's back.

``ThreadPoolExecutor`` registers a threading-level exit hook that, when the main thread
ends, first runs every call still queued and joins its workers, before anything can stop
the consumer feeding it. With these threads the owner decides: the sync consumer's exit hook
(``_exit.py``) cancels the queued calls (their messages are requeued) and joins only the
running ones.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Call = tuple["Future[Any]", Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class HandlerThreads(Executor):
    """Up to ``max_workers`` daemon threads, started as calls need them, running the
    submitted calls in order."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: released by a worker each time it finishes a call (so it is free for the next)
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            fut: Future[T] = Future()
            self._calls.put((fut, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self._name}_{len(self._threads)}")
                # listed before it runs a call: running_here() is asked from the calls
                self._threads.append(thread)
                thread.start()
            return fut

    def running_here(self) -> bool:
        """True when called from one of these threads (a handler using its own consumer)."""
        return threading.current_thread() in self._threads

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            fut, fn, args, kwargs = call
            del call
            if fut.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    fut.set_exception(exc)
                else:
                    fut.set_result(result)
            # what the call held is not kept alive while the thread waits for the next one
            del fut, fn, args, kwargs
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False,
                 timeout: float | None = None) -> None:
        """Accept no more calls; with ``cancel_futures`` the queued ones are cancelled, else
        they still run; ``wait`` joins the threads (not the calling one), for at most
        ``timeout`` seconds in all (see :meth:`stuck`)."""
        with self._lock:
            self._shut = True
            if cancel_futures:
                while True:
                    try:
                        call = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    if call is not None:
                        call[0].cancel()
            for _ in self._threads:
                self._calls.put(None)
            threads = list(self._threads)
        if wait:
            me = threading.current_thread()
            deadline = None if timeout is None else time.monotonic() + timeout
            for thread in threads:
                if thread is not me:
                    thread.join(None if deadline is None
                                else max(0.0, deadline - time.monotonic()))

    def stuck(self) -> list[str]:
        """The names of the threads still in a call (after a bounded :meth:`shutdown`)."""
        me = threading.current_thread()
        return [t.name for t in self._threads if t.is_alive() and t is not me]
