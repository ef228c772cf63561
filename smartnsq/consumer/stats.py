"""Snapshots of a consumer's counters (``Consumer.stats()``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """One subscription: a connection to one nsqd (and partition on youzan)."""

    address: str
    #: youzan partition, None on a non-partitioned subscription
    partition: int | None
    connected: bool
    #: the RDY count last sent
    rdy: int
    #: delivered and not yet answered
    in_flight: int
    received: int
    finished: int
    requeued: int
    given_up: int


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """Totals over the consumer's life (closed connections included) and the live
    subscriptions."""

    topic: str
    channel: str
    received: int
    finished: int
    requeued: int
    given_up: int
    #: delivered to the handler / iterator and not yet answered
    in_flight: int
    max_in_flight: int
    total_rdy: int
    backoff_level: int
    in_backoff: bool
    #: a backoff pause is running (RDY 0 everywhere)
    backoff_paused: bool
    starved: bool
    #: connections made (first connects and reconnects)
    connects: int
    subscriptions: tuple[SubscriptionStats, ...]
    #: deliveries finished without reaching the handler: below the requested start position
    #: (``start_at``; nsqd's read-ahead on repositioning), or the second copy of a message
    #: nsqd had read ahead and then read again (docs/protocol.md §13.2.1)
    dropped_before_start: int = 0

