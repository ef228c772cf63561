"""Users' patterns: code written the way users of pynsq, gnsq and aiokafka write it, against
the embedded cluster (and, under ``make test-real``, the real servers).

The invariant of every test: each message published reaches the application or stays in the
channel (nothing is given up unseen, nothing is lost), and each call returns or fails within
its stated time. Only the public API is used.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from smartnsq import (
    Consumer,
    ConsumerConfig,
    Message,
    NotStartedError,
    OrderedConsumer,
    Producer,
)
from smartnsq.consumer.unseen import unseen
from smartnsq.devcluster import DevCluster
from tests.real_servers import StockServer, YouzanCluster, stock, unique, youzan

__all__ = ["stock", "youzan"]  # the fixtures, imported for pytest

#: how long any single step of these tests may take before it counts as a hang
STEP = 20.0


async def publish_bodies(producer: Producer, topic: str, n: int) -> list[bytes]:
    sent = [b"msg-%03d" % i for i in range(n)]
    for body in sent:
        await producer.publish(topic, body)
    return sent


async def youzan_topic(y: YouzanCluster, prefix: str, partitions: int = 1,
                       ordered: bool = False) -> str:
    return (await y.create_topic(prefix, partition_num=partitions, replicator=1,
                                 ordered=ordered, channels=("app",))).name


async def stock_topic(s: StockServer, prefix: str) -> str:
    """A topic with the channel ``app`` made before anything is published (stock nsqd
    copies messages only to channels that exist)."""
    topic = unique(prefix)
    async with aiohttp.ClientSession() as http:
        for path, params in (("/topic/create", {"topic": topic}),
                             ("/channel/create", {"topic": topic, "channel": "app"})):
            async with http.post(f"http://{s.nsqd_http}{path}", params=params) as r:
                assert r.status == 200, await r.text()
    return topic


async def iterate_and_break(topic: str, sent: list[bytes], take: int, max_in_flight: int,
                            rounds: int, *, nsqd: list[str] | None = None,
                            lookupd: list[str] | None = None) -> Counter[bytes]:
    """A fresh consumer per round (reading through ``nsqd`` or ``lookupd``), ``async for`` +
    ``break`` after ``take`` messages, until every published body was seen (at most
    ``rounds`` rounds)."""
    seen: Counter[bytes] = Counter()
    config = ConsumerConfig(max_in_flight=max_in_flight, lookupd_poll_interval=0.5)
    for _ in range(rounds):
        if len(seen) == len(sent):
            break
        async with asyncio.timeout(STEP):
            async with Consumer(topic, "app", nsqd=nsqd, lookupd=lookupd, config=config) as c:
                n = 0
                async for m in c:
                    m.finish()
                    seen[m.body] += 1
                    n += 1
                    if n == take or len(seen) == len(sent):
                        break
            st = c.stats()
        assert st.given_up == 0, st
        # every read-ahead message went back once: not bounced back and forth on stop
        assert st.requeued <= max_in_flight + take, st
        assert st.received <= st.finished + st.requeued, st
    return seen


# ---------------------------------------------------------------------- iterate and break


@pytest.mark.real_youzan
async def test_iterate_and_break_with_fresh_consumers_youzan(youzan: YouzanCluster) -> None:
    """`async for` + `break` after 5 of 10 in flight, a fresh consumer each time: nothing is
    given up unseen (issue: 3 to 51 of 100 were)."""
    topic = await youzan_topic(youzan, "brk")
    async with Producer(lookupd=youzan.lookupd) as p:
        sent = await publish_bodies(p, topic, 100)
    seen = await iterate_and_break(topic, sent, take=5, max_in_flight=10, rounds=40,
                                   lookupd=[youzan.lookupd])
    assert set(seen) == set(sent)


@pytest.mark.real_nsqd
async def test_iterate_and_break_with_fresh_consumers_stock(stock: StockServer) -> None:
    topic = await stock_topic(stock, "brk")
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        sent = await publish_bodies(p, topic, 60)
    seen = await iterate_and_break(topic, sent, take=5, max_in_flight=10, rounds=30,
                                   nsqd=[stock.nsqd_tcp])
    assert set(seen) == set(sent)


async def test_break_after_one_with_deep_read_ahead_gives_nothing_up() -> None:
    """One message per consumer with 20 in flight: the same read-ahead messages go back
    many times, more than max_attempts; deliveries the application never saw do not count
    towards giving up."""
    unseen.clear()
    async with DevCluster(nodes=1, flavour="youzan") as cluster:
        cluster.create_topic("deep", partition_num=1, replica=1, channels=["app"])
        async with Producer(lookupd=cluster.lookupd_http_addresses) as p:
            sent = await publish_bodies(p, "deep", 12)
        seen = await iterate_and_break("deep", sent, take=1, max_in_flight=20, rounds=40,
                                       lookupd=cluster.lookupd_http_addresses)
    assert set(seen) == set(sent)
    assert all(n == 1 for n in seen.values()), seen


@pytest.mark.real_nsqd
async def test_break_before_finish_waits_the_drain_and_says_why(
        stock: StockServer, caplog: pytest.LogCaptureFixture) -> None:
    """The careless loop: ``break`` before ``finish()``. Leaving ``async with`` then waits
    for that message up to drain_timeout (another task may still answer it), and says so
    early, naming the fix; after the drain it is requeued, and the next reader gets it."""
    topic = await stock_topic(stock, "careless")
    addr = [stock.nsqd_tcp]
    async with Producer(nsqd=addr) as p:
        await p.publish(topic, b"only")
    config = ConsumerConfig(drain_timeout=2.0)
    with caplog.at_level(logging.WARNING, logger="smartnsq.consumer"):
        async with asyncio.timeout(STEP):
            async with Consumer(topic, "app", nsqd=addr, config=config) as c:
                async for msg in c:
                    assert msg.body == b"only"
                    break  # no finish()
    hints = [r.getMessage() for r in caplog.records
             if "call finish() or requeue() on each" in r.getMessage()]
    assert len(hints) == 1 and f"{topic}/app" in hints[0], caplog.text
    async with asyncio.timeout(STEP), Consumer(topic, "app", nsqd=addr) as again:
        async for msg in again:
            assert msg.body == b"only" and msg.attempts == 2
            msg.finish()
            break


@pytest.mark.real_nsqd
async def test_a_timeout_around_the_consumer_cuts_its_stop_short(
        stock: StockServer, caplog: pytest.LogCaptureFixture) -> None:
    """``async with asyncio.timeout(t): async with Consumer(...)``, the timeout firing while
    the stop drains (a message handed out and not answered): the consumer still ends closed,
    with no task left behind, and the message is back in the channel at once, not held for
    the rest of the drain (nor for nsqd's message timeout)."""
    topic = await stock_topic(stock, "cut")
    addr = [stock.nsqd_tcp]
    async with Producer(nsqd=addr) as p:
        sent = await publish_bodies(p, topic, 5)
    c = Consumer(topic, "app", nsqd=addr, config=ConsumerConfig(drain_timeout=60.0))
    with caplog.at_level(logging.WARNING, logger="smartnsq.consumer"), \
            pytest.raises(TimeoutError):
        async with asyncio.timeout(1.0), c:
            async for _ in c:
                break  # unanswered: the stop's drain would wait for it
    assert c.is_closed
    assert "stop() was cancelled" in caplog.text
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
              and "Consumer" in repr(t.get_coro())]
    assert not others, others
    got: list[bytes] = []
    async with asyncio.timeout(STEP), Consumer(topic, "app", nsqd=addr) as again:
        async for msg in again:
            got.append(msg.body)
            msg.finish()
            if len(got) == len(sent):
                break
    assert sorted(got) == sent


