"""ConnectionSet with a fake discovery and opener: reconnect backoff with jitter and cap,
reconciling against topologies, fatal errors, and the lookup rule "reconnect only while a
later poll still lists the endpoint"."""

from __future__ import annotations

import asyncio
import random
from types import MappingProxyType

import pytest

from smartnsq.backoff import ConstantBackoff, EqualJitterBackoff
from smartnsq.consumer.conns import ConnectionSet
from smartnsq.consumer.discovery import (
    DirectDiscovery,
    Discovery,
    Endpoint,
    OnUpdate,
    Topology,
)
from smartnsq.errors import ConfigError, NSQConnectionError, ServerNotLeaderError
from tests.consumer_support import eventually

A = Endpoint("10.0.0.1:4150", "10.0.0.1", 4150)
B = Endpoint("10.0.0.2:4150", "10.0.0.2", 4150, partition=3)


def topology(*eps: Endpoint) -> Topology:
    return Topology(MappingProxyType({e.key: e for e in eps}))


class FakeDiscovery(Discovery):
    kind = "lookupd"

    def __init__(self) -> None:
        self.listed: set[tuple[str, int]] = set()
        self.lost: list[tuple[Endpoint, bool]] = []
        self.asked: list[Endpoint] = []

    async def start(self, on_update: OnUpdate) -> Topology:
        return Topology()

    def connection_lost(self, endpoint: Endpoint, stale_leader: bool) -> None:
        self.lost.append((endpoint, stale_leader))

    async def still_wanted(self, endpoint: Endpoint) -> bool:
        self.asked.append(endpoint)
        return endpoint.key in self.listed

    async def close(self) -> None:
        return None


class Session:
    def __init__(self) -> None:
        self.closed = asyncio.Event()
        self.retired = False
        self.stale_leader = False

    async def wait_closed(self) -> None:
        await self.closed.wait()

    async def retire(self) -> None:
        self.retired = True
        self.closed.set()


