"""A producer's stop: graceful unless cut short (one run however many callers wait for it,
:class:`~smartnsq.stop_run.StopRun`).

Graceful: the producer's ordered lanes, its open and outstanding auto-batches and its
publishes in flight get ``limit`` seconds to be answered; what is still unanswered then is
given up, and its callers get :class:`ClientClosedError` (nsqd may have stored it), as a
publish of its own does (a ``CancelledError`` their tasks never asked for would end them as
if cancelled: a web framework's request as a client disconnect). Then the connections close
(answers still awaited up to their ``close_timeout``), and the lookup component the producer
made stops.

Cut short (a caller cancelled while it waits): what is unanswered is given up as above, at
once, and the connections close without waiting for answers.

Caller: :meth:`smartnsq.Producer.stop`.
"""

from __future__ import annotations

import asyncio
import logging

from smartnsq.errors import ClientClosedError
from smartnsq.lookup import Lookup
from smartnsq.producer.batcher import Batcher
from smartnsq.producer.engine import TcpEngine
from smartnsq.producer.instruments import ProducerInstruments
from smartnsq.producer.lanes import ShardLanes
from smartnsq.producer.nodes import Nodes
from smartnsq.producer.router import Routes
from smartnsq.stop_run import StopRun

__all__ = ["ProducerStop"]

logger = logging.getLogger("smartnsq.producer")


class ProducerStop:
    """See the module docstring. ``lookup``: the lookup component to stop (the producer's
    own, not a shared one)."""

    def __init__(self, lanes: ShardLanes, batcher: Batcher | None, engine: TcpEngine,
                 routes: Routes | None, nodes: Nodes, instruments: ProducerInstruments,
                 lookup: Lookup | None) -> None:
        self._lanes = lanes
        self._batcher = batcher
        self._engine = engine
        self._routes = routes
        self._nodes = nodes
        self._instruments = instruments
        self._lookup = lookup
        self._run = StopRun(self._cut_short)

    @property
    def done(self) -> bool:
        """The stop ran to its end (gracefully or cut short)."""
        return self._run.done

    async def run(self, limit: float) -> None:
        """Stop (``limit``: the seconds accepted publishes get), or wait for the stop under
        way; cancelled, cut it short first."""
        self._run.start(lambda: self._stop(limit))
        await self._run.wait()

    async def _stop(self, limit: float) -> None:
        try:
            async with asyncio.timeout(limit):
                await self._lanes.drain()
                if self._batcher is not None:
                    await self._batcher.drain()
                await self._engine.wait_idle()
        except TimeoutError:
            logger.warning("producer closed with publishes still in flight after %gs", limit)
        await self._give_up()
        await self._close(None)

    async def _cut_short(self) -> None:
        await self._give_up()
        await self._close(0.0)
        logger.warning("producer: stop() was cancelled; its connections were closed without "
                       "waiting for answers (publishes unanswered failed with "
                       "ClientClosedError: nsqd may have stored them)")

    async def _give_up(self) -> None:
        await self._lanes.abort()
        if self._batcher is not None:
            await self._batcher.abort(ClientClosedError(
                "the producer stopped before nsqd answered the batch (nsqd may have stored "
                "it)"))

    async def _close(self, within: float | None) -> None:
        """Close the connections (``within``: how long answers are awaited; None: each
        connection's ``close_timeout``) and the producer's own lookup component."""
        if self._routes is not None:
            await self._routes.close()
        await self._nodes.close(within)
        self._instruments.close()
        if self._lookup is not None:
            await self._lookup.stop()
