"""Consumers on generated channel names (per tenant, per deployment, an ``#ephemeral`` one per
process): the ``channel`` label is bounded like the topic, so the exporter's series stay
bounded while the counts still add up."""

from __future__ import annotations

import asyncio
import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError
from smartnsq.message import Message
from smartnsq.metrics import catalog
from smartnsq.metrics.bounds import ALIASES, LabelBounds
from smartnsq.metrics.local import OTHER, LocalStore
from smartnsq.metrics.otel import OpenTelemetryMetrics
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer

CFG = ConsumerConfig(max_in_flight=10, backoff_enabled=False, reconnect_min=0.05,
                     reconnect_max=0.5)


def samples(registry: CollectorRegistry, name: str) -> list[tuple[dict[str, str], float]]:
    text = generate_latest(registry).decode()
    return [(dict(s.labels), s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name]


async def test_a_consumer_per_process_on_ephemeral_channels_keeps_the_series_bounded(
        caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry, max_channels=5)
    got: list[bytes] = []
    rounds, per_round = 12, 2
    try:
        with caplog.at_level(logging.WARNING, logger="smartnsq.metrics"):
            async with asyncio.timeout(60), DevCluster(nodes=1, flavour="stock") as cluster, \
                    Producer(nsqd=cluster.nsqd_tcp_addresses) as p:
                for i in range(rounds):
                    # one process after another, each on its own ephemeral channel
                    done = asyncio.Event()

                    async def handle(msg: Message) -> None:
                        got.append(msg.body)
                        if len(got) == (i + 1) * per_round:  # noqa: B023 (this round's)
                            done.set()  # noqa: B023

                    async with Consumer("jobs", f"worker-{i:02d}#ephemeral", handle,
                                        nsqd=cluster.nsqd_tcp_addresses, config=CFG,
                                        metrics=metrics):
                        # started: subscribed, so the channel takes what follows
                        for k in range(per_round):
                            await p.publish("jobs", b"%d-%d" % (i, k))
                        async with asyncio.timeout(10):
                            await done.wait()
        received = samples(registry, "smartnsq_consumer_messages_received_total")
        finished = samples(registry, "smartnsq_consumer_messages_finished_total")
    finally:
        metrics.close()
    assert sorted(got) == sorted(b"%d-%d" % (i, k) for i in range(rounds)
                                 for k in range(per_round))
    channels = {labels["channel"] for labels, _ in received}
    assert channels == {f"worker-{i:02d}#ephemeral" for i in range(5)} | {OTHER}
    assert sum(v for _, v in received) == sum(v for _, v in finished) == rounds * per_round
    assert sum(v for labels, v in received if labels["channel"] == OTHER) == 7 * per_round
    warned = [r for r in caplog.records if "distinct channels" in r.getMessage()]
    assert len(warned) == 1 and "worker-05#ephemeral" in warned[0].getMessage()


def test_5000_channel_names_on_the_prometheus_registry_stay_1001_series_per_family() -> None:
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)  # the default bound
    try:
        received = metrics.counter(catalog.CONSUMER_RECEIVED)
        process = metrics.histogram(catalog.CONSUMER_PROCESS)
        for i in range(5000):
            received.labels("orders", f"tenant-{i:05d}", "127.0.0.1:4150", "").inc()
            process.labels("orders", f"tenant-{i:05d}").observe(0.01)
        counts = samples(registry, "smartnsq_consumer_messages_received_total")
        handled = samples(registry, "smartnsq_consumer_process_duration_seconds_count")
    finally:
        metrics.close()
    assert len(counts) == len(handled) == 1001  # 5000 before the bound
    assert {labels["channel"] for labels, _ in counts} >= {"tenant-00999", OTHER}
    assert sum(v for _, v in counts) == sum(v for _, v in handled) == 5000
    assert dict((labels["channel"], v) for labels, v in counts)[OTHER] == 4000


def test_otel_channel_attribute_sets_are_bounded_too() -> None:
    reader = InMemoryMetricReader()
    metrics = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]), max_channels=10)
    for i in range(300):
        metrics.counter(catalog.CONSUMER_FINISHED).labels("t", f"c{i}", "h:4150", "").inc()
        metrics.histogram(catalog.CONSUMER_PROCESS).labels("t", f"c{i}").observe(0.5)
    data = reader.get_metrics_data()
    assert data is not None
    points = {m.name: list(m.data.data_points)  # type: ignore[union-attr]
              for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    finished = points[catalog.CONSUMER_FINISHED.otel_name]
    process = points[catalog.CONSUMER_PROCESS.otel_name]
    assert len(finished) == len(process) == 11
    assert sum(pt.value for pt in finished) == 300
    assert sum(pt.count for pt in process) == 300
    assert {pt.attributes["messaging.consumer.group.name"] for pt in process} >= {OTHER}


def test_a_channel_is_counted_with_its_topic_as_nsqd_has_it() -> None:
    store = LocalStore(max_topics=2, max_channels=3)
    fam = store.counter(catalog.CONSUMER_CONNECTS)
    fam.labels("a", "archive", "h:1").inc()
    fam.labels("b", "archive", "h:1").inc()  # the same name on another topic: a 2nd channel
    fam.labels("c", "x", "h:1").inc()  # topic past its bound: ("(other)", "x"), the 3rd
    fam.labels("a", "late", "h:1").inc()  # a 4th channel: past the channel bound
    fam.labels("d", "y", "h:1").inc()
    assert dict(fam.samples()) == {
        ("a", "archive", "h:1"): 1, ("b", "archive", "h:1"): 1, (OTHER, "x", "h:1"): 1,
        ("a", OTHER, "h:1"): 1, (OTHER, OTHER, "h:1"): 1}


def test_a_channel_bound_that_is_not_a_count_is_refused_by_name() -> None:
    for wrong in (0, -1, True, 2.5, "100"):
        with pytest.raises(ConfigError, match="max_channels"):
            PrometheusMetrics(CollectorRegistry(), max_channels=wrong)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="max_channels"):
            OpenTelemetryMetrics(MeterProvider(), max_channels=wrong)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    first = PrometheusMetrics(registry, max_channels=50)
    try:
        with pytest.raises(ConfigError, match="max_channels=50"):
            PrometheusMetrics(registry, max_channels=60)  # shares the first one's figures
        PrometheusMetrics(registry).close()  # no bound given: the shared one holds
    finally:
        first.close()


def test_names_past_the_bound_skip_the_bound_check_and_keep_no_entry_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(max_topics=10)
    fam = store.counter(catalog.PRODUCER_RETRIES)
    for i in range(11):
        fam.labels(f"day-{i}").inc()
    checks = 0
    real = LabelBounds.bound

    def counted(self: LabelBounds, spec: catalog.MetricSpec, values: tuple[str, ...]
                ) -> tuple[str, ...]:
        nonlocal checks
        checks += 1
        return real(self, spec, values)

    monkeypatch.setattr(LabelBounds, "bound", counted)
    for _ in range(100):
        fam.labels("day-10").inc()  # past the bound, again and again: bound once, at most
    assert checks == 0  # its first call, above, cached where it goes
    for i in range(20_000):
        fam.labels(f"day-{i + 11}").inc()
    assert checks == 20_000
    assert len(fam._aliases) <= ALIASES  # memory stays bounded
    totals = dict(fam.samples())
    assert len(totals) == 11 and sum(totals.values()) == 11 + 100 + 20_000
    assert totals[(OTHER,)] == 1 + 100 + 20_000
