"""``Lookup.admin`` pointed at a lookupd that accepts connections and never answers: every
call fails within one request timeout (not /listlookup's timeout and then its own), naming
the lookupd and the seconds waited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from smartnsq.errors import LookupFailedError
from smartnsq.lookup import Lookup, LookupAdmin
from tests.lookup_fakes import FakeLookupd, TopicSpec, quick_config, youzan_cluster
from tests.silent_server import Silent, silent_servers

pytestmark = pytest.mark.timeout(20)

#: long enough that one timeout plus scheduling on a loaded machine stays below 1.5 x
TIMEOUT = 0.8

CALLS: dict[str, Callable[[LookupAdmin], Awaitable[Any]]] = {
    "topics": lambda a: a.topics(),
    "channels": lambda a: a.channels("orders"),
    "nodes": lambda a: a.nodes(),
    "info": lambda a: a.info(),
    "create_topic": lambda a: a.create_topic("orders", 1, 1),
    "create_channel": lambda a: a.create_channel("orders", "ch"),
    "delete_topic": lambda a: a.delete_topic("orders"),
}


@pytest.fixture
async def silent() -> AsyncIterator[Silent]:
    async with silent_servers() as make:
        yield await make()


@pytest.mark.parametrize("call", sorted(CALLS))
async def test_an_admin_call_on_a_silent_lookupd_fails_in_one_request_timeout(
        silent: Silent, call: str) -> None:
    # it waited out the first /listlookup pass, then its own request: 2 x the timeout
    async with Lookup(quick_config(silent.address, request_timeout=TIMEOUT)) as lk:
        start = time.monotonic()
        with pytest.raises(LookupFailedError) as ei:
            async with asyncio.timeout(4 * TIMEOUT):
                await CALLS[call](lk.admin)
        took = time.monotonic() - start
    text = str(ei.value)
    assert took < 1.5 * TIMEOUT, f"{call} took {took:.2f}s at a {TIMEOUT}s timeout"
    assert f"127.0.0.1:{silent.port}" in text and f"no answer within {TIMEOUT:g}s" in text, text


async def test_a_write_beside_a_silent_lookupd_reaches_the_one_that_answers(
        silent: Silent, fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    stock = await FakeLookupd("stock").start()
    fakes.append(stock)
    stock.topics = {"orders": TopicSpec()}
    async with Lookup(quick_config(silent.address, stock.url,
                                   request_timeout=TIMEOUT)) as lk:
        start = time.monotonic()
        async with asyncio.timeout(4 * TIMEOUT):
            took_by = await lk.admin.create_channel("orders", "ch")
        took = time.monotonic() - start
        async with asyncio.timeout(4 * TIMEOUT):
            topics = await lk.admin.topics()
    assert took_by == (stock.url,)
    assert stock.writes == [("/channel/create", {"topic": "orders", "channel": "ch"})]
    assert topics == ["orders"]
    assert took < 1.5 * TIMEOUT, f"the write took {took:.2f}s at a {TIMEOUT}s timeout"
    # the lookupd that took no part is named in a warning
    assert any("/channel/create" in r.getMessage() and f"127.0.0.1:{silent.port}" in
               r.getMessage() for r in caplog.records if r.levelname == "WARNING")


async def test_a_write_later_is_sent_again_to_a_lookupd_that_was_silent_before(
        fakes: list[FakeLookupd]) -> None:
    # only a timeout during the call itself spares the lookupd the write
    stock = await FakeLookupd("stock").start()
    fakes.append(stock)
    async with Lookup(quick_config(stock.url, request_timeout=TIMEOUT)) as lk:
        stock.mode = "hang"
        with pytest.raises(LookupFailedError):
            await lk.admin.topics()
        await stock.stop()
        await stock.start()  # the same port, answering again
        stock.mode = "ok"
        assert await lk.admin.create_channel("orders", "ch") == (stock.url,)
    assert stock.writes == [("/channel/create", {"topic": "orders", "channel": "ch"})]


async def test_a_write_to_a_leader_gone_silent_fails_in_one_request_timeout(
        fakes: list[FakeLookupd]) -> None:
    # it waited out the write, then the /listlookup pass that asked the silent leader again
    follower, leader = await youzan_cluster(2, leader=1)
    fakes += [follower, leader]
    async with Lookup(quick_config(follower.url, request_timeout=TIMEOUT)) as lk:
        async with asyncio.timeout(4 * TIMEOUT):
            await lk.discover()
        assert lk.leader == leader.url
        leader.mode = "hang"
        start = time.monotonic()
        with pytest.raises(LookupFailedError) as ei:
            async with asyncio.timeout(4 * TIMEOUT):
                await lk.admin.create_topic("orders", 1, 1)
        took = time.monotonic() - start
    text = str(ei.value)
    assert took < 1.5 * TIMEOUT, f"the write took {took:.2f}s at a {TIMEOUT}s timeout"
    assert leader.url in text and f"no answer within {TIMEOUT:g}s" in text, text
    # the follower still names the same leader: the write is not sent anywhere else
    assert leader.count("/topic/create") == 1 and follower.count("/topic/create") == 0
