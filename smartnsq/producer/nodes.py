"""The producer's connection pools, one :class:`~smartnsq.producer.pool.NodePool` per nsqd.

:class:`Nodes` owns every pool the producer made: with direct nsqd addresses the listed ones
(redialled in the background; :attr:`Nodes.direct` picks them round-robin, skipping those in
their reconnect backoff and, while another one is connected, those waiting for a redial, and
lets a publish wait until one comes up again), in lookupd mode one per leader the lookup names
(made on first use: :meth:`Nodes.target` is the retry engine's way from a route's address to a
pool, and forgotten once no route names the nsqd and nothing is under way on it, so nsqd
replaced by new addresses leave no pool behind). The pools share one reconnect backoff
policy, made from the config.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Collection, Sequence

from smartnsq.backoff import Backoff
from smartnsq.config import ProducerConfig
from smartnsq.errors import ClientClosedError
from smartnsq.metrics.catalog import address_label
from smartnsq.producer.observe import PublishMetrics
from smartnsq.producer.pool import NodePool, reconnect_backoff
from smartnsq.producer.router import TopicRoute
from smartnsq.producer.sweeps import SweepSchedule
from smartnsq.producer.targets import DirectTargets

__all__ = ["Nodes"]

#: lookupd-mode pools made before the first sweep of those no route names
SWEEP_MIN = 16


class Nodes:
    """Every connection pool of one producer (see the module docstring)."""

    def __init__(self, config: ProducerConfig, direct: Sequence[str] = (),
                 backoff: Backoff | None = None) -> None:
        self.config = config
        #: how long a node stays down after its n-th consecutive failure
        self.backoff = backoff if backoff is not None else reconnect_backoff(config)
        #: pools by ``host:port``
        self.pools: dict[str, NodePool] = {}
        #: bounds dials across all nodes (many nodes listed must not mean as many dials)
        self._connect_slots = asyncio.Semaphore(config.max_concurrent_connects)
        #: the producer's metrics (None: off): reconnects are counted into it
        self.obs: PublishMetrics | None = None
        #: lookupd mode: the nsqd addresses the routes name now (set by the wiring)
        self.named: Callable[[], Collection[str]] | None = None
        self._sweeps = SweepSchedule(SWEEP_MIN)
        #: swept pools a publish may still hold (closed with the others at the end)
        self._swept: weakref.WeakSet[NodePool] = weakref.WeakSet()
        listed: list[NodePool] = []
        for address in direct:
            if address not in self.pools:
                listed.append(self._new(address, auto_reconnect=True))
        #: the pools of the listed nsqd addresses (direct mode), in the order given
        self.direct = DirectTargets(listed)

    def _new(self, address: str, *, auto_reconnect: bool) -> NodePool:
        pool = NodePool(address, self.config, auto_reconnect=auto_reconnect,
                        on_up=self._on_up, on_reconnect=self._on_reconnect,
                        backoff=self.backoff, connect_slots=self._connect_slots)
        self.pools[address] = pool
        return pool

    def target(self, route: TopicRoute, address: str) -> NodePool:
        """The pool of nsqd ``address`` a route names (lookupd mode), made (without
        background redials) on first use."""
        return self.pool(address)

    def pool(self, address: str) -> NodePool:
        """The pool of nsqd ``address``: a listed one, or (lookupd mode) made without
        background redials on first use."""
        pool = self.pools.get(address)
        if pool is not None:
            return pool
        if self.direct.closed:
            # a publish retrying after the producer stopped must not dial a new nsqd
            raise ClientClosedError(f"the producer is stopped (no pool for nsqd {address})")
        if self.named is not None and self._sweeps.due(len(self.pools)):
            self._sweep(self.named())
        return self._new(address, auto_reconnect=False)

    def _sweep(self, named: Collection[str]) -> None:
        """Forget the pools of nsqd no route names that have nothing under way."""
        listed = set(self.direct.targets)
        for address, pool in list(self.pools.items()):
            if address not in named and pool not in listed and pool.idle:
                del self.pools[address]
                self._swept.add(pool)
        self._sweeps.swept(len(self.pools))

    def _on_up(self, pool: NodePool) -> None:
        self.direct.up()

    def _on_reconnect(self, pool: NodePool) -> None:
        if self.obs is not None:
            self.obs.reconnect(pool.address)

    def connection_states(self) -> list[tuple[tuple[str, str], float]]:
        """The producer's connections by (nsqd, state) for the connections gauge; runs on
        the metrics exporter's thread (the pools are copied first)."""
        out: list[tuple[tuple[str, str], float]] = []
        for address, pool in list(self.pools.items()):
            ready, connecting, closed = pool.state_counts()
            nsqd = address_label(address)
            out += [((nsqd, "ready"), ready), ((nsqd, "connecting"), connecting),
                    ((nsqd, "closed"), closed)]
        return out

    async def close(self, within: float | None = None) -> None:
        """Wake every waiter, then close every pool (``within``: see
        :meth:`NodePool.close`)."""
        self.direct.close()
        pools = [*self.pools.values(), *self._swept]
        await asyncio.gather(*(p.close(within) for p in pools), return_exceptions=True)

