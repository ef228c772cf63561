"""The asyncio Producer and HttpProducer as users of aiokafka, pynsq, gnsq and ansq write code
against them: one publish per web request, a shared producer through an nsqd restart,
publishes cut short by wait_for and TaskGroups, stop() beside publishes in flight,
auto-batching at the size limits, careless arguments, wrong ports. Each publish that returned
is stored exactly once, each call ends within its time with an error naming what was wrong."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import AsyncIterator

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.devcluster.nsqd import NsqdOptions
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    NsqdHttpWrongPortError,
    PublishError,
)
from smartnsq.errors.ports import LOOKUPD_HTTP, NSQD_TCP
from smartnsq.producer import BatchReceipt, HttpProducer, Producer, TraceSwitch
from tests.test_producer_support import bodies_of, consume

FAST = ProducerConfig(publish_timeout=3.0, reconnect_min=0.02, reconnect_max=0.2)
#: bound on every wait
WAIT = 15.0


@pytest.fixture
async def stock() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, flavour="stock") as c:
        yield c


def stored(c: DevCluster, topic: str) -> int:
    st = c.store.stock_topic(c.nodes[0].node_id, topic)
    return 0 if st is None else st.message_count


async def read_back(c: DevCluster, topic: str, expect: int) -> collections.Counter[bytes]:
    """Every message of ``topic`` (there are ``expect``), by body."""
    assert stored(c, topic) == expect
    got = bodies_of(await consume(c.nsqd_tcp_addresses[0], topic, "c", expect))
    return collections.Counter(got)


# ---------------------------------------------------------------- web requests, restarts

async def test_a_fresh_producer_per_request_leaves_nothing_behind(stock: DevCluster) -> None:
    stock.create_topic("req", channels=["c"])
    before = len(asyncio.all_tasks())
    async with asyncio.timeout(WAIT):
        for i in range(200):
            p = Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST)
            await p.start()
            await p.publish("req", b"r%03d" % i)
            await p.stop()
    assert len(asyncio.all_tasks()) == before
    assert await read_back(stock, "req", 200) == {b"r%03d" % i: 1 for i in range(200)}


async def test_a_shared_producer_through_an_nsqd_restart(stock: DevCluster) -> None:
    """1,000 gathered publishes while the one nsqd is stopped and started again: the calls
    that fail name the nsqd, the ones that returned are stored once each."""
    stock.create_topic("bounce", channels=["c"])

    async def bounce() -> None:
        await asyncio.sleep(0.3)
        await stock.stop_node(0)
        await asyncio.sleep(0.3)
        await stock.start_node(0)

    async with Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST) as p:
        async def one(i: int) -> None:
            await asyncio.sleep(i * 0.001)
            await p.publish("bounce", b"m%04d" % i)

        restart = asyncio.create_task(bounce())
        started = time.monotonic()
        results = await asyncio.wait_for(
            asyncio.gather(*(one(i) for i in range(1000)), return_exceptions=True), WAIT)
        await restart
    assert time.monotonic() - started < FAST.publish_timeout + 1
    # a failure names the nsqd: mostly a refused dial ("no nsqd reachable"); under load also
    # a connection lost after the write, or the deadline reached while it redials
    addr = stock.nsqd_tcp_addresses[0]
    failed = {b"m%04d" % i: r for i, r in enumerate(results) if r is not None}
    odd = collections.Counter(f"{type(r).__name__}: {r}"[:160] for r in failed.values()
                              if not (isinstance(r, PublishError) and addr in str(r)))
    assert not odd, odd
    ok = {b"m%04d" % i for i, r in enumerate(results) if r is None}
    assert len(ok) + len(failed) == 1000 and len(ok) > 500
    # each one that returned is stored once; one that failed after its write may be stored
    # too (at-least-once), at most once per attempt; nothing else is
    got = await read_back(stock, "bounce", stored(stock, "bounce"))
    assert all(got[body] == 1 for body in ok)
    assert all(got[body] <= FAST.max_attempts for body in failed)
    assert set(got) <= ok | set(failed)


# ---------------------------------------------------------------- cancellation

async def test_wait_for_and_task_group_cancellations_keep_the_answers_aligned() -> None:
    """PUB_TRACE answers carry the caller's trace id: after publishes cancelled mid-flight
    (wait_for, a TaskGroup's failing sibling), each later call gets its own receipt."""
    async with DevCluster(nodes=1, flavour="youzan") as c:
        c.create_topic("aligned", partition_num=1, channels=["c"])
        async with Producer(lookupd=c.lookupd_http_addresses, config=FAST) as p:
            await p.publish("aligned", b"warm", trace_id=1)
            c.delay_responses(0, 0.02)
            outcomes = []
            for i in range(30):
                try:
                    r = await asyncio.wait_for(
                        p.publish("aligned", b"w%d" % i, trace_id=100 + i),
                        timeout=(0.005, 0.03, 0.2)[i % 3])
                    outcomes.append(r.trace_id == 100 + i)
                except TimeoutError:
                    outcomes.append(None)
            assert None in outcomes and True in outcomes and False not in outcomes

            async def sibling() -> None:
                await asyncio.sleep(0.03)
                raise LookupError("sibling failed")

            with pytest.raises(ExceptionGroup):
                async with asyncio.TaskGroup() as g:
                    for i in range(20):
                        g.create_task(p.publish("aligned", b"g%d" % i, trace_id=200 + i))
                    g.create_task(sibling())
            c.delay_responses(0, 0)
            receipts = await asyncio.wait_for(asyncio.gather(
                *(p.publish("aligned", b"a%d" % i, trace_id=300 + i) for i in range(100))),
                WAIT)
            assert [r.trace_id for r in receipts] == list(range(300, 400))
            assert len({r.offset for r in receipts}) == 100


# ---------------------------------------------------------------- stop()

async def test_two_stops_beside_publishes_in_flight(stock: DevCluster) -> None:
    stock.create_topic("stop2", channels=["c"])
    p = Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST)
    await p.start()
    await p.publish("stop2", b"warm")
    stock.delay_responses(0, 0.02)
    tasks = [asyncio.create_task(p.publish("stop2", b"s%d" % i)) for i in range(20)]
    await asyncio.sleep(0.01)
    await asyncio.wait_for(asyncio.gather(p.stop(), p.stop()), WAIT)
    assert [t.result() for t in tasks] == [None] * 20  # stop() waited for them
    with pytest.raises(ClientClosedError):
        await p.publish("stop2", b"late")
    with pytest.raises(KeyError):
        async with Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST) as q:
            await q.publish("stop2", b"in the block")
            raise KeyError("the request failed")
    assert q.is_closed
    assert stored(stock, "stop2") == 22


