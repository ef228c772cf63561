"""A publish and its consumption form one trace (issue 23): a web request publishes through a
traced Producer, a traced Consumer handles the message, and the real OpenTelemetry SDK's
in-memory exporter holds request → send → process → the handler's own span, the process span
parented to and linked with the send span. On youzan ext topics the context travels in the
message's JSON ext header (the double and, with ``make test-real``, the real cluster); on stock
nsqd in the body envelope both sides opted into."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.producer import Producer
from tests.real_servers import StockServer, YouzanCluster, stock, unique, youzan
from tests.tracing_helpers import sdk

__all__ = ["sdk", "stock", "youzan"]  # the fixtures, imported for pytest

WAIT = 60.0
CFG = ConsumerConfig(max_in_flight=10, lookupd_poll_interval=1.0)


def only(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    spans = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(spans) == 1, (name, [s.name for s in exporter.get_finished_spans()])
    return spans[0]


async def order_flow(provider: TracerProvider, producer: Producer, consumer_of: type[Consumer],
                     topic: str, **consumer_kw: object) -> Message:
    """The shop: ``POST /orders`` publishes the order, the billing consumer charges it."""
    tracer = provider.get_tracer("shop")
    with tracer.start_as_current_span("POST /orders"):
        async with producer as p:
            await p.publish(topic, b"order 42")
    handled: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    async def charge(msg: Message) -> None:
        with tracer.start_as_current_span("charge card"):
            if not handled.done():
                handled.set_result(msg)

    async with consumer_of(topic, "billing", charge, config=CFG,  # type: ignore[arg-type]
                           tracer_provider=provider, **consumer_kw):
        async with asyncio.timeout(WAIT):
            return await handled


def assert_one_trace(exporter: InMemorySpanExporter, topic: str) -> tuple[ReadableSpan,
                                                                          ReadableSpan]:
    request = only(exporter, "POST /orders")
    send = only(exporter, f"send {topic}")
    process = only(exporter, f"process {topic}")
    charge = only(exporter, "charge card")
    assert (send.kind, process.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (send, process, charge)} == {trace_id}
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    # the process span is the send span's child, and links it (messaging conventions)
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert [link.context.span_id for link in process.links] == [send.context.span_id]
    assert charge.parent is not None and charge.parent.span_id == process.context.span_id
    return send, process


@pytest.mark.real_youzan
async def test_youzan_ext_topic_publish_and_consume_form_one_trace(
        youzan: YouzanCluster, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    t = await youzan.create_topic("e2etrace", partition_num=2, ext=True, channels=("billing",))
    msg = await order_flow(provider, Producer(lookupd=youzan.lookupd, tracer_provider=provider),
                           Consumer, t.name, lookupd=youzan.lookupd)
    assert msg.body == b"order 42"
    assert msg.ext is not None and "traceparent" in msg.ext
    send, process = assert_one_trace(exporter, t.name)
    assert send.attributes is not None and send.attributes["messaging.nsq.command"] == "PUB_EXT"
    assert process.attributes is not None
    assert process.attributes["messaging.message.id"] == msg.id.hex()
    assert process.attributes["messaging.destination.partition.id"] == str(msg.partition)


@pytest.mark.real_nsqd
async def test_stock_envelope_publish_and_consume_form_one_trace(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    topic = unique("e2eenv")
    msg = await order_flow(
        provider, Producer(nsqd=stock.nsqd_tcp, tracer_provider=provider, trace_envelope=True),
        Consumer, topic, nsqd=stock.nsqd_tcp, trace_envelope=True)
    assert msg.body == b"order 42"  # the envelope is gone before the handler
    assert_one_trace(exporter, topic)