async def test_a_second_stop_waiting_beside_a_cancelled_one_returns() -> None:
    """Two tasks stop one consumer (a shutdown hook and the ``async with`` exit, say); the
    first is cancelled while the stop drains. The second was not cancelled: it returns,
    the consumer stopped, without a CancelledError of its own."""
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        addr = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=addr) as p:
            await p.publish("twostops", b"held")
        c = Consumer("twostops", "app", nsqd=addr, config=ConsumerConfig(drain_timeout=60.0))
        await c.start()
        async with asyncio.timeout(STEP):
            await anext(aiter(c))  # handed out, never answered: the drain waits for it
            first = asyncio.create_task(c.stop())
            second = asyncio.create_task(c.stop())
            for _ in range(2):  # two loop turns: both wait for the stop, which has begun
                await asyncio.sleep(0)
            assert not c.is_running and not first.done() and not second.done()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            await second
        assert c.is_closed


@pytest.mark.real_youzan
async def test_a_partition_the_topic_lacks_is_named(
        youzan: YouzanCluster, caplog: pytest.LogCaptureFixture) -> None:
    """``partitions=[1, 7]`` on a topic of two partitions (a typo, or the wrong topic): the
    consumer reads partition 1 and says that there is no partition 7."""
    topic = await youzan_topic(youzan, "two", partitions=2)
    async with Producer(lookupd=youzan.lookupd) as p:
        await p.publish(topic, b"on one", partition=1)
    with caplog.at_level(logging.WARNING, logger="smartnsq.consumer"):
        async with asyncio.timeout(STEP), \
                Consumer(topic, "app", lookupd=youzan.lookupd, partitions=[1, 7]) as c:
            async for msg in c:
                assert (msg.body, msg.partition) == (b"on one", 1)
                msg.finish()
                break
    said = [r.getMessage() for r in caplog.records if "no partition 7" in r.getMessage()]
    assert len(said) == 1 and "partitions 0..1" in said[0], caplog.text


