"""The blocking producer facade: round trips from plain threads against the embedded cluster
(which runs on its own loop in another thread)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import smartnsq.sync
from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    NotStartedError,
    UnsupportedFeatureError,
)
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
    with smartnsq.sync.Producer(nsqd=c.nsqd_tcp_addresses, config=FAST) as p:
        assert p.publish("st", b"one") is None
        sent = p.publish_many("st", [b"two", b"three"])
        assert (sent.topic, sent.count, sent.receipts) == ("st", 2, ())
        p.publish_deferred("st", b"four", 0.01)
        with pytest.raises(UnsupportedFeatureError):
            p.publish("st", b"x", trace_id=1)
        with pytest.raises(ConfigError):
            p.publish("st", b"")
        # many threads at once
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: p.publish("st", b"t%d" % i), range(40)))
    assert p.is_closed
    with pytest.raises(ClientClosedError):
        p.publish("st", b"late")
    counts = [c.store.stock_topic(n.node_id, "st").message_count for n in c.nodes]  # type: ignore[union-attr]
    assert sum(counts) == 44
    assert _loop._shared is None  # the background thread was given back


def test_sync_round_trip_youzan_ordered_and_traced(
        youzan: ClusterThread, caplog: pytest.LogCaptureFixture) -> None:
    c = youzan.cluster
    youzan.sync(functools.partial(c.create_topic, "yz", partition_num=2, ordered=True,
                                  channels=("c",)))
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    with smartnsq.sync.Producer(lookupd=c.lookupd_http_addresses, config=FAST,
                                trace_switch=TraceSwitch()) as p:
        for i in range(10):
            assert p.publish_ordered("yz", "key", b"%d" % i) is None
        r = p.publish("yz", b"traced", partition=0, trace_id=3)
        assert r is not None and r.trace_id == 3
        p.trace.enable("yz")
        # the switch traces and logs the publish; only a trace_id makes it return a receipt
        assert p.publish("yz", b"switch on", partition=1) is None
    (logged,) = [rec for rec in caplog.records if rec.name == "smartnsq.trace"]
    stored = c.store.partition("yz", 1).records[-1]
    assert stored.body == b"switch on"
    assert (logged.topic, logged.partition, logged.internal_id, logged.offset) == (  # type: ignore[attr-defined]
        "yz", 1, stored.key, stored.offset)
    from smartnsq.sharding import shard_partition

    part = shard_partition("key", 2)
    bodies = [rec.body for rec in c.store.partition("yz", part).records]
    assert [b for b in bodies if b.isdigit()] == [b"%d" % i for i in range(10)]


def test_two_facades_share_one_loop_thread(stock: ClusterThread) -> None:
    c = stock.cluster
    a = smartnsq.sync.Producer(nsqd=c.nsqd_tcp_addresses, config=FAST)
    b = smartnsq.sync.Producer(nsqd=c.nsqd_tcp_addresses, config=FAST)
    # constructing connects nothing and takes no thread: start() (or with) does
    assert _loop._shared is None
    with pytest.raises(NotStartedError, match="start"):
        a.publish("shared", b"too early")
    a.start()
    b.start()
    try:
        assert _loop._shared is not None and _loop._users == 2
        a.publish("shared", b"a")
        b.publish("shared", b"b")
    finally:
        a.stop()
        assert _loop._shared is not None
        b.stop()
    assert _loop._shared is None
    a.stop()  # idempotent
    assert a.is_closed and b.is_closed
    with pytest.raises(ClientClosedError):
        a.start()  # a stopped producer stays stopped
    assert _loop._shared is None
    topics = [c.store.stock_topic(n.node_id, "shared") for n in c.nodes]
    assert sum(t.message_count for t in topics if t is not None) == 2  # not the early one


def test_bad_construction_does_not_leak_the_thread() -> None:
    with pytest.raises(ConfigError):
        smartnsq.sync.Producer()
    assert _loop._shared is None
