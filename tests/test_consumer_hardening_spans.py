"""``async for`` left with ``break`` while a message is in hand, as a user writes it, with the
OpenTelemetry SDK's in-memory exporter: what the ``process {topic}`` spans say and when they
end, and that every published message is handled or still in the channel.

Leaving the loop does not give a message back: ``m = await anext(aiter(c)); m.finish()`` is
supported (tests/test_user_patterns.py), so a message handed out stays the application's
until it is answered or stop() requeues it after ``drain_timeout``. Its span ends at that
REQ, not earlier and not at the end of stop()."""

from __future__ import annotations

import asyncio
import time

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.consumer.process_spans import ProcessSpans
from smartnsq.devcluster import DevCluster
from smartnsq.message import Message
from smartnsq.producer import Producer
from smartnsq.tracing.semconv import MESSAGE_ID, NSQ_GIVEN_BACK
from smartnsq.tracing.spans import tracing_for
from tests.tracing_helpers import sdk  # noqa: F401  (fixture)

STEP = 20.0
DRAIN = 0.5


def by_id(exporter: InMemorySpanExporter, topic: str) -> dict[str, ReadableSpan]:
    return {str((s.attributes or {})[MESSAGE_ID]): s for s in exporter.get_finished_spans()
            if s.name == f"process {topic}"}


async def test_break_with_a_message_in_hand_ends_its_span_at_the_stop_requeue(
        sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    bodies = {b"m-%d" % i for i in range(10)}
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        addr = cluster.nsqd_tcp_addresses
        async with Producer(nsqd=addr) as p:
            for body in sorted(bodies):
                await p.publish("brk", body)
        c = Consumer("brk", "app", nsqd=addr, tracer_provider=provider,
                     config=ConsumerConfig(max_in_flight=5, drain_timeout=DRAIN))
        await c.start()
        taken: list[Message] = []
        async with asyncio.timeout(STEP):
            async for msg in c:
                taken.append(msg)
                if len(taken) == 3:
                    break  # the third is in hand, unanswered
                msg.finish()
        await asyncio.sleep(1.0)  # the application does something else for a while
        stopped_at = time.time_ns()
        async with asyncio.timeout(STEP):
            await c.stop()
        stop_returned = time.time_ns()

        spans = by_id(exporter, "brk")
        ids = [m.id.decode() for m in taken]
        assert sorted(spans) == sorted(ids)  # a span per message handed out, none for others
        for done in ids[:2]:
            end = spans[done].end_time
            assert end is not None and end < stopped_at
            assert spans[done].status.status_code is StatusCode.UNSET
            assert NSQ_GIVEN_BACK not in (spans[done].attributes or {})
        # the held one reads as given back unprocessed, not as a processed message
        assert (spans[ids[2]].attributes or {})[NSQ_GIVEN_BACK] is True
        held = spans[ids[2]].end_time
        # ended by stop()'s REQ after the drain, not before stop() and not after it returned
        assert held is not None and stopped_at + DRAIN * 1e9 * 0.9 <= held <= stop_returned
        assert taken[2].requeued

        # the 8 not finished are still in the channel: a second consumer gets each of them
        async with Consumer("brk", "app", nsqd=addr) as again:
            rest: set[bytes] = set()
            async with asyncio.timeout(STEP):
                async for msg in again:
                    rest.add(msg.body)
                    msg.finish()
                    if len(rest) == 8:
                        break
        assert rest | {m.body for m in taken[:2]} == bodies


def test_a_span_given_back_says_so(
        sdk: tuple[TracerProvider, InMemorySpanExporter],  # noqa: F811
) -> None:
    provider, exporter = sdk
    tracing = tracing_for(provider)
    assert tracing is not None
    spans = ProcessSpans(tracing, False, "t", "c")
    kept = tracing.start_process("t", "c", message_id="1", attempts=1, body_size=0)
    back = tracing.start_process("t", "c", message_id="2", attempts=1, body_size=0)
    spans.close(kept)
    spans.close(back, given_back=True)
    got = by_id(exporter, "t")
    assert NSQ_GIVEN_BACK not in (got["1"].attributes or {})
    assert (got["2"].attributes or {})[NSQ_GIVEN_BACK] is True
    assert got["2"].status.status_code is StatusCode.UNSET  # given back is not a failure
