"""What a consumer was asked to report (``metrics=``, ``tracer_provider=``,
``trace_envelope=``), checked at construction and resolved at ``start()``.

At start the metrics backend (the process default unless given) and the tracer provider (the
global one unless given) are read once. Only what is on reaches the consumer's parts: the
dispatcher gets meters (:mod:`.meters`) and process spans (:mod:`.process_spans`), the
subscription set binds each new subscription's counters. With both off nothing is installed,
so the per-message path is the one without any of it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from smartnsq.consumer.meters import ConsumerMeters, SubView
from smartnsq.errors import ConfigError
from smartnsq.metrics.api import Metrics
from smartnsq.metrics.default import get_metrics
from smartnsq.metrics.noop import NO_METRICS
from smartnsq.tracing import resolve

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from smartnsq.consumer.process_spans import ProcessSpans

__all__ = ["Observability"]


class Observability:
    """One consumer's metrics and tracing settings, and what they became at start."""

    def __init__(self, metrics: Metrics | None, tracer_provider: TracerProvider | None,
                 trace_envelope: bool) -> None:
        if metrics is not None and not (hasattr(metrics, "enabled")
                                        and callable(getattr(metrics, "counter", None))):
            raise ConfigError(f"metrics must be a smartnsq.metrics.Metrics (e.g. "
                              f"PrometheusMetrics), got {type(metrics).__name__}")
        if not isinstance(trace_envelope, bool):
            raise ConfigError(f"trace_envelope must be True or False, got {trace_envelope!r}")
        if trace_envelope and importlib.util.find_spec("opentelemetry") is None:
            raise ConfigError("trace_envelope=True needs opentelemetry-api "
                              "(pip install 'smartnsq[otel]')")
        self._metrics = metrics
        self._provider = tracer_provider
        self.envelope = trace_envelope
        #: the backend in use once started (off: the no-op one)
        self.metrics: Metrics = NO_METRICS
        #: the consumer's meters once started with metrics on
        self.meters: ConsumerMeters | None = None
        #: its process spans / envelope unwrapping once started with either on
        self.spans: ProcessSpans | None = None

    def start(self, topic: str, channel: str, subs: Callable[[], list[Any]],
              in_backoff: Callable[[], bool]) -> None:
        """Resolve the backend and the provider; register the gauges (``subs()`` copies the
        live subscriptions, :class:`~smartnsq.consumer.meters.SubView`)."""
        metrics = self.metrics = get_metrics() if self._metrics is None else self._metrics
        if metrics.enabled:
            self.meters = ConsumerMeters(metrics, topic, channel)
            views: Callable[[], list[SubView]] = subs
            self.meters.watch(views, in_backoff)
        # an SDK provider can only be global if the application imported opentelemetry.trace:
        # without one, resolving is skipped, so a consumer never loads opentelemetry for
        # nothing (its objects would make every full garbage collection dearer)
        tracing = None
        if self._provider is not None or "opentelemetry.trace" in sys.modules:
            tracing = resolve(self._provider)
        if tracing is not None or self.envelope:
            from smartnsq.consumer.process_spans import ProcessSpans

            self.spans = ProcessSpans(tracing, self.envelope, topic, channel)

    def stop(self) -> None:
        """The consumer stopped: its gauges go."""
        if self.meters is not None:
            self.meters.close()
