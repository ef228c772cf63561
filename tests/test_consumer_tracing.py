"""The consumer's ``process {topic}`` spans on the real OpenTelemetry SDK (in-memory exporter),
passed as ``tracer_provider=`` (the global provider is never set here): the producer's
context travels in youzan's JSON ext header, or on stock nsqd in the opt-in body envelope;
the handler's own spans nest under the process span; a handler that raises ends it as failed
and its message is requeued."""

from __future__ import annotations

import asyncio
import threading

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

import smartnsq.sync
from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.metrics.prometheus import PrometheusMetrics
from smartnsq.producer import Producer
from smartnsq.tracing.carrier import inject_ext, wrap_body
from tests.metrics_helpers import ascrape, total
from tests.real_servers import (
    StockServer,
    YouzanCluster,
    stock,  # noqa: F401  (fixture)
    unique,
    youzan,  # noqa: F401  (fixture)
)
from tests.tracing_helpers import sdk  # noqa: F401  (fixture)

WAIT = 60.0
CFG = ConsumerConfig(max_in_flight=10, default_requeue_delay=0, backoff_enabled=False,
                     reconnect_min=0.05, reconnect_max=0.5, lookupd_poll_interval=1.0)


async def wait(event: asyncio.Event, what: str) -> None:
    try:
        async with asyncio.timeout(WAIT):
            await event.wait()
    except TimeoutError:
        raise AssertionError(f"{what}: not within {WAIT:.0f} s") from None


class Bodies:
    """A handler keeping the bodies it saw; ``done`` once it saw ``want``."""

    def __init__(self, want: int) -> None:
        self.want = want
        self.bodies: list[bytes] = []
        self.done = asyncio.Event()

    async def __call__(self, msg: Message) -> None:
        self.bodies.append(msg.body)
        if len(self.bodies) == self.want:
            self.done.set()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.real_youzan
