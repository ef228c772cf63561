"""The lookup's background work ends when nobody needs it (issue 19 item 8).

A topic nobody asked about for ``LookupConfig.idle_polls`` poll intervals stops being
refreshed and is forgotten (a process that looks up many topics once does not keep a
refresher per topic forever); a subscribed topic is never forgotten while subscribed; a
refresh running in the background when the Lookup stops ends cancelled, and the stop is
prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from smartnsq.config import LookupConfig
from smartnsq.errors import ConfigError
from smartnsq.lookup import Lookup
from smartnsq.producer import Producer
from tests.consumer_support import eventually
from tests.lookup_fakes import FakeLookupd, TopicSpec
from tests.real_servers import StockServer, stock, unique

__all__ = ["stock"]  # the fixture, imported for pytest

POLL = 0.05
IDLE_POLLS = 3
#: bound on every wait here (the idle time is IDLE_POLLS * POLL = 0.15 s)
WITHIN = 5.0


def config(url: str, **kw: Any) -> LookupConfig:
    base: dict[str, Any] = {"poll_interval": POLL, "poll_jitter": 0.0, "idle_polls": IDLE_POLLS,
                            "request_timeout": 30.0, "use_listlookup": False}
    return LookupConfig(addresses=(url,), **{**base, **kw})


@pytest.fixture
async def fake() -> AsyncIterator[FakeLookupd]:
    async with FakeLookupd("stock") as f:
        for i in range(20):
            f.topics[f"t{i}"] = TopicSpec(legacy=[4150 + i])
        yield f


async def until_tracked(lk: Lookup, want: set[tuple[str, str]]) -> None:
    await eventually(lambda: set(lk.tracked()) == want, WITHIN, POLL)


async def test_topics_nobody_asks_about_are_forgotten_but_not_subscribed_ones(
        fake: FakeLookupd) -> None:
    async with Lookup(config(fake.url)) as lk:
        for i in range(20):
            await lk.lookup(f"t{i}", "w")
        sub = lk.subscribe("t0", "r")
        await lk.lookup("t0", "r")
        assert len(lk.tracked()) == 21
        await until_tracked(lk, {("t0", "r")})
        assert lk.view("t1", "w") is None
        # refreshes of the subscribed topic go on
        rounds = lk.rounds("t0", "r")
        await eventually(lambda: lk.rounds("t0", "r") >= rounds + 2, WITHIN, POLL)
        # asking again tracks it again; ending the subscription lets it go
        await lk.lookup("t1", "w")
        assert ("t1", "w") in lk.tracked()
        sub.close()
        await until_tracked(lk, set())
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(
            "smartnsq lookup refresher")]


async def test_a_topic_in_use_is_kept(fake: FakeLookupd) -> None:
    async with Lookup(config(fake.url)) as lk:
        await lk.lookup("t0", "w")
        await lk.lookup("t1", "w")
        loop = asyncio.get_running_loop()
        end = loop.time() + POLL * IDLE_POLLS * 4
        # a producer reads the current view while it publishes (its route recheck)
        while loop.time() < end:
            assert lk.view("t0", "w") is not None
            await asyncio.sleep(POLL / 2)
        assert lk.tracked() == (("t0", "w"),)


@pytest.mark.parametrize("idle_polls", [0, -1, 1.5])
def test_idle_polls_must_be_a_positive_int(idle_polls: Any) -> None:
    with pytest.raises(ConfigError, match="idle_polls"):
        config("http://127.0.0.1:4161", idle_polls=idle_polls)


def test_idle_polls_defaults_to_five_polls() -> None:
    assert LookupConfig(addresses=("127.0.0.1:4161",)).idle_polls == 5


async def stock_topic(server: StockServer) -> str:
    """A topic on the stock nsqd (its nsqlookupd learns it from the nsqd)."""
    topic = unique("idle")
    async with aiohttp.ClientSession() as http, http.post(
            f"http://{server.nsqd_http}/topic/create", params={"topic": topic}) as r:
        assert r.status == 200, await r.text()
    return topic


@pytest.mark.real_nsqd
async def test_a_producer_on_a_shared_lookup_follows_its_idle_polls(
        stock: StockServer) -> None:
    if stock.lookupd is None:
        pytest.skip("SMARTNSQ_REAL_LOOKUPD (the stock nsqlookupd) is not set")
    topics = [await stock_topic(stock) for _ in range(3)]
    used = {(t, "w") for t in topics}

    def lookupd(idle_polls: int) -> Lookup:
        assert stock.lookupd is not None
        return Lookup(LookupConfig(addresses=(stock.lookupd,), poll_interval=POLL,
                                   poll_jitter=0.0, idle_polls=idle_polls))

    # the lookup settings belong to a Lookup the caller starts, shares and stops
    async with lookupd(2) as brief_lookup, lookupd(10**6) as patient_lookup:
        async with Producer(lookupd=brief_lookup) as brief, \
                Producer(lookupd=patient_lookup) as patient:
            for t in topics:
                await brief.publish(t, b"x", timeout=WITHIN)
                await patient.publish(t, b"x", timeout=WITHIN)
            assert brief.lookup is brief_lookup and patient.lookup is patient_lookup
            assert set(brief_lookup.tracked()) == set(patient_lookup.tracked()) == used
            assert brief_lookup.config.idle_polls == 2
            # nobody publishes any more: 2 polls later the first producer's lookup lets go,
            # the other one keeps refreshing well past the default's 5 polls
            await until_tracked(brief_lookup, set())
            rounds = patient_lookup.rounds(topics[0], "w")
            await eventually(lambda: patient_lookup.rounds(topics[0], "w") >= rounds + 6,
                             WITHIN, POLL)
            assert set(patient_lookup.tracked()) == used
        # the producers stopped; the lookups they were given are the caller's, still running
        assert not brief_lookup.is_closed and not patient_lookup.is_closed
    assert brief_lookup.is_closed and patient_lookup.is_closed


async def test_stop_cancels_a_background_refresh_in_flight_promptly(
        fake: FakeLookupd) -> None:
    lk = Lookup(config(fake.url))
    await lk.lookup("t0", "r")
    fake.mode = "hang"
    seen = fake.path_event("/lookup")
    lk.report_stale("t0")  # a connection saw a stale leader: a refresh in the background
    async with asyncio.timeout(WITHIN):
        await seen.wait()
    spawned = [t for t in asyncio.all_tasks()
               if t.get_name().startswith("smartnsq lookup: refresh of topic 't0'")]
    assert len(spawned) == 1 and not spawned[0].done()
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(WITHIN):
        await lk.stop()
    assert loop.time() - started < 2.0
    assert spawned[0].cancelled()
