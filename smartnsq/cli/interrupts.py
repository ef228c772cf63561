"""Ctrl-C while ``smartnsq`` imports (at start-up, and a command's module when it is asked
for): it ends the imports quietly, and a second one does not break into that quiet exit.
Only the standard library here: :mod:`smartnsq.cli` uses it before checking that the
``cli`` extra is installed."""

from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["OWN_PROCESS", "guard_imports", "held_back", "ignore_further_ctrl_c",
           "ignore_further_stops"]

#: set while :func:`smartnsq.cli.app.main` runs the group as the ``smartnsq`` process (not
#: inside a test's or another program's process, whose Ctrl-C stays theirs)
OWN_PROCESS: contextvars.ContextVar[bool] = contextvars.ContextVar("own_process",
                                                                  default=False)


def ignore_further_ctrl_c() -> None:
    """Once a Ctrl-C has stopped it, the ``smartnsq`` process ignores further ones while it
    ends: Python's default handler, back once the command's loop closed, killed it on its
    way out (exit status -SIGINT instead of its code, or a traceback)."""
    ignore_further_stops((signal.SIGINT,))


def ignore_further_stops(signums: tuple[signal.Signals, ...]) -> None:
    """:func:`ignore_further_ctrl_c` for each of ``signums`` (a command that SIGINT or
    SIGTERM stopped: a second SIGTERM killed it with -SIGTERM as it ended, not 143)."""
    if OWN_PROCESS.get():
        with contextlib.suppress(ValueError):  # not the main thread
            for signum in signums:
                signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def held_back(signums: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Hold ``signums`` back in the ``smartnsq`` process's main thread while their handlers
    change: between an event loop's handler going (which puts the default back: termination
    for SIGTERM, KeyboardInterrupt for SIGINT) and :func:`ignore_further_stops`, one arriving
    would act on the default. One held back meanwhile is discarded once ignored."""
    if not OWN_PROCESS.get() or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signums)


def _first_interrupt(signum: int, frame: FrameType | None) -> None:
    # the first Ctrl-C stops the imports; a second one must not break into the quiet exit
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def guard_imports() -> Callable[[], None]:
    """Route Ctrl-C to :func:`_first_interrupt` until the returned undo is called; nothing
    when not on the main thread, or when SIGINT is not Python's default handler (ignored in
    a background job, or an embedding program's own): that choice stays as it is."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None
    signal.signal(signal.SIGINT, _first_interrupt)

    def undo() -> None:
        # the commands (asyncio.run) take Ctrl-C over from Python's default handler only
        if signal.getsignal(signal.SIGINT) is _first_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    return undo
