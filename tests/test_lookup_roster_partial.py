"""Discovery passes whose lookupds disagree: a lookupd that only the slower lookupd lists is
kept through every pass (not dropped by the faster answer, then re-added with its health
reset), and one that nobody lists any more is still dropped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from smartnsq.lookup import Lookup
from tests.lookup_fakes import FakeLookupd, quick_config

pytestmark = pytest.mark.timeout(20)

PASSES = 4
SLOW = 0.2


def lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.name == "smartnsq.lookup" and text in
               r.getMessage())


async def disagreeing(fakes: list[FakeLookupd]) -> tuple[FakeLookupd, FakeLookupd, FakeLookupd]:
    """fast lists (fast, slow); slow, answering SLOW seconds later, lists (fast, slow, extra)."""
    fast, slow, extra = [await FakeLookupd("youzan").start() for _ in range(3)]
    fakes += [fast, slow, extra]
    fast.cluster = [fast, slow]
    slow.cluster = [fast, slow, extra]
    for f in (fast, slow):
        f.cluster_leader = fast
    slow.path_delays["/listlookup"] = SLOW
    extra.mode = "error500"  # it fails every request: its failures must add up
    return fast, slow, extra


async def test_a_lookupd_only_the_slower_lookupd_lists_is_kept_across_passes(
        fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.lookup")
    fast, slow, extra = await disagreeing(fakes)
    async with Lookup(quick_config(fast.url, slow.url, failure_threshold=3)) as lk:
        async with asyncio.timeout(10):
            for _ in range(PASSES):
                known = await lk.discover()
        status = {s.address: s for s in lk.lookupds()}
    assert extra.url in known
    # it was dropped by fast's answer and discovered again by slow's, every pass
    assert lines(caplog, f"discovered lookupd {extra.url}") == 1, caplog.text
    assert lines(caplog, f"lookupd {extra.url} is no longer listed") == 0, caplog.text
    # its failures were not reset by being re-added: it is demoted after 3 in a row
    assert extra.count("/listlookup") >= 3
    assert status[extra.url].demoted, status[extra.url]
    assert lk.leader == fast.url


async def test_a_lookupd_no_answer_of_the_pass_lists_is_still_dropped(
        fakes: list[FakeLookupd], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.lookup")
    fast, slow, extra = await disagreeing(fakes)
    async with Lookup(quick_config(fast.url, slow.url)) as lk:
        async with asyncio.timeout(10):
            assert extra.url in await lk.discover()
            slow.cluster = [fast, slow]  # now both agree that extra left
            for _ in range(2):
                known = await lk.discover()
    assert extra.url not in known
    assert lines(caplog, f"lookupd {extra.url} is no longer listed") == 1, caplog.text
    assert lines(caplog, f"discovered lookupd {extra.url}") == 1, caplog.text