# ---------------------------------------------------------------------- iterate with timeouts


async def test_anext_with_timeouts_never_strands_a_message() -> None:
    """The aiokafka-style poll loop: ``async with asyncio.timeout(t): await anext(it)``.
    A timed-out wait must not swallow the wake-up of the next one."""
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        addr = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=addr) as p, Consumer("polls", "app", nsqd=addr) as c:
            it = aiter(c)
            got: list[bytes] = []
            for i in range(5):
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await anext(it)  # nothing published yet: times out
                await p.publish("polls", b"poll-%d" % i)
                async with asyncio.timeout(STEP):
                    m = await anext(it)
                m.finish()
                got.append(m.body)
            assert got == [b"poll-%d" % i for i in range(5)]


async def test_poll_loop_with_short_timeouts_gets_every_message() -> None:
    """Messages arrive while the application polls with a short timeout."""
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        addr = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=addr) as p, Consumer("trickle", "app", nsqd=addr,
                                                 config=ConsumerConfig(max_in_flight=3)) as c:
            async def trickle() -> None:
                for i in range(30):
                    await p.publish("trickle", b"t-%02d" % i)
                    await asyncio.sleep(0.005)

            task = asyncio.create_task(trickle())
            got: list[bytes] = []
            it = aiter(c)
            async with asyncio.timeout(STEP):
                while len(got) < 30:
                    try:
                        async with asyncio.timeout(0.003):
                            m = await anext(it)
                    except TimeoutError:
                        continue
                    m.finish()
                    got.append(m.body)
            await task
            assert sorted(got) == [b"t-%02d" % i for i in range(30)]


async def test_iterating_a_consumer_that_was_not_started_says_how_and_loses_nothing() -> None:
    """Code written for the old implicit start (``c = Consumer(...); async for m in c``):
    the first ``anext`` says to start it, takes nothing off the channel, and the same loop
    under ``async with`` gets the message."""
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        addr = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=addr) as p:
            await p.publish("jobs", b"job-1")
        c = Consumer("jobs", "app", nsqd=addr)
        with pytest.raises(NotStartedError, match="async with Consumer"):
            async with asyncio.timeout(STEP):
                async for _ in c:
                    pass
        assert not c.is_closed  # not started is not stopped: it can start now
        async with c:
            async with asyncio.timeout(STEP):
                m = await anext(aiter(c))
            m.finish()
        assert m.body == b"job-1" and m.attempts == 1
        assert c.is_closed


