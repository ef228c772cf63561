"""The consumer's metrics as an operator reads them: traffic through the embedded cluster (and,
with ``make test-real``, the real servers), a :class:`PrometheusMetrics` passed as
``metrics=``, its real HTTP endpoint scraped and parsed with ``prometheus_client``'s parser.
The counts must equal what was published, finished, requeued and given up."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import aiohttp
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

import smartnsq.sync
from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.metrics import set_metrics
from smartnsq.metrics.otel import OpenTelemetryMetrics
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer
from tests.metrics_helpers import Samples, ascrape, series, total, until
from tests.real_servers import (
    StockServer,
    YouzanCluster,
    stock,  # noqa: F401  (fixture)
    unique,
    youzan,  # noqa: F401  (fixture)
)

WAIT = 60.0
#: failures are retried at once and do not pause the consumer, so the tests run in seconds
CFG = ConsumerConfig(max_in_flight=10, default_requeue_delay=0, backoff_enabled=False,
                     reconnect_min=0.05, reconnect_max=0.5, lookupd_poll_interval=1.0)

P = "smartnsq_consumer_"


def fresh() -> PrometheusMetrics:
    return PrometheusMetrics(CollectorRegistry())


async def wait(event: asyncio.Event, what: str) -> None:
    try:
        async with asyncio.timeout(WAIT):
            await event.wait()
    except TimeoutError:
        raise AssertionError(f"{what}: not within {WAIT:.0f} s") from None


async def settled(metrics: PrometheusMetrics, name: str, want: float, **labels: str
                  ) -> Samples:
    """Scrape until ``name`` reaches ``want`` (counts are fed once per loop turn)."""
    got: Samples = {}

    async def probe() -> bool:
        nonlocal got
        got = await ascrape(metrics)
        return total(got, name, **labels) >= want

    await until(f"{name}{labels} = {want}", probe)
    return got


async def publish(nsqd: str, topic: str, bodies: list[bytes]) -> None:
    # one publish per web request, as an application does
    async with Producer(nsqd=[nsqd]) as p:
        for body in bodies:
            await p.publish(topic, body)


@pytest.mark.real_nsqd
async def test_stock_counts_equal_published_finished_and_requeued(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmstock"), "billing"
    ok = [b"ok-%d" % i for i in range(12)]
    failing = [b"fail-%d" % i for i in range(3)]
    later = [b"later-%d" % i for i in range(2)]
    await publish(stock.nsqd_tcp, topic, ok + failing + later)
    metrics = fresh()
    done, handled = asyncio.Event(), set()

    async def handle(msg: Message) -> None:
        if msg.body in failing and msg.attempts == 1:
            raise ConnectionError("the database is down")
        if msg.body in later and msg.attempts == 1:
            msg.requeue(0, backoff=False)
            return
        handled.add(msg.body)
        if len(handled) == 17:
            done.set()

    sub = {"topic": topic, "channel": channel, "nsqd": stock.nsqd_tcp, "partition": ""}
    async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=CFG,
                        metrics=metrics):
        await wait(done, "every message handled")
        got = await settled(metrics, P + "messages_finished_total", 17, **sub)
        assert total(got, P + "messages_received_total", **sub) == 17 + 3 + 2
        assert total(got, P + "messages_requeued_total", reason="handler_error", **sub) == 3
        assert total(got, P + "messages_requeued_total", reason="application", **sub) == 2
        assert total(got, P + "messages_requeued_total", reason="stop", **sub) == 0
        assert total(got, P + "messages_given_up_total", **sub) == 0
        assert total(got, P + "connects_total", topic=topic, nsqd=stock.nsqd_tcp) == 1
        # every delivery went to the handler once: timed once, its latency observed once
        assert total(got, P + "process_duration_seconds_count", topic=topic) == 22
        assert total(got, P + "end_to_end_latency_seconds_count", topic=topic) == 22
        assert 0 < total(got, P + "end_to_end_latency_seconds_sum", topic=topic) < 22 * WAIT
        assert total(got, P + "messages_in_flight", **sub) == 0
        assert series(got, P + "rdy", **sub) == [sub]
        assert total(got, P + "backoff_active", topic=topic, channel=channel) == 0
    after = await ascrape(metrics)
    # a stopped consumer's gauges go; its counters stay
    for gauge in ("messages_in_flight", "rdy", "backoff_active"):
        assert series(after, P + gauge, topic=topic) == [], gauge
    assert total(after, P + "messages_finished_total", **sub) == 17


@pytest.mark.real_youzan
async def test_youzan_counts_per_partition_and_given_up(
        youzan: YouzanCluster) -> None:  # noqa: F811
    t = await youzan.create_topic("cmyz", partition_num=2, channels=("billing",))
    per_partition = {0: [b"p0-%d" % i for i in range(5)], 1: [b"p1-%d" % i for i in range(7)]}
    async with Producer(lookupd=youzan.lookupd) as p:
        for part, bodies in per_partition.items():
            for body in bodies:
                await p.publish(t.name, body, partition=part)
        await p.publish(t.name, b"poison", partition=1)
    metrics = fresh()
    done, handled = asyncio.Event(), set()

    async def handle(msg: Message) -> None:
        if msg.body == b"poison":
            raise ValueError("cannot parse")
        handled.add(msg.body)
        if len(handled) == 12:
            done.set()

    cfg = CFG.replace(max_attempts=2)
    async with Consumer(t.name, "billing", handle, lookupd=youzan.lookupd, config=cfg,
                        metrics=metrics):
        await wait(done, "every good message handled")
        # the poison: attempts 1 and 2 fail, the third delivery is given up (and finished)
        got = await settled(metrics, P + "messages_given_up_total", 1, topic=t.name)
        got = await settled(metrics, P + "messages_finished_total", 13, topic=t.name)
    for part, bodies in per_partition.items():
        sub = {"topic": t.name, "channel": "billing", "nsqd": t.leaders[part].tcp,
               "partition": str(part)}
        poison = 3 if part == 1 else 0
        assert total(got, P + "messages_received_total", **sub) == len(bodies) + poison
        assert total(got, P + "messages_finished_total", **sub) == len(bodies) + bool(poison)
        assert total(got, P + "messages_requeued_total", reason="handler_error",
                     **sub) == 2 * bool(poison)
        assert total(got, P + "messages_given_up_total", **sub) == bool(poison)
    # the given-up delivery never reached the handler
    assert total(got, P + "process_duration_seconds_count", topic=t.name) == 12 + 2


async def timeouts(nsqd_http: str, topic: str, channel: str) -> bool:
    """nsqd's own count of ``channel``'s in-flight timeouts is 1 or more."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
            s.get(f"http://{nsqd_http}/stats",
                  params={"format": "json", "topic": topic}) as resp:
        stats = await resp.json()
    stats = stats.get("data", stats)
    return any(c["channel_name"] == channel and c["timeout_count"] >= 1
               for t in stats["topics"] for c in t["channels"])