async def test_youzan_ext_context_parents_the_process_span(
        youzan: YouzanCluster, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("shop")
    t = await youzan.create_topic("tracext", partition_num=1, ext=True, channels=("billing",))
    # the web request that publishes: its context goes into the message's ext header
    with tracer.start_as_current_span("POST /orders") as web:
        ext = inject_ext({"app": "shop"}, trace.set_span_in_context(web))
        async with Producer(lookupd=youzan.lookupd) as p:
            await p.publish(t.name, b"order 42", partition=0, ext=ext)
    handled = asyncio.Event()
    seen: list[Message] = []

    async def handle(msg: Message) -> None:
        with tracer.start_as_current_span("charge card"):
            seen.append(msg)
        handled.set()

    async with Consumer(t.name, "billing", handle, lookupd=youzan.lookupd, config=CFG,
                        tracer_provider=provider):
        await wait(handled, "the order")
    [msg] = seen
    assert msg.body == b"order 42" and msg.ext is not None and msg.ext["app"] == "shop"
    [process] = named(exporter, f"process {t.name}")
    [charge] = named(exporter, "charge card")
    [request] = named(exporter, "POST /orders")
    assert process.kind is SpanKind.CONSUMER
    # one trace from the web request to the handler's own work
    assert process.context.trace_id == request.context.trace_id
    assert process.parent is not None and process.parent.span_id == request.context.span_id
    assert [link.context.span_id for link in process.links] == [request.context.span_id]
    assert charge.parent is not None and charge.parent.span_id == process.context.span_id
    leader = t.leaders[0].tcp
    assert dict(process.attributes or {}) == {
        "messaging.system": "nsq", "messaging.operation.name": "process",
        "messaging.operation.type": "process", "messaging.destination.name": t.name,
        "messaging.consumer.group.name": "billing", "messaging.message.id": msg.id.hex(),
        "messaging.nsq.message.attempts": 1, "messaging.message.body.size": 8,
        "messaging.destination.partition.id": "0",
        "server.address": leader.rpartition(":")[0],
        "server.port": int(leader.rpartition(":")[2])}
    assert process.status.status_code is StatusCode.UNSET


@pytest.mark.real_nsqd
async def test_a_failing_handler_ends_its_span_as_failed_and_is_requeued(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    topic, channel = unique("tracfail"), "mailer"
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        await p.publish(topic, b"welcome mail")
    metrics = PrometheusMetrics(CollectorRegistry())
    sent = asyncio.Event()

    async def handle(msg: Message) -> None:
        if msg.attempts == 1:
            raise TimeoutError("smtp timed out")
        sent.set()

    async with Consumer(topic, channel, handle, nsqd=stock.nsqd_tcp, config=CFG,
                        metrics=metrics, tracer_provider=provider):
        await wait(sent, "the retry")
    failed, retried = named(exporter, f"process {topic}")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "TimeoutError"
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.attributes["messaging.nsq.message.attempts"] == 1
    assert retried.status.status_code is StatusCode.UNSET
    assert retried.attributes is not None
    assert retried.attributes["messaging.nsq.message.attempts"] == 2
    # no context in a stock body: no parent, and the message id is the one nsqd shows
    assert failed.parent is None and failed.links == ()
    assert failed.attributes["messaging.message.id"] == retried.attributes[
        "messaging.message.id"]
    got = await ascrape(metrics)
    assert total(got, "smartnsq_consumer_messages_requeued_total", topic=topic,
                 reason="handler_error") == 1


@pytest.mark.real_nsqd
async def test_stock_envelope_carries_the_context_and_is_removed(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("shop")
    topic = unique("tracenv")
    with tracer.start_as_current_span("POST /orders") as web:
        wrapped = wrap_body(b"order 7", trace.set_span_in_context(web))
    assert wrapped != b"order 7"
    traced, untraced = Bodies(2), Bodies(2)
    # the untraced consumer has no SDK provider (the global one is the API's default): it
    # makes no spans but still removes the envelope
    async with (
        Consumer(topic, "traced", traced, nsqd=stock.nsqd_tcp, config=CFG,
                 tracer_provider=provider, trace_envelope=True),
        Consumer(topic, "untraced", untraced, nsqd=stock.nsqd_tcp, config=CFG,
                 trace_envelope=True),
        Producer(nsqd=[stock.nsqd_tcp]) as p,
    ):
        # an enveloped body (as a producer with trace_envelope=True sends it) and a plain one
        await p.publish(topic, wrapped)
        await p.publish(topic, b"plain order")
        await wait(traced.done, "both bodies, traced")
        await wait(untraced.done, "both bodies, untraced")
    assert sorted(traced.bodies) == sorted(untraced.bodies) == [b"order 7", b"plain order"]
    spans = named(exporter, f"process {topic}")
    assert len(spans) == 2
    [child] = [s for s in spans if s.parent is not None]
    assert child.parent is not None and child.parent.span_id == web.get_span_context().span_id
    assert child.attributes is not None and child.attributes["messaging.message.body.size"] == 7


@pytest.mark.real_nsqd
async def test_async_for_and_break_spans_what_was_handed_out(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    topic, channel = unique("traciter"), "tail"
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        for i in range(10):
            await p.publish(topic, b"line %d" % i)
    taken: list[Message] = []
    async with Consumer(topic, channel, nsqd=stock.nsqd_tcp, config=CFG.replace(max_in_flight=5),
                        tracer_provider=provider) as c:
        async with asyncio.timeout(WAIT):
            async for msg in c:
                taken.append(msg)
                if len(taken) == 2:
                    msg.requeue(0, backoff=False)  # answered either way: the span ends
                    break
                msg.finish()
    spans = named(exporter, f"process {topic}")
    assert len(spans) == 2
    ids = {s.attributes["messaging.message.id"] for s in spans if s.attributes is not None}
    assert ids == {m.id.decode() for m in taken}


@pytest.mark.real_nsqd
async def test_a_sync_handler_thread_runs_inside_the_process_span(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    tracer = provider.get_tracer("worker")
    topic = unique("tracsync")
    async with Producer(nsqd=[stock.nsqd_tcp]) as p:
        await p.publish(topic, b"resize image")
    done = threading.Event()

    def handle(msg: smartnsq.sync.ThreadMessage) -> None:  # runs in a handler thread
        with tracer.start_as_current_span("resize"):
            pass
        done.set()

    def run() -> None:
        with smartnsq.sync.Consumer(topic, "images", handle, nsqd=stock.nsqd_tcp, config=CFG,
                                    tracer_provider=provider):
            assert done.wait(WAIT)

    await asyncio.to_thread(run)
    [process] = named(exporter, f"process {topic}")
    [resize] = named(exporter, "resize")
    assert resize.parent is not None and resize.parent.span_id == process.context.span_id
