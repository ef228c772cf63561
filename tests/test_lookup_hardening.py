"""The lookup used the way a user uses it, where it used to go wrong: a lookupd that accepts
connections and never answers, discovery passes done twice over, a Lookup entered twice."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from smartnsq import Consumer
from smartnsq.errors import ClientClosedError, ConfigError, LookupFailedError
from smartnsq.lookup import Lookup
from tests.lookup_fakes import QUICK_TIMEOUT, FakeLookupd, TopicSpec, quick_config, youzan_cluster
from tests.silent_server import Silent, silent_servers

pytestmark = pytest.mark.timeout(20)

T = "orders"
TIMEOUT = QUICK_TIMEOUT


@pytest.fixture
async def silent() -> AsyncIterator[Silent]:
    """A hung nsqlookupd."""
    async with silent_servers() as make:
        yield await make()


# -- 1. a silent lookupd costs the first lookup one request timeout -----------------------

@pytest.mark.parametrize("threshold", [1, 3])
async def test_first_lookup_on_a_silent_lookupd_fails_in_one_request_timeout(
        silent: Silent, threshold: int) -> None:
    # it waited out /listlookup's timeout, then /lookup's on the same lookupd: 2.0 x
    async with Lookup(quick_config(silent.address, failure_threshold=threshold)) as lk:
        start = time.monotonic()
        with pytest.raises(LookupFailedError) as ei:
            async with asyncio.timeout(4 * TIMEOUT):
                await lk.lookup(T, "w")
        took = time.monotonic() - start
    text = str(ei.value)
    assert took < 1.5 * TIMEOUT, f"first lookup took {took:.2f}s at {TIMEOUT}s"
    assert silent.address in text and f"no answer within {TIMEOUT:g}s" in text, text
    assert silent.accepted >= 2  # /listlookup and /lookup were both asked, side by side


async def test_a_consumer_on_a_silent_lookupd_starts_in_one_request_timeout(
        silent: Silent, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with Lookup(quick_config(silent.address)) as lk:
        start = time.monotonic()
        async with asyncio.timeout(4 * TIMEOUT):
            consumer = Consumer(T, "ch", lookupd=lk)
            await consumer.start()  # returns, waiting in the background for the topic
        took = time.monotonic() - start
        try:
            assert took < 1.5 * TIMEOUT, f"start took {took:.2f}s at {TIMEOUT}s"
        finally:
            await consumer.stop()
    said = [r.getMessage() for r in caplog.records if "no lookupd answered" in r.getMessage()]
    assert said and silent.address in said[0] and f"within {TIMEOUT:g}s" in said[0], said


async def test_a_silent_seed_beside_a_youzan_cluster_still_finds_the_discovered_lookupds(
        silent: Silent, fakes: list[FakeLookupd]) -> None:
    # the first round starts before /listlookup answered: the lookupds it lists are still
    # asked in that round, and the first answer still releases the round
    cluster = await youzan_cluster(2)
    fakes.extend(cluster)
    for f in cluster:
        f.topics[T] = TopicSpec(legacy=[4150])
    async with Lookup(quick_config(cluster[0].url, silent.address)) as lk:
        start = time.monotonic()
        async with asyncio.timeout(4 * TIMEOUT):
            view = await lk.lookup(T, "r")
        took = time.monotonic() - start
        assert list(view.nodes) == ["127.0.0.1:4150"]
        assert cluster[1].count("/lookup") == 1  # discovered, then asked in the first round
        assert took < 1.5 * TIMEOUT, f"took {took:.2f}s"
        assert lk.leader == cluster[0].url


# -- 3. one discovery pass applies its answers once ---------------------------------------

async def test_each_discovery_pass_applies_its_answers_once(fakes: list[FakeLookupd]) -> None:
    cluster = await youzan_cluster(3, leader=1)
    fakes.extend(cluster)
    async with Lookup(quick_config(cluster[0].url)) as lk:
        async with asyncio.timeout(5):
            for _ in range(5):
                known = await lk.discover()
        roster = lk._roster
        assert roster is not None
        # the first answer released the round and was applied; the pass's end applied the
        # same answers again (2 per pass before)
        assert roster.applied == roster.passes, (roster.applied, roster.passes)
        assert set(known) == {f.url for f in cluster}
        assert lk.leader == cluster[1].url


# -- 4. a Lookup entered twice --------------------------------------------------------------

async def test_a_lookup_entered_twice_refuses_the_inner_entry_and_keeps_running(
        fakes: list[FakeLookupd]) -> None:
    good = await FakeLookupd("stock").start()
    good.topics[T] = TopicSpec(legacy=[4150])
    fakes.append(good)
    lk = Lookup(quick_config(good.url))
    async with lk:
        with pytest.raises(ConfigError, match=r"already inside an 'async with'.*another Lookup"):
            async with lk:
                pytest.fail("the inner block ran")
        assert not lk.is_closed  # the refused entry did not stop it under the outer block
        async with asyncio.timeout(2):
            view = await lk.lookup(T, "r")
        assert list(view.nodes) == ["127.0.0.1:4150"]
    assert lk.is_closed
    with pytest.raises(ClientClosedError, match="cannot be started again"):
        async with lk:
            pass


async def test_a_started_lookup_may_still_be_entered_once(fakes: list[FakeLookupd]) -> None:
    # start() (or a first lookup(), which starts it) is not an 'async with': entering after
    # it is the one entry, and its end stops the Lookup
    good = await FakeLookupd("stock").start()
    good.topics[T] = TopicSpec(legacy=[4150])
    fakes.append(good)
    lk = Lookup(quick_config(good.url))
    async with asyncio.timeout(2):
        await lk.lookup(T, "r")
    async with lk:
        assert not lk.is_closed
    assert lk.is_closed
