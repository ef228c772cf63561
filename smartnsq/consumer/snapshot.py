"""``Consumer.stats()``: one :class:`~smartnsq.consumer.stats.ConsumerStats` put together
from the parts that keep the figures."""

from __future__ import annotations

from typing import Any

from smartnsq.consumer.dispatch import Dispatcher
from smartnsq.consumer.stats import ConsumerStats
from smartnsq.consumer.subscriptions import SubscriptionSet
from smartnsq.flow import RdyController

__all__ = ["consumer_stats"]


def consumer_stats(topic: str, channel: str, max_in_flight: int,
                   flow: RdyController[Any] | None, subscriptions: SubscriptionSet,
                   dispatch: Dispatcher) -> ConsumerStats:
    """A consumer's snapshot from its parts: the subscriptions' counters, the dispatcher's
    outstanding messages, the flow controller's RDY and backoff state (None: not started)."""
    per, totals = subscriptions.stats()
    return ConsumerStats(
        topic=topic, channel=channel, received=totals[0], finished=totals[1],
        requeued=totals[2], given_up=totals[3], in_flight=dispatch.outstanding,
        max_in_flight=max_in_flight,
        total_rdy=flow.total_rdy if flow is not None else 0,
        backoff_level=flow.backoff_level if flow is not None else 0,
        in_backoff=flow.in_backoff if flow is not None else False,
        backoff_paused=flow.backoff_window_active if flow is not None else False,
        starved=flow.is_starved() if flow is not None else False,
        connects=subscriptions.connects, subscriptions=per,
        dropped_before_start=dispatch.dropped_before_start)