async def test_a_stop_cut_short_fails_batched_callers_with_client_closed(
        stock: DevCluster, caplog: pytest.LogCaptureFixture) -> None:
    """Auto-batched publishes still unanswered when stop()'s timeout ends fail as unbatched
    ones do, with ClientClosedError: their tasks were not cancelled (a CancelledError would
    end the caller's task, a web framework's request, as if it had been)."""
    stock.create_topic("short", channels=["c"])
    p = Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST.replace(linger=0.005))
    await p.start()
    await p.publish("short", b"warm")
    stock.delay_responses(0, 1.0)
    tasks = [asyncio.create_task(p.publish("short", b"s%d" % i)) for i in range(5)]
    await asyncio.sleep(0.05)  # the batch is on the wire
    await asyncio.wait_for(p.stop(timeout=0.05), WAIT)
    done, _ = await asyncio.wait(tasks, timeout=WAIT)
    assert len(done) == 5
    assert not any(t.cancelled() for t in tasks)
    assert all(isinstance(t.exception(), ClientClosedError) for t in tasks)
    # the warning gives the timeout as given (it said 0.1s)
    assert "still in flight after 0.05s" in caplog.text
    stock.delay_responses(0, 0)


async def test_a_stop_cut_short_fails_ordered_callers_with_client_closed() -> None:
    async with DevCluster(nodes=1, flavour="youzan") as c:
        c.create_topic("lanes", partition_num=2, ordered=True, channels=["c"])
        p = Producer(lookupd=c.lookupd_http_addresses, config=FAST)
        await p.start()
        await p.publish_ordered("lanes", "k", b"warm")
        c.delay_responses(0, 1.0)
        # one in flight and two queued behind it, per key
        tasks = [asyncio.create_task(p.publish_ordered("lanes", k, b"%s%d" % (k.encode(), i)))
                 for i in range(3) for k in ("a", "b")]
        await asyncio.sleep(0.05)
        await asyncio.wait_for(p.stop(timeout=0.05), WAIT)
        done, _ = await asyncio.wait(tasks, timeout=WAIT)
        assert len(done) == 6
        assert not any(t.cancelled() for t in tasks)
        assert all(isinstance(t.exception(), ClientClosedError) for t in tasks)
        c.delay_responses(0, 0)


