"""Demotion and backoff (health.py), coalescing (coalesce.py), jittered loops (refresher.py)."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from smartnsq.errors import LookupFailedError
from smartnsq.lookup.coalesce import Coalescer
from smartnsq.lookup.health import HealthBook
from smartnsq.lookup.refresher import jittered_delay, run_periodically

A, B, C = "http://a:1", "http://b:1", "http://c:1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def book(clock: Clock, threshold: int = 2) -> HealthBook:
    hb = HealthBook(failure_threshold=threshold, retry_min=1.0, retry_max=4.0, clock=clock)
    hb.add(A, seed=True)
    hb.add(B)
    hb.add(C)
    return hb


def test_demotion_after_threshold_and_backoff_doubling(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    hb = book(clock)
    assert hb.plan() == ([A, B, C], [])
    assert not hb.failure(B, "refused")
    assert not hb.is_demoted(B) and "1/2 failures" in caplog.text
    assert hb.failure(B, "refused")
    assert hb.is_demoted(B) and f"lookupd {B} demoted after 2 consecutive failures" in caplog.text
    assert hb.plan() == ([A, C], [])
    assert hb.ordered() == [A, C, B]
    clock.now += 1.0
    assert hb.plan() == ([A, C], [B])
    # claimed: a second round at the same moment does not probe again
    assert hb.plan() == ([A, C], [])
    retries = []
    for _ in range(4):
        hb.failure(B, "refused")
        status = {s.address: s for s in hb.snapshot(None)}[B]
        retries.append(status.retry_in)
    assert retries == [2.0, 4.0, 4.0, 4.0]


def test_success_promotes_and_resets(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "smartnsq.lookup")
    clock = Clock()
    hb = book(clock, threshold=1)
    hb.failure(C, "timeout")
    assert hb.is_demoted(C)
    hb.success(C)
    assert not hb.is_demoted(C) and "promoted" in caplog.text
    status = {s.address: s for s in hb.snapshot(A)}
    assert status[C].consecutive_failures == 0 and status[C].last_error is None
    assert status[A].leader and status[A].seed and not status[B].seed


def test_a_success_between_failures_resets_the_count() -> None:
    hb = book(Clock(), threshold=2)
    hb.failure(A, "x")
    hb.success(A)
    hb.failure(A, "x")
    assert not hb.is_demoted(A)


def test_all_demoted_and_none_due_still_probes_the_soonest() -> None:
    clock = Clock()
    hb = book(clock, threshold=1)
    hb.failure(A, "x")
    clock.now += 0.5
    hb.failure(B, "x")
    hb.failure(C, "x")
    assert hb.plan() == ([], [A])


def test_unknown_addresses_are_ignored() -> None:
    hb = book(Clock())
    assert not hb.failure("http://nope:1", "x")
    hb.success("http://nope:1")
    hb.remove(B)
    assert hb.addresses == (A, C) and B not in hb
    assert not hb.add(A) and hb.is_seed(A) and not hb.is_seed(C)


def test_jittered_delay_stays_within_interval_and_jitter() -> None:
    class Fixed(random.Random):
        def __init__(self, v: float) -> None:
            super().__init__()
            self.v = v

        def random(self) -> float:
            return self.v

    assert jittered_delay(60, 0.3, Fixed(0.0)) == 60
    assert jittered_delay(60, 0.3, Fixed(0.5)) == pytest.approx(69)
    rng = random.Random(1)
    delays = [jittered_delay(10, 0.3, rng) for _ in range(200)]
    assert min(delays) >= 10 and max(delays) < 13 and len(set(delays)) > 100


# -- coalescing ----------------------------------------------------------------------------

async def test_concurrent_callers_share_one_round() -> None:
    calls = 0

    async def run() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        return calls

    co: Coalescer[int] = Coalescer(run)
    results = await asyncio.gather(*(co() for _ in range(11)))
    assert results == [1] * 11 and calls == 1 and co.rounds == 1


async def test_caller_during_a_running_round_gets_a_later_round() -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    calls = 0

    async def run() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            started.set()
            await release.wait()
        return calls

    co: Coalescer[int] = Coalescer(run)
    first = asyncio.create_task(co())
    await asyncio.wait_for(started.wait(), 1)
    later = [asyncio.create_task(co()) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.wait_for(first, 1) == 1
    assert await asyncio.wait_for(asyncio.gather(*later), 1) == [2] * 5
    assert co.rounds == 2


async def test_errors_reach_every_caller_and_the_next_round_runs() -> None:
    outcomes = [LookupFailedError("down"), 7]

    async def run() -> int:
        o = outcomes.pop(0)
        if isinstance(o, Exception):
            raise o
        return o

    co: Coalescer[int] = Coalescer(run)
    results = await asyncio.gather(co(), co(), return_exceptions=True)
    assert all(isinstance(r, LookupFailedError) for r in results)
    assert await co() == 7


async def test_min_spacing_delays_only_back_to_back_rounds() -> None:
    loop = asyncio.get_running_loop()
    starts: list[float] = []

    async def run() -> None:
        starts.append(loop.time())

    co: Coalescer[None] = Coalescer(run, min_spacing=0.05)
    await co()
    await co()
    assert starts[1] - starts[0] >= 0.049


async def test_close_cancels_waiting_callers() -> None:
    release = asyncio.Event()

    async def run() -> None:
        await release.wait()

    co: Coalescer[None] = Coalescer(run)
    waiter = asyncio.create_task(co())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert co.busy
    await co.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiter, 1)
    assert not co.busy


async def test_periodic_loop_survives_every_error(caplog: pytest.LogCaptureFixture) -> None:
    done = asyncio.Event()
    outcomes: list[Exception | None] = [LookupFailedError("all down"), RuntimeError("bug"),
                                        None]
    runs = 0

    async def round_() -> None:
        nonlocal runs
        runs += 1
        o = outcomes.pop(0) if outcomes else None
        if not outcomes:
            done.set()
        if o is not None:
            raise o

    task = asyncio.create_task(run_periodically("test loop", round_, lambda: 0.001,
                                                immediately=True))
    await asyncio.wait_for(done.wait(), 2)
    assert not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert runs == 3
    assert "test loop: unexpected error" in caplog.text and "RuntimeError: bug" in caplog.text


def test_the_same_failure_between_answers_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    # a lookupd that answers /listlookup but refuses each /lookup: one warning, not one per
    # poll; a different reason, or the same one much later, warns again
    clock = Clock()
    hb = book(clock, threshold=3)
    with caplog.at_level(logging.DEBUG, logger="smartnsq.lookup"):
        for _ in range(5):
            hb.failure(A, "partition_num too large")
            hb.success(A)
            clock.now += 60
        hb.failure(A, "HTTP 500")
        clock.now += 600
        hb.failure(A, "HTTP 500")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 3, warned
    assert "partition_num too large" in warned[0] and "HTTP 500" in warned[1]
