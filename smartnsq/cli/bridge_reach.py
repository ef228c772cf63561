"""``smartnsq bridge``'s start: wait until the destination accepts a connection, before
anything is read from the source.

With ``--to-nsqd`` the dial is the producer's own (its connection pool of that nsqd), so the
connection made here is the one the first publish uses. With ``--to-lookupd`` the producer
has no pool of a node before its first publish routes there, so the nodes the lookup names
are dialled on a connection of their own, closed again (one extra connection per run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from smartnsq.cli.bridge_forward import retrying
from smartnsq.cli.common import CliError, describe, err_print
from smartnsq.cli.connections import REMIND_SECONDS
from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection
from smartnsq.producer import Producer
from smartnsq.protocol.validation import parse_tcp_address

#: seconds between two rounds of dials to an unreachable destination
REDIAL_SECONDS = 0.5


def _named(address: str, exc: BaseException) -> str:
    text = describe(exc)
    return text if address in text else f"nsqd {address}: {text}"


async def _refusal(address: str, config: ConnectionConfig) -> str | None:
    """Why the nsqd at ``address`` refused a connection (dial and IDENTIFY), None if not."""
    host, port = parse_tcp_address(address)
    conn = Connection(host, port, config)
    try:
        await conn.connect()
    except Exception as exc:  # any failure to connect is the answer here
        return _named(address, exc)
    await conn.close()
    return None


async def _pool_refusal(producer: Producer, address: str) -> str | None:
    """As :func:`_refusal`, through the producer's pool of ``address``: a connection made
    stays in the pool. A pool in its reconnect backoff answers with its last failure (its
    own redial runs in the background)."""
    pool = producer.pools[address]
    if pool.is_up:
        return None
    if not pool.available(asyncio.get_running_loop().time()):
        return _named(address, pool.last_error) if pool.last_error is not None else \
            f"nsqd {address}: waiting to redial"
    try:
        await pool.get()
    except Exception as exc:  # any failure to connect is the answer here
        return _named(address, exc)
    return None


async def reach_destination(producer: Producer, addresses: Sequence[str],
                            config: ConnectionConfig, bound: float) -> None:
    """Return once one of the destination's nsqd ``addresses`` accepts a connection. Until
    then the reason is on stderr (at once, then every :data:`REMIND_SECONDS`); after
    ``bound`` seconds (0: never) raise :class:`CliError` with it. Nothing has been read
    from the source yet, so failing here costs it nothing."""
    loop = asyncio.get_running_loop()
    began, shown_at = loop.time(), None
    why = ""
    pooled = all(a in producer.pools for a in addresses)
    while True:
        left = began + bound - loop.time() if bound else None
        try:
            async with asyncio.timeout(left):
                refusals = await asyncio.gather(*(
                    _pool_refusal(producer, a) if pooled else _refusal(a, config)
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
