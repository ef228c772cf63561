"""The process-wide metrics backend that clients use unless given their own."""

from __future__ import annotations

from smartnsq.metrics.api import Metrics
from smartnsq.metrics.noop import NO_METRICS

__all__ = ["get_metrics", "set_metrics"]

_current: Metrics = NO_METRICS


def get_metrics() -> Metrics:
    """The process default (metrics off unless :func:`set_metrics` was called). Clients read
    it at ``start()``, so set it before starting them."""
    return _current


def set_metrics(metrics: Metrics | None) -> Metrics:
    """Make ``metrics`` the process default (None: off again); return the previous one."""
    global _current
    previous, _current = _current, (NO_METRICS if metrics is None else metrics)
    return previous
