"""Saying why a reading command reads nothing: while its consumer holds no connection, the
consumer's warnings (``cannot subscribe at HOST:PORT ...: the connection error``) reach stderr
whatever ``-v`` says, and a command that never connected gives up after a bound.

The consumer reports connection failures only through its log, so that log is where they are
taken from: a handler on the ``smartnsq.consumer`` logger, lowered to WARNING for the command's
run (``-v`` decides only what the rich log handler shows, see :func:`cli_logging`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from smartnsq.cli.common import CliError, err_print
from smartnsq.consumer import Consumer

#: while still unconnected, the latest warning is shown again after this many seconds
REMIND_SECONDS = 5.0
#: how often the consumer's connections are looked at
POLL_SECONDS = 0.1


class ConsumerWarnings(logging.Handler):
    """The consumer's warnings, newest last (only the few needed to explain a failure)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
        except Exception:  # a malformed record must not break the command
            return
        self.lines = [*self.lines[-7:], text]

    @property
    def last(self) -> str | None:
        return self.lines[-1] if self.lines else None


@contextlib.contextmanager
def consumer_warnings() -> Iterator[ConsumerWarnings]:
    """Collect the consumer's warnings for the duration (logger level restored after)."""
    logger = logging.getLogger("smartnsq.consumer")
    saved = logger.level
    handler = ConsumerWarnings()
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


def _connected(consumer: Consumer) -> bool:
    return any(s.connected for s in consumer.stats().subscriptions)


async def watch_connections(consumer: Consumer, warnings: ConsumerWarnings, *,
                            bound: float, began: float) -> None:
    """Run beside a started ``consumer``: while it holds no connection, print its newest
    warning on stderr (at once, then every :data:`REMIND_SECONDS`); raise :class:`CliError`
    when it never connected within ``bound`` seconds of ``began`` (loop time; 0: keep
    trying). After a connection was lost it keeps trying, saying so the same way."""
    loop = asyncio.get_running_loop()
    ever = False
    shown: str | None = None
    shown_at = 0.0
    while True:
        now = loop.time()
        if _connected(consumer):
            ever = True
            shown = None
            warnings.lines.clear()  # the next outage is told by its own warnings
        else:
            last = warnings.last
            if last is not None and (shown is None or now - shown_at >= REMIND_SECONDS):
                tail = ("; retrying" if ever or not bound else
                        f"; retrying for up to {bound:g} s (--connect-timeout)")
                err_print(f"smartnsq: warning: {last}{tail}")
                shown, shown_at = last, now
            if not ever and bound and now - began >= bound:
                why = f": {warnings.last}" if warnings.last else ""
                raise CliError(f"no nsqd accepted the subscription within {bound:g} s "
                               f"(--connect-timeout){why}")
        await asyncio.sleep(POLL_SECONDS)
