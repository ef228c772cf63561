"""What a client was asked to report (``metrics=``, ``tracer_provider=``,
``trace_envelope=``): checked when the client is made, resolved when it starts.

Producers and consumers hold one :class:`TelemetryOptions` each and build their own meters
and spans from what it resolves to.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import TYPE_CHECKING

from smartnsq._checks import type_named
from smartnsq.errors import ConfigError
from smartnsq.metrics.api import Metrics
from smartnsq.metrics.default import check_metrics, get_metrics
from smartnsq.tracing import resolve

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from smartnsq.tracing.spans import Tracing

__all__ = ["TelemetryOptions"]


def _check_provider(provider: object) -> None:
    """A tracer provider is an instance with ``get_tracer``; the usual slips (the module
    ``opentelemetry.trace``, the SDK class itself, a tracer) are named at construction,
    not met as an AttributeError when the client starts."""
    if isinstance(provider, types.ModuleType):
        got = f"the module {provider.__name__} (pass trace.get_tracer_provider(), or "
        got += "an SDK TracerProvider())"
    elif isinstance(provider, type):
        got = f"the class {provider.__qualname__} (pass an instance: {provider.__name__}())"
    elif not callable(getattr(provider, "get_tracer", None)):
        got = type_named(provider)
        if callable(getattr(provider, "start_span", None)):
            got += " (a tracer: pass the provider it came from)"
    else:
        return
    raise ConfigError(f"tracer_provider= takes an OpenTelemetry TracerProvider, got {got}")


class TelemetryOptions:
    """A client's metrics backend, tracer provider and envelope choice."""

    def __init__(self, metrics: Metrics | None, tracer_provider: TracerProvider | None,
                 trace_envelope: bool) -> None:
        if metrics is not None:
            check_metrics(metrics, "metrics=")
        if tracer_provider is not None:
            _check_provider(tracer_provider)
        if not isinstance(trace_envelope, bool):
            raise ConfigError(f"trace_envelope must be True or False, got {trace_envelope!r}")
        if trace_envelope and importlib.util.find_spec("opentelemetry") is None:
            raise ConfigError("trace_envelope=True needs opentelemetry-api "
                              "(pip install 'smartnsq[otel]')")
        self._metrics = metrics
        self._provider = tracer_provider
        #: carry the span context in front of the body (stock nsqd, opt-in on both sides)
        self.envelope = trace_envelope

    def metrics(self) -> Metrics:
        """The backend to use: the given one, else the process default now."""
        return get_metrics() if self._metrics is None else self._metrics

    def tracing(self) -> Tracing | None:
        """The span maker, or None when tracing is off."""
        # an SDK provider can only be global if the application imported opentelemetry.trace:
        # without one given or imported, opentelemetry is not loaded for nothing (its objects
        # make every full garbage collection dearer, which showed in consume + FIN)
        if self._provider is None and "opentelemetry.trace" not in sys.modules:
            return None
        return resolve(self._provider)