# ---------------------------------------------------------------------- start/stop in a loop


@pytest.mark.real_youzan
async def test_handler_consumers_started_and_stopped_in_a_loop(youzan: YouzanCluster) -> None:
    """A worker that is restarted over and over (deploys, autoscaling) on one channel."""
    topic = await youzan_topic(youzan, "restarts", partitions=2)
    async with Producer(lookupd=youzan.lookupd) as p:
        sent = await publish_bodies(p, topic, 150)
    seen: Counter[bytes] = Counter()
    all_seen = asyncio.Event()

    async def handle(m: Message) -> None:
        seen[m.body] += 1
        if len(seen) == len(sent):
            all_seen.set()
        await asyncio.sleep(0)

    given_up = 0
    for _ in range(30):
        if len(seen) == len(sent):
            break
        c = Consumer(topic, "app", handle, lookupd=[youzan.lookupd],
                     config=ConsumerConfig(max_in_flight=20))
        async with asyncio.timeout(STEP):
            await c.start()
            try:
                async with asyncio.timeout(0.3):  # this worker's run
                    await all_seen.wait()
            except TimeoutError:
                pass
            await c.stop()
        given_up += c.stats().given_up
    assert set(seen) == set(sent)
    assert given_up == 0


# ---------------------------------------------------------------------- a handler that raises


async def test_handler_raising_for_one_message(caplog: pytest.LogCaptureFixture) -> None:
    """The failing message comes back (attempt 2) and is handled; the others are not held
    up; the failure is logged with its traceback."""
    failed_once: set[bytes] = set()
    handled: Counter[bytes] = Counter()
    done = asyncio.Event()

    async def handle(m: Message) -> None:
        if m.body == b"msg-007" and m.body not in failed_once:
            failed_once.add(m.body)
            raise ValueError("cannot parse order 7")
        handled[m.body] += 1
        if len(handled) == 20:
            done.set()

    async with DevCluster(nodes=1, flavour="stock") as cluster:
        addr = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=addr) as p:
            sent = await publish_bodies(p, "raises", 20)
        config = ConsumerConfig(max_in_flight=5, default_requeue_delay=0.05)
        with caplog.at_level(logging.WARNING, logger="smartnsq"):
            async with Consumer("raises", "app", handle, nsqd=addr,
                                config=config) as c:
                async with asyncio.timeout(STEP):
                    await done.wait()
                st = c.stats()
    assert set(handled) == set(sent) and all(n == 1 for n in handled.values())
    assert st.requeued == 1 and st.given_up == 0
    failures = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].exc_info is not None and failures[0].exc_info[0] is ValueError


# ---------------------------------------------------------------------- web app publishing


async def test_one_publish_per_web_request() -> None:
    """An aiohttp app shares one Producer, made at startup, and publishes one message per
    request; concurrent requests all succeed and every message arrives."""
    async with DevCluster(nodes=2, flavour="youzan") as cluster:
        cluster.create_topic("orders", partition_num=2, replica=1, channels=["app"])
        lookupd = cluster.lookupd_http_addresses
        producer_key = web.AppKey("producer", Producer)

        async def producer_ctx(app: web.Application) -> AsyncIterator[None]:
            async with Producer(lookupd=lookupd) as producer:
                app[producer_key] = producer
                yield

        async def create_order(request: web.Request) -> web.Response:
            body = await request.read()
            await request.app[producer_key].publish("orders", body, timeout=5)
            return web.json_response({"queued": True}, status=202)

        app = web.Application()
        app.cleanup_ctx.append(producer_ctx)
        app.router.add_post("/orders", create_order)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            got: set[bytes] = set()
            all_in = asyncio.Event()

            async def handle(m: Message) -> None:
                got.add(m.body)
                if len(got) == 60:
                    all_in.set()

            async with Consumer("orders", "app", handle, lookupd=lookupd,
                                start_at="earliest", config=ConsumerConfig(max_in_flight=10)
                                ), aiohttp.ClientSession() as http:
                async def request(i: int) -> int:
                    async with http.post(f"http://127.0.0.1:{port}/orders",
                                         data=b"order-%d" % i) as r:
                        return r.status

                async with asyncio.timeout(STEP):
                    statuses = await asyncio.gather(*(request(i) for i in range(60)))
                    await all_in.wait()
            assert statuses == [202] * 60
            assert got == {b"order-%d" % i for i in range(60)}
        finally:
            await runner.cleanup()


