"""The consumer's stop sequence over its parts: the graceful one that ``stop()`` runs, and the
one that ends a cancelled ``stop()`` at once. The consumer keeps the lifecycle flags and calls
these; each step is owned by the part it names."""

from __future__ import annotations

import asyncio

from smartnsq.config import ConsumerConfig
from smartnsq.consumer.discovery import Discovery
from smartnsq.consumer.dispatch import Dispatcher
from smartnsq.consumer.observe import Observability
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.subscriptions import SubscriptionSet

__all__ = ["StopSteps"]


class StopSteps:
    """See the module docstring."""

    def __init__(self, config: ConsumerConfig, driver: RdyDriver,
                 subscriptions: SubscriptionSet, discovery: Discovery, dispatch: Dispatcher,
                 observe: Observability) -> None:
        self._config = config
        self._driver = driver
        self._subscriptions = subscriptions
        self._discovery = discovery
        self._dispatch = dispatch
        self._observe = observe

    async def graceful(self, drain_timeout: float) -> None:
        loop = asyncio.get_running_loop()
        subscriptions, dispatch, driver = self._subscriptions, self._dispatch, self._driver
        # 1. no more deliveries, before anything else can happen: RDY 0 now (max_in_flight 0
        # in the flow keeps it from raising RDY again), so nothing returned below can come
        # straight back to us; what is already on its way waits in the buffer until step 3.
        # The messages let in are still handled concurrently (the workers' cap)
        driver.close()
        driver.set_max_in_flight(0)
        subscriptions.rdy_zero()
        await subscriptions.conns.close()
        await self._discovery.close()
        # 2. CLS: only CLOSE_WAIT proves that no message is still on its way to us. CLS and
        # the final close share one close_timeout, so stop() takes at most drain_timeout +
        # close_timeout however the server behaves
        close_deadline = loop.time() + self._config.connection.close_timeout
        await subscriptions.cls_all()
        # 3. iterated messages nobody took yet go back at once
        dispatch.requeue_buffered()
        # 4. let in-flight messages be answered
        await dispatch.drain(drain_timeout)
        # 5. close (what was written goes out first)
        drain_end = loop.time()
        close_deadline = max(close_deadline, drain_end)
        await subscriptions.close_all(close_deadline - drain_end)
        await dispatch.stop_workers(close_deadline)
        if driver.flow is not None:
            driver.flush()
        self._observe.stop()

    async def cut_short(self) -> None:
        """After a cancelled :meth:`graceful`: what is in flight is requeued (nsqd would
        hold it until its message timeout after a close), and the connections are closed
        without waiting for answers; what was written (FINs, those REQs) still goes out."""
        dispatch = self._dispatch
        self._driver.close()
        dispatch.requeue_buffered()
        dispatch.requeue_outstanding()
        await self._subscriptions.conns.close()
        await self._discovery.close()
        await self._subscriptions.close_all(0.0)
        await dispatch.stop_workers(asyncio.get_running_loop().time())
        self._observe.stop()
