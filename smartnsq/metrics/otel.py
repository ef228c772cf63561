"""The OpenTelemetry metrics exporter (``pip install 'smartnsq[otel]'``).

Depends on ``opentelemetry-api`` only; figures reach a backend once the application
configures an SDK ``MeterProvider`` (or passes one here)::

    from smartnsq.metrics import set_metrics
    from smartnsq.metrics.otel import OpenTelemetryMetrics

    set_metrics(OpenTelemetryMetrics())    # the global MeterProvider

Counters and gauges are aggregated in process and reported through observable instruments
(read at each export, nothing per message). Histograms have no observable form in the OTel
API, so each observation is recorded on an OTel histogram: its cost per message is the
SDK's own.

Every ``OpenTelemetryMetrics`` on one meter provider shares one set of instruments and
figures: one made per request (or per client) adds to the same counts, where a second set
of observable instruments of the same names would each report only its own share (and
the SDK keeps every instrument's callback for good).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from smartnsq._checks import type_named
from smartnsq._version import __version__
from smartnsq.errors import ConfigError
from smartnsq.metrics.api import GaugeRead, MetricSpec
from smartnsq.metrics.bounds import (
    DEFAULT_MAX_CHANNELS,
    DEFAULT_MAX_TOPICS,
    BoundChildren,
    LabelBounds,
    check_bounds,
)
from smartnsq.metrics.catalog import OTEL_ATTRIBUTES
from smartnsq.metrics.local import Counter, GaugeReader, LocalStore
from smartnsq.tracing.semconv import SERVER_ADDRESS, SERVER_PORT, server_of

__all__ = ["OpenTelemetryMetrics", "attributes"]

Attributes = dict[str, str | int]


def attributes(spec: MetricSpec, values: tuple[str, ...]) -> Attributes:
    """The OTel attributes for a child's label values (semantic-convention keys)."""
    attrs: Attributes = {"messaging.system": "nsq"}
    for label, value in zip(spec.labels, values, strict=True):
        if label == "nsqd":
            host, port = server_of(value)
            attrs[SERVER_ADDRESS] = host
            if port is not None:
                attrs[SERVER_PORT] = port
        elif label == "result":
            if value != "ok":
                attrs["error.type"] = value
        elif label == "partition":
            if value != "":
                attrs[OTEL_ATTRIBUTES[label]] = value
        else:
            attrs[OTEL_ATTRIBUTES.get(label, f"smartnsq.{label}")] = value
    return attrs


def _observations(spec: MetricSpec,
                  samples: Callable[[], Iterable[tuple[tuple[str, ...], float]]]
                  ) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, attributes(spec, values)) for values, value in samples()]
    return callback


class _HistogramChild:
    __slots__ = ("_attrs", "_record")

    def __init__(self, record: Callable[..., None], attrs: Attributes) -> None:
        self._record = record
        self._attrs = attrs

    def observe(self, value: float) -> None:
        self._record(value, self._attrs)

    def observe_many(self, values: list[float]) -> None:
        record, attrs = self._record, self._attrs
        for value in values:
            record(value, attrs)


class _Histogram(BoundChildren[_HistogramChild]):
    """Past a bound, observations go to the ``"(other)"`` attribute set."""

    def __init__(self, spec: MetricSpec, instrument: Any, bounds: LabelBounds) -> None:
        super().__init__(spec, bounds)
        self._record = instrument.record

    def _new(self, values: tuple[str, ...]) -> _HistogramChild:
        return _HistogramChild(self._record, attributes(self.spec, values))


class _Instruments:
    """A meter provider's smartnsq instruments and their figures, shared by its exporters."""

    def __init__(self, meter: Meter, max_topics: int, max_channels: int) -> None:
        self.meter = meter
        self.store = LocalStore(max_topics, max_channels)
        self.histograms: dict[str, _Histogram] = {}
        # instruments are made once per metric even when clients on two threads bind at once
        self.lock = threading.Lock()


