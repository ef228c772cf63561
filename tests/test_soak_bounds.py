"""Bounds found by soaking the clients the way a service runs for days: structures that grew
with every new topic name or every start and stop stay bounded (seconds, not minutes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.lookup import Lookup
from smartnsq.producer import Producer
from tests.consumer_support import eventually


def forgotten(lookup: Lookup, topics: Iterable[str]) -> Callable[[], bool]:
    """True once ``lookup`` tracks none of ``topics`` any more."""
    names = set(topics)
    return lambda: names.isdisjoint(t for t, _ in lookup.tracked())


async def test_lookupd_producer_forgets_the_routes_of_idle_topics() -> None:
    """A lookupd-mode producer publishing to generated topic names (per tenant, per day)
    kept one route (view, nodes, meta) per name for good although its lookup forgot the
    idle ones: 240 names, 240 routes. Now the routes follow the lookup's idle eviction."""
    poll = 0.05  # the lookup forgets a topic after idle_polls (5) polls without use
    config = ProducerConfig(lookupd_poll_interval=poll, lookupd_poll_jitter=0,
                            publish_timeout=5)
    rounds, per_round = 6, 40
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        names = [f"gen{i}" for i in range(rounds * per_round)]
        for name in names:
            cluster.create_topic(name)
        async with Producer(lookupd=cluster.lookupd_http_addresses, config=config) as p:
            lookup = p.lookup
            assert lookup is not None
            for r in range(rounds):
                batch = names[r * per_round:(r + 1) * per_round]
                await asyncio.gather(*(p.publish(t, b"x") for t in batch))
                # this round's names go idle; the lookup evicts them within a few polls
                await eventually(forgotten(lookup, batch), timeout=5, interval=poll)
            assert p._router is not None
            routes = p._router.routes._routes
            assert len(routes) <= 2 * per_round + 40, len(routes)
            # a forgotten topic published again is looked up afresh, and tracked again
            assert p.route(names[0]) is None
            await p.publish(names[0], b"again")
            assert (names[0], "w") in lookup.tracked()
