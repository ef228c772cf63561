"""``smartnsq bridge``'s start: wait until the destination accepts a connection, before
anything is read from the source.

The dial is the producer's own (its connection pool of each nsqd: with ``--to-lookupd`` of
each node the destination topic's lookup names, made ahead of the first publish routed
there), so the connection made here is the one the publishes use: no extra connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from smartnsq.cli.bridge_forward import retrying
from smartnsq.cli.common import CliError, describe, err_print
from smartnsq.cli.connections import REMIND_SECONDS

if TYPE_CHECKING:  # the producer (aiohttp, pydantic) loads when bridge runs
    from smartnsq.producer import Producer

#: seconds between two rounds of dials to an unreachable destination
REDIAL_SECONDS = 0.5


def _named(address: str, exc: BaseException) -> str:
    text = describe(exc)
    return text if address in text else f"nsqd {address}: {text}"


def _refusal(address: str, exc: BaseException) -> str:
    """The reason to retry after ``exc``; a :class:`CliError` at once for what the
    producer's publishes would not retry either (a refused secret, TLS required, a
    certificate either side refuses, settings nsqd does not take): waiting for
    ``--connect-timeout`` changes nothing, as for ``publish`` and the source side."""
    from smartnsq.producer.retry import Action, classify

    if classify(exc) is Action.RAISE:
        raise CliError(f"the destination refused the connection: {_named(address, exc)}")
    return _named(address, exc)


async def _pool_refusal(producer: Producer, address: str) -> str | None:
    """Why the nsqd at ``address`` refused a connection (dial and IDENTIFY), None if not,
    asked through the producer's pool of ``address``: a connection made stays in the pool.
    A pool in its reconnect backoff answers with its last failure (a listed nsqd's pool
    redials in the background, a looked-up one's on the next round)."""
    pool = producer.pool(address)
    if pool.is_up:
        return None
    if not pool.available(asyncio.get_running_loop().time()):
        return _refusal(address, pool.last_error) if pool.last_error is not None else \
            f"nsqd {address}: waiting to redial"
    try:
        await pool.get()
    except Exception as exc:  # any failure to connect is the answer here
        return _refusal(address, exc)
    return None


async def reach_destination(producer: Producer, addresses: Sequence[str],
                            bound: float) -> None:
    """Return once one of the destination's nsqd ``addresses`` accepts a connection. Until
    then the reason is on stderr (at once, then every :data:`REMIND_SECONDS`); after
    ``bound`` seconds (0: never) raise :class:`CliError` with it. Nothing has been read
    from the source yet, so failing here costs it nothing."""
    loop = asyncio.get_running_loop()
    began, shown_at = loop.time(), None
    why = ""
    while True:
        left = began + bound - loop.time() if bound else None
        try:
            async with asyncio.timeout(left):
                refusals = await asyncio.gather(*(_pool_refusal(producer, a)
                                                  for a in addresses))
        except TimeoutError:
            # the bound ran out during this round: the previous round's reason is the news
            why = why or "; ".join(f"nsqd {a}: no answer" for a in addresses)
        else:
            if None in refusals:
                return
            why = "; ".join(r for r in refusals if r is not None)
        now = loop.time()
        if bound and now - began >= bound:
            raise CliError(f"no destination nsqd accepted a connection within {bound:g} s "
                           f"(--connect-timeout): {why}")
        if shown_at is None or now - shown_at >= REMIND_SECONDS:
            err_print(f"smartnsq: warning: cannot reach the destination: {why}{retrying(bound)}")
            shown_at = now
        await asyncio.sleep(REDIAL_SECONDS if left is None else min(REDIAL_SECONDS, left))
