"""A producer's stop() cancelled while it waits (``asyncio.wait_for(p.stop(), 1)``, or
``asyncio.run`` ending on Ctrl-C while ``async with`` closes): it is cut short, not left half
done. Before, the cancellation left the producer marked stopped with its connections open,
and every later stop() returned at once: the sockets stayed until the garbage collector
found them. A second stop() called meanwhile returned at once too, connections still open.

nsqd is made silent (the embedded cluster's ``delay_responses``): a publish stays unanswered,
so the graceful stop waits for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from smartnsq import Producer
from smartnsq.config import ConnectionConfig, ProducerConfig
from smartnsq.conn import Connection
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ClientClosedError, PublishError

#: long enough that no test here sees a silent nsqd answer
SILENCE = 1000.0


@pytest.fixture
async def stock() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, flavour="stock") as c:
        c.create_topic("t")
        yield c


def config(linger: float = 0.0) -> ProducerConfig:
    # a graceful stop would wait 10 s for the publish, then 5 s for its answer at the close
    return ProducerConfig(publish_timeout=10.0, request_timeout=10.0, linger=linger,
                          connection=ConnectionConfig(close_timeout=5.0))


async def an_unanswered_publish(p: Producer, c: DevCluster) -> asyncio.Task[None]:
    await p.publish("t", b"warm")
    c.delay_responses(0, SILENCE)
    task = asyncio.create_task(p.publish("t", b"unanswered"))
    await asyncio.sleep(0.05)  # written, waiting for its answer
    assert not task.done()
    return task


@pytest.mark.parametrize("linger", [0.0, 0.005])
async def test_a_stop_cancelled_by_a_timeout_closes_the_connections(stock: DevCluster,
                                                                    linger: float) -> None:
    p = Producer(nsqd=stock.nsqd_tcp_addresses, config=config(linger))
    await p.start()
    pending = await an_unanswered_publish(p, stock)
    conns = p.pools[stock.nsqd_tcp_addresses[0]].connections
    assert conns
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(p.stop(), 0.3)
    # the cut-short stop does not wait for answers: it ends soon after the timeout
    assert time.monotonic() - started < 2.0
    assert all(c.is_closed for c in conns)
    assert p.is_closed
    # the unanswered publish fails saying the producer stopped (nsqd may have stored it)
    async with asyncio.timeout(2):
        with pytest.raises((ClientClosedError, PublishError)):
            await pending
    # a later stop() has nothing left to do
    async with asyncio.timeout(1):
        await p.stop()


async def test_a_second_stop_waits_for_the_first(stock: DevCluster) -> None:
    p = Producer(nsqd=stock.nsqd_tcp_addresses, config=config())
    await p.start()
    pending = await an_unanswered_publish(p, stock)
    conns = p.pools[stock.nsqd_tcp_addresses[0]].connections
    first = asyncio.create_task(p.stop(0.3))
    await asyncio.sleep(0)
    async with asyncio.timeout(8):
        await p.stop()  # before: returned at once, the first still waiting
        assert first.done()
        assert all(c.is_closed for c in conns)
    await first
    with pytest.raises((ClientClosedError, PublishError)):
        await pending


async def test_a_waiter_not_cancelled_returns_when_another_cuts_the_stop_short(
        stock: DevCluster) -> None:
    p = Producer(nsqd=stock.nsqd_tcp_addresses, config=config())
    await p.start()
    pending = await an_unanswered_publish(p, stock)
    first = asyncio.create_task(p.stop())
    second = asyncio.create_task(p.stop())
    await asyncio.sleep(0.05)
    first.cancel()
    async with asyncio.timeout(2):
        await second  # stopped, without a cancellation of its own
        with pytest.raises(asyncio.CancelledError):
            await first
    with pytest.raises((ClientClosedError, PublishError)):
        await pending


async def test_async_with_cut_short_by_the_task_cancelled_leaves_nothing_open(
        stock: DevCluster) -> None:
    """``asyncio.run`` ending on Ctrl-C cancels the main task; if that happens in the
    block's exit (stop() waiting for an answer), the connections are still closed."""
    conns: list[Connection] = []
    pending: list[asyncio.Task[None]] = []

    async def app() -> None:
        async with Producer(nsqd=stock.nsqd_tcp_addresses, config=config()) as p:
            pending.append(await an_unanswered_publish(p, stock))
            conns.extend(p.pools[stock.nsqd_tcp_addresses[0]].connections)
            # the block ends: stop() waits for the unanswered publish, and is cancelled
            asyncio.get_running_loop().call_later(0.2, main.cancel)

    main = asyncio.create_task(app())
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(3):
            await main
    assert conns and all(c.is_closed for c in conns)
    with pytest.raises((ClientClosedError, PublishError)):
        await pending[0]


async def ticker(gaps: list[float]) -> None:
    """Records the longest pause between its ticks: how long the loop was blocked."""
    last = time.monotonic()
    while True:
        await asyncio.sleep(0.02)
        now = time.monotonic()
        gaps[0] = max(gaps[0], now - last)
        last = now


@pytest.mark.parametrize("mode", ["nsqd", "lookupd"])
async def test_a_publish_unanswered_at_stop_fails_at_the_stop_without_blocking_the_loop(
        stock: DevCluster, mode: str) -> None:
    """Before: the publish waited its whole publish_timeout (10 s) after stop() returned,
    and failed with 'no nsqd reachable (all in backoff)'. In lookupd mode its retry went
    round without a pause against the closed pool: the event loop was blocked for those
    10 s, and stop(0.3) itself took them (its last step waited for a loop turn)."""
    where = {"nsqd": stock.nsqd_tcp_addresses} if mode == "nsqd" else \
        {"lookupd": stock.lookupd_http_addresses}
    p = Producer(**where, config=ProducerConfig(  # type: ignore[arg-type]
        publish_timeout=10.0, request_timeout=10.0,
        connection=ConnectionConfig(close_timeout=0.3)))
    await p.start()
    pending = await an_unanswered_publish(p, stock)
    gaps = [0.0]
    tick = asyncio.create_task(ticker(gaps))
    try:
        started = time.monotonic()
        async with asyncio.timeout(3):
            await p.stop(0.3)
            with pytest.raises(ClientClosedError):
                await pending
        assert time.monotonic() - started < 2.0
        assert gaps[0] < 0.5, f"the event loop was blocked for {gaps[0]:.1f}s"
    finally:
        tick.cancel()
