"""Where a publish goes: partition choice and the per-topic routes fed by the lookup component.

:class:`TopicRoute` is what one :class:`~smartnsq.lookup.TopicView` (``access=w``,
``metainfo=true``) means for a producer: a slot per partition id holding the leader's address
(empty when the partition has no leader, is not writable, or its mapping was dropped after a
leader-type error), plus the old non-partitioned nodes, which take the stock commands.

Round-robin (docs/protocol.md §8.2, youzan go-nsq): a per-topic counter is incremented *before*
each pick, so the first message goes to partition ``1 % n``; empty slots are skipped, at most
``n`` tries. A topic with a single partition always uses partition 0.

:class:`Routes` keeps one route per topic and makes refreshes coalesce: a publish that saw a
stale leader calls :meth:`Routes.refresh` with the route it used; if a newer route is already
installed it gets that one at once, else it joins the refresh in progress or starts the one
refresh every other caller joins (the lookup component coalesces again underneath).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable

from smartnsq.errors import Flavour, LookupFailedError
from smartnsq.lookup import Lookup, TopicView
from smartnsq.producer.sweeps import SweepSchedule
from smartnsq.protocol.validation import parse_http_address

logger = logging.getLogger("smartnsq.producer")

#: how often (seconds) a cached route is compared with the lookup component's current view,
#: which the component refreshes in the background every ``poll_interval``
RECHECK_INTERVAL = 1.0
#: routes kept before the first sweep of those whose topic the lookup forgot
SWEEP_MIN = 64


class TopicRoute:
    """A producer's picture of one topic, built from one view (see the module docstring)."""

    __slots__ = ("counter", "legacy", "legacy_counter", "partition_num", "recheck_at",
                 "slots", "topic", "view", "writable")

    def __init__(self, view: TopicView, now: float = 0.0) -> None:
        self.view = view
        self.topic = view.topic
        n = view.partition_num
        if view.partitions:
            n = max(n, max(view.partitions) + 1)
        #: partitions as far as sharding is concerned (meta.partition_num when valid)
        self.partition_num = view.partition_num
        slots: list[str | None] = [None] * n
        for pid, node in view.partitions.items():
            slots[pid] = node.address
        self.slots = slots
        self.writable = sum(1 for s in slots if s is not None)
        self.legacy: tuple[str, ...] = tuple(view.legacy_nodes)
        self.counter = 0
        self.legacy_counter = 0
        self.recheck_at = now + RECHECK_INTERVAL

    def __repr__(self) -> str:
        return (f"<TopicRoute {self.topic!r} slots={self.slots} legacy={list(self.legacy)} "
                f"flavour={self.view.flavour.value}>")

    @property
    def partitioned(self) -> bool:
        """Publishes name a partition (youzan HA topic)."""
        return bool(self.slots)

    @property
    def stock(self) -> bool:
        """Stock lookupds: no partitions, nothing youzan-only may be used."""
        return self.view.flavour is Flavour.STOCK

    @property
    def ordered(self) -> bool:
        return self.view.meta.ordered

    @property
    def has_targets(self) -> bool:
        return self.writable > 0 or bool(self.legacy)

    def leader(self, partition: int) -> str | None:
        slots = self.slots
        return slots[partition] if partition < len(slots) else None

    def pick(self, avoid: Iterable[int] | None = None) -> int | None:
        """Next partition round-robin, skipping empty slots and ``avoid``; None if none."""
        slots = self.slots
        n = len(slots)
        if n == 1:
            return 0 if slots[0] is not None and not (avoid and 0 in avoid) else None
        self.counter += 1
        start = self.counter
        for i in range(n):
            p = (start + i) % n
            if slots[p] is not None and not (avoid and p in avoid):
                if i:
                    self.counter = start + i
                return p
        return None

    def pick_legacy(self, avoid: Iterable[str] | None = None) -> str | None:
        legacy = self.legacy
        n = len(legacy)
        for _ in range(n):
            self.legacy_counter += 1
            a = legacy[self.legacy_counter % n]
            if not (avoid and a in avoid):
                return a
        return None

    def drop(self, partition: int, address: str) -> None:
        """Forget ``partition``'s leader after a leader-type error from ``address``."""
        slots = self.slots
        if partition < len(slots) and slots[partition] == address:
            slots[partition] = None
            self.writable -= 1


