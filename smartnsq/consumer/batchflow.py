"""Batched events for :class:`smartnsq.flow.RdyController`.

The controller takes one event per message; at consume rates of hundreds of thousands of
messages a second that alone costs more than the whole per-message budget. A consumer sees
messages in batches (one socket read holds hundreds), so it reports them per batch here.

Outside backoff the batched calls are exactly equivalent to repeating the single event:
"finished" only lowers the in-flight count, and "received" adds to the counters before the
one 25 % check that a single event would make for the last message of the batch. In
backoff every message is reported one by one, because then each result can change the
backoff state. The two methods touch the controller's per-connection counters directly;
they belong in the controller itself as a ``count`` argument, and then this module goes.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TypeVar

from smartnsq.flow import Action, RdyController

__all__ = ["BatchRdyController"]

K = TypeVar("K", bound=Hashable)


class BatchRdyController(RdyController[K]):
    """:class:`RdyController` plus per-batch ``messages_received`` / ``messages_finished``."""

    def messages_received(self, key: K, count: int, now: float) -> list[Action[K]]:
        """``count`` messages arrived on ``key`` (the last of them at ``now``)."""
        if count <= 0:
            return []
        if count > 1:
            conn = self._conns.get(key)
            if conn is None:
                return []
            conn.in_flight += count - 1
            conn.received += count - 1
        return self.message_received(key, now)

    def messages_finished(self, key: K, count: int, now: float) -> list[Action[K]]:
        """``count`` messages of ``key`` were finished."""
        if count <= 0:
            return []
        if count == 1 or self.in_backoff or self.backoff_window_active:
            actions: list[Action[K]] = []
            for _ in range(count):
                actions.extend(self.message_finished(key, now))
            return actions
        conn = self._conns.get(key)
        if conn is not None:
            conn.in_flight = max(0, conn.in_flight - count)
        return []