# ---------------------------------------------------------------- sizes and batches

async def test_a_message_too_big_for_an_mpub_of_its_own_goes_as_a_pub() -> None:
    """nsqd bounds a PUB by max_msg_size and an MPUB by max_body_size: with the two equal, a
    message near the limit that a plain publish stores fails as an MPUB of one (E_BAD_BODY,
    and nsqd closes the connection; /mpub answers BODY_TOO_BIG). Auto-batching and
    publish_many send it as a PUB (/pub)."""
    limits = NsqdOptions(max_msg_size=1024, max_body_size=1024)
    async with DevCluster(nodes=1, flavour="stock", nsqd_options=limits) as c:
        c.create_topic("big", channels=["c"])
        cfg = FAST.replace(max_msg_size=1024, max_body_size=1024)
        sizes = [1024, 1020, 10, 1016, 500, 600]
        async with Producer(nsqd=c.nsqd_tcp_addresses, config=cfg.replace(linger=0.01)) as p:
            await asyncio.wait_for(asyncio.gather(
                *(p.publish("big", b"%d" % n + b"x" * (n - len(b"%d" % n))) for n in sizes)),
                WAIT)
        async with Producer(nsqd=c.nsqd_tcp_addresses, config=cfg) as p:
            bodies = [b"y" * n for n in (1024, 1020, 3, 1017)]
            receipt = await asyncio.wait_for(p.publish_many("big", bodies), WAIT)
            assert receipt == BatchReceipt("big", 4, (None,) * 4, ())  # none fits beside another
            conn = p.pools[c.nsqd_tcp_addresses[0]].connections[0]
            assert conn.is_connected and conn.error is None
        async with HttpProducer(nsqd=c.nsqd_http_addresses, config=cfg) as h:
            receipt = await asyncio.wait_for(h.publish_many("big", bodies), WAIT)
            assert receipt == BatchReceipt("big", 4, (None,) * 4, ())
        got = await read_back(c, "big", 14)
        assert sorted(map(len, got.elements())) == sorted([*sizes, *map(len, bodies * 2)])


async def test_a_traced_auto_batch_near_max_body_size_is_stored(
        caplog: pytest.LogCaptureFixture) -> None:
    """With the trace switch on, an auto-batch goes out as MPUB_TRACE, 8 bytes more per
    message than the MPUB the batcher sized: ten 96-byte messages (1,004 bytes as an MPUB)
    made 1,084 and nsqd refused them all with E_BAD_BODY. The batcher sizes a batch as the
    MPUB_TRACE it may become: two batches, both traced."""
    limits = NsqdOptions(max_msg_size=1024, max_body_size=1024)
    async with DevCluster(nodes=1, flavour="youzan", nsqd_options=limits) as c:
        c.create_topic("traced", partition_num=1, channels=["c"])
        switch = TraceSwitch()
        switch.enable("traced")
        cfg = FAST.replace(linger=0.01, max_msg_size=1024, max_body_size=1024)
        async with Producer(lookupd=c.lookupd_http_addresses, config=cfg,
                            trace_switch=switch) as p:
            with caplog.at_level(logging.INFO, logger="smartnsq.trace"):
                await asyncio.wait_for(asyncio.gather(
                    *(p.publish("traced", b"%02d" % i + b"x" * 94) for i in range(10))), WAIT)
            assert p.batcher is not None and p.batcher.batches == 2
            # both went out traced: a receipt each, their counts adding up
            counts = [int(r.getMessage().rsplit("count=", 1)[1]) for r in caplog.records
                      if r.name == "smartnsq.trace" and "published" in r.getMessage()]
            assert len(counts) == 2 and sum(counts) == 10
        assert sum(len(part.records) for part in c.store.partitions_of("traced").values()) == 10