@pytest.mark.real_nsqd
async def test_touch_and_a_fin_after_msg_timeout_are_counted(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmslow"), "reports"
    await publish(stock.nsqd_tcp, topic, [b"slow report"])
    metrics = fresh()
    done = asyncio.Event()
    consumer: Consumer

    async def handle(msg: Message) -> None:
        msg.touch()
        if msg.attempts == 1:
            # paused (RDY 0) and beyond the 1 s msg_timeout: nsqd takes the message back (its
            # stats say when: a new channel's timeouts are scanned within nsqd's 5 s refresh)
            # and answers this FIN with E_FIN_FAILED; resumed, the message comes again
            consumer.set_max_in_flight(0)
            await until("nsqd timed the message out",
                        lambda: timeouts(stock.nsqd_http, topic, channel))
            asyncio.get_running_loop().call_later(0.2, consumer.set_max_in_flight, 1)
        else:
            done.set()

    cfg = CFG.replace(max_in_flight=1, connection={"msg_timeout": 1.0})
    sub = {"topic": topic, "channel": channel, "nsqd": stock.nsqd_tcp, "partition": ""}
    async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=cfg,
                        metrics=metrics) as consumer:
        await wait(done, "the redelivery")
        got = await settled(metrics, P + "messages_finished_total", 2, **sub)
    assert total(got, P + "fin_failed_total", **sub) == 1
    assert total(got, P + "messages_touched_total", **sub) == 2
    assert total(got, P + "messages_received_total", **sub) == 2


