"""The end of a producer's accepted publishes when it stops: its ordered lanes, its open and
outstanding auto-batches and its publishes in flight get ``limit`` seconds to be answered;
what is still unanswered then is given up, and its callers get :class:`ClientClosedError`
(nsqd may have stored it), as a publish of its own does (a ``CancelledError`` their tasks
never asked for would end them as if cancelled: a web framework's request as a client
disconnect).

Caller: :meth:`smartnsq.Producer.stop`, before it closes the connections.
"""

from __future__ import annotations

import asyncio
import logging

from smartnsq.errors import ClientClosedError
from smartnsq.producer.batcher import Batcher
from smartnsq.producer.engine import TcpEngine
from smartnsq.producer.lanes import ShardLanes

__all__ = ["settle"]

logger = logging.getLogger("smartnsq.producer")


async def settle(lanes: ShardLanes, batcher: Batcher | None, engine: TcpEngine,
                 limit: float) -> None:
    """See the module docstring."""
    try:
        async with asyncio.timeout(limit):
            await lanes.drain()
            if batcher is not None:
                await batcher.drain()
            await engine.wait_idle()
    except TimeoutError:
        logger.warning("producer closed with publishes still in flight after %gs", limit)
    await lanes.abort()
    if batcher is not None:
        await batcher.abort(ClientClosedError(
            "the producer stopped before nsqd answered the batch (nsqd may have stored it)"))
