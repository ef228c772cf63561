"""The Prometheus exporter (``pip install 'smartnsq[prometheus]'``).

::

    from smartnsq.metrics import set_metrics
    from smartnsq.metrics.prometheus import PrometheusMetrics

    metrics = PrometheusMetrics()          # registers on prometheus_client's default registry
    set_metrics(metrics)                   # before starting clients
    metrics.serve(9108)                    # or expose the registry the way the app already does

The clients aggregate in process (:mod:`smartnsq.metrics.local`); this module's collector
turns that into metric families when the registry is scraped.

Every ``PrometheusMetrics`` on one registry with one prefix shares one collector and one set
of figures: a web application that makes one per request (or per client) gets the sum of all
of them, not prometheus_client's "Duplicated timeseries" from the second one.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import types
import weakref
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

from smartnsq.errors import ConfigError
from smartnsq.metrics.api import GaugeRead, Kind, MetricSpec
from smartnsq.metrics.bounds import DEFAULT_MAX_CHANNELS, DEFAULT_MAX_TOPICS, check_bounds
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


class _Shared:
    """One registry's collector for one prefix, and how many exporters use it."""

    __slots__ = ("collector", "store", "users")

    def __init__(self, store: LocalStore, collector: _Collector) -> None:
        self.store = store
        self.collector = collector
        self.users = 0


#: registry -> prefix -> its collector (weak: a dropped registry takes its entry along)
_SHARED: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, _Shared]] = (
    weakref.WeakKeyDictionary())
_SHARED_LOCK = threading.Lock()
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
log = logging.getLogger("smartnsq.metrics")
#: the multiprocess warning was logged (once per process)
_told_multiprocess = False


def _tell_multiprocess() -> None:
    """prometheus_client's multiprocess mode (gunicorn and the like) scrapes its own files
    through MultiProcessCollector, which never reads a custom collector such as this one:
    say so once, where the operator would otherwise find the smartnsq series missing."""
    global _told_multiprocess
    if _told_multiprocess or not ({"PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"}
                                  & os.environ.keys()):
        return
    _told_multiprocess = True
    log.warning("metrics: PROMETHEUS_MULTIPROC_DIR is set, but prometheus_client's "
                "MultiProcessCollector does not read smartnsq's figures: they are this "
                "process's own, in its registry; serve it from each process "
                "(PrometheusMetrics.serve(port)) and scrape every process")


def _describe(value: object) -> str:
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}"
    return f"{type(value).__name__} {value!r}"[:120]


def _attach(registry: CollectorRegistry, prefix: str, max_topics: int | None,
            max_channels: int | None, store: LocalStore | None = None) -> _Shared:
    """The registry's shared collector for ``prefix``, made (on ``store`` when given: a
    closed exporter's figures) if there is none."""
    with _SHARED_LOCK:
        by_prefix = _SHARED.setdefault(registry, {})
        shared = by_prefix.get(prefix)
        if shared is not None:
            check_bounds(max_topics, max_channels, shared.store.bounds, "PrometheusMetrics")
        if shared is None:
            if store is None:
                store = LocalStore(
                    DEFAULT_MAX_TOPICS if max_topics is None else max_topics,
                    DEFAULT_MAX_CHANNELS if max_channels is None else max_channels)
            collector = _Collector(store, prefix)
            try:
                registry.register(collector)
            except ValueError as exc:
                # another collector (the application's own) holds names of ours
                raise ConfigError(
                    f"PrometheusMetrics: the registry already has metrics named "
                    f"{prefix}_*, registered by another collector than smartnsq's "
                    f"({str(exc)[:200]}); pass prefix= or another registry") from None
            shared = by_prefix[prefix] = _Shared(store, collector)
        shared.users += 1
        return shared


class PrometheusMetrics:
    """Metrics for ``prometheus_client``: one collector on ``registry`` (the default
    registry unless given), names ``smartnsq_*`` (``prefix`` changes that). Exporters made
    on the same registry with the same prefix share that collector and its figures.

    ``max_topics`` (default 1000) bounds the ``topic`` label: the first that many distinct
    topics keep their own series, later ones are counted under ``topic="(other)"`` (a
    warning is logged once), so generated topic names do not grow the registry without
    end. ``max_channels`` (default 1000) bounds the ``channel`` label the same way, counting
    a topic's channels as nsqd does (distinct topic and channel pairs): channels made per
    tenant or per process (``#ephemeral``) past it are counted under ``channel="(other)"``.
    Exporters sharing a collector share its bounds."""

    enabled = True

    def __init__(self, registry: CollectorRegistry | None = None,
                 prefix: str = PREFIX, *, max_topics: int | None = None,
                 max_channels: int | None = None) -> None:
        if registry is not None and not isinstance(registry, CollectorRegistry):
            raise ConfigError(f"PrometheusMetrics(registry=...) takes a prometheus_client "
                              f"CollectorRegistry (prometheus_client.REGISTRY, or "
                              f"CollectorRegistry()), got {_describe(registry)}")
        if not isinstance(prefix, str) or not _NAME.fullmatch(prefix):
            raise ConfigError(f"PrometheusMetrics(prefix=...) must be a Prometheus metric "
                              f"name ([a-zA-Z_:][a-zA-Z0-9_:]*), got {prefix!r}")
        self.registry = REGISTRY if registry is None else registry
        self._prefix = prefix
        check_bounds(max_topics, max_channels, None, "PrometheusMetrics")
        _tell_multiprocess()
        self._shared: _Shared | None = _attach(self.registry, prefix, max_topics, max_channels)
        self._store = self._shared.store
        self._reopening = threading.Lock()

    def _live(self) -> LocalStore:
        """The figures clients bind to; a closed exporter that a client starts with again
        (an application's second startup after its shutdown hook closed it) registers
        again instead of counting where no scrape looks."""
        if self._shared is None:
            with self._reopening:  # clients starting on two threads attach it once
                if self._shared is None:
                    bounds = self._store.bounds
                    shared = _attach(self.registry, self._prefix, bounds.topics.limit,
                                     bounds.channels.limit, self._store)
                    self._shared, self._store = shared, shared.store
        return self._store

    def counter(self, spec: MetricSpec) -> Counter:
        return self._live().counter(spec)

    def histogram(self, spec: MetricSpec) -> Histogram:
        return self._live().histogram(spec)

    def gauge(self, spec: MetricSpec, read: GaugeRead) -> GaugeReader:
        return self._live().gauge(spec).add(read)

    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
        """Serve this registry's text format on ``http://addr:port/metrics`` from a daemon
        thread (``prometheus_client.start_http_server``); port 0 picks a free one
        (``server.server_port``)."""
        return start_http_server(port, addr, registry=self.registry)

    def close(self) -> None:
        """Stop using the collector; once every exporter sharing it (same registry and
        prefix) is closed, it is unregistered and its figures disappear. Closing twice does
        nothing more; a client started with it afterwards registers it again."""
        shared, self._shared = self._shared, None
        if shared is None:
            return
        with _SHARED_LOCK:
            shared.users -= 1
            if shared.users:
                return
            by_prefix = _SHARED.get(self.registry, {})
            if by_prefix.get(self._prefix) is shared:
                del by_prefix[self._prefix]
            self.registry.unregister(shared.collector)

    def __repr__(self) -> str:
        return f"PrometheusMetrics(registry={self.registry!r})"
