"""A producer publishing to generated topic names (one per tenant, per day): the ``topic``
label is bounded, so the exporter's series stay bounded while the counts still add up."""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError
from smartnsq.metrics import catalog
from smartnsq.metrics.local import OTHER_TOPIC
from smartnsq.metrics.otel import OpenTelemetryMetrics
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer

TOPICS = 5000


async def test_5000_generated_topics_keep_the_series_bounded_and_the_counts(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    try:
        with caplog.at_level(logging.WARNING, logger="smartnsq.metrics"):
            async with asyncio.timeout(120), DevCluster(nodes=1, flavour="stock") as cluster, \
                    Producer(nsqd=cluster.nsqd_tcp_addresses, metrics=metrics) as p:
                for i in range(TOPICS):
                    await p.publish(f"tenant-{i:05d}", b"x")
        text = generate_latest(registry).decode()
    finally:
        metrics.close()
    sent = [s for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "smartnsq_producer_messages_sent_total"]
    topics = {s.labels["topic"] for s in sent}
    assert len(topics) == 1001 and OTHER_TOPIC in topics  # 1000 of their own, one "(other)"
    assert sum(s.value for s in sent) == TOPICS
    assert next(s.value for s in sent if s.labels["topic"] == OTHER_TOPIC) == TOPICS - 1000
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    assert series < 40 * 1001, series  # per topic a few families, not per generated topic
    warned = [r for r in caplog.records if "distinct topics" in r.getMessage()]
    assert len(warned) == 1 and "tenant-01000" in warned[0].getMessage()


def test_otel_attribute_sets_are_bounded_too() -> None:
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]), max_topics=10)
    for i in range(300):
        metrics.counter(catalog.PRODUCER_RETRIES).labels(f"day-{i}").inc()
        metrics.histogram(catalog.PRODUCER_BATCH).labels(f"day-{i}").observe(1)
    data = reader.get_metrics_data()
    assert data is not None
    points = {m.name: list(m.data.data_points)  # type: ignore[union-attr]
              for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    retries = points[catalog.PRODUCER_RETRIES.otel_name]
    batches = points[catalog.PRODUCER_BATCH.otel_name]
    assert len(retries) == len(batches) == 11
    assert sum(pt.value for pt in retries) == 300
    assert sum(pt.count for pt in batches) == 300


def test_a_bound_that_is_not_a_count_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="max_topics"):
        PrometheusMetrics(CollectorRegistry(), max_topics=0)
    registry = CollectorRegistry()
    first = PrometheusMetrics(registry, max_topics=50)
    try:
        with pytest.raises(ConfigError, match="max_topics=50"):
            PrometheusMetrics(registry, max_topics=60)  # shares the first one's figures
    finally:
        first.close()
