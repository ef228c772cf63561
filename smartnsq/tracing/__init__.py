"""OpenTelemetry traces across NSQ (``pip install 'smartnsq[otel]'``).

Producers and consumers call :func:`resolve` once at ``start()``: it returns None (and they
do nothing per message) unless ``opentelemetry-api`` is installed and an SDK tracer provider
is configured, globally or passed as the client's ``tracer_provider``.

- :mod:`smartnsq.tracing.spans`: ``send {topic}`` / ``process {topic}`` spans.
- :mod:`smartnsq.tracing.carrier`: the W3C context in youzan's JSON ext header, and the
  opt-in body envelope for stock nsqd.
- :mod:`smartnsq.tracing.semconv`: the attribute keys.

This is not :mod:`smartnsq.trace`, youzan's server-side message trace switch; a traced
publish's youzan trace id is recorded on the send span (``messaging.nsq.message.trace_id``),
where the two meet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smartnsq.tracing.spans import Tracing

__all__ = ["resolve"]


def resolve(tracer_provider: Any = None) -> Tracing | None:
    """The client's span maker, or None when tracing is off (no ``opentelemetry-api``, or
    no SDK provider configured and none given)."""
    try:
        from smartnsq.tracing.spans import tracing_for
    except ImportError:  # opentelemetry-api is not installed: the otel extra is optional
        return None
    return tracing_for(tracer_provider)
