"""What a consumer was asked to report (``metrics=``, ``tracer_provider=``,
``trace_envelope=``), checked at construction and resolved at ``start()``.

At start the metrics backend (the process default unless given) and the tracer provider (the
global one unless given) are read once. Only what is on reaches the consumer's parts: the
dispatcher gets meters (:mod:`.meters`) and process spans (:mod:`.process_spans`), the
subscription set binds each new subscription's counters. With both off nothing is installed,
so the per-message path is the one without any of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from smartnsq.consumer.meters import ConsumerMeters, SubView
from smartnsq.metrics.api import Metrics
from smartnsq.metrics.noop import NO_METRICS
from smartnsq.telemetry import TelemetryOptions

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from smartnsq.consumer.process_spans import ProcessSpans

__all__ = ["Observability"]


class Observability:
    """One consumer's metrics and tracing settings, and what they became at start."""

    def __init__(self, metrics: Metrics | None, tracer_provider: TracerProvider | None,
                 trace_envelope: bool) -> None:
        self._options = TelemetryOptions(metrics, tracer_provider, trace_envelope)
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
        metrics = self.metrics = self._options.metrics()
        if metrics.enabled:
            self.meters = ConsumerMeters(metrics, topic, channel)
            views: Callable[[], list[SubView]] = subs
            self.meters.watch(views, in_backoff)
        tracing = self._options.tracing()
        if tracing is not None or self.envelope:
            from smartnsq.consumer.process_spans import ProcessSpans

            self.spans = ProcessSpans(tracing, self.envelope, topic, channel)

    def stop(self) -> None:
        """The consumer stopped: its gauges go."""
        if self.meters is not None:
            self.meters.close()
