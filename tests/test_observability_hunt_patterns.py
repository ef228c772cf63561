"""Metrics and traces as an operator runs them: a scrape of the registry while producers and
consumers run (counts add up, families match the guide's tables), an application whose
lifespan closes its exporter and starts again, prometheus_client's multiprocess mode, a
handler still running when stop() gives its message back, and the careless inputs (an
exporter class where an instance belongs)."""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import ConfigError
from smartnsq.message import Message
from smartnsq.metrics import NoMetrics, prometheus, set_metrics
from smartnsq.metrics.catalog import LABELS, PRODUCER_ATTEMPTS, PRODUCER_RETRIES
from smartnsq.metrics.otel import OpenTelemetryMetrics, attributes
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer
from smartnsq.tracing.semconv import ERROR_TYPE, NSQ_GIVEN_BACK, SERVER_ADDRESS, SERVER_PORT
from smartnsq.tracing.spans import tracing_for
from tests.real_servers import (
    StockServer,
    stock,  # noqa: F401  (fixture)
    unique,
)
from tests.test_observability_docs import rows, text
from tests.tracing_helpers import sdk  # noqa: F401  (fixture)

WAIT = 20.0


def families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    """smartnsq family name (counters without ``_total``) -> (type, label names of its
    samples) as a scrape of ``registry`` shows them."""
    out: dict[str, tuple[str, set[str]]] = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        if fam.name.startswith("smartnsq_"):
            labels = {k for s in fam.samples for k in s.labels if k != "le"}
            out[fam.name] = (fam.type, labels)
    return out


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.real_nsqd
async def test_a_scrape_while_clients_run_adds_up_and_matches_the_guide(
        stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("hunt"), "billing"
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    n, outcomes, done = 60, collections.Counter[str](), asyncio.Event()

    async def handle(msg: Message) -> None:
        kind = int(msg.body) % 6
        if kind == 0 and msg.attempts == 1:
            outcomes["raised"] += 1
            raise RuntimeError("flaky")
        if kind == 1 and msg.attempts == 1:
            outcomes["requeued"] += 1
            msg.requeue(0, backoff=False)
            return
        if kind == 2:
            outcomes["failing"] += 1
            raise RuntimeError("always")
        outcomes["ok"] += 1
        if outcomes["ok"] == n - n // 6:
            done.set()

    cfg = ConsumerConfig(max_in_flight=10, default_requeue_delay=0, backoff_enabled=False,
                         max_attempts=2)
    labels = {"topic": topic, "channel": channel, "nsqd": stock.nsqd_tcp, "partition": ""}
    try:
        async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, metrics=metrics,
                            config=cfg):
            async with Producer(nsqd=stock.nsqd_tcp, metrics=metrics) as p:
                for i in range(0, n, 2):
                    await p.publish(topic, b"%d" % i)
                await p.publish_many(topic, [b"%d" % i for i in range(1, n, 2)])
            async with asyncio.timeout(WAIT):
                await done.wait()
                while value(registry, "smartnsq_consumer_messages_given_up_total",  # noqa: ASYNC110
                            **labels) < n // 6:
                    await asyncio.sleep(0.02)
            # scraped while the consumer runs: its gauges are there
            running = families(registry)
            assert value(registry, "smartnsq_consumer_rdy", **labels) == 10
        sent = value(registry, "smartnsq_producer_messages_sent_total", topic=topic,
                     command="PUB", result="ok")
        sent += value(registry, "smartnsq_producer_messages_sent_total", topic=topic,
                      command="MPUB", result="ok")
        assert sent == n
        received = value(registry, "smartnsq_consumer_messages_received_total", **labels)
        finished = value(registry, "smartnsq_consumer_messages_finished_total", **labels)
        by_reason = {r: value(registry, "smartnsq_consumer_messages_requeued_total",
                              **labels, reason=r)
                     for r in ("handler_error", "application", "stop", "closed")}
        # every delivery was answered once: finished or requeued
        assert received == finished + sum(by_reason.values())
        assert by_reason == {"handler_error": outcomes["raised"] + outcomes["failing"],
                             "application": outcomes["requeued"], "stop": 0, "closed": 0}
        assert finished == n  # the given up ones are finished unhandled
        handled = sum(outcomes.values())
        assert value(registry, "smartnsq_consumer_process_duration_seconds_count",
                     topic=topic, channel=channel) == handled
    finally:
        metrics.close()
    # every family a scrape shows has the guide's row: type and labels
    table = rows()
    for name, (kind, labels_seen) in running.items():
        cells = table.get(name if kind != "counter" else f"{name}_total")
        assert cells is not None, name
        assert cells[1] == kind, name
        if labels_seen:  # a family with samples: the labels they carry
            assert set(re.findall(r"`(\w+)`", cells[2])) == labels_seen, name
    assert len(table) == len(running)


@pytest.mark.real_nsqd
async def test_an_exporter_closed_at_shutdown_and_used_again_reports_again(
        stock: StockServer) -> None:  # noqa: F811
    topic = unique("lifespan")
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)  # module level, as an application keeps it
    previous = set_metrics(metrics)
    try:
        for run in (1, 2):  # the application's startup / shutdown, twice (its tests do)
            async with Producer(nsqd=stock.nsqd_tcp) as p:
                await p.publish(topic, b"order")
            # was None on the second run: the clients counted into an unregistered store
            assert value(registry, "smartnsq_producer_messages_sent_total", topic=topic,
                         command="PUB", result="ok") == run
            metrics.close()  # the shutdown hook
            assert value(registry, "smartnsq_producer_messages_sent_total", topic=topic,
                         command="PUB", result="ok") == 0
    finally:
        set_metrics(previous)
        metrics.close()
    # once closed and not used again, the registry is as it was
    assert not families(registry)


