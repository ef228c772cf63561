"""The metrics interface the clients call, and the description of one metric.

Clients never import an exporter. They ask the :class:`Metrics` they were given (the process
default unless a client got its own) for a family by its :class:`MetricSpec` from
:mod:`smartnsq.metrics.catalog`, bind it once to its label values, and then only call
``inc`` / ``observe`` on the bound child. Gauges are read, not set: a client registers a
function that the exporter calls at collection time, so a gauge costs nothing between scrapes.

``Metrics.enabled`` is False for the no-op default: a client checks it once (at ``start()``)
and then skips the clock reads that only a histogram needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

__all__ = ["CounterChild", "CounterFamily", "GaugeRead", "HistogramChild", "HistogramFamily",
           "Kind", "MetricSpec", "Metrics", "Registration"]


class Kind(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric, as every exporter names it.

    ``name`` is the Prometheus base name without the ``smartnsq_`` prefix and without the
    ``_total`` suffix of counters; the unit is already part of it (``_seconds``, ``_bytes``,
    ``_messages``). ``otel_name`` follows the OpenTelemetry messaging semantic conventions
    where they define the metric, else a ``smartnsq.`` name. ``labels`` are Prometheus label
    names (see :data:`smartnsq.metrics.catalog.OTEL_ATTRIBUTES` for their OTel keys)."""

    name: str
    kind: Kind
    description: str
    labels: tuple[str, ...]
    otel_name: str
    #: UCUM unit for OpenTelemetry: "s", "By", "{message}", ...
    otel_unit: str
    #: histogram bucket upper bounds (ascending, +Inf implied)
    buckets: tuple[float, ...] = ()


class CounterChild(Protocol):
    """A counter bound to its label values."""

    def inc(self, amount: float = 1) -> None: ...


class HistogramChild(Protocol):
    """A histogram bound to its label values."""

    def observe(self, value: float) -> None: ...

    def observe_many(self, values: list[float]) -> None:
        """Observe each of ``values`` (a per-message hot path gathers them and hands them
        over in one call; the list may be sorted in place)."""
        ...


class CounterFamily(Protocol):
    def labels(self, *values: str) -> CounterChild:
        """The child for these label values, in the spec's label order."""
        ...


class HistogramFamily(Protocol):
    def labels(self, *values: str) -> HistogramChild:
        """The child for these label values, in the spec's label order."""
        ...


#: a gauge's reading: (label values in the spec's order, value) pairs
GaugeRead = Callable[[], Iterable[tuple[tuple[str, ...], float]]]


class Registration(Protocol):
    """A registered gauge reader; ``close()`` removes it (a stopped client's gauges go)."""

    def close(self) -> None: ...


class Metrics(Protocol):
    """What a client asks of a metrics backend."""

    #: False for the no-op backend: clients skip work that only feeds metrics
    enabled: bool

    def counter(self, spec: MetricSpec) -> CounterFamily: ...

    def histogram(self, spec: MetricSpec) -> HistogramFamily: ...

    def gauge(self, spec: MetricSpec, read: GaugeRead) -> Registration:
        """Register ``read``; the exporter calls it at collection time, from its own thread.
        Readings of several registrations with the same label values add up."""
        ...
