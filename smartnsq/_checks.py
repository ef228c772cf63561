"""Argument checks shared by every public call: one rule for durations and counts.

A duration is a real number of seconds, finite and >= 0 (``bool`` is refused although it is
an ``int``): a NaN or an infinity reaching a loop timer corrupts the timer heap's ordering
and stalls every other timer on that loop, so none may pass. Errors name the argument and
the value given.
"""

from __future__ import annotations

import asyncio
import math
import threading
import types

from smartnsq.errors import ConfigError, EventLoopError

__all__ = ["check_count", "check_duration", "check_loop", "check_optional_duration",
           "type_named"]


def type_named(value: object) -> str:
    """What a wrong argument is, for its error: ``the module m`` for a module (a common
    slip: the package instead of one of its objects), else the type's full name."""
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}"
    return f"{type(value).__module__}.{type(value).__qualname__}"


def check_duration(value: object, name: str, *, positive: bool = False) -> float:
    """``value`` as a float of seconds, or ConfigError naming ``name``.

    ``positive`` also refuses 0 (for bounds where 0 could never succeed)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r} "
                          f"({type(value).__name__})")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"{name} must be {bound} seconds, got {value!r}")
    return seconds


def check_optional_duration(value: object, name: str, *, positive: bool = False
                            ) -> float | None:
    """Like :func:`check_duration`, with None passed through (meaning "the default")."""
    if value is None:
        return None
    return check_duration(value, name, positive=positive)


def check_count(value: object, name: str, *, minimum: int = 0,
                maximum: int | None = None) -> int:
    """``value`` as an int within ``minimum..maximum``, or ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        rng = f">= {minimum}" if maximum is None else f"within {minimum}..{maximum}"
        raise ConfigError(f"{name} must be {rng}, got {value}")
    return value


def check_loop(bound: asyncio.AbstractEventLoop | None, what: str) -> None:
    """Raise EventLoopError unless the caller runs on ``bound`` (None: not bound yet).

    A client's connections, futures and timers belong to one loop; touching them from
    another loop or thread writes to a socket that loop does not own and fails (or worse,
    half succeeds) afterwards, so the call is refused before anything happens."""
    if bound is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not bound:
        where = ("no running event loop" if running is None
                 else "a different event loop")
        raise EventLoopError(
            f"{what} belongs to the event loop it was started on, but was called from "
            f"{where} (thread {threading.current_thread().name!r}); use it from its own "
            "loop, or use smartnsq.sync from other threads")