def test_reopened_exporters_share_what_the_registry_has_then() -> None:
    registry = CollectorRegistry()
    first = PrometheusMetrics(registry)
    first.close()
    second = PrometheusMetrics(registry)  # a new one registered meanwhile
    try:
        first.counter(PRODUCER_RETRIES).labels("t").inc()
        second.counter(PRODUCER_RETRIES).labels("t").inc()
        # one collector, both counts: no "Duplicated timeseries" and nothing lost
        assert value(registry, "smartnsq_producer_retries_total", topic="t") == 2
    finally:
        first.close()
        second.close()
    assert not families(registry)


def test_multiprocess_mode_says_the_figures_are_this_process_own(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        tmp_path: Path) -> None:
    # prometheus_client's MultiProcessCollector reads only its own per-process files:
    # a gunicorn setup scraping it never saw a smartnsq series, and nothing said so
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(prometheus, "_told_multiprocess", False)
    with caplog.at_level(logging.WARNING, "smartnsq.metrics"):
        metrics = PrometheusMetrics(CollectorRegistry())
        again = PrometheusMetrics(CollectorRegistry())
    metrics.close()
    again.close()
    warned = [r.getMessage() for r in caplog.records if "PROMETHEUS_MULTIPROC_DIR" in
              r.getMessage()]
    assert len(warned) == 1, warned  # once per process
    assert "MultiProcessCollector" in warned[0] and "serve" in warned[0]
    # and the guide says the same, where it names the ways of serving
    assert "MultiProcessCollector" in text()


def test_an_exporter_class_is_refused_when_the_client_is_made() -> None:
    # metrics=PrometheusMetrics (no parentheses) used to pass the check and fail at start()
    # with "counter() missing 1 required positional argument"
    for cls in (PrometheusMetrics, OpenTelemetryMetrics, NoMetrics):
        with pytest.raises(ConfigError, match=rf"the class {cls.__name__} \(pass an "
                                              rf"instance: {cls.__name__}\(\)\)"):
            Producer(nsqd="127.0.0.1:4150", metrics=cls)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=rf"set_metrics\(\).*the class {cls.__name__}"):
            set_metrics(cls)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=rf"metrics=.*the class {cls.__name__}"):
            Consumer("t", "c", nsqd="127.0.0.1:4150", metrics=cls)  # type: ignore[arg-type]


@pytest.mark.real_nsqd
async def test_a_handler_still_running_at_stop_gives_its_span_back_not_failed(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    topic, channel = unique("hang"), "c"
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    async with Producer(nsqd=stock.nsqd_tcp, tracer_provider=provider) as p:
        await p.publish(topic, b"slow")
    started = asyncio.Event()

    async def hang(msg: Message) -> None:
        started.set()
        await asyncio.sleep(3600)  # a call that never answers

    cfg = ConsumerConfig(max_in_flight=1, drain_timeout=0.2, backoff_enabled=False)
    try:
        async with Consumer(topic, channel, hang, nsqd=stock.nsqd_tcp, config=cfg,
                            metrics=metrics, tracer_provider=provider):
            async with asyncio.timeout(WAIT):
                await started.wait()
        # stop() gave the message back after drain_timeout: counted as such ...
        assert value(registry, "smartnsq_consumer_messages_requeued_total", topic=topic,
                     channel=channel, nsqd=stock.nsqd_tcp, partition="", reason="stop") == 1
        (span,) = [s for s in exporter.get_finished_spans() if s.name == f"process {topic}"]
        # ... and its span says so, as for async for; it was ERROR with CancelledError
        attrs = dict(span.attributes or {})
        assert attrs.get(NSQ_GIVEN_BACK) is True
        assert ERROR_TYPE not in attrs
        assert span.status.status_code is StatusCode.UNSET
    finally:
        metrics.close()


def test_the_command_label_lists_every_command_the_clients_send() -> None:
    (row,) = [line for line in text().splitlines() if line.startswith("| `command` |")]
    documented = re.findall(r"`([A-Z_]+)`", row)
    in_code = re.findall(r"[A-Z_]{3,}", LABELS["command"])
    # HTTP_PUB_TRACE, HTTP_PUB_EXT and HTTP_DPUB were missing
    assert documented == in_code


def test_an_ipv6_nsqd_is_an_address_without_brackets(
        sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    # nsqd="[::1]:4150" is accepted; its spans and OTel metrics said server.address="[::1]"
    # where the conventions want the IP address, and the attribute never matched the peer's
    attrs = attributes(PRODUCER_ATTEMPTS, ("t", "[::1]:4150", "ok"))
    assert (attrs[SERVER_ADDRESS], attrs[SERVER_PORT]) == ("::1", 4150)
    provider, exporter = sdk
    tracing = tracing_for(provider)
    assert tracing is not None
    tracing.end(tracing.start_send("t", command="PUB", server="[::1]:4150"))
    (span,) = exporter.get_finished_spans()
    assert (span.attributes or {})[SERVER_ADDRESS] == "::1"
    # the Prometheus label keeps the address as given
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    try:
        metrics.counter(PRODUCER_ATTEMPTS).labels("t", "[::1]:4150", "ok").inc()
        assert value(registry, "smartnsq_producer_attempts_total", topic="t",
                     nsqd="[::1]:4150", result="ok") == 1
    finally:
        metrics.close()
