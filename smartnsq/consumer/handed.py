"""Iterated messages' processing, timed and spanned from hand-over to answer.

An ``async for`` loop gets its messages from the consumer, and the consumer learns that the
application is done with one only when it is answered. While metrics or process spans are
on, this object notes each message handed out (its hand-over time and span) and closes that
record when the message is answered. Owned by the dispatcher.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from smartnsq.message import Message
from smartnsq.protocol.messages import TIMESTAMP

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from smartnsq.consumer.meters import ConsumerMeters
    from smartnsq.consumer.process_spans import ProcessSpans

__all__ = ["HandedOut"]


class HandedOut:
    """See the module docstring."""

    __slots__ = ("_handed", "_meters", "_spans")

    def __init__(self) -> None:
        self._meters: ConsumerMeters | None = None
        self._spans: ProcessSpans | None = None
        #: messages handed out and not answered yet: hand-over time and span
        self._handed: dict[Message, tuple[float, Span | None]] = {}

    def observe(self, meters: ConsumerMeters | None, spans: ProcessSpans | None) -> None:
        self._meters = meters
        self._spans = spans

    @property
    def on(self) -> bool:
        """Metrics or spans are on: hand-overs are worth noting."""
        return self._meters is not None or self._spans is not None

    def __bool__(self) -> bool:
        return bool(self._handed)

    def hand_over(self, msg: Message) -> None:
        """``msg`` goes to the application: its processing starts."""
        span = None
        if self._spans is not None:
            opened = self._spans.open(msg)
            span = opened[0] if opened is not None else None
        start = 0.0
        if self._meters is not None:
            start = time.perf_counter()
            self._meters.latency.observe(time.time() - msg._raw[TIMESTAMP] * 1e-9)
        if span is not None or self._meters is not None:
            self._handed[msg] = (start, span)

    def answered(self, msg: Message, given_back: bool = False) -> None:
        """``msg`` was answered: its processing ended (``given_back``: the consumer requeued
        it unprocessed, as stop() does with what the application left unanswered)."""
        entry = self._handed.pop(msg, None)
        if entry is None:
            return
        start, span = entry
        if self._meters is not None:
            self._meters.process.observe(time.perf_counter() - start)
        if span is not None and self._spans is not None:
            self._spans.close(span, given_back=given_back)