class Routes:
    """Per-topic routes for producers, fed by a :class:`Lookup` (``access=w``)."""

    def __init__(self, lookup: Lookup) -> None:
        self.lookup = lookup
        self._routes: dict[str, TopicRoute] = {}
        self._refreshing: dict[str, asyncio.Future[TopicRoute]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeps = SweepSchedule(SWEEP_MIN)
        #: refreshes this producer asked for (each shared by every caller that joined it)
        self.refreshes = 0

    def cached(self, topic: str, now: float) -> TopicRoute | None:
        """The current route without I/O; picks up a newer background view every
        :data:`RECHECK_INTERVAL`."""
        route = self._routes.get(topic)
        if route is not None and now >= route.recheck_at:
            route.recheck_at = now + RECHECK_INTERVAL
            view = self.lookup.view(topic, "w")
            if view is None:
                # the lookup forgot the idle topic: look it up afresh (tracking it again)
                del self._routes[topic]
                return None
            if view is not route.view:
                route = self._install(TopicRoute(view, now))
        return route

    def _install(self, route: TopicRoute) -> TopicRoute:
        old = self._routes.get(route.topic)
        if old is None and self._sweeps.due(len(self._routes)):
            self._sweep()
        self._routes[route.topic] = route
        if old is not None and old.slots != route.slots:
            logger.debug("topic %r: partition leaders now %s", route.topic, route.slots)
        return route

    def addresses(self) -> set[str]:
        """Every nsqd address a route names (partition leaders and legacy nodes)."""
        out: set[str] = set()
        for route in self._routes.values():
            out.update(a for a in route.slots if a is not None)
            out.update(route.legacy)
        return out

    def http_addresses(self) -> set[str]:
        """The HTTP address (``http://host:port``) of every nsqd a route names that the
        lookup described (the HTTP producer's nodes)."""
        out: set[str] = set()
        for route in self._routes.values():
            nodes = route.view.nodes
            for address in (*route.slots, *route.legacy):
                node = nodes.get(address) if address is not None else None
                if node is not None:
                    out.add(parse_http_address(node.http_address))
        return out

    def _sweep(self) -> None:
        """Drop the routes of topics the lookup forgot (unused for its ``idle_polls``
        polls), so generated topic names (per tenant, per day) leave no route behind."""
        kept = {topic for topic, access in self.lookup.tracked() if access == "w"}
        for topic in [t for t in self._routes if t not in kept]:
            del self._routes[topic]
        self._sweeps.swept(len(self._routes))

    async def get(self, topic: str) -> TopicRoute:
        """The route, looking the topic up on first use (raises LookupFailedError)."""
        loop = asyncio.get_running_loop()
        route = self.cached(topic, loop.time())
        if route is not None:
            return route
        fut = self._refreshing.get(topic)
        if fut is not None:
            return await asyncio.shield(fut)
        view = await self.lookup.lookup(topic, "w", metainfo=True)
        route = self._routes.get(topic)
        if route is None or route.view is not view:
            route = self._install(TopicRoute(view, loop.time()))
        return route

    async def refresh(self, topic: str, seen: TopicRoute | None) -> TopicRoute:
        """A route newer than ``seen``: the installed one if it already is, else the result
        of the one refresh in progress (started here if none is)."""
        current = self._routes.get(topic)
        if current is not None and current is not seen:
            return current
        return await asyncio.shield(self._start_refresh(topic))

    def refresh_soon(self, topic: str, seen: TopicRoute | None) -> None:
        """Like :meth:`refresh` without waiting (for round-robin publishes, which carry on on
        another partition meanwhile)."""
        current = self._routes.get(topic)
        if current is not None and current is not seen:
            return
        self._start_refresh(topic)

    def _start_refresh(self, topic: str) -> asyncio.Future[TopicRoute]:
        fut = self._refreshing.get(topic)
        if fut is not None:
            return fut
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        # nobody may be waiting (refresh_soon): never log "exception was never retrieved"
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._refreshing[topic] = fut
        self.refreshes += 1
        task = loop.create_task(self._refresh(topic, fut))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return fut

    async def _refresh(self, topic: str, fut: asyncio.Future[TopicRoute]) -> None:
        try:
            view = await self.lookup.refresh(topic, "w", metainfo=True)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            if not isinstance(exc, LookupFailedError):
                logger.exception("lookup refresh of topic %r failed", topic)
            fut.set_exception(exc)
            return
        finally:
            if self._refreshing.get(topic) is fut:
                del self._refreshing[topic]
        current = self._routes.get(topic)
        if current is not None and current.view is view:
            # every lookupd failed and the old view was kept: keep the dropped mappings too
            route = current
        else:
            route = self._install(TopicRoute(view, asyncio.get_running_loop().time()))
        if not fut.done():
            fut.set_result(route)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(BaseException):
                await t
