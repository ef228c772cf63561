"""Span makers and context carriers on the real OpenTelemetry SDK (in-memory exporter)."""

from __future__ import annotations

import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from smartnsq import tracing
from smartnsq.tracing.carrier import (
    ENVELOPE_MAGIC,
    extract_ext,
    inject_ext,
    unwrap_body,
    wrap_body,
)
from tests.tracing_helpers import sdk

__all__ = ["sdk"]  # the fixture, imported for pytest


def test_off_without_an_sdk_provider() -> None:
    # the API's default (proxy) provider and the no-op one: no per-message work at all
    assert tracing.resolve() is None
    assert tracing.resolve(trace.NoOpTracerProvider()) is None


def test_send_then_process_form_one_trace_through_the_ext_header(
        sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    spans = tracing.resolve(provider)
    assert spans is not None
    send = spans.start_send("orders", command="PUB_EXT", body_size=5, partition=1,
                            server="127.0.0.1:4250", trace_id=42)
    ext = inject_ext({"app": "web", "##client_dispatch_tag": "x"},
                     trace.set_span_in_context(send))
    spans.end(send)
    assert ext["app"] == "web" and ext["##client_dispatch_tag"] == "x"
    assert ext["traceparent"].startswith("00-")
    process = spans.start_process("orders", "billing", message_id="0a", attempts=1,
                                  body_size=5, parent=extract_ext(ext), partition=1,
                                  server="127.0.0.1:4250", offset=120)
    spans.end(process, RuntimeError("boom"))
    sent, handled = exporter.get_finished_spans()
    assert (sent.name, sent.kind) == ("send orders", SpanKind.PRODUCER)
    assert (handled.name, handled.kind) == ("process orders", SpanKind.CONSUMER)
    assert handled.context.trace_id == sent.context.trace_id
    assert handled.parent is not None and handled.parent.span_id == sent.context.span_id
    assert [link.context.span_id for link in handled.links] == [sent.context.span_id]
    assert sent.attributes == {
        "messaging.system": "nsq", "messaging.operation.name": "send",
        "messaging.operation.type": "send", "messaging.destination.name": "orders",
        "messaging.nsq.command": "PUB_EXT", "messaging.message.body.size": 5,
        "messaging.destination.partition.id": "1", "messaging.nsq.message.trace_id": "42",
        "server.address": "127.0.0.1", "server.port": 4250}
    assert handled.attributes is not None
    assert handled.attributes["messaging.consumer.group.name"] == "billing"
    assert handled.attributes["error.type"] == "RuntimeError"
    assert handled.status.status_code is StatusCode.ERROR


def test_batch_send_records_the_count_not_a_body_size(
        sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    spans = tracing.resolve(provider)
    assert spans is not None
    spans.end(spans.start_send("t", command="MPUB", count=100, body_size=999))
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["messaging.batch.message_count"] == 100
    assert "messaging.message.body.size" not in span.attributes


def test_headers_without_a_context_extract_nothing() -> None:
    assert extract_ext(None) is None
    assert extract_ext({}) is None
    assert extract_ext({"n": 1, "app": "x"}) is None
    assert extract_ext({"traceparent": "garbage"}) is None


def test_body_envelope_round_trip_and_careless_bodies(
        sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, _ = sdk
    # no active span: the body goes unchanged
    assert wrap_body(b"payload") == b"payload"
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent:
        wrapped = wrap_body(b"payload")
    body, ctx = unwrap_body(wrapped)
    assert body == b"payload" and ctx is not None
    assert trace.get_current_span(ctx).get_span_context().span_id == \
        parent.get_span_context().span_id
    # bodies that only look like an envelope are the application's, whole
    for careless in (ENVELOPE_MAGIC, ENVELOPE_MAGIC + b"\xff\xff" + b"x",
                     ENVELOPE_MAGIC + b"\x00\x03abc", ENVELOPE_MAGIC + b"\x00\x02[]rest",
                     b"plain"):
        assert unwrap_body(careless) == (careless, None)


def test_off_when_opentelemetry_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    # the otel extra is optional: without the API installed, clients get None, not an error
    for name in [n for n in sys.modules if n.startswith(
            ("opentelemetry", "smartnsq.tracing.spans"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    assert tracing.resolve() is None
