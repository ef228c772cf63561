"""The producers' ``send {topic}`` spans and where their context travels
(:mod:`smartnsq.tracing`); imported only when a producer's tracing is on, since it needs
``opentelemetry-api``.

One PRODUCER span per publish call (one per ``publish_many`` call, with its message count),
ended with ``error.type`` when the call raised. Its context goes with the messages:

* on a youzan ext topic (the lookup's topic meta says ``extend_support``, or the caller
  gave an ``ext`` header, which only ext topics take) into each message's JSON ext header,
  next to the caller's own keys: the publish goes out as PUB_EXT / MPUB_EXT;
* elsewhere only when the producer was made with ``trace_envelope=True``: in front of the
  body (:func:`~smartnsq.tracing.carrier.wrap_body`), which the consumer must unwrap;
* else nowhere (a PUB_EXT to a topic without ext support would be refused).

A producer with nsqd addresses given directly has no lookup to ask, so only a caller's own
``ext`` tells it a topic is an ext topic. Where the context goes, per call:
:meth:`~smartnsq.producer.Producer.publish` as above (on an ext topic the message leaves
the auto-batch: it needs its own header); ``publish_many`` as above, one header for the
batch, except with a ``trace_id`` and no ``ext`` (MPUB_TRACE keeps its receipts);
``publish_ext_batch`` into each item's header; ``publish_deferred`` in the envelope when
asked; ``publish_encoded`` and ``publish_ordered`` nowhere (span only). Arguments are
checked before a span starts: a call refused for its arguments has none.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from smartnsq.producer.batcher import Batcher
from smartnsq.producer.checks import check_bodies
from smartnsq.producer.encoded import ExtBatch
from smartnsq.producer.ops import DPub, Op, check_trace_id, ext_header_bytes, one_op
from smartnsq.producer.routing import Router
from smartnsq.producer.sharded import Run
from smartnsq.producer.trace import TraceSwitch, log_receipt
from smartnsq.producer.types import BatchReceipt, PublishReceipt
from smartnsq.protocol.commands import encode_ext_header
from smartnsq.tracing import semconv as sc
from smartnsq.tracing.carrier import inject_ext, wrap_body
from smartnsq.tracing.spans import Tracing

__all__ = ["SendSpans"]

T = TypeVar("T")
ExtHeader = Mapping[str, Any]
#: the producer's ``publish_many`` after its checks: (topic, bodies, partition, trace_id,
#: ext, deadline)
SendMany = Callable[[str, Sequence[bytes], int | None, int | None, ExtHeader | None, float],
                    Awaitable[BatchReceipt]]


def _inject_header(header: bytes, ctx: Context) -> bytes:
    """A JSON ext header with ``ctx`` added (one that is not a JSON object stays as is)."""
    try:
        doc = json.loads(header)
    except ValueError:
        return header
    return encode_ext_header(inject_ext(doc, ctx)) if isinstance(doc, dict) else header


async def _send_one(run: Run, batcher: Batcher | None, switch: TraceSwitch, topic: str,
                    body: bytes, partition: int | None, trace_id: int | None,
                    ext: ExtHeader | None, deadline: float,
                    max_msg_size: int) -> PublishReceipt | None:
    """One traced publish once its span started (``batcher``: it joins an auto-batch)."""
    if batcher is not None:
        await batcher.add(topic if partition is None else (topic, partition), body, deadline)
        return None
    traced = switch.is_on(topic)
    receipt = await run(one_op(topic, partition, body, trace_id, ext, traced,
                               max_msg_size=max_msg_size), deadline)
    if receipt is not None and traced:
        log_receipt(receipt)
    return receipt if trace_id is not None else None


class SendSpans:
    """One producer's send spans (see the module docstring); ``server``: the one nsqd a
    producer publishes to, when it was given only one."""

    def __init__(self, tracing: Tracing, *, router: Router | None, envelope: bool,
                 server: str | None) -> None:
        self.tracing = tracing
        self.envelope = envelope
        self._router = router
        self._server = server

    async def ext_topic(self, topic: str, deadline: float) -> bool:
        """The lookup says ``topic`` is a youzan ext topic (looked up if not cached, bounded
        by the publish's deadline; a failed lookup says no: the publish finds out why)."""
        router = self._router
        if router is None:
            return False
        route = router.routes.cached(topic, asyncio.get_running_loop().time())
        if route is None:
            route = await router.get(topic, deadline)
        return route is not None and route.partitioned and route.view.meta.extend_support

    def start(self, topic: str, command: str, *, count: int = 1,
              body_size: int | None = None, partition: int | None = None,
              trace_id: int | None = None) -> tuple[Span, Context]:
        """A started send span and the context to inject (the span as current)."""
        span = self.tracing.start_send(topic, command=command, count=count,
                                       body_size=body_size, partition=partition,
                                       server=self._server, trace_id=trace_id)
        return span, trace.set_span_in_context(span)

    def end(self, span: Span, error: BaseException | None = None,
            receipt: PublishReceipt | BatchReceipt | None = None) -> None:
        """End ``span``; a receipt adds where the message went."""
        if isinstance(receipt, PublishReceipt):
            span.set_attribute(sc.PARTITION, str(receipt.partition))
            host, port = sc.server_of(receipt.nsqd)
            span.set_attribute(sc.SERVER_ADDRESS, host)
            if port is not None:
                span.set_attribute(sc.SERVER_PORT, port)
        elif isinstance(receipt, BatchReceipt) and len(set(receipt.partitions)) == 1 and \
                receipt.partitions[0] is not None:
            span.set_attribute(sc.PARTITION, str(receipt.partitions[0]))
        self.tracing.end(span, error)

    def carry(self, ctx: Context, ext: Mapping[str, Any] | None, ext_topic: bool,
              body: bytes) -> tuple[Mapping[str, Any] | None, bytes]:
        """(ext, body) carrying ``ctx``: in the ext header on an ext topic, in an envelope
        when asked for, else as they are."""
        if ext_topic:
            return inject_ext(ext, ctx), body
        if self.envelope:
            return ext, wrap_body(body, ctx)
        return ext, body

    def carry_many(self, ctx: Context, ext: Mapping[str, Any] | None, ext_topic: bool,
                   bodies: list[bytes]) -> tuple[Mapping[str, Any] | None, list[bytes]]:
        """:meth:`carry` for a batch sharing one header (and one span)."""
        if ext_topic:
            return inject_ext(ext, ctx), bodies
        if self.envelope:
            return ext, [wrap_body(b, ctx) for b in bodies]
        return ext, bodies

    async def within(self, span: Span, call: Awaitable[T]) -> T:
        """Await ``call`` and end ``span`` with its outcome."""
        try:
            result = await call
        except BaseException as exc:
            self.end(span, exc)
            raise
        self.end(span, None, result if isinstance(result, PublishReceipt | BatchReceipt)
                 else None)
        return result

    async def publish(self, run: Run, batcher: Batcher | None, switch: TraceSwitch,
                      topic: str, body: bytes, partition: int | None, trace_id: int | None,
                      ext: ExtHeader | None, deadline: float,
                      max_msg_size: int) -> PublishReceipt | None:
        """:meth:`Producer.publish <smartnsq.producer.Producer.publish>` after its checks,
        in a span whose context the message carries."""
        if trace_id is not None:
            check_trace_id(trace_id)
        if ext is not None:
            ext_header_bytes(ext, trace_id)  # refused before a span, as without tracing
        ext_topic = ext is not None or await self.ext_topic(topic, deadline)
        batched = batcher is not None and not ext_topic and trace_id is None
        command = "PUB_EXT" if ext_topic else "PUB_TRACE" if trace_id is not None else \
            "MPUB" if batched else "PUB"
        span, ctx = self.start(topic, command, body_size=len(body), partition=partition,
                               trace_id=trace_id)
        ext, body = self.carry(ctx, ext, ext_topic, body)
        return await self.within(span, _send_one(
            run, batcher if batched else None, switch, topic, body, partition, trace_id, ext,
            deadline, max_msg_size))

    async def publish_many(self, send: SendMany, topic: str, bodies: Sequence[bytes],
                           partition: int | None, trace_id: int | None,
                           ext: ExtHeader | None, deadline: float,
                           max_msg_size: int) -> BatchReceipt:
        """``publish_many`` after its first checks, in one span for the call."""
        checked = check_bodies(bodies, max_msg_size)
        if trace_id is not None:
            check_trace_id(trace_id)
        if ext is not None:
            ext_header_bytes(ext, trace_id)
        ext_topic = ext is not None or (trace_id is None
                                        and await self.ext_topic(topic, deadline))
        command = "MPUB_EXT" if ext_topic else "MPUB_TRACE" if trace_id is not None else "MPUB"
        span, ctx = self.start(topic, command, count=len(checked), partition=partition,
                               trace_id=trace_id)
        ext, checked = self.carry_many(ctx, ext, ext_topic, checked)
        return await self.within(span, send(topic, checked, partition, trace_id, ext,
                                            deadline))

    async def run_op(self, run: Run, op: Op, deadline: float) -> PublishReceipt | None:
        """One op built by the producer (encoded and ext batches, deferred) in a span."""
        span, ctx = self.start(op.topic, op.what, count=op.count, partition=op.partition)
        if isinstance(op, ExtBatch):
            op.items = [(_inject_header(h, ctx), b) for h, b in op.items]
        elif isinstance(op, DPub) and self.envelope:
            op.body = wrap_body(op.body, ctx)
        return await self.within(span, run(op, deadline))

    async def call(self, topic: str, command: str, call: Awaitable[T],
                   trace_id: int | None = None) -> T:
        """``call`` (an ordered publish queued in its lane) in a span, context carried
        nowhere."""
        span, _ = self.start(topic, command, trace_id=trace_id)
        return await self.within(span, call)