# ---------------------------------------------------------------------- consumer before topic


async def test_consumer_before_the_topic_exists_says_so_and_then_consumes(
        caplog: pytest.LogCaptureFixture) -> None:
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        lookupd = cluster.lookupd_http_addresses
        got = asyncio.Event()

        async def handle(m: Message) -> None:
            got.set()

        config = ConsumerConfig(lookupd_poll_interval=0.2)
        with caplog.at_level(logging.INFO, logger="smartnsq.consumer"):
            async with Consumer("later", "app", handle, lookupd=lookupd,
                                config=config):
                waiting = [r for r in caplog.records if "waiting for it" in r.getMessage()]
                assert len(waiting) == 1 and waiting[0].levelno == logging.WARNING
                assert "no nsqd has topic 'later'" in waiting[0].getMessage()
                async with Producer(nsqd=cluster.nsqd_tcp_addresses) as p:
                    await p.publish("later", b"first")
                async with asyncio.timeout(STEP):
                    await got.wait()
        assert any("the topic appeared" in r.getMessage() for r in caplog.records)


async def test_a_topic_whose_nsqd_went_is_waited_for_to_come_back(
        caplog: pytest.LogCaptureFixture) -> None:
    """Its only nsqd stopped: the lookup lists no nsqd for a topic the consumer was reading.
    The warning said "no nsqd has topic 't' yet; waiting for it to appear", as for a topic
    not created yet."""
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        cluster.create_topic("went", channels=["app"])
        config = ConsumerConfig(lookupd_poll_interval=0.2)

        async def handle(m: Message) -> None:
            pass

        with caplog.at_level(logging.INFO, logger="smartnsq.consumer"):
            async with Consumer("went", "app", handle, lookupd=cluster.lookupd_http_addresses,
                                config=config) as c:
                assert len(c.stats().subscriptions) == 1
                await cluster.stop_node(0)
                async with asyncio.timeout(STEP):
                    while not any("waiting for it" in r.getMessage()  # noqa: ASYNC110
                                  for r in caplog.records):
                        await asyncio.sleep(0.05)
        (said,) = [r.getMessage() for r in caplog.records if "waiting for it" in r.getMessage()]
        assert said.endswith("waiting for it to come back"), said
        assert "no nsqd has topic 'went'" in said and " yet" not in said


# ---------------------------------------------------------------------- ordered defaults


@pytest.mark.real_youzan
async def test_ordered_consumer_with_default_config_drains_every_partition(
        youzan: YouzanCluster) -> None:
    """The default max_in_flight (1) still moves every partition: youzan delivers an
    ordered partition one message at a time (issue: 966 of 3,006 in 40 s)."""
    topic = await youzan_topic(youzan, "ordall", partitions=4, ordered=True)
    async with Producer(lookupd=youzan.lookupd) as p:
        for i in range(800):
            await p.publish_ordered(topic, f"key-{i % 40}", b"%d" % i)
    got: Counter[int] = Counter()
    done = asyncio.Event()

    async def handle(m: Message) -> None:
        assert m.partition is not None
        got[m.partition] += 1
        if sum(got.values()) == 800:
            done.set()

    async with OrderedConsumer(topic, "app", handle, lookupd=[youzan.lookupd]):
        async with asyncio.timeout(STEP):
            await done.wait()
    assert len(got) == 4
