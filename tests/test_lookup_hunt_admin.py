"""Hunt findings on the lookup's admin writes: their outcome feeds the health book that
orders and demotes lookupds (scripted lookupds on 127.0.0.1)."""

from __future__ import annotations

import pytest

from smartnsq.errors import LookupdError, LookupFailedError
from smartnsq.lookup import Lookup
from tests.lookup_fakes import V1_HEADERS, FakeLookupd, quick_config, youzan_cluster

ERROR_500 = (500, b'{"message":"INTERNAL_ERROR"}', V1_HEADERS)


async def test_a_lookupd_failing_every_write_is_demoted(fakes: list[FakeLookupd]) -> None:
    # stock: no leader, each write goes to every lookupd; one answers 500 to every write
    good, bad = await FakeLookupd("stock").start(), await FakeLookupd("stock").start()
    fakes += [good, bad]
    bad.raw["/channel/create"] = ERROR_500
    async with Lookup(quick_config(good.url, bad.url)) as lk:
        for _ in range(3):
            assert await lk.admin.create_channel("t", "c") == (good.url,)
        status = {s.address: s for s in lk.lookupds()}
        assert status[bad.url].demoted and status[bad.url].consecutive_failures == 3
        assert "/channel/create" in (status[bad.url].last_error or "")
        assert not status[good.url].demoted
        # the next round does not wait for it: it is probed only when due
        before = bad.count("/lookup")
        await lk.refresh("t")
        assert bad.count("/lookup") == before


async def test_a_refused_write_is_the_callers_error_not_the_lookupds(
        fakes: list[FakeLookupd]) -> None:
    # 400 (bad arguments, topic exists ...): the lookupd answered; its health is untouched
    a = await FakeLookupd("stock").start()
    fakes.append(a)
    a.raw["/topic/delete"] = (400, b'{"message":"INVALID_ARG"}', V1_HEADERS)
    async with Lookup(quick_config(a.url)) as lk:
        for _ in range(3):
            with pytest.raises(LookupdError, match="INVALID_ARG"):
                await lk.admin.delete_topic("t")
        (status,) = lk.lookupds()
        assert status.consecutive_failures == 0 and not status.demoted


async def test_a_refused_read_is_an_answer_too(fakes: list[FakeLookupd]) -> None:
    # reads follow the writes' rule: a 400 is an answer about the call, and the lookupd
    # that gave it is neither counted as failing nor demoted
    good, picky = await FakeLookupd("stock").start(), await FakeLookupd("stock").start()
    fakes += [good, picky]
    good.raw["/channels"] = (200, b'{"channels":["c"]}', V1_HEADERS)
    picky.raw["/channels"] = (400, b'{"message":"INVALID_ARG_TOPIC"}', V1_HEADERS)
    async with Lookup(quick_config(good.url, picky.url)) as lk:
        for _ in range(3):
            assert await lk.admin.channels("t") == ["c"]
        status = {s.address: s for s in lk.lookupds()}
        assert status[picky.url].consecutive_failures == 0 and not status[picky.url].demoted


async def test_a_leader_failing_writes_is_recorded_and_a_success_clears_it(
        fakes: list[FakeLookupd]) -> None:
    a, b = await youzan_cluster(2, leader=0)
    fakes += [a, b]
    a.raw["/topic/create"] = ERROR_500
    async with Lookup(quick_config(a.url)) as lk:
        await lk.discover()
        with pytest.raises(LookupdError, match="INTERNAL_ERROR"):
            await lk.admin.create_topic("t", 1, 1)
        status = {s.address: s for s in lk.lookupds()}
        assert status[a.url].consecutive_failures == 1
        assert "/topic/create" in (status[a.url].last_error or "")
        del a.raw["/topic/create"]
        assert await lk.admin.create_topic("t", 1, 1) == (a.url,)
        status = {s.address: s for s in lk.lookupds()}
        assert status[a.url].consecutive_failures == 0


async def test_every_lookupd_failing_a_write_names_each(fakes: list[FakeLookupd]) -> None:
    a, b = await FakeLookupd("stock").start(), await FakeLookupd("stock").start()
    fakes += [a, b]
    a.raw["/channel/create"] = b.raw["/channel/create"] = ERROR_500
    async with Lookup(quick_config(a.url, b.url)) as lk:
        with pytest.raises(LookupFailedError) as ei:
            await lk.admin.create_channel("t", "c")
        assert a.url.removeprefix("http://") in str(ei.value)
        assert b.url.removeprefix("http://") in str(ei.value)
        assert all(s.consecutive_failures == 1 for s in lk.lookupds())
