"""The metrics interface, its no-op default and both exporters, on the real libraries."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from smartnsq.metrics import NO_METRICS, Kind, get_metrics, set_metrics
from smartnsq.metrics import catalog as c
from smartnsq.metrics.local import HistogramChild
from smartnsq.metrics.otel import OpenTelemetryMetrics
from smartnsq.metrics.prometheus import PrometheusMetrics
from tests.metrics_helpers import scrape


def test_catalog_names_follow_prometheus_practice() -> None:
    names = [s.name for s in c.ALL]
    assert len(names) == len(set(names))
    assert len({s.otel_name for s in c.ALL}) == len(c.ALL)
    for spec in c.ALL:
        assert not spec.name.endswith("_total"), spec.name
        assert set(spec.labels) <= set(c.LABELS), spec.name
        if spec.kind is Kind.HISTOGRAM:
            assert spec.buckets and spec.name.endswith(("_seconds", "_messages")), spec.name
        assert spec.name.startswith(("consumer_", "producer_", "lookup_", "spark_"))
    # the messaging semantic conventions' names, where they define the metric
    assert c.PRODUCER_SENT.otel_name == "messaging.client.sent.messages"
    assert c.CONSUMER_RECEIVED.otel_name == "messaging.client.consumed.messages"
    assert c.PRODUCER_DURATION.otel_name == "messaging.client.operation.duration"
    assert c.CONSUMER_PROCESS.otel_name == "messaging.process.duration"
    assert c.by_name("consumer_rdy") is c.CONSUMER_RDY
    with pytest.raises(KeyError, match="no smartnsq metric is named 'nope'"):
        c.by_name("nope")


def test_default_is_off_and_set_metrics_swaps_it() -> None:
    assert get_metrics() is NO_METRICS and not NO_METRICS.enabled
    child = NO_METRICS.counter(c.CONSUMER_RECEIVED).labels("t", "c", "n", "")
    child.inc()
    NO_METRICS.histogram(c.CONSUMER_PROCESS).labels("t", "c").observe(1.0)
    NO_METRICS.gauge(c.CONSUMER_RDY, lambda: []).close()
    mine = PrometheusMetrics(CollectorRegistry())
    try:
        assert set_metrics(mine) is NO_METRICS
        assert get_metrics() is mine
    finally:
        assert set_metrics(None) is mine
    assert get_metrics() is NO_METRICS


def test_prometheus_endpoint_reports_counts_histograms_and_gauges() -> None:
    m = PrometheusMetrics(CollectorRegistry())
    received = m.counter(c.CONSUMER_RECEIVED)
    received.labels("orders", "billing", "127.0.0.1:4150", "0").inc(3)
    received.labels("orders", "billing", "127.0.0.1:4150", "0").inc()
    hist = m.histogram(c.CONSUMER_PROCESS).labels("orders", "billing")
    for v in (0.0004, 0.002, 0.002, 7.0):
        hist.observe(v)
    in_flight = {"n": 2.0}
    reg = m.gauge(c.CONSUMER_IN_FLIGHT,
                  lambda: [(("orders", "billing", "127.0.0.1:4150", "0"), in_flight["n"])])
    # a second client on the same labels adds up
    reg2 = m.gauge(c.CONSUMER_IN_FLIGHT,
                   lambda: [(("orders", "billing", "127.0.0.1:4150", "0"), 1.0)])
    got = scrape(m)
    assert got["smartnsq_consumer_messages_received_total"] == [
        ({"topic": "orders", "channel": "billing", "nsqd": "127.0.0.1:4150",
          "partition": "0"}, 4.0)]
    buckets = {s[0]["le"]: s[1] for s in got["smartnsq_consumer_process_duration_seconds_bucket"]}
    assert buckets["0.0005"] == 1 and buckets["0.0025"] == 3 and buckets["5.0"] == 3
    assert buckets["10.0"] == 4 and buckets["+Inf"] == 4
    assert got["smartnsq_consumer_process_duration_seconds_count"][0][1] == 4
    assert got["smartnsq_consumer_process_duration_seconds_sum"][0][1] == pytest.approx(7.0044)
    assert got["smartnsq_consumer_messages_in_flight"][0][1] == 3.0
    reg2.close()
    in_flight["n"] = 5.0
    assert scrape(m)["smartnsq_consumer_messages_in_flight"][0][1] == 5.0
    reg.close()
    assert "smartnsq_consumer_messages_in_flight" not in scrape(m)


def test_prometheus_scrape_survives_a_failing_gauge_reader(caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    m = PrometheusMetrics(CollectorRegistry())

    def broken() -> list[tuple[tuple[str, ...], float]]:
        raise RuntimeError("dictionary changed size during iteration")

    m.gauge(c.CONSUMER_RDY, broken)
    m.gauge(c.CONSUMER_RDY, lambda: [(("t", "c", "n:1", ""), 7.0)])
    with caplog.at_level("WARNING", logger="smartnsq.metrics"):
        got = scrape(m)
    assert got["smartnsq_consumer_rdy"] == [
        ({"topic": "t", "channel": "c", "nsqd": "n:1", "partition": ""}, 7.0)]
    assert "a reader of consumer_rdy failed" in caplog.text


def test_wrong_label_count_names_the_metric() -> None:
    m = PrometheusMetrics(CollectorRegistry())
    with pytest.raises(ValueError, match=r"consumer_messages_received takes labels"):
        m.counter(c.CONSUMER_RECEIVED).labels("only-topic")
    with pytest.raises(ValueError, match=r"consumer_process_duration_seconds takes labels"):
        m.histogram(c.CONSUMER_PROCESS).labels("t", "c", "extra")


def test_exporters_on_one_registry_share_its_collector_until_the_last_closes() -> None:
    registry = CollectorRegistry()
    first = PrometheusMetrics(registry)
    second = PrometheusMetrics(registry)  # was "Duplicated timeseries in CollectorRegistry"
    first.counter(c.PRODUCER_RETRIES).labels("orders").inc(2)
    second.counter(c.PRODUCER_RETRIES).labels("orders").inc(3)
    assert registry.get_sample_value("smartnsq_producer_retries_total",
                                     {"topic": "orders"}) == 5.0
    other = PrometheusMetrics(registry, prefix="app_nsq")  # another prefix: its own figures
    assert registry.get_sample_value("app_nsq_producer_retries_total",
                                     {"topic": "orders"}) is None
    other.close()
    first.close()
    first.close()  # twice: no second release
    assert registry.get_sample_value("smartnsq_producer_retries_total",
                                     {"topic": "orders"}) == 5.0
    second.close()
    assert registry.get_sample_value("smartnsq_producer_retries_total",
                                     {"topic": "orders"}) is None
    PrometheusMetrics(registry).close()  # registrable again, from zero


def test_counts_from_threads_while_scraping() -> None:
    """Clients on several loops' threads and a scraper at once: nothing lost, no error."""
    m = PrometheusMetrics(CollectorRegistry())
    fam = m.counter(c.PRODUCER_SENT)

    def publish(i: int) -> None:
        child = fam.labels(f"t{i}", "PUB", "ok")
        for _ in range(20_000):
            child.inc()

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    scrape(m)
    for t in threads:
        t.join(30)
    got = scrape(m)["smartnsq_producer_messages_sent_total"]
    assert sorted(v for _, v in got) == [20_000.0] * 4


