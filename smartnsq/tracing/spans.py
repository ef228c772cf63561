"""The spans of one client: ``send {topic}`` around a publish, ``process {topic}`` around the
handler (the messaging semantic conventions' names, kinds and attributes).

Context propagation: the producer injects the send span's context into each message's ext
header (youzan ext topics), which makes the send span the message's creation context, so
its kind is PRODUCER. The consumer extracts it and makes the process span a child of it
*and* links it: the conventions require the link (batch receivers cannot parent) and allow
the parent when one span processes one message, which is how smartnsq's handler runs; with
the parent, a publish and its consumption are one trace that a tracing UI shows end to end.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from smartnsq._version import __version__
from smartnsq.tracing import semconv as sc

__all__ = ["Tracing", "tracing_for"]

Attrs = dict[str, str | int]


def _server(attrs: Attrs, address: str | None) -> None:
    if address:
        host, port = sc.server_of(address)
        attrs[sc.SERVER_ADDRESS] = host
        if port is not None:
            attrs[sc.SERVER_PORT] = port


def tracing_for(provider: TracerProvider | None) -> Tracing | None:
    """Spans through ``provider`` (the global one unless given); None while that is the
    API's default (no SDK configured) or a no-op provider, so nothing is done per message."""
    if provider is None:
        provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return Tracing(provider.get_tracer("smartnsq", __version__))


class Tracing:
    """Starts and ends one client's spans."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def start_send(self, topic: str, *, command: str, count: int = 1, body_size: int | None = None,
                   partition: int | None = None, server: str | None = None,
                   trace_id: int | None = None) -> Span:
        """A PRODUCER span for one publish call (``count`` > 1: a batch); the caller ends it
        with :meth:`end`. Its context is the current one's child, ready to inject."""
        attrs: Attrs = {sc.SYSTEM: sc.SYSTEM_NSQ, sc.OPERATION_NAME: "send",
                        sc.OPERATION_TYPE: "send", sc.DESTINATION: topic,
                        sc.NSQ_COMMAND: command}
        if count != 1:
            attrs[sc.BATCH_COUNT] = count
        elif body_size is not None:
            attrs[sc.BODY_SIZE] = body_size
        if partition is not None:
            attrs[sc.PARTITION] = str(partition)
        if trace_id is not None:
            attrs[sc.NSQ_TRACE_ID] = str(trace_id)
        _server(attrs, server)
        return self.tracer.start_span(f"send {topic}", kind=SpanKind.PRODUCER, attributes=attrs)

    def start_process(self, topic: str, channel: str, *, message_id: str, attempts: int,
                      body_size: int, parent: Context | None = None,
                      partition: int | None = None, server: str | None = None,
                      offset: int | None = None, trace_id: int | None = None) -> Span:
        """A CONSUMER span around one handler call, child of and linked to ``parent`` (the
        producer's context from the message) when there is one."""
        attrs: Attrs = {sc.SYSTEM: sc.SYSTEM_NSQ, sc.OPERATION_NAME: "process",
                        sc.OPERATION_TYPE: "process", sc.DESTINATION: topic,
                        sc.CONSUMER_GROUP: channel, sc.MESSAGE_ID: message_id,
                        sc.NSQ_ATTEMPTS: attempts, sc.BODY_SIZE: body_size}
        if partition is not None:
            attrs[sc.PARTITION] = str(partition)
        if offset is not None:
            attrs[sc.NSQ_OFFSET] = offset
        if trace_id:
            attrs[sc.NSQ_TRACE_ID] = str(trace_id)
        _server(attrs, server)
        links = None
        if parent is not None:
            ctx = trace.get_current_span(parent).get_span_context()
            if ctx.is_valid:
                links = [Link(ctx)]
        return self.tracer.start_span(f"process {topic}", context=parent,
                                      kind=SpanKind.CONSUMER, attributes=attrs, links=links)

    @staticmethod
    def end(span: Span, error: BaseException | None = None) -> None:
        """End ``span``; with ``error``, as failed (``error.type`` = its class name)."""
        if error is not None:
            span.set_attribute(sc.ERROR_TYPE, type(error).__qualname__)
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__qualname__))
        span.end()
