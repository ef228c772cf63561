"""``process {topic}`` spans around the consumer's handler (or from ``async for``'s hand-over
to the answer), and the opt-in body envelope of stock nsqd.

Imported only when the consumer traces or unwraps envelopes (it needs
``opentelemetry-api``). The producer's context comes from the message: youzan ext topics
carry it in the JSON ext header (:func:`~smartnsq.tracing.carrier.extract_ext`); with
``trace_envelope=True`` the body starts with an envelope (:func:`~smartnsq.tracing.carrier.
unwrap_body`), which is removed before anyone sees the body, traced or not. The handler runs
with the process span as the current span, so spans it makes nest under it (asyncio keeps a
context per task, and each handler worker is a task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from smartnsq.errors import ProtocolError
from smartnsq.message import Message
from smartnsq.protocol.messages import EXT, EXT_VERSION, EXT_VERSION_JSON
from smartnsq.tracing.carrier import extract_ext, unwrap_body
from smartnsq.tracing.semconv import NSQ_GIVEN_BACK
from smartnsq.tracing.spans import Tracing

__all__ = ["ProcessSpans"]

Handler = Callable[[Message], Awaitable[object]]


def _message_id(msg: Message) -> str:
    # stock ids are 16 ASCII hex digits (as nsqd shows them); youzan's are binary
    return msg.id.hex() if msg.internal_id is not None else msg.id.decode("ascii", "replace")


class ProcessSpans:
    """One consumer's process spans (``tracing``; None: spans off) and envelopes."""

    def __init__(self, tracing: Tracing | None, envelope: bool, topic: str,
                 channel: str) -> None:
        self._tracing = tracing
        self._envelope = envelope
        self._topic = topic
        self._channel = channel

    def open(self, msg: Message) -> tuple[Span, Context | None] | None:
        """Unwrap ``msg``'s envelope; start its span (None with spans off)."""
        parent: Context | None = None
        if self._envelope:
            body, parent = unwrap_body(msg.body)
            if parent is not None or len(body) != len(msg.body):
                msg._set_body(body)
        tracing = self._tracing
        if tracing is None:
            return None
        raw = msg._raw
        if parent is None and raw[EXT_VERSION] == EXT_VERSION_JSON and raw[EXT]:
            try:
                parent = extract_ext(msg.ext)
            except ProtocolError:
                parent = None  # a header that is not a JSON object carries no context
        span = tracing.start_process(
            self._topic, self._channel, message_id=_message_id(msg), attempts=msg.attempts,
            body_size=len(msg.body), parent=parent, partition=msg.partition,
            server=msg.nsqd_address, offset=msg.offset, trace_id=msg.trace_id)
        return span, parent

    @staticmethod
    def close(span: Span, error: BaseException | None = None, *,
              given_back: bool = False) -> None:
        """End ``span``: processed (failed with ``error``), or ``given_back``: requeued by
        the consumer, unprocessed (stop() with the message unanswered), marked so that
        the span does not read as a processed message."""
        if given_back:
            span.set_attribute(NSQ_GIVEN_BACK, True)
        Tracing.end(span, error)

    def wrap(self, handler: Handler) -> Handler:
        """``handler`` inside its span, the span current while it runs; an exception ends
        the span as failed and goes on to the consumer (which requeues the message). A
        handler cancelled by ``stop()`` ends it given back, as the consumer requeues it."""
        async def process(msg: Message) -> object:
            opened = self.open(msg)
            if opened is None:
                return await handler(msg)
            span, parent = opened
            token = otel_context.attach(trace.set_span_in_context(span, parent))
            try:
                result = await handler(msg)
            except asyncio.CancelledError as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # stop() cancelled the handler after drain_timeout and gives the
                    # message back (reason stop): not a failure of the handler
                    ProcessSpans.close(span, given_back=True)
                else:
                    Tracing.end(span, exc)
                raise
            except BaseException as exc:
                Tracing.end(span, exc)
                raise
            finally:
                otel_context.detach(token)
            Tracing.end(span)
            return result

        return process