def _otel_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, object], object]]]:
    data = reader.get_metrics_data()
    out: dict[str, list[tuple[dict[str, object], object]]] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "smartnsq"
            for metric in sm.metrics:
                for p in metric.data.data_points:
                    value = getattr(p, "value", None)
                    out.setdefault(metric.name, []).append(
                        (dict(p.attributes or {}), value if value is not None else p.count))
    return out


def test_opentelemetry_exporter_uses_semantic_convention_names_and_attributes() -> None:
    reader = InMemoryMetricReader()
    m = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    m.counter(c.PRODUCER_SENT).labels("orders", "MPUB", "ok").inc(100)
    m.counter(c.PRODUCER_SENT).labels("orders", "PUB", "PublishTimeoutError").inc()
    m.histogram(c.CONSUMER_PROCESS).labels("orders", "billing").observe(0.01)
    m.gauge(c.CONSUMER_RDY, lambda: [(("orders", "billing", "127.0.0.1:4150", "2"), 5.0)])
    got = _otel_points(reader)
    sent = {p[0].get("messaging.operation.name"): p for p in got["messaging.client.sent.messages"]}
    assert sent["MPUB"] == ({"messaging.system": "nsq", "messaging.destination.name": "orders",
                             "messaging.operation.name": "MPUB"}, 100)
    assert sent["PUB"][0]["error.type"] == "PublishTimeoutError"
    assert got["messaging.process.duration"] == [
        ({"messaging.system": "nsq", "messaging.destination.name": "orders",
          "messaging.consumer.group.name": "billing"}, 1)]
    assert got["smartnsq.consumer.rdy"] == [
        ({"messaging.system": "nsq", "messaging.destination.name": "orders",
          "messaging.consumer.group.name": "billing", "server.address": "127.0.0.1",
          "server.port": 4150, "messaging.destination.partition.id": "2"}, 5.0)]


@given(st.lists(st.one_of(st.sampled_from(c.CONSUMER_PROCESS.buckets),
                          st.floats(min_value=0, max_value=100, allow_nan=False)),
                max_size=200))
def test_observe_many_counts_as_observing_each(values: list[float]) -> None:
    """The hot path hands timings over in lists: the buckets (bounds included, "le") and
    the sum are those of observing each value."""
    one, many = (HistogramChild(c.CONSUMER_PROCESS.buckets) for _ in range(2))
    for v in values:
        one.observe(v)
    many.observe_many(list(values))
    assert many.counts == one.counts
    assert many.sum == pytest.approx(one.sum)
