"""Bounds found by soaking the clients the way a service runs for days: structures that grew
with every generated topic name, every replaced nsqd or every wait for a down one stay bounded
(each test takes seconds, not minutes)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterable

import pytest

import smartnsq.producer.http_targets as http_targets
import smartnsq.producer.nodes as nodes_module
from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import NSQConnectionError
from smartnsq.lookup import Lookup
from smartnsq.producer import HttpProducer, Producer
from smartnsq.producer.pool import NodePool
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


async def test_a_down_nsqd_keeps_no_waiter_per_publish_that_waited_for_it() -> None:
    """Each publish that waited in vain for a down nsqd (``recover`` until its deadline) left
    a cancelled future in the pool's waiter list, freed only when the node came back: a node
    down for hours collected one per publish."""
    with socket.socket() as s:  # a port nobody listens on: every dial is refused
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    pool = NodePool(address, ProducerConfig(reconnect_min=5.0, reconnect_max=5.0))
    with pytest.raises(NSQConnectionError):
        await pool.get()  # refused: the node is down for 5 s
    loop = asyncio.get_running_loop()
    for _ in range(50):
        assert not await pool.recover(loop.time() + 0.001)
    assert not pool._up_waiters, len(pool._up_waiters)
    await pool.close()


async def replace_the_leader(cluster: DevCluster, publish: Callable[[], Awaitable[object]],
                             times: int) -> None:
    """Publish, then ``times`` over: a new node takes the lead of topic ``moving``'s partition
    0 and the old leader goes (a rolling restart with new addresses), and publish again (the
    stale leader is refused: refresh, retry)."""
    await publish()
    for _ in range(times):
        new = await cluster.add_node()
        old = cluster.leader("moving")
        assert old is not None
        cluster.move_leader("moving", 0, new)
        await cluster.remove_node(old)
        await publish()


async def test_lookupd_producer_forgets_the_pools_of_replaced_nsqd() -> None:
    """nsqd replaced by new addresses (a rolling restart with new pod IPs, scale-out and in)
    each left their pool, and 3 connection-gauge series saying 'closed', for the life of a
    lookupd-mode producer: 24 replacements, 25 pools."""
    config = ProducerConfig(lookupd_poll_interval=0.1, publish_timeout=5)
    async with DevCluster(nodes=1, flavour="youzan") as cluster:
        cluster.create_topic("moving", channels=["c"])
        async with Producer(lookupd=cluster.lookupd_http_addresses, config=config) as p:
            await replace_the_leader(cluster, lambda: p.publish("moving", b"x"), 24)
            assert len(p.pools) <= nodes_module.SWEEP_MIN, list(p.pools)
            leader = cluster.nsqd_tcp_addresses[cluster.leader("moving") or 0]
            assert p.pools[leader].is_up


async def test_lookupd_http_producer_forgets_the_nodes_of_replaced_nsqd() -> None:
    """The same for the HTTP producer: each replaced nsqd's HTTP node (its address and
    backoff state) was kept for good: 24 replacements, 25 nodes."""
    config = ProducerConfig(lookupd_poll_interval=0.1, publish_timeout=5)
    async with DevCluster(nodes=1, flavour="youzan") as cluster:
        cluster.create_topic("moving", channels=["c"])
        async with HttpProducer(lookupd=cluster.lookupd_http_addresses, config=config) as p:
            await replace_the_leader(cluster, lambda: p.publish("moving", b"x"), 24)
            assert p._nodes.size <= http_targets.SWEEP_MIN