class Opener:
    """Fails the first ``failures`` attempts per endpoint with ``error``."""

    def __init__(self, failures: int = 0, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or NSQConnectionError("refused")
        self.calls: list[Endpoint] = []
        self.sessions: list[Session] = []
        self.opened = asyncio.Event()

    async def __call__(self, ep: Endpoint) -> Session:
        self.calls.append(ep)
        if sum(1 for c in self.calls if c == ep) <= self.failures:
            raise self.error
        s = Session()
        self.sessions.append(s)
        self.opened.set()
        return s


def make(discovery: Discovery, opener: Opener,
         fatal: list[BaseException] | None = None) -> ConnectionSet:
    errors = fatal if fatal is not None else []
    return ConnectionSet(discovery, opener, is_fatal=lambda e, _s: isinstance(e, ConfigError),
                         on_fatal=errors.append, reconnect_min=1.0, reconnect_max=60.0,
                         backoff=ConstantBackoff(0.01))


def test_reconnects_wait_as_the_backoff_policy_says() -> None:
    # the default: equal jitter from reconnect_min up to reconnect_max (the formula itself is
    # tested in test_backoff.py)
    cs = ConnectionSet(DirectDiscovery(["127.0.0.1:1"]), Opener(), is_fatal=lambda e, _s: False,
                       on_fatal=lambda e: None, reconnect_min=1.0, reconnect_max=8.0,
                       rng=random.Random(1))
    assert isinstance(cs.backoff, EqualJitterBackoff)
    assert (cs.backoff.base, cs.backoff.cap) == (1.0, 8.0)
    given = ConstantBackoff(0.01)
    cs = ConnectionSet(DirectDiscovery(["127.0.0.1:1"]), Opener(), is_fatal=lambda e, _s: False,
                       on_fatal=lambda e: None, reconnect_min=1.0, reconnect_max=8.0,
                       backoff=given)
    assert cs.backoff is given


async def test_direct_endpoint_is_retried_until_it_works() -> None:
    d = DirectDiscovery(["10.0.0.1:4150"])
    opener = Opener(failures=3)
    cs = make(d, opener)
    cs.reconcile(d.topology)
    await cs.wait_first_attempts()
    async with asyncio.timeout(5):
        await opener.opened.wait()
    assert len(opener.calls) == 4
    # the connection ends: reconnected again
    opener.opened.clear()
    opener.sessions[0].closed.set()
    async with asyncio.timeout(5):
        await opener.opened.wait()
    assert len(opener.calls) == 5
    await cs.close()


async def test_lookup_endpoint_not_listed_any_more_is_not_reconnected() -> None:
    d = FakeDiscovery()
    d.listed = {A.key, B.key}
    opener = Opener()
    cs = make(d, opener)
    cs.reconcile(topology(A, B))
    await cs.wait_first_attempts()
    assert {e.key for e in opener.calls} == {A.key, B.key}
    # B's leader says it is not the leader any more, and the next poll drops it
    d.listed = {A.key}
    session_b = opener.sessions[[e.key for e in opener.calls].index(B.key)]
    runner_b = next(s.task for s in cs.slots if s.endpoint == B)
    assert runner_b is not None
    session_b.stale_leader = True
    session_b.closed.set()
    # the runner asks the discovery once more, and ends without reconnecting
    async with asyncio.timeout(5):
        await runner_b
    assert (B, True) in d.lost and d.asked == [B]
    assert [e.key for e in opener.calls].count(B.key) == 1
    assert {s.endpoint.key for s in cs.slots} == {A.key}
    await cs.close()


async def test_reconcile_retires_and_starts() -> None:
    d = FakeDiscovery()
    opener = Opener()
    cs = make(d, opener)
    cs.reconcile(topology(B))
    await cs.wait_first_attempts()
    first = opener.sessions[0]
    cs.reconcile(topology(A))
    await cs.wait_first_attempts()
    async with asyncio.timeout(5):
        await first.closed.wait()
    assert first.retired
    assert [s.endpoint for s in cs.slots] == [A]
    await cs.close()
    cs.reconcile(topology(B))  # ignored once closed
    assert len(opener.calls) == 2


async def test_unlisted_stock_subscription_is_kept_until_it_ends() -> None:
    """A restarted nsqlookupd lists no nsqd until each re-registers (up to 30 s on stock):
    the live subscription goes on, as in go-nsq; once it ends it is not reconnected."""
    d = FakeDiscovery()
    opener = Opener()
    cs = make(d, opener)
    cs.reconcile(topology(A))
    await cs.wait_first_attempts()
    live = opener.sessions[0]
    cs.reconcile(topology())
    assert not live.retired and [s.endpoint for s in cs.slots] == [A]
    live.closed.set()
    await eventually(lambda: not cs.slots, 5)
    assert d.asked == [A] and len(opener.calls) == 1
    await cs.close()


async def test_fatal_errors_end_the_runner() -> None:
    d = FakeDiscovery()
    opener = Opener(failures=10, error=ConfigError("bad"))
    fatal: list[BaseException] = []
    cs = make(d, opener, fatal)
    cs.reconcile(topology(A))
    await cs.wait_first_attempts()
    assert len(fatal) == 1 and isinstance(fatal[0], ConfigError)
    assert len(opener.calls) == 1 and cs.slots == ()
    await cs.close()


@pytest.mark.parametrize("error,stale", [(ServerNotLeaderError("", fatal=True), True),
                                         (NSQConnectionError("x"), False)])
async def test_failed_attempts_report_to_discovery(error: Exception, stale: bool) -> None:
    d = FakeDiscovery()
    d.listed = {A.key}
    opener = Opener(failures=1, error=error)
    cs = make(d, opener)
    cs.reconcile(topology(A))
    await cs.wait_first_attempts()
    assert d.lost == [(A, stale)]
    async with asyncio.timeout(5):
        await opener.opened.wait()
    await cs.close()
