"""Tracing as an application meets it: an environment with ``opentelemetry-api`` and no
SDK (spans off, no error, the envelope still removed), the usual slips when passing a
tracer provider (named at construction), and an ``async for`` loop left with ``break``
before answering (its span ends when the consumer stops, and the message stays in the
channel for the next consumer)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import ConfigError
from smartnsq.message import Message
from smartnsq.producer import Producer
from tests.real_servers import (
    StockServer,
    stock,  # noqa: F401  (fixture)
    unique,
)
from tests.tracing_helpers import sdk  # noqa: F401  (fixture)

WAIT = 30.0

#: a process where opentelemetry.sdk cannot be imported: only the API is "installed"
NO_SDK = textwrap.dedent('''
    import asyncio, importlib.abc, sys

    class NoSdk(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoSdk())
    from opentelemetry import trace
    from smartnsq import Consumer, Producer
    from smartnsq.devcluster import DevCluster

    async def main():
        async with DevCluster(nodes=1, lookupds=1, flavour="stock") as cluster:
            nsqd = cluster.nsqd_tcp_addresses[0]
            tracer = trace.get_tracer("app")
            for envelope in (False, True):
                topic = f"nosdk{int(envelope)}"
                async with Producer(nsqd=nsqd, trace_envelope=envelope) as p:
                    with tracer.start_as_current_span("request"):
                        await p.publish(topic, b"body")
                got = asyncio.Queue()
                async with Consumer(topic, "c", got.put, nsqd=nsqd, trace_envelope=envelope):
                    msg = await asyncio.wait_for(got.get(), 20)
                print(envelope, msg.body)

    asyncio.run(main())
''')


def test_api_without_sdk_traces_nothing_and_fails_nothing() -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", NO_SDK], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["False b'body'", "True b'body'"]
    assert "Traceback" not in done.stderr and "ERROR" not in done.stderr, done.stderr
    assert time.monotonic() - started < 60


def test_tracer_provider_slips_are_named_when_the_client_is_made() -> None:
    cases: list[tuple[object, str]] = [
        (trace, r"the module opentelemetry.trace \(pass trace.get_tracer_provider\(\)"),
        (TracerProvider, r"the class TracerProvider \(pass an instance: TracerProvider\(\)\)"),
        (trace.get_tracer("app"), r"opentelemetry.trace.ProxyTracer \(a tracer: pass the provider"),
        ("jaeger", r"builtins.str"),
    ]
    for wrong, why in cases:
        with pytest.raises(ConfigError, match=r"tracer_provider= takes an OpenTelemetry "
                                              r"TracerProvider, got " + why):
            Producer(nsqd="127.0.0.1:4150", tracer_provider=wrong)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=why):
            Consumer("t", "c", nsqd="127.0.0.1:4150",
                     tracer_provider=wrong)  # type: ignore[arg-type]


@pytest.mark.real_nsqd
async def test_break_without_answering_ends_the_span_at_stop_and_keeps_the_message(
        stock: StockServer, sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    topic, channel = unique("tracebreak"), "tail"
    async with Producer(nsqd=stock.nsqd_tcp, tracer_provider=provider,
                        trace_envelope=True) as p:
        await p.publish(topic, b"only")
    cfg = ConsumerConfig(max_in_flight=1, default_requeue_delay=0, backoff_enabled=False,
                         drain_timeout=0.5)
    started = time.monotonic()
    async with Consumer(topic, channel, nsqd=stock.nsqd_tcp, config=cfg,
                        tracer_provider=provider, trace_envelope=True) as c:
        async with asyncio.timeout(WAIT):
            async for msg in c:
                assert msg.body == b"only"
                break  # no finish(), no requeue()
    # stop() waited drain_timeout for an answer, then requeued it and ended its span
    assert time.monotonic() - started < WAIT
    (send,) = [s for s in exporter.get_finished_spans() if s.name == f"send {topic}"]
    (process,) = [s for s in exporter.get_finished_spans() if s.name == f"process {topic}"]
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    # the message stayed in the channel: the next consumer gets it, body unwrapped
    got: asyncio.Queue[Message] = asyncio.Queue()
    async with Consumer(topic, channel, got.put, nsqd=stock.nsqd_tcp, config=cfg,
                        trace_envelope=True):
        again = await asyncio.wait_for(got.get(), WAIT)
    assert again.body == b"only" and again.attempts == 2