async def test_publish_many_with_careless_bodies(stock: DevCluster) -> None:
    stock.create_topic("many", channels=["c"])
    async with Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST) as p, \
            HttpProducer(nsqd=stock.nsqd_http_addresses, config=FAST) as h:
        for producer in (p, h):
            for bodies in (b"abc", bytearray(b"abc"), memoryview(b"abc"), "abc",
                           (b for b in [b"a"]), {b"a"}, None):
                with pytest.raises(ConfigError, match="bodies must be a"):
                    await producer.publish_many("many", bodies)  # type: ignore[arg-type]
            with pytest.raises(ConfigError):
                await producer.publish_many("many", [])
            with pytest.raises(ConfigError, match="must not be empty"):
                await producer.publish_many("many", [b"a", b""])
        listed = [b"%d" % i for i in range(100_000)]
        call = asyncio.create_task(p.publish_many("many", listed))
        await asyncio.sleep(0)  # the call has begun: what the list held then is published
        listed.append(b"appended after the call")
        listed[0] = b"changed after the call"
        assert (await asyncio.wait_for(call, WAIT)).count == 100_000
        assert (await h.publish_many("many", [b"one"])).count == 1
    assert stored(stock, "many") == 100_001


async def test_odd_timeouts_and_delays_are_refused_naming_them(stock: DevCluster) -> None:
    stock.create_topic("odd", channels=["c"])
    async with Producer(nsqd=stock.nsqd_tcp_addresses, config=FAST) as p, \
            HttpProducer(nsqd=stock.nsqd_http_addresses, config=FAST) as h:
        for producer in (p, h):
            for timeout in (0, -1, float("nan"), float("inf"), "1", True):
                with pytest.raises(ConfigError, match="timeout must be"):
                    await producer.publish("odd", b"x", timeout=timeout)  # type: ignore[arg-type]
            for delay in (-1, float("nan"), "1", 1e12):
                with pytest.raises(ConfigError, match="delay"):
                    await producer.publish_deferred("odd", b"x", delay)  # type: ignore[arg-type]
            await producer.publish_deferred("odd", b"now", 0)
            await producer.publish_deferred("odd", b"soon", 0.0015)
            await producer.publish("odd", b"patient", timeout=0.5)
    assert stored(stock, "odd") == 6


# ---------------------------------------------------------------- HttpProducer, wrong ports

@pytest.mark.parametrize("kind", ["nsqd TCP", "nsqlookupd HTTP"])
async def test_http_producer_given_another_port_names_it_in_time(
        stock: DevCluster, kind: str) -> None:
    stock.create_topic("ports", channels=["c"])
    address = stock.nsqd_tcp_addresses[0] if kind == "nsqd TCP" else \
        stock.lookupd_http_addresses[0]
    started = time.monotonic()
    async with HttpProducer(nsqd=address, config=FAST) as h:
        with pytest.raises(PublishError, match="not an nsqd HTTP port") as info:
            await h.publish("ports", b"x")
    assert time.monotonic() - started < FAST.publish_timeout
    cause = info.value.__cause__
    assert isinstance(cause, NsqdHttpWrongPortError)
    assert cause.address == address
    assert cause.found == (NSQD_TCP if kind == "nsqd TCP" else LOOKUPD_HTTP)
    assert stored(stock, "ports") == 0
