"""The producer's connection pools, one :class:`~smartnsq.producer.pool.NodePool` per nsqd.

:class:`Nodes` owns every pool the producer made: with direct nsqd addresses the listed ones
(redialled in the background, picked round-robin skipping those in their reconnect backoff
and, while another one is connected, those waiting for a redial),
in lookupd mode one per leader the lookup names (made on first use). It also lets a publish
wait until some pool comes up again (the direct mode's "every node is in backoff" case).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from smartnsq.config import ProducerConfig
from smartnsq.errors import NSQConnectionError, NSQError
from smartnsq.producer.pool import NodePool

__all__ = ["Nodes"]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Nodes:
    """Every connection pool of one producer (see the module docstring)."""

    def __init__(self, config: ProducerConfig, direct: Sequence[str] = ()) -> None:
        self.config = config
        #: pools by ``host:port``
        self.pools: dict[str, NodePool] = {}
        #: the pools of the listed nsqd addresses (direct mode), in the order given
        self.direct: list[NodePool] = []
        self._rr = 0
        self._rng = random.Random()
        #: bounds dials across all nodes (many nodes listed must not mean as many dials)
        self._connect_slots = asyncio.Semaphore(config.max_concurrent_connects)
        self._up_waiters: set[asyncio.Future[None]] = set()
        for address in direct:
            if address not in self.pools:
                self.direct.append(self._new(address, auto_reconnect=True))

    def _new(self, address: str, *, auto_reconnect: bool) -> NodePool:
        pool = NodePool(address, self.config, auto_reconnect=auto_reconnect,
                        on_up=self._on_up, rng=self._rng,
                        connect_slots=self._connect_slots)
        self.pools[address] = pool
        return pool

    def pool_for(self, address: str) -> NodePool:
        """The pool of ``address``, made (without background redials) on first use."""
        pool = self.pools.get(address)
        if pool is None:
            pool = self._new(address, auto_reconnect=False)
        return pool

    def _on_up(self, pool: NodePool) -> None:
        for fut in self._up_waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_for_node(self, until: float) -> None:
        """Until some pool comes up or the loop time ``until``, whichever is first."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        handle = loop.call_at(until, _wake, fut)
        self._up_waiters.add(fut)
        try:
            await fut
        finally:
            handle.cancel()
            self._up_waiters.discard(fut)

    def pick_direct(self, avoid: set[str] | None, now: float) -> NodePool | None:
        """The next listed pool not in its backoff, preferring those not in ``avoid`` and
        those not waiting for a redial (taken only when nothing better is left)."""
        pools = self.direct
        n = len(pools)
        if n == 1:
            p = pools[0]
            return p if p.available(now) else None
        fallback: NodePool | None = None
        for _ in range(n):
            self._rr += 1
            p = pools[self._rr % n]
            standing = p.standing(now)
            if standing:
                if standing == 2 and (avoid is None or p.address not in avoid):
                    return p
                if fallback is None:
                    fallback = p
        return fallback

    def dial_failures(self) -> int:
        """Failed dials so far over the listed pools (each one counts as an attempt)."""
        return sum(p.dial_failures for p in self.direct)

    def no_node_error(self) -> NSQError:
        """Why no listed nsqd can take a publish now (each one's last error)."""
        reasons = "; ".join(f"{p.address}: {p.last_error}" for p in self.direct
                            if p.last_error is not None)
        err = NSQConnectionError(f"no nsqd reachable ({reasons or 'all in backoff'})")
        last = next((p.last_error for p in self.direct if p.last_error is not None), None)
        err.__cause__ = last
        return err

    async def close(self) -> None:
        """Wake every waiter, then close every pool."""
        for fut in self._up_waiters:
            if not fut.done():
                fut.set_result(None)
        await asyncio.gather(*(p.close() for p in self.pools.values()), return_exceptions=True)
