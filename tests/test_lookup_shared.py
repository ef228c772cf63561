"""A Lookup used the way an operator's script or a service sharing it between clients uses it:
a silent seed next to a good lookupd, the Lookup stopped under its clients."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from smartnsq.errors import ClientClosedError
from smartnsq.lookup import Lookup
from tests.lookup_fakes import QUICK_TIMEOUT, FakeLookupd, TopicSpec, quick_config

pytestmark = pytest.mark.timeout(20)

T = "orders"
TIMEOUT = QUICK_TIMEOUT


async def good_and_silent(fakes: list[FakeLookupd]) -> tuple[FakeLookupd, FakeLookupd]:
    good = await FakeLookupd("stock").start()
    good.topics[T] = TopicSpec(legacy=[4150])
    silent = await FakeLookupd("stock").start()
    silent.mode = "hang"
    fakes.extend([good, silent])
    return good, silent


async def test_a_silent_seed_costs_the_first_lookup_one_request_timeout_not_two(
        fakes: list[FakeLookupd]) -> None:
    # the first round waited for the whole /listlookup pass (the silent seed's timeout),
    # then for the silent seed's /lookup: 2 x request_timeout before anything was returned
    good, silent = await good_and_silent(fakes)
    before = asyncio.all_tasks()
    async with Lookup(quick_config(silent.url, good.url)) as lk:
        start = time.monotonic()
        view = await lk.lookup(T, "r")
        took = time.monotonic() - start
        assert list(view.nodes) == ["127.0.0.1:4150"]
        assert took < 1.6 * TIMEOUT, f"first lookup took {took:.2f}s"
        assert view.failed[silent.url].endswith(f"no answer within {TIMEOUT:g}s")
    await asyncio.sleep(0)
    left = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert not [t for t in left if "lookup" in t.get_name()], left


async def test_stopped_during_the_first_discovery_pass_leaves_no_request_running(
        fakes: list[FakeLookupd]) -> None:
    _, silent = await good_and_silent(fakes)
    lk = Lookup(quick_config(silent.url))
    asked = silent.path_event("/listlookup")
    await lk.start()
    async with asyncio.timeout(2):
        await asked.wait()  # the pass is under way
    before_stop = len(asyncio.all_tasks())
    start = time.monotonic()
    await lk.stop()
    assert time.monotonic() - start < TIMEOUT  # cancelled, not waited out
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) < before_stop


async def test_a_lookup_stopped_under_a_subscriber_says_so_and_refuses_clearly(
        fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    good, _ = await good_and_silent(fakes)
    lk = Lookup(quick_config(good.url))
    await lk.lookup(T, "r")
    sub = lk.subscribe(T, "r")
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    await lk.stop()
    warned = [r.getMessage() for r in caplog.records if "Lookup stopped while" in r.getMessage()]
    assert len(warned) == 1 and f"{T}/r" in warned[0]
    async with asyncio.timeout(2):
        changes = [c async for c in sub]  # ends: the subscription was closed by stop()
    assert [c.previous for c in changes] == [None]  # only the snapshot it started with
    for call in (lk.refresh(T, "w"), lk.lookup(T), lk.start()):
        with pytest.raises(ClientClosedError, match=r"stopped .*cannot be started again"):
            await call
    with pytest.raises(ClientClosedError, match="give them a new Lookup"):
        lk.subscribe(T, "r")
    with pytest.raises(ClientClosedError, match="cannot be started again"):
        async with lk:
            pass


async def test_stopping_an_idle_lookup_warns_about_nothing(
        fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    good, _ = await good_and_silent(fakes)
    caplog.set_level(logging.WARNING, "smartnsq.lookup")
    async with Lookup(quick_config(good.url)) as lk:
        sub = lk.subscribe(T, "r")
        await lk.lookup(T, "r")
        sub.close()
    assert not [r for r in caplog.records if "Lookup stopped while" in r.getMessage()]
