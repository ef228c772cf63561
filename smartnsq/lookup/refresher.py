"""Background loops that repeat a round at a jittered interval and never die of an error."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from smartnsq.errors import LookupFailedError

log = logging.getLogger("smartnsq.lookup")


def jittered_delay(interval: float, jitter: float, rng: random.Random) -> float:
    """``interval`` plus up to ``jitter × interval``, as youzan go-nsq spreads its polls.

    Never shorter than the configured interval, so jitter never adds load; clients started
    together drift apart instead of polling in lockstep.
    """
    return interval * (1.0 + jitter * rng.random())


async def run_periodically(
    what: str,
    round_: Callable[[], Awaitable[object]],
    delay: Callable[[], float],
    *,
    immediately: bool,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Run ``round_`` with ``delay()`` seconds between runs, until cancelled or until
    ``stop()``, asked after each pause, says True.

    Lookup failures were already logged per lookupd, so they are logged briefly here;
    anything else is a bug and is logged with its traceback. Nothing escapes.
    """
    first = immediately
    while True:
        if not first:
            await asyncio.sleep(delay())
            if stop is not None and stop():
                return
        first = False
        try:
            await round_()
        except LookupFailedError as exc:
            log.debug("%s: %s", what, exc)
        except Exception:
            log.exception("%s: unexpected error (the refresher keeps running)", what)
