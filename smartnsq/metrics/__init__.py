"""Client metrics: one small interface the clients call, a no-op default, and exporters.

- :class:`Metrics` (``smartnsq.metrics.api``): what clients ask of a backend.
- :func:`get_metrics` / :func:`set_metrics`: the process default, off (:data:`NO_METRICS`)
  unless set. A client also takes ``metrics=`` for its own.
- :mod:`smartnsq.metrics.prometheus` (``smartnsq[prometheus]``) and
  :mod:`smartnsq.metrics.otel` (``smartnsq[otel]``): the exporters, imported on use.
- :mod:`smartnsq.metrics.catalog`: every metric's name, labels and meaning.
"""

from __future__ import annotations

from smartnsq.metrics.api import (
    CounterChild,
    CounterFamily,
    GaugeRead,
    HistogramChild,
    HistogramFamily,
    Kind,
    Metrics,
    MetricSpec,
    Registration,
)
from smartnsq.metrics.default import get_metrics, set_metrics
from smartnsq.metrics.noop import NO_METRICS, NoMetrics

__all__ = ["NO_METRICS", "CounterChild", "CounterFamily", "GaugeRead", "HistogramChild",
           "HistogramFamily", "Kind", "MetricSpec", "Metrics", "NoMetrics", "Registration",
           "get_metrics", "set_metrics"]
