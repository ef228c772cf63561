"""The process-wide metrics backend that clients use unless given their own."""

from __future__ import annotations

from smartnsq._checks import type_named
from smartnsq.errors import ConfigError
from smartnsq.metrics.api import Metrics
from smartnsq.metrics.noop import NO_METRICS

__all__ = ["check_metrics", "get_metrics", "set_metrics"]

_current: Metrics = NO_METRICS


def check_metrics(metrics: object, where: str) -> Metrics:
    """``metrics`` if it is a smartnsq metrics backend, else a :class:`ConfigError` naming
    what was passed (``where``: the call or keyword that got it). Checked where it is given,
    not when a client starts far from the mistake."""
    if isinstance(metrics, type):
        # the class has the attributes too (metrics=PrometheusMetrics, no parentheses): it
        # would fail only at start(), on a call missing its self
        raise ConfigError(f"{where} takes a smartnsq.metrics backend, got the class "
                          f"{metrics.__qualname__} (pass an instance: {metrics.__name__}())")
    if (isinstance(getattr(metrics, "enabled", None), bool)
            and all(callable(getattr(metrics, name, None))
                    for name in ("counter", "histogram", "gauge"))):
        return metrics  # type: ignore[return-value]
    got = type_named(metrics)
    hint = ""
    if type(metrics).__module__.startswith("prometheus_client") or got.startswith(
            "the module prometheus_client"):
        hint = " (wrap a registry: PrometheusMetrics(registry))"
    elif type(metrics).__module__.startswith("opentelemetry") or got.startswith(
            "the module opentelemetry"):
        hint = " (wrap a meter provider: OpenTelemetryMetrics(meter_provider))"
    raise ConfigError(f"{where} takes a smartnsq.metrics backend (PrometheusMetrics, "
                      f"OpenTelemetryMetrics, or None), got {got}{hint}")


def get_metrics() -> Metrics:
    """The process default (metrics off unless :func:`set_metrics` was called). Clients read
    it at ``start()``, so set it before starting them."""
    return _current


def set_metrics(metrics: Metrics | None) -> Metrics:
    """Make ``metrics`` the process default (None: off again); return the previous one.
    Clients already started keep the backend they started with."""
    global _current
    new = NO_METRICS if metrics is None else check_metrics(metrics, "set_metrics()")
    previous, _current = _current, new
    return previous
