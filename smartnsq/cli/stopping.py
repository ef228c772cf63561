"""How a command stops on a signal, and its exit code: one convention for every command, owned
here (:func:`command_runner` applies it).

- 0: done; also a closed output (``| head`` that has read enough), which is not an error,
  unless the command left work undone because of it: ``publish`` then exits 141 (128 +
  SIGPIPE, :data:`EXIT_OUTPUT_CLOSED`), its input not all published;
- 1: an error (one line on stderr), also when a signal came first; 2: a usage error;
- after SIGINT (Ctrl-C) or SIGTERM, a command that runs until it is stopped (``tail``,
  ``stat``, ``to-file``, ``bridge``: a stop is how their run ends, as for nsq_tail or
  nsq_to_file and as a service manager expects) exits 0 once it stopped gracefully; a
  command that a signal cut short before its own end (``publish`` before its input's end)
  exits 130 or 143, 128 + the signal's number, as shells report a command a signal ended,
  so that a script around it sees its job was not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import signal
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import click

from smartnsq.cli.common import Stopped, run
from smartnsq.cli.interrupts import held_back, ignore_further_stops

__all__ = ["EXIT_INTERRUPTED", "EXIT_OUTPUT_CLOSED", "EXIT_TERMINATED", "StopEvent",
           "command_runner", "exit_code_after", "stop_event"]

P = ParamSpec("P")
T = TypeVar("T")

#: exit code after Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 128 + signal.SIGINT
#: exit code after SIGTERM (128 + SIGTERM)
EXIT_TERMINATED = 128 + signal.SIGTERM
#: ``publish``'s input was not all published because stdout's reader went away: 128 +
#: SIGPIPE, as shells report a command a broken pipe ended
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


def exit_code_after(signum: int) -> int:
    """The exit code of a command stopped by signal ``signum``: 128 + its number."""
    return 128 + signum


class StopEvent(asyncio.Event):
    """Set on SIGINT/SIGTERM; :attr:`signum` says which signal set it, :attr:`hurry` is set
    by a second signal (the operator does not want to wait for the graceful stop)."""

    signum: int | None = None

    def __init__(self, *, cuts_short: bool = False) -> None:
        super().__init__()
        self.hurry = asyncio.Event()
        #: a signal cuts the command's own job short (exit 128 + its number), rather than
        #: ending a run that lasts until it is stopped (exit 0)
        self.cuts_short = cuts_short

    def on_signal(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        elif self.is_set():
            self.hurry.set()
        self.set()

    def exit_code(self) -> int | None:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM), as shells report a
        command a signal ended, when a signal cut the command short; None when no signal
        came or the signal ended a run that lasts until it is stopped."""
        if self.signum is None or not self.cuts_short:
            return None
        return exit_code_after(self.signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a stop"


#: the signals that stop a command gracefully
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: the stop events of the command being run (see :func:`command_runner`)
_STOPS: contextvars.ContextVar[list[StopEvent] | None] = contextvars.ContextVar(
    "smartnsq_cli_stops", default=None)


def stop_event(*, cuts_short: bool = False) -> StopEvent:
    """Set on SIGINT/SIGTERM: commands stop gracefully (drain, FIN what is done, close).
    ``cuts_short``: the command has an end of its own that a signal comes before, so once it
    returns it exits with 128 + the signal's number (:func:`command_runner`); without it, a
    stop is the normal end of its run (exit 0)."""
    event = StopEvent(cuts_short=cuts_short)
    stops = _STOPS.get()
    if stops is not None:
        stops.append(event)
    loop = asyncio.get_running_loop()
    for sig in _STOP_SIGNALS:
        # not on every platform (Windows), nor outside the main thread (tests)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, event.on_signal, int(sig))
    return event


def _ending_after_a_signal() -> None:
    """The command is done after SIGINT or SIGTERM stopped it (its drain included): further
    ones are ignored while the process ends. The loop's handlers go first, or closing the
    loop would put Python's default ones (KeyboardInterrupt, termination) back."""
    loop = asyncio.get_running_loop()
    with held_back(_STOP_SIGNALS):
        # twice at most: a Ctrl-C that reached the process just before it was held back runs
        # its Python handler at the next bytecode, the default one (KeyboardInterrupt) once
        # the loop's is gone, and cuts the switch short; none can follow it
        for _ in range(2):
            try:
                for sig in _STOP_SIGNALS:
                    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                        loop.remove_signal_handler(sig)
                ignore_further_stops(_STOP_SIGNALS)
                return
            except KeyboardInterrupt:
                continue


def command_runner(fn: Callable[P, Awaitable[T]]) -> Callable[P, T]:
    """Decorate an ``async def`` command body so click can call it. A body that returns
    after a signal cut it short (its :func:`stop_event`, made with ``cuts_short``, was set
    by SIGINT/SIGTERM) exits with 128 + the signal's number; an error it raises keeps its
    own exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        stops: list[StopEvent] = []

        async def main() -> T:
            _STOPS.set(stops)  # this task's own context: the command's stop events
            try:
                return await fn(*args, **kwargs)
            except Stopped:
                return None  # type: ignore[return-value]  # stopped before any result
            finally:
                if any(s.signum is not None for s in stops):
                    _ending_after_a_signal()

        result = run(main())
        codes = [c for c in (s.exit_code() for s in stops) if c is not None]
        if codes:
            raise click.exceptions.Exit(codes[0])
        return result

    return wrapper
