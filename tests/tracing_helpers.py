"""The OpenTelemetry SDK as the tests use it: a tracer provider of their own (never the global
one, which a process can set only once) whose finished spans land in memory."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["sdk"]


@pytest.fixture
def sdk() -> tuple[TracerProvider, InMemorySpanExporter]:
    """(provider, exporter): pass the provider as ``tracer_provider=``, read the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter
