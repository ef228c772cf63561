"""The blocking producer facade: round trips from plain threads against the embedded cluster
(which runs on its own loop in another thread)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import smartnsq.sync
from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ClientClosedError, ConfigError, UnsupportedFeatureError
from smartnsq.sync import _loop
from smartnsq.trace import TraceSwitch

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)


class ClusterThread:
    """A DevCluster running on its own event loop thread, driven from the test thread."""

    def __init__(self, **kw: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.cluster = DevCluster(**kw)
        self.call(self.cluster.start())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    def sync(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)
        return self.call(run())

    def stop(self) -> None:
        self.call(self.cluster.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


@pytest.fixture
def stock() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=2, flavour="stock")
    yield ct
    ct.stop()


@pytest.fixture
def youzan() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=3, flavour="youzan")
    yield ct
    ct.stop()


def test_sync_round_trip_stock(stock: ClusterThread) -> None:
    c = stock.cluster
    stock.sync(functools.partial(c.create_topic, "st", channels=("c",)))
    with smartnsq.sync.Producer(c.nsqd_tcp_addresses, config=FAST) as p:
        assert p.publish("st", b"one") is None
        assert p.publish_many("st", [b"two", b"three"]) == []
        p.publish_deferred("st", b"four", 0.01)
        with pytest.raises(UnsupportedFeatureError):
            p.publish("st", b"x", trace_id=1)
        with pytest.raises(ConfigError):
            p.publish("st", b"")
        # many threads at once
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: p.publish("st", b"t%d" % i), range(40)))
    assert p.closed
    with pytest.raises(ClientClosedError):
        p.publish("st", b"late")
    counts = [c.store.stock_topic(n.node_id, "st").message_count for n in c.nodes]  # type: ignore[union-attr]
    assert sum(counts) == 44
    assert _loop._shared is None  # the background thread was given back


def test_sync_round_trip_youzan_ordered_and_traced(youzan: ClusterThread) -> None:
    c = youzan.cluster
    youzan.sync(functools.partial(c.create_topic, "yz", partition_num=2, ordered=True,
                                  channels=("c",)))
    with smartnsq.sync.Producer(lookupd=c.lookupd_http_addresses, config=FAST,
                                trace=TraceSwitch()) as p:
        for i in range(10):
            p.publish_ordered("yz", "key", b"%d" % i)
        r = p.publish("yz", b"traced", partition=0, trace_id=3)
        assert r is not None and r.trace_id == 3
        p.trace.enable("yz")
        assert p.publish("yz", b"switch on", partition=1) is not None
    from smartnsq.ordered.sharding import shard_partition

    part = shard_partition("key", 2)
    bodies = [rec.body for rec in c.store.partition("yz", part).records]
    assert [b for b in bodies if b.isdigit()] == [b"%d" % i for i in range(10)]


def test_two_facades_share_one_loop_thread(stock: ClusterThread) -> None:
    c = stock.cluster
    a = smartnsq.sync.Producer(c.nsqd_tcp_addresses, config=FAST)
    b = smartnsq.sync.Producer(c.nsqd_tcp_addresses, config=FAST)
    try:
        assert _loop._shared is not None and _loop._users == 2
        a.publish("shared", b"a")
        b.publish("shared", b"b")
    finally:
        a.close()
        assert _loop._shared is not None
        b.close()
    assert _loop._shared is None
    a.close()  # idempotent


def test_bad_construction_does_not_leak_the_thread() -> None:
    with pytest.raises(ConfigError):
        smartnsq.sync.Producer()
    assert _loop._shared is None
