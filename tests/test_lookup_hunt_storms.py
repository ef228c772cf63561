"""Hunt findings on bursts the lookup meets in production: stale-leader reports from every
connection at once, and many topics refreshed together (scripted lookupds on 127.0.0.1)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from smartnsq.errors import LookupFailedError
from smartnsq.lookup import Lookup
from tests.lookup_fakes import FakeLookupd, TopicSpec, closed_port_url, quick_config
from tests.silent_server import silent_servers


async def test_a_burst_of_stale_reports_is_one_round_and_one_task(
        fakes: list[FakeLookupd]) -> None:
    # a consumer whose 1000 partition connections all drop at once reports each of them
    fake = await FakeLookupd("stock").start()
    fakes.append(fake)
    fake.topics["t"] = TopicSpec(legacy=[4150])
    async with Lookup(quick_config(fake.url)) as lk:
        await lk.lookup("t")
        before_tasks = len(asyncio.all_tasks())
        before = fake.count("/lookup")
        asked = fake.path_event("/lookup")
        for p in range(1000):
            lk.report_stale("t", p, access="r")
        # one round runs for all of them: not a task per report (100k reports took 4 s
        # and 138 MB of tasks that all joined the same round)
        assert len(asyncio.all_tasks()) - before_tasks <= 2
        await asyncio.wait_for(asked.wait(), 5)
        # a report while that round runs gets a round that starts after it, which a
        # refresh now joins (rounds of one topic are 0.1 s apart)
        lk.report_stale("t")
        await asyncio.wait_for(lk.refresh("t"), 5)
        assert fake.count("/lookup") - before == 2
        assert lk.rounds("t") == 3


async def test_a_burst_of_failures_demotes_without_blowing_the_backoff() -> None:
    # 20 topics refreshed together while the lookupd restarts (its port refuses)
    dead = closed_port_url()
    async with Lookup(quick_config(dead, demoted_retry_min=0.5, demoted_retry_max=60)) as lk:
        results = await asyncio.gather(*(lk.refresh(f"t{i}") for i in range(20)),
                                       return_exceptions=True)
        assert all(isinstance(r, LookupFailedError) for r in results)
        (status,) = lk.lookupds()
        assert status.demoted and status.consecutive_failures >= 20
        # probed again after the first backoff, not after the cap: the 17 requests already
        # in flight when it was demoted are not 17 failed probes (it was 60 s)
        assert status.retry_in <= 0.5


async def test_many_topics_refreshed_at_once_do_not_demote_a_healthy_lookupd(
        fakes: list[FakeLookupd]) -> None:
    # a producer's 401 topics refreshed together (after a long pause of the loop, every
    # refresher is due at once) on a lookupd that takes 0.2 s to answer each. The timeout
    # leaves 0.5 s to spare for a loaded machine (the fake answers on this loop too), and
    # is still below the 1 s the last ones waited in aiohttp's pool of 100 connections
    n = 401
    fake = await FakeLookupd("stock").start()
    fakes.append(fake)
    fake.topics = {f"t{i}": TopicSpec(legacy=[4150]) for i in range(n)}
    fake.delay = 0.2
    async with Lookup(quick_config(fake.url, request_timeout=0.7)) as lk:
        views = await asyncio.wait_for(
            asyncio.gather(*(lk.refresh(f"t{i}") for i in range(n))), 20)
        # 200 of them failed with "no answer within 0.7s" while they waited for a pooled
        # connection, and the lookupd was demoted
        assert all(v.nodes for v in views)
        (status,) = lk.lookupds()
        assert not status.demoted and status.consecutive_failures == 0
        assert fake.count("/lookup") == n


async def test_requests_queued_behind_a_silent_lookupd_fail_with_the_first() -> None:
    async with silent_servers() as make:
        silent = await make()
        async with Lookup(quick_config(silent.address, request_timeout=0.3)) as lk:
            loop = asyncio.get_running_loop()
            start = loop.time()
            results = await asyncio.wait_for(asyncio.gather(
                *(lk.refresh(f"t{i}") for i in range(100)), return_exceptions=True), 10)
            took = loop.time() - start
        # the 68 requests queued behind the first 32 do not wait a timeout each batch
        assert all(isinstance(r, LookupFailedError) for r in results)
        assert took < 1.0
        assert silent.accepted <= 33  # 32 slots (+ the /listlookup pass before them)
        assert any("not sent" in str(r) for r in results)


class OneSlowTopic(FakeLookupd):
    """Answers topic ``slow`` 1 s later than the others."""

    async def _respond(self, request: web.Request, path: str,
                       params: dict[str, str]) -> web.Response:
        if params.get("topic") == "slow":
            await asyncio.sleep(1.0)
        return await super()._respond(request, path, params)


async def test_one_request_timing_out_does_not_fail_those_queued_behind_it(
        fakes: list[FakeLookupd]) -> None:
    fake = await OneSlowTopic("stock").start()
    fakes.append(fake)
    fake.topics = {f"t{i}": TopicSpec(legacy=[4150]) for i in range(100)}
    fake.topics["slow"] = TopicSpec(legacy=[4150])
    # the 100 queue behind 31 free slots for 0.8 s, past the slow one's timeout; each one
    # answered has 0.4 s of its timeout to spare (a loaded machine)
    fake.delay = 0.2
    async with Lookup(quick_config(fake.url, request_timeout=0.6)) as lk:
        await lk.discover()
        slow = asyncio.ensure_future(lk.refresh("slow"))
        await asyncio.wait_for(fake.path_event("/lookup").wait(), 5)
        views = await asyncio.wait_for(
            asyncio.gather(*(lk.refresh(f"t{i}") for i in range(100))), 10)
        assert all(v.nodes for v in views)
        with pytest.raises(LookupFailedError, match=r"no answer within 0\.6s"):
            await slow
        (status,) = lk.lookupds()
        assert not status.demoted