@pytest.mark.real_nsqd
async def test_async_for_and_break_counts_what_went_back(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmiter"), "tail"
    await publish(stock.nsqd_tcp, topic, [b"line %d" % i for i in range(20)])
    metrics = fresh()
    taken = 0
    async with Consumer(topic, channel, nsqd=stock.nsqd_tcp, config=CFG.replace(max_in_flight=5),
                        metrics=metrics) as c:
        async with asyncio.timeout(WAIT):
            async for msg in c:
                msg.finish()
                taken += 1
                if taken == 3:
                    break
    got = await ascrape(metrics)
    sub = {"topic": topic, "channel": channel, "nsqd": stock.nsqd_tcp, "partition": ""}
    received = total(got, P + "messages_received_total", **sub)
    assert total(got, P + "messages_finished_total", **sub) == 3
    # the read-ahead nobody took went back at stop, unseen
    assert received >= 3
    assert total(got, P + "messages_requeued_total", reason="stop", **sub) == received - 3
    # iteration: timed from hand-over to the answer, for the messages handed over only
    assert total(got, P + "process_duration_seconds_count", topic=topic) == 3
    assert total(got, P + "end_to_end_latency_seconds_count", topic=topic) == 3
    assert series(got, P + "messages_in_flight", topic=topic) == []


@pytest.mark.real_nsqd
async def test_start_stop_in_a_loop_leaves_no_gauge_readers(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmloop"), "poll"
    metrics = fresh()
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        for i in range(4):
            # a fresh consumer per iteration, as a cron-style job does
            async with Consumer(topic, channel, nsqd=stock.nsqd_tcp, config=CFG,
                                metrics=metrics) as c:
                await p.publish(topic, b"job %d" % i)
                async with asyncio.timeout(WAIT):
                    msg = await anext(aiter(c))
                msg.finish()
                running = await ascrape(metrics)
                assert len(series(running, P + "rdy", topic=topic)) == 1
                assert len(series(running, P + "backoff_active", topic=topic)) == 1
            stopped = await ascrape(metrics)
            for gauge in ("messages_in_flight", "rdy", "backoff_active"):
                assert series(stopped, P + gauge, topic=topic) == [], (i, gauge)
    assert total(stopped, P + "messages_finished_total", topic=topic) == 4
    assert total(stopped, P + "connects_total", topic=topic) == 4


@pytest.mark.real_nsqd
async def test_the_process_default_is_read_at_start(stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmdefault"), "c"
    await publish(stock.nsqd_tcp, topic, [b"a", b"b"])
    metrics = fresh()
    got_two = asyncio.Event()
    seen: list[bytes] = []

    async def handle(msg: Message) -> None:
        seen.append(msg.body)
        if len(seen) == 2:
            got_two.set()

    consumer = Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=CFG)
    previous = set_metrics(metrics)
    try:
        async with consumer:
            await wait(got_two, "both messages")
            got = await settled(metrics, P + "messages_finished_total", 2, topic=topic)
    finally:
        set_metrics(previous)
    assert total(got, P + "messages_received_total", topic=topic) == 2


@pytest.mark.real_nsqd
async def test_sync_consumer_reports_through_its_metrics(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmsync"), "worker"
    await publish(stock.nsqd_tcp, topic, [b"%d" % i for i in range(6)])
    metrics = fresh()
    six = threading.Event()
    lock, seen = threading.Lock(), set()

    def handle(msg: smartnsq.sync.ThreadMessage) -> None:  # a plain function, in a thread
        with lock:
            seen.add(msg.body)
            if len(seen) == 6:
                six.set()

    def run() -> None:
        with smartnsq.sync.Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=CFG,
                                    metrics=metrics):
            assert six.wait(WAIT)

    await asyncio.to_thread(run)
    got = await ascrape(metrics)
    assert total(got, P + "messages_finished_total", topic=topic) == 6
    assert total(got, P + "process_duration_seconds_count", topic=topic) == 6


@pytest.mark.real_nsqd
async def test_opentelemetry_metrics_count_consumed_messages(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cmotel"), "analytics"
    await publish(stock.nsqd_tcp, topic, [b"e%d" % i for i in range(5)])
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    five = asyncio.Event()
    seen: set[bytes] = set()

    async def handle(msg: Message) -> None:
        seen.add(msg.body)
        if len(seen) == 5:
            five.set()

    points: dict[str, list[Any]] = {}

    async def collected() -> bool:
        data = reader.get_metrics_data()
        assert data is not None
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    points[m.name] = [
                        p for p in m.data.data_points
                        if p.attributes.get("messaging.destination.name") == topic]
        return [p.value for p in points.get("messaging.client.consumed.messages", [])] == [5]

    async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=CFG,
                        metrics=metrics):
        await wait(five, "five messages")
        await until("5 consumed messages reported", collected)
    consumed = points["messaging.client.consumed.messages"]
    assert dict(consumed[0].attributes) == {
        "messaging.system": "nsq", "messaging.destination.name": topic,
        "messaging.consumer.group.name": channel,
        "server.address": stock.nsqd_tcp.rpartition(":")[0],
        "server.port": int(stock.nsqd_tcp.rpartition(":")[2])}
    assert [p.count for p in points["messaging.process.duration"]] == [5]
