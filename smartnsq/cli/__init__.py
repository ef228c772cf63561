"""The ``smartnsq`` command line. It needs the ``cli`` extra (click and rich), which a client
library's users, such as Spark executors and web apps, do not need:
``pip install 'smartnsq[cli]'``. :func:`main` says so, instead of a traceback, when the extra
is missing; the commands live in :mod:`smartnsq.cli.app`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence

from smartnsq.cli.interrupts import guard_imports

__all__ = ["main"]

#: the ``cli`` extra's distributions, by the module each one installs
_EXTRA = {"click": "click", "rich": "rich"}

#: exit code after Ctrl-C (128 + SIGINT), as the commands themselves exit (cli.stopping)
_EXIT_INTERRUPTED = 128 + signal.SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``smartnsq`` console script (and ``python -m smartnsq``)."""
    _closed_stderr_to_devnull()
    # Ctrl-C while the commands are still importing (most of the start-up) ends
    # quietly with 130, as it does once a command runs, instead of a traceback out of
    # whichever import it hit; repeated Ctrl-C while ending says nothing more either
    guard = guard_imports()
    try:
        run = _load()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stderr.write("smartnsq: interrupted\n")
        return _EXIT_INTERRUPTED
    finally:
        guard()
    if run is None:
        return 1
    return run(argv)


def _closed_stderr_to_devnull() -> None:
    """Started with stderr closed (``2>&-``), Python has no ``sys.stderr``, and every
    ``print(..., file=sys.stderr)`` writes to stdout, into the data a pipeline reads. The
    diagnostics go to /dev/null instead, on descriptor 2, which a socket opened later would
    otherwise take."""
    if sys.stderr is not None:
        return
    fd = os.open(os.devnull, os.O_WRONLY)
    if fd != 2:
        os.dup2(fd, 2)
        os.close(fd)
    sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # noqa: SIM115


def _load() -> Callable[[Sequence[str] | None], int] | None:
    """The commands' entry point; None (having said why) when the extra is missing."""
    import importlib

    for module, dist in _EXTRA.items():
        try:
            importlib.import_module(module)
        except ImportError:
            sys.stderr.write(
                f"smartnsq: the command line needs the 'cli' extra ({dist} is not installed):"
                " pip install 'smartnsq[cli]'\n")
            return None
    from smartnsq.cli.app import main as run

    return run
