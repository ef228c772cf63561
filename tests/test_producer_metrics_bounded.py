"""A producer publishing to generated topic names (one per tenant, per day): its metrics keep
bounded memory, not one cached entry per topic it ever published to, and still count every
publish."""

from __future__ import annotations

import asyncio
import gc
import logging
import tracemalloc

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smartnsq.metrics.local import OTHER
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer.observe import CACHED, PublishMetrics

TOPICS = 20_000
NSQD = "127.0.0.1:4150"


def sent(registry: CollectorRegistry) -> dict[str, float]:
    text = generate_latest(registry).decode()
    return {s.labels["topic"]: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == "smartnsq_producer_messages_sent_total"}


def test_20000_generated_topics_keep_the_producer_metrics_memory_bounded(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    loop = asyncio.new_event_loop()
    try:
        # what the producer's engine calls per publish acknowledged at once, and per attempt
        pm = PublishMetrics(metrics, loop)
        topics = [f"tenant-{i:06d}" for i in range(TOPICS)]
        for topic in topics[:2000]:  # past the label bound and the caches already
            pm.sent_at_once(topic, "PUB", 1, NSQD, loop.time())
        with caplog.at_level(logging.ERROR, logger="smartnsq.metrics"):
            gc.collect()
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                for topic in topics[2000:]:
                    pm.sent_at_once(topic, "PUB", 1, NSQD, loop.time())
                    pm.attempt(topic, NSQD)
                gc.collect()
                grown = sum(d.size_diff for d in
                            tracemalloc.take_snapshot().compare_to(before, "filename"))
            finally:
                tracemalloc.stop()
        by_topic = sent(registry)
    finally:
        loop.close()
        metrics.close()
    # 18,000 topics more: the old cache held ~480 bytes each (8.6 MB here, 47 MB at 100,000)
    assert grown < 1_000_000, grown
    assert max(len(pm._ok), len(pm._at_once), len(pm._ok_attempts)) <= CACHED
    assert sum(by_topic.values()) == TOPICS and by_topic[OTHER] == TOPICS - 1000


def test_todays_topics_are_cached_once_yesterdays_filled_the_cache() -> None:
    metrics = PrometheusMetrics(CollectorRegistry(), max_topics=10 * CACHED)
    loop = asyncio.new_event_loop()
    try:
        pm = PublishMetrics(metrics, loop)
        for i in range(CACHED + 10):
            pm.published(f"day-1-tenant-{i}", "MPUB", 5, loop.time())
        ok = pm._ok_children("day-2-tenant-0", "MPUB")
        assert pm._ok_children("day-2-tenant-0", "MPUB") is ok  # cached, not bound anew
        assert len(pm._ok) <= CACHED
    finally:
        loop.close()
        metrics.close()
