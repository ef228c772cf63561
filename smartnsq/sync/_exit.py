"""Hooks run when the main thread ends, for the sync consumers still running then.

A non-daemon thread, started with the first hook, waits for the main thread
(``threading.main_thread().join()`` returns once the interpreter's shutdown, or the end of a
multiprocessing worker, has marked it stopped, before the other non-daemon threads are
joined) and runs the hooks; the interpreter waits for it as for any non-daemon thread.

Not ``atexit``: a multiprocessing worker (fork or forkserver) ends with ``os._exit`` after
threading's shutdown and runs no ``atexit`` hook, and in a plain interpreter ``atexit`` comes
only once every other non-daemon thread has ended. The handler threads the hooks wait for
are daemon threads, not a ``ThreadPoolExecutor``'s, whose own exit hook (threading's, run
before the main thread is marked stopped) would first run every queued call
(``_threads.py``).

After ``fork`` the child has no watcher thread: its first hook starts one of its own.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

__all__ = ["at_main_thread_end"]

log = logging.getLogger("smartnsq.sync")

_lock = threading.Lock()
_watcher: threading.Thread | None = None
_hooks: list[Callable[[], None]] = []


def at_main_thread_end(hook: Callable[[], None]) -> None:
    """Run ``hook`` once when the main thread ends (registering it again changes nothing);
    hooks run in reverse order of registration. Nothing runs if the main thread has ended
    already."""
    global _watcher
    with _lock:
        if hook not in _hooks:
            _hooks.append(hook)
        if _watcher is None and threading.main_thread().is_alive():
            _watcher = threading.Thread(target=_watch, name="smartnsq-exit", daemon=False)
            _watcher.start()


def _watch() -> None:
    threading.main_thread().join()
    with _lock:
        hooks = list(reversed(_hooks))
    for hook in hooks:
        try:
            hook()
        except Exception:  # the process is ending: say so, and run the other hooks
            log.exception("smartnsq exit hook %r failed", hook)


def _forget_parents_watcher() -> None:
    """After fork, in the child: the watcher thread is the parent's (and the lock may have
    been held by another of the parent's threads)."""
    global _lock, _watcher
    _lock = threading.Lock()
    _watcher = None


os.register_at_fork(after_in_child=_forget_parents_watcher)
