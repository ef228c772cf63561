"""The Prometheus exporter (``pip install 'smartnsq[prometheus]'``).

::

    from smartnsq.metrics import set_metrics
    from smartnsq.metrics.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics()          # registers on prometheus_client's default registry
    set_metrics(metrics)                   # before starting clients
    metrics.serve(9108)                    # or expose the registry the way the app already does

The clients aggregate in process (:mod:`smartnsq.metrics.local`); this module's collector
turns that into metric families when the registry is scraped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from smartnsq.metrics.api import GaugeRead, Kind, MetricSpec
from smartnsq.metrics.catalog import ALL, PREFIX
from smartnsq.metrics.local import Counter, GaugeReader, Histogram, LocalStore

__all__ = ["PrometheusMetrics"]


def _family(spec: MetricSpec, prefix: str) -> Metric:
    name = f"{prefix}_{spec.name}"
    labels = list(spec.labels)
    if spec.kind is Kind.COUNTER:
        return CounterMetricFamily(name, spec.description, labels=labels)
    if spec.kind is Kind.GAUGE:
        return GaugeMetricFamily(name, spec.description, labels=labels)
    return HistogramMetricFamily(name, spec.description, labels=labels)


class _Collector(Collector):
    def __init__(self, store: LocalStore, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def describe(self) -> Iterable[Metric]:
        # every catalog metric: registering two exporters on one registry fails at once
        return [_family(spec, self._prefix) for spec in ALL]

    def collect(self) -> Iterable[Metric]:
        store = self._store
        for spec in ALL:
            fam = _family(spec, self._prefix)
            if spec.kind is Kind.COUNTER:
                counter = store.counters.get(spec.name)
                for values, value in counter.samples() if counter else ():
                    fam.add_metric(values, value)  # type: ignore[attr-defined]
            elif spec.kind is Kind.GAUGE:
                gauge = store.gauges.get(spec.name)
                for values, value in gauge.samples() if gauge else ():
                    fam.add_metric(values, value)  # type: ignore[attr-defined]
            else:
                hist = store.histograms.get(spec.name)
                les = [floatToGoString(b) for b in spec.buckets]  # type: ignore[no-untyped-call]
                les.append("+Inf")
                for values, snap in hist.samples() if hist else ():
                    fam.add_metric(  # type: ignore[attr-defined]
                        values, list(zip(les, snap.cumulative(), strict=True)), snap.sum)
            yield fam


class PrometheusMetrics:
    """Metrics for ``prometheus_client``: one collector on ``registry`` (the default
    registry unless given), names ``smartnsq_*`` (``prefix`` changes that)."""

    enabled = True

    def __init__(self, registry: CollectorRegistry | None = None,
                 prefix: str = PREFIX) -> None:
        self.registry = REGISTRY if registry is None else registry
        self._store = LocalStore()
        self._collector = _Collector(self._store, prefix)
        self.registry.register(self._collector)

    def counter(self, spec: MetricSpec) -> Counter:
        return self._store.counter(spec)

    def histogram(self, spec: MetricSpec) -> Histogram:
        return self._store.histogram(spec)

    def gauge(self, spec: MetricSpec, read: GaugeRead) -> GaugeReader:
        return self._store.gauge(spec).add(read)

    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
        """Serve this registry's text format on ``http://addr:port/metrics`` from a daemon
        thread (``prometheus_client.start_http_server``); port 0 picks a free one
        (``server.server_port``)."""
        return start_http_server(port, addr, registry=self.registry)

    def close(self) -> None:
        """Unregister the collector (its figures disappear from the registry)."""
        self.registry.unregister(self._collector)

    def __repr__(self) -> str:
        return f"PrometheusMetrics(registry={self.registry!r})"
