"""How the reading commands (``tail``, ``to-file``, ``bridge``) run their consumer: saying why
one reads nothing, bounding the wait for a first connection, and naming ``--ordered`` for an
ordered topic.

The consumer's warnings (``cannot subscribe at HOST:PORT ...: the connection error``) reach
stderr whatever ``-v`` says, also while another nsqd is connected (one of several that is
down, or lost later, is named), and a command that never connected gives up after
``--connect-timeout``; one that lost a connection later keeps retrying, saying so.
The consumer reports connection failures only through its log, so that log is where they are
taken from: a handler on the ``smartnsq.consumer`` logger, lowered to WARNING for the command's
run (``-v`` decides only what the rich log handler shows, see :func:`cli_logging`).

An ordered youzan topic refuses a plain SUB (``E_SUB_ORDER_IS_MUST``): the commands read it
with SUB_ORDERED when given ``--ordered`` (through the lookupds) and otherwise say so in the
operator's terms, not the library's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import click

from smartnsq.cli.common import CliError, consume_until, err_print
from smartnsq.errors import SubOrderIsMustError, WrongPortError

if TYPE_CHECKING:
    from smartnsq.consumer import Consumer
    from smartnsq.lookup import TopicView

P = ParamSpec("P")
T = TypeVar("T")

#: seconds a reading command waits for its first connection before giving up
CONNECT_TIMEOUT = 10.0

ORDERED_HINT = ("topic {topic!r} is ordered: it is read one message at a time per partition "
                "(SUB_ORDERED); {how}")

#: while still unconnected, the latest warning is shown again after this many seconds
REMIND_SECONDS = 5.0
#: how often the consumer's connections are looked at
POLL_SECONDS = 0.1


class ConsumerWarnings(logging.Handler):
    """The consumer's warnings, newest last (only the few needed to explain a failure)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        #: warnings received so far (``lines`` keeps only the newest)
        self.count = 0
        #: the first warning about an address that answered as another listener: retrying
        #: the same address cannot help, so the command ends with it
        self.wrong_port: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
        except Exception:  # a malformed record must not break the command
            return
        self.lines = [*self.lines[-7:], text]
        self.count += 1
        args = record.args if isinstance(record.args, tuple) else ()
        if self.wrong_port is None and any(isinstance(a, WrongPortError) for a in args):
            self.wrong_port = text

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
    """Run beside a started ``consumer``: print its newest warning on stderr, at once, then
    every :data:`REMIND_SECONDS` (while it holds no connection, as a reminder; while some
    nsqd is connected, only warnings not shown yet: another nsqd down); raise
    :class:`CliError` when it never connected within ``bound`` seconds of ``began`` (loop
    time; 0: keep trying), or at once when, still unconnected, an address answered as
    another listener (a wrong port). After a connection was lost it keeps trying, saying so
    the same way."""
    loop = asyncio.get_running_loop()
    ever = False
    #: a warning was shown in the current outage (no connection at all)
    shown = False
    shown_at = -REMIND_SECONDS
    #: ``warnings.count`` when the latest warning was shown
    printed = 0
    while True:
        now = loop.time()
        last = warnings.last
        new = warnings.count > printed
        if _connected(consumer):
            ever = True
            shown = False
            due = new and now - shown_at >= REMIND_SECONDS
        else:
            due = last is not None and (new if not shown else now - shown_at >= REMIND_SECONDS)
        if due and last is not None:
            tail = ("; retrying" if ever or not bound else
                    f"; retrying for up to {bound:g} s (--connect-timeout)")
            err_print(f"smartnsq: warning: {last}{tail}")
            shown, shown_at, printed = True, now, warnings.count
        if not ever and warnings.wrong_port is not None:
            raise CliError(warnings.wrong_port)
        if not ever and bound and now - began >= bound:
            why = f": {last}" if last else ""
            raise CliError(f"no nsqd accepted the subscription within {bound:g} s "
                           f"(--connect-timeout){why}")
        await asyncio.sleep(POLL_SECONDS)


def connect_timeout_option() -> Callable[[Callable[P, T]], Callable[P, T]]:
    """``--connect-timeout SECONDS`` (default :data:`CONNECT_TIMEOUT`; 0: keep trying)."""
    return click.option(
        "--connect-timeout", type=click.FloatRange(min=0), default=CONNECT_TIMEOUT,
        show_default=True, metavar="SECONDS",
        help="exit with an error when no nsqd accepted the subscription within SECONDS "
             "(0: keep trying). Until one does, connection errors are shown on stderr; a "
             "connection lost later is retried for ever, also shown")


def refuse_unordered(view: TopicView, ordered: bool) -> None:
    """The lookup says ``view``'s topic is ordered and ``--ordered`` was not given."""
    if view.ordered and not ordered:
        raise CliError(ORDERED_HINT.format(topic=view.topic, how="add --ordered"))


async def consume_watched(consumer: Consumer, *events: asyncio.Event, connect_timeout: float,
                          lookupd_flag: str = "--lookupd",
                          guards: Sequence[Callable[[], Awaitable[None]]] = (),
                          before_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """:func:`~smartnsq.cli.common.consume_until` with the connection watch beside it
    (:func:`watch_connections`, bounded by ``connect_timeout``). An nsqd that refuses the plain
    SUB of an ordered topic (only reachable straight at the nsqd, where ``--ordered`` is not
    offered) ends the command with the advice to read it through ``lookupd_flag``."""
    began = asyncio.get_running_loop().time()
    with consumer_warnings() as warnings:
        watch = functools.partial(watch_connections, consumer, warnings,
                                  bound=connect_timeout, began=began)
        try:
            await consume_until(consumer, *events, guards=[watch, *guards],
                                before_stop=before_stop)
        except SubOrderIsMustError:
            raise CliError(ORDERED_HINT.format(
                topic=consumer.topic, how=f"use {lookupd_flag} with --ordered")) from None