#: meter provider -> its instruments (weak: a dropped provider takes its entry along)
_SHARED: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()
#: the global provider's: one entry whatever it is now, since the API's proxy forwards to
#: the SDK provider set later
_GLOBAL: list[_Instruments] = []
_SHARED_LOCK = threading.Lock()


def _instruments(provider: MeterProvider | None, max_topics: int | None,
                 max_channels: int | None) -> _Instruments:
    with _SHARED_LOCK:
        shared = _GLOBAL[0] if provider is None and _GLOBAL else (
            _SHARED.get(provider) if provider is not None else None)
        if shared is not None:
            check_bounds(max_topics, max_channels, shared.store.bounds, "OpenTelemetryMetrics")
        if shared is None:
            meter = otel_metrics.get_meter("smartnsq", __version__, meter_provider=provider)
            shared = _Instruments(
                meter, DEFAULT_MAX_TOPICS if max_topics is None else max_topics,
                DEFAULT_MAX_CHANNELS if max_channels is None else max_channels)
            if provider is None:
                _GLOBAL.append(shared)
            else:
                _SHARED[provider] = shared
        return shared


class OpenTelemetryMetrics:
    """Metrics through the OpenTelemetry API, on ``meter_provider`` (the global one unless
    given), instrumentation scope ``smartnsq``. Exporters on the same provider share its
    instruments and figures.

    ``max_topics`` (default 1000) bounds the topic attribute
    (``messaging.destination.name``): the first that many distinct topics keep their own
    attribute sets, later ones are reported as ``"(other)"`` (a warning is logged once).
    ``max_channels`` (default 1000) bounds the channel attribute
    (``messaging.consumer.group.name``) the same way, counting distinct topic and channel
    pairs. Exporters on one provider share its bounds."""

    enabled = True

    def __init__(self, meter_provider: MeterProvider | None = None, *,
                 max_topics: int | None = None, max_channels: int | None = None) -> None:
        if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
            raise ConfigError(f"OpenTelemetryMetrics(meter_provider=...) takes an "
                              f"OpenTelemetry MeterProvider, got {type_named(meter_provider)}")
        self.meter_provider = meter_provider
        check_bounds(max_topics, max_channels, None, "OpenTelemetryMetrics")
        shared = _instruments(meter_provider, max_topics, max_channels)
        self._meter: Meter = shared.meter
        self._store = shared.store
        self._histograms = shared.histograms
        self._lock = shared.lock

    def counter(self, spec: MetricSpec) -> Counter:
        fam = self._store.counters.get(spec.name)
        if fam is not None:
            return fam
        with self._lock:
            if spec.name in self._store.counters:
                return self._store.counters[spec.name]
            fam = self._store.counter(spec)
            self._meter.create_observable_counter(
                spec.otel_name, [_observations(spec, fam.samples)], spec.otel_unit,
                spec.description)
        return fam

    def histogram(self, spec: MetricSpec) -> _Histogram:
        fam = self._histograms.get(spec.name)
        if fam is not None:
            return fam
        with self._lock:
            fam = self._histograms.get(spec.name)
            if fam is None:
                instrument = self._meter.create_histogram(
                    spec.otel_name, spec.otel_unit, spec.description,
                    explicit_bucket_boundaries_advisory=list(spec.buckets))
                fam = self._histograms[spec.name] = _Histogram(spec, instrument,
                                                               self._store.bounds)
        return fam

    def gauge(self, spec: MetricSpec, read: GaugeRead) -> GaugeReader:
        with self._lock:
            gauges = self._store.gauges.get(spec.name)
            if gauges is None:
                gauges = self._store.gauge(spec)
                self._meter.create_observable_gauge(
                    spec.otel_name, [_observations(spec, gauges.samples)], spec.otel_unit,
                    spec.description)
        return gauges.add(read)

    def __repr__(self) -> str:
        return "OpenTelemetryMetrics()"

