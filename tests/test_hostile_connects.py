"""A lookupd that lists thousands of nsqd must not make thousands of concurrent dials
(issue 9, item 12): connects are bounded by ``max_concurrent_connects`` and start() stays
bounded."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.consumer.discovery import Endpoint
from smartnsq.errors import NSQError
from smartnsq.producer import Producer
from tests.lookup_fakes import FakeLookupd, TopicSpec
from tests.scripted_server import Peer, ScriptedServer

TOPIC = "t"


def closed_ports(n: int) -> list[int]:
    """``n`` distinct 127.0.0.1 ports that were just released: connections are refused."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Gauge:
    """Wraps the consumer's opener: counts connects in progress and their peak."""

    def __init__(self, inner: Callable[[Endpoint], Awaitable[Any]]) -> None:
        self.inner = inner
        self.now = 0
        self.peak = 0
        self.attempts = 0

    async def __call__(self, ep: Endpoint) -> Any:
        self.now += 1
        self.attempts += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self.inner(ep)
        finally:
            self.now -= 1


def config(bound: int, **conn: Any) -> ConsumerConfig:
    # retries far in the future: the test is about the first round of connects
    return ConsumerConfig(max_concurrent_connects=bound, reconnect_min=30.0,
                          reconnect_max=60.0, lookupd_poll_interval=60.0,
                          connection=ConnectionConfig(**{"dial_timeout": 1.0, **conn}))


async def test_two_thousand_listed_nsqd_are_dialled_a_few_at_a_time() -> None:
    ports = closed_ports(2000)
    async with FakeLookupd("stock") as lookupd:
        lookupd.topics[TOPIC] = TopicSpec(legacy=ports)
        c = Consumer(TOPIC, "c", lookupd=[lookupd.url], config=config(16))
        gauge = Gauge(c._conns._open)
        c._conns._open = gauge
        try:
            async with asyncio.timeout(60):  # guards the test only
                await c.start()
            assert gauge.attempts == 2000  # every endpoint was tried once
            assert 0 < gauge.peak <= 16, gauge.peak
        finally:
            await c.stop(0)


def test_default_bound() -> None:
    assert ConsumerConfig().max_concurrent_connects == 32


async def test_start_returns_after_one_connects_time_when_connects_queue() -> None:
    """Four nsqd that accept and never answer IDENTIFY, one connect slot: start() returns
    after one connect's time (dial + handshake + SUB) with some still queued, instead of
    after four handshake timeouts in a row."""
    async def silent(p: Peer) -> None:
        await p.expect_eof()

    servers = [ScriptedServer(silent) for _ in range(4)]
    for s in servers:
        await s.__aenter__()
    try:
        async with FakeLookupd("stock") as lookupd:
            lookupd.topics[TOPIC] = TopicSpec(legacy=[s.port for s in servers])
            c = Consumer(TOPIC, "c", lookupd=[lookupd.url],
                         config=config(1, dial_timeout=0.2, handshake_timeout=0.5))
            gauge = Gauge(c._conns._open)
            c._conns._open = gauge
            try:
                async with asyncio.timeout(30):
                    await c.start()
                assert gauge.peak == 1
                # one slot, 0.5 s per silent server, 0.2 + 2 x 0.5 s for start(): the
                # fourth connect cannot have had its turn yet
                assert gauge.attempts < 4
            finally:
                await c.stop(0)
    finally:
        for s in servers:
            await s.__aexit__(None, None, None)


async def test_producer_dials_a_few_nodes_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """300 listed nodes that all refuse, 300 concurrent publishes: at most
    max_concurrent_connects dials run at once."""
    from smartnsq.conn import Connection
    from smartnsq.producer import pool as pool_module

    gauge = {"now": 0, "peak": 0, "dials": 0}

    class CountingConnection(Connection):
        async def connect(self) -> Any:
            gauge["now"] += 1
            gauge["dials"] += 1
            gauge["peak"] = max(gauge["peak"], gauge["now"])
            try:
                await asyncio.sleep(0)  # let the other publishes pile up behind the bound
                return await super().connect()
            finally:
                gauge["now"] -= 1

    monkeypatch.setattr(pool_module, "Connection", CountingConnection)
    addresses = [f"127.0.0.1:{p}" for p in closed_ports(300)]
    cfg = ProducerConfig(max_concurrent_connects=8, publish_timeout=1.0,
                         reconnect_min=5.0, reconnect_max=10.0)
    async with Producer(nsqd=addresses, config=cfg) as p:
        results = await asyncio.gather(*(p.publish("t", b"x") for _ in range(300)),
                                       return_exceptions=True)
    assert all(isinstance(r, NSQError) for r in results), results[:3]
    assert gauge["dials"] >= 8
    assert gauge["peak"] <= 8, gauge
