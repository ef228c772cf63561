"""A producer's metrics and tracing, resolved once at ``start()`` (TCP and HTTP producers).

``metrics`` (:class:`~smartnsq.metrics.Metrics`): where the producer's ``PRODUCER_*``
metrics go, and the ``LOOKUP_*`` ones of a lookup component it makes (a shared one keeps its
own); None: the process default (:func:`smartnsq.metrics.get_metrics`) read at start. With a
disabled backend (the default) nothing is bound and publishes run the code they ran before;
enabled, the retry engine counts them (:mod:`smartnsq.producer.observe`).

``tracer_provider``: the OpenTelemetry provider of the ``send {topic}`` spans (None: the
global one); without an SDK configured tracing is off and nothing is done per publish.
``trace_envelope=True``: where no youzan ext header can carry a span's context (stock nsqd),
carry it in front of the body for consumers made with ``trace_envelope=True``
(:mod:`smartnsq.producer.spans`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from smartnsq.lookup import Lookup
from smartnsq.metrics import Metrics, Registration
from smartnsq.metrics import catalog as c
from smartnsq.producer.engine import TcpEngine
from smartnsq.producer.nodes import Nodes
from smartnsq.producer.observe import PublishMetrics
from smartnsq.producer.routing import Router
from smartnsq.telemetry import TelemetryOptions

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from smartnsq.producer.spans import SendSpans

__all__ = ["ProducerInstruments"]


class ProducerInstruments:
    """One producer's metrics and send spans (see the module docstring)."""

    def __init__(self, metrics: Metrics | None, tracer_provider: TracerProvider | None,
                 trace_envelope: bool) -> None:
        self._options = TelemetryOptions(metrics, tracer_provider, trace_envelope)
        self.envelope = trace_envelope
        #: the metrics in use once started
        self.metrics: Metrics | None = None
        #: the engine's counters (None: metrics off)
        self.obs: PublishMetrics | None = None
        #: send spans (None: tracing off)
        self.spans: SendSpans | None = None
        self._gauge: Registration | None = None

    def resolve(self, loop: asyncio.AbstractEventLoop, own_lookup: Lookup | None,
                router: Router | None, server: str | None) -> None:
        """At start, before ``own_lookup`` (a lookup the producer made) starts: the metrics
        and tracing in use. ``server``: the one nsqd the producer was given, if only one."""
        metrics = self.metrics = self._options.metrics()
        if own_lookup is not None:
            own_lookup.meters.use(metrics)
        if metrics.enabled:
            self.obs = PublishMetrics(metrics, loop)
        tracing = self._options.tracing()
        if tracing is not None:
            from smartnsq.producer.spans import SendSpans

            self.spans = SendSpans(tracing, router=router, envelope=self.envelope,
                                   server=server)

    def observe(self, engine: TcpEngine, nodes: Nodes) -> PublishMetrics:
        """Metrics on: the engine counts attempts and the nodes reconnects, and the
        connections gauge reads the pools; the caller switches to the engine's counted
        runs."""
        obs = self.obs
        assert obs is not None
        engine.observe(obs)
        nodes.obs = obs
        self._gauge = obs.metrics.gauge(c.PRODUCER_CONNECTIONS, nodes.connection_states)
        return obs

    def close(self) -> None:
        """The stopped producer's gauge goes."""
        if self._gauge is not None:
            self._gauge.close()
            self._gauge = None
