"""Metrics the way a production application wires them: an exporter per request or per
client on prometheus_client's default registry, consumers started and stopped in a loop, a
scraper on another thread while clients run, and the mistakes of wiring it (the module for
the registry, a registry for the backend). Counts must add up; series and gauge readers
must stay bounded; a mistake fails at once naming what was passed."""

from __future__ import annotations

import asyncio
import threading

import prometheus_client
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import ConfigError
from smartnsq.message import Message
from smartnsq.metrics import get_metrics, set_metrics
from smartnsq.metrics.otel import OpenTelemetryMetrics
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer
from tests.real_servers import (
    StockServer,
    stock,  # noqa: F401  (fixture)
    unique,
)

WAIT = 30.0
CFG = ConsumerConfig(max_in_flight=1, default_requeue_delay=0, backoff_enabled=False,
                     reconnect_min=0.05, reconnect_max=0.5)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.real_nsqd
async def test_an_exporter_per_request_on_the_default_registry_adds_up(
        stock: StockServer) -> None:  # noqa: F811
    topic = unique("perreq")
    made: list[PrometheusMetrics] = []
    try:
        for n in range(5):  # five web requests, each with its own producer and exporter
            metrics = PrometheusMetrics()  # the second one used to fail: Duplicated timeseries
            made.append(metrics)
            async with Producer(nsqd=stock.nsqd_tcp, metrics=metrics) as p:
                await p.publish(topic, b"order %d" % n)
        assert sample(REGISTRY, "smartnsq_producer_messages_sent_total", topic=topic,
                      command="PUB", result="ok") == 5.0
    finally:
        for metrics in made:
            metrics.close()
    # the last close unregistered the shared collector: the default registry is as before
    assert sample(REGISTRY, "smartnsq_producer_messages_sent_total", topic=topic,
                  command="PUB", result="ok") == 0.0


@pytest.mark.real_nsqd
async def test_otel_exporter_per_client_on_one_provider_adds_up(
        stock: StockServer) -> None:  # noqa: F811
    topic = unique("otelreq")
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    for n in range(3):
        async with Producer(nsqd=stock.nsqd_tcp,
                            metrics=OpenTelemetryMetrics(provider)) as p:
            await p.publish(topic, b"order %d" % n)
    sent = [point.value
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "messaging.client.sent.messages"
            for point in m.data.data_points
            if point.attributes.get("messaging.destination.name") == topic]
    assert sent == [3]  # was [1]: each exporter's own instrument, the last one reported
    provider.shutdown()


@pytest.mark.real_nsqd
async def test_consumer_started_and_stopped_50_times_leaves_no_readers_or_series(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("cycle"), "billing"
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    previous = set_metrics(metrics)  # the process default, as the guide says
    bodies = [b"m%d" % i for i in range(50)]
    seen: list[bytes] = []
    try:
        async with Producer(nsqd=stock.nsqd_tcp) as p:
            await p.publish_many(topic, bodies)
        lines_after: dict[int, int] = {}
        for cycle in range(50):
            got = asyncio.Event()

            async def handle(msg: Message, got: asyncio.Event = got) -> None:
                seen.append(msg.body)
                got.set()

            async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=CFG):
                if len(set(seen)) < len(bodies):
                    async with asyncio.timeout(WAIT):
                        await got.wait()
            # a stopped consumer's gauges are gone: no reader of it left behind
            assert sample(registry, "smartnsq_consumer_messages_in_flight", topic=topic,
                          channel=channel, nsqd=stock.nsqd_tcp, partition="") == 0.0
            assert all(not g._readers for g in metrics._store.gauges.values())
            if cycle in (9, 49):
                lines_after[cycle] = generate_latest(registry).count(b"\n")
        assert lines_after[9] == lines_after[49]  # the series did not grow with the cycles
        assert sorted(set(seen)) == sorted(bodies)  # every message reached the handler
        assert sample(registry, "smartnsq_consumer_messages_finished_total", topic=topic,
                      channel=channel, nsqd=stock.nsqd_tcp, partition="") == len(seen)
        assert sample(registry, "smartnsq_consumer_connects_total", topic=topic,
                      channel=channel, nsqd=stock.nsqd_tcp) == 50
    finally:
        set_metrics(previous)
        metrics.close()


@pytest.mark.real_nsqd
async def test_scraping_from_another_thread_while_clients_run(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("scrape"), "billing"
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    stop = threading.Event()
    errors: list[BaseException] = []
    finished: list[float] = []

    def scraper() -> None:
        while not stop.is_set():
            try:
                generate_latest(registry)
                finished.append(sample(registry, "smartnsq_consumer_messages_finished_total",
                                       topic=topic, channel=channel, nsqd=stock.nsqd_tcp,
                                       partition=""))
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    n, done = 300, asyncio.Event()
    handled = 0

    async def handle(msg: Message) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            done.set()

    try:
        async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, metrics=metrics,
                            config=CFG.replace(max_in_flight=20)):
            async with Producer(nsqd=stock.nsqd_tcp, metrics=metrics) as p:
                for i in range(0, n, 10):
                    await p.publish_many(topic, [b"x%d" % j for j in range(i, i + 10)])
            async with asyncio.timeout(WAIT):
                await done.wait()
    finally:
        stop.set()
        thread.join(10)
    assert not errors
    assert finished == sorted(finished)  # a counter never goes back between scrapes
    assert sample(registry, "smartnsq_producer_messages_sent_total", topic=topic,
                  command="MPUB", result="ok") == n
    metrics.close()


def test_wiring_mistakes_fail_at_once_naming_what_was_passed() -> None:
    with pytest.raises(ConfigError, match=r"CollectorRegistry.*got the module prometheus_client"):
        PrometheusMetrics(prometheus_client)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"registry=.*got str 'myapp'"):
        PrometheusMetrics("myapp")  # type: ignore[arg-type]  (meant prefix=)
    with pytest.raises(ConfigError, match=r"prefix=.*'my-app'"):
        PrometheusMetrics(CollectorRegistry(), prefix="my-app")
    before = get_metrics()
    with pytest.raises(ConfigError, match=r"set_metrics\(\).*the module prometheus_client.*"
                                          r"PrometheusMetrics\(registry\)"):
        set_metrics(prometheus_client)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"set_metrics\(\).*CollectorRegistry"):
        set_metrics(REGISTRY)  # type: ignore[arg-type]
    assert get_metrics() is before  # a refused default leaves the one in place
    with pytest.raises(ConfigError, match=r"metrics=.*CollectorRegistry"):
        Producer(nsqd="127.0.0.1:4150", metrics=REGISTRY)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"metrics=.*builtins.str"):
        Consumer("t", "c", nsqd="127.0.0.1:4150", metrics="prometheus")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"meter_provider=.*CollectorRegistry"):
        OpenTelemetryMetrics(REGISTRY)  # type: ignore[arg-type]
    # set_metrics twice with exporters of the default registry: both work, one collector
    first, second = PrometheusMetrics(), PrometheusMetrics()
    try:
        set_metrics(first)
        assert set_metrics(second) is first
    finally:
        set_metrics(before)
        first.close()
        second.close()
