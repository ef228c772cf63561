"""The producer's ``send {topic}`` spans on the real OpenTelemetry SDK (in-memory exporter),
passed as ``tracer_provider=`` (the global provider is never set here), and where their
context travels: youzan ext topics' JSON header, the opt-in body envelope on stock nsqd, or
nowhere. Messages are read back by a consumer without tracing, which sees what went on the
wire."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import smartnsq.sync
from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError, PublishError
from smartnsq.message import Message
from smartnsq.producer import HttpProducer, Producer
from smartnsq.tracing.carrier import ENVELOPE_MAGIC, extract_ext, unwrap_body
from tests.real_servers import StockServer, YouzanCluster, stock, unique, youzan
from tests.tracing_helpers import sdk

__all__ = ["sdk", "stock", "youzan"]  # the fixtures, imported for pytest

WAIT = 60.0
CFG = ConsumerConfig(max_in_flight=20, lookupd_poll_interval=1.0)


def sends(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is SpanKind.PRODUCER]


async def read(consumer: Consumer, n: int) -> list[Message]:
    """The next ``n`` messages, finished, within :data:`WAIT`."""
    got: list[Message] = []
    async with asyncio.timeout(WAIT), consumer:
        async for msg in consumer:
            got.append(msg)
            msg.finish()
            if len(got) == n:
                break
    return got


def span_id_in(ctx: object) -> int:
    return trace.get_current_span(ctx).get_span_context().span_id  # type: ignore[arg-type]


@pytest.mark.real_nsqd
async def test_stock_publish_is_a_send_span_under_the_request_and_the_body_unchanged(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("shop")
    topic = unique("tsend")
    async with Producer(nsqd=stock.nsqd_tcp, tracer_provider=provider) as p:
        with tracer.start_as_current_span("POST /orders") as web:
            await p.publish(topic, b"order 42")
        await p.publish_many(topic, [b"line %d" % i for i in range(10)])
    one, many = sends(exporter)
    assert (one.name, many.name) == (f"send {topic}", f"send {topic}")
    assert one.parent is not None and one.parent.span_id == web.get_span_context().span_id
    assert one.context.trace_id == web.get_span_context().trace_id
    host, port = stock.nsqd_tcp.rsplit(":", 1)
    assert one.attributes == {
        "messaging.system": "nsq", "messaging.operation.name": "send",
        "messaging.operation.type": "send", "messaging.destination.name": topic,
        "messaging.nsq.command": "PUB", "messaging.message.body.size": 8,
        "server.address": host, "server.port": int(port)}
    assert many.attributes is not None
    assert many.attributes["messaging.batch.message_count"] == 10
    assert many.attributes["messaging.nsq.command"] == "MPUB"
    assert one.status.status_code is StatusCode.UNSET
    # stock nsqd has no headers and no envelope was asked for: the bodies are the app's
    got = await read(Consumer(topic, "c", nsqd=stock.nsqd_tcp, config=CFG), 11)
    assert sorted(m.body for m in got) == sorted(
        [b"order 42"] + [b"line %d" % i for i in range(10)])


@pytest.mark.real_nsqd
async def test_stock_envelope_carries_the_send_span_when_asked(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    topic = unique("tenv")
    async with Producer(nsqd=stock.nsqd_tcp, tracer_provider=provider,
                        trace_envelope=True) as p:
        await p.publish(topic, b"enveloped")
        await p.publish_deferred(topic, b"deferred", 0.01)
    sent = {s.attributes["messaging.nsq.command"]: s for s in sends(exporter)
            if s.attributes is not None}
    # a consumer without trace_envelope sees the envelope in front of the body
    for msg in await read(Consumer(topic, "c", nsqd=stock.nsqd_tcp, config=CFG), 2):
        assert msg.body.startswith(ENVELOPE_MAGIC)
        body, ctx = unwrap_body(msg.body)
        span = sent["PUB"] if body == b"enveloped" else sent["DPUB"]
        assert body in (b"enveloped", b"deferred")
        assert span_id_in(ctx) == span.context.span_id


async def test_a_failed_publish_ends_its_span_as_failed(
        sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    cfg = ProducerConfig(max_attempts=1, publish_timeout=2.0)
    async with Producer(nsqd=dead, tracer_provider=provider, config=cfg) as p:
        with pytest.raises(PublishError) as failed:
            await p.publish("nowhere", b"x")
        # arguments refused before any I/O make no span
        with pytest.raises(ConfigError):
            await p.publish("nowhere", b"x", trace_id=-1)
    (span,) = sends(exporter)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == type(failed.value).__qualname__
    assert [e.name for e in span.events] == ["exception"]


@pytest.mark.real_youzan
async def test_youzan_ext_topic_messages_carry_the_send_span_in_their_header(
        youzan: YouzanCluster, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    ext_topic = await youzan.create_topic("tyext", partition_num=1, ext=True, channels=("c",))
    plain = await youzan.create_topic("typlain", partition_num=1, channels=("c",))
    async with Producer(lookupd=youzan.lookupd, tracer_provider=provider) as p:
        await p.publish(ext_topic.name, b"with app header", ext={"app": "shop"})
        await p.publish(ext_topic.name, b"no header given")
        await p.publish_many(ext_topic.name, [b"b1", b"b2"])
        receipt = await p.publish(plain.name, b"traced", trace_id=77)
        await p.publish(plain.name, b"plain topic")
    spans = sends(exporter)
    assert [s.attributes["messaging.nsq.command"] for s in spans  # type: ignore[index]
            ] == ["PUB_EXT", "PUB_EXT", "MPUB_EXT", "PUB_TRACE", "PUB"]
    by_body = {}
    for msg in await read(Consumer(ext_topic.name, "c", lookupd=youzan.lookupd, config=CFG),
                          4):
        by_body[msg.body] = msg
    # the app's own keys stay; each message's context is its call's send span
    assert by_body[b"with app header"].ext is not None
    assert by_body[b"with app header"].ext["app"] == "shop"
    for body, span in [(b"with app header", spans[0]), (b"no header given", spans[1]),
                       (b"b1", spans[2]), (b"b2", spans[2])]:
        assert span_id_in(extract_ext(by_body[body].ext)) == span.context.span_id, body
    # a topic without ext support gets no header (PUB_EXT would be refused); youzan's own
    # trace id is on the span, where its server-side trace meets this one
    got = await read(Consumer(plain.name, "c", lookupd=youzan.lookupd, config=CFG), 2)
    assert sorted(m.body for m in got) == [b"plain topic", b"traced"]
    assert all(not m.ext for m in got)
    traced = spans[3].attributes
    assert traced is not None and traced["messaging.nsq.message.trace_id"] == "77"
    assert traced["messaging.destination.partition.id"] == str(receipt.partition)


@pytest.mark.real_youzan
async def test_http_producer_ext_topic_carries_the_send_span(
        youzan: YouzanCluster, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    t = await youzan.create_topic("thttp", partition_num=1, ext=True, channels=("c",))
    async with HttpProducer(lookupd=youzan.lookupd, tracer_provider=provider) as p:
        await p.publish(t.name, b"over http")
    (span,) = sends(exporter)
    assert span.attributes is not None
    assert span.attributes["messaging.nsq.command"] == "HTTP_PUB_EXT"
    (msg,) = await read(Consumer(t.name, "c", lookupd=youzan.lookupd, config=CFG), 1)
    assert msg.body == b"over http"
    assert span_id_in(extract_ext(msg.ext)) == span.context.span_id


@pytest.mark.real_nsqd
async def test_sync_producer_send_span_is_a_child_of_the_calling_threads_span(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("web")
    topic = unique("tsync")
    parents: dict[str, int] = {}
    errors: list[BaseException] = []

    def request(p: smartnsq.sync.Producer, name: str) -> None:  # a web worker thread
        with tracer.start_as_current_span(f"GET /{name}") as web:
            parents[name] = web.get_span_context().span_id
            try:
                p.publish(topic, name.encode())
            except BaseException as exc:
                errors.append(exc)

    def app() -> None:
        with smartnsq.sync.Producer(nsqd=stock.nsqd_tcp, tracer_provider=provider) as p:
            threads = [threading.Thread(target=request, args=(p, n)) for n in "abc"]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)

    await asyncio.to_thread(app)  # the double keeps answering on this loop meanwhile
    assert errors == []
    spans = sends(exporter)
    assert len(spans) == 3
    assert {s.parent.span_id for s in spans if s.parent is not None} == set(parents.values())


async def test_ext_batches_carry_the_span_per_item_and_ordered_publishes_have_spans(
        sdk: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = sdk
    async with DevCluster(nodes=2, flavour="youzan") as cluster:
        cluster.create_topic("xb", partition_num=2, ext=True, channels=("c",))
        async with Producer(lookupd=cluster.lookupd_http_addresses,
                            tracer_provider=provider) as p:
            await p.publish_ext_batch("xb", [({"k": "1"}, b"one"), (b'{"k":"2"}', b"two")],
                                      partition=0)
            await p.publish_ordered("xb", "customer-7", b"ordered")
        stored = [r for part in range(2) for r in cluster.store.partition("xb", part).records]
    batch, ordered = sends(exporter)
    assert batch.attributes is not None and ordered.attributes is not None
    assert batch.attributes["messaging.nsq.command"] == "MPUB_EXT"
    assert batch.attributes["messaging.batch.message_count"] == 2
    assert ordered.attributes["messaging.nsq.command"] == "PUB"
    headers = {r.body: json.loads(r.ext) for r in stored if r.body in (b"one", b"two")}
    assert {b: h["k"] for b, h in headers.items()} == {b"one": "1", b"two": "2"}
    for header in headers.values():
        assert span_id_in(extract_ext(header)) == batch.context.span_id


_NO_PROVIDER = """
import asyncio, sys
from smartnsq.devcluster import DevCluster
from smartnsq.producer import Producer

async def main():
    async with DevCluster(nodes=1, flavour="stock") as c, \\
            Producer(nsqd=c.nsqd_tcp_addresses) as p:
        await p.publish("t", b"x")
    print(sorted({m.split(".")[0] for m in sys.modules if m.startswith("opentelemetry")}))

asyncio.run(main())
"""


async def test_without_a_provider_opentelemetry_is_not_even_imported() -> None:
    # a fresh interpreter: this one imported the SDK for the other tests
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _NO_PROVIDER, stdout=asyncio.subprocess.PIPE)
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert out.decode().strip() == "[]"
