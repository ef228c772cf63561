"""The consumer's metrics (:mod:`smartnsq.metrics.catalog`, ``CONSUMER_*`` and ``ORDERED_*``).

Everything is bound once: the consumer's children at ``start()``, a subscription's when it is
opened (:meth:`ConsumerMeters.sub`), so counting is one ``inc`` on a bound child. Received
and finished are fed in the batches the flow-control driver already counts (once per loop
turn, :meth:`~smartnsq.consumer.rdy_driver.RdyDriver.flush`); the histograms are observed by
the handler workers, or at hand-over and answer in ``async for``. The gauges read the live
subscriptions at collection time (from the exporter's thread: containers are copied first)
and are removed at stop. A consumer whose metrics are off has no meters at all (None
everywhere), and its per-message path is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from smartnsq.metrics import catalog as c
from smartnsq.metrics.api import CounterChild, HistogramChild, Metrics, Registration

__all__ = ["APPLICATION", "CLOSED", "HANDLER_ERROR", "STOP", "ConsumerMeters",
           "RequeueReason", "SubMeters"]

#: why a message went back to nsqd (the ``reason`` label of CONSUMER_REQUEUED)
RequeueReason = Literal["handler_error", "application", "stop", "closed"]
#: the handler (or the giving_up / dead-letter callback) raised
HANDLER_ERROR: RequeueReason = "handler_error"
#: the application called ``message.requeue()``
APPLICATION: RequeueReason = "application"
#: returned as the consumer stopped (never handed out, or not answered within the drain)
STOP: RequeueReason = "stop"
#: its connection closed before it was handled: nsqd requeues it by itself
CLOSED: RequeueReason = "closed"
REASONS: tuple[RequeueReason, ...] = (HANDLER_ERROR, APPLICATION, STOP, CLOSED)

#: (label values, value) pairs of a gauge reading
Reading = list[tuple[tuple[str, ...], float]]


class SubMeters:
    """One subscription's counters, bound to (topic, channel, nsqd, partition)."""

    __slots__ = ("connects", "dropped", "fin_failed", "finished", "given_up", "received",
                 "requeued", "touched")

    def __init__(self, metrics: Metrics, labels: tuple[str, str, str, str]) -> None:
        self.received: CounterChild = metrics.counter(c.CONSUMER_RECEIVED).labels(*labels)
        self.finished: CounterChild = metrics.counter(c.CONSUMER_FINISHED).labels(*labels)
        requeued = metrics.counter(c.CONSUMER_REQUEUED)
        self.requeued: dict[str, CounterChild] = {
            reason: requeued.labels(*labels, reason) for reason in REASONS}
        self.touched: CounterChild = metrics.counter(c.CONSUMER_TOUCHED).labels(*labels)
        self.given_up: CounterChild = metrics.counter(c.CONSUMER_GIVEN_UP).labels(*labels)
        self.dropped: CounterChild = metrics.counter(c.CONSUMER_DROPPED).labels(*labels)
        self.fin_failed: CounterChild = metrics.counter(c.CONSUMER_FIN_FAILED).labels(*labels)
        self.connects: CounterChild = metrics.counter(c.CONSUMER_CONNECTS).labels(*labels[:3])


class ConsumerMeters:
    """One consumer's metrics: its histograms, its subscriptions' counters and its gauges."""

    def __init__(self, metrics: Metrics, topic: str, channel: str) -> None:
        self._metrics = metrics
        self.topic = topic
        self.channel = channel
        #: hand-over to answer, per message (messaging.process.duration)
        self.process: HistogramChild = metrics.histogram(c.CONSUMER_PROCESS).labels(
            topic, channel)
        #: hand-over time minus the message's timestamp (its publish time on nsqd)
        self.latency: HistogramChild = metrics.histogram(c.CONSUMER_LATENCY).labels(
            topic, channel)
        self._gaps = metrics.counter(c.ORDERED_GAPS)
        self._violations = metrics.counter(c.ORDERED_VIOLATIONS)
        self._registrations: list[Registration] = []

    def sub(self, address: str, partition: int | None) -> SubMeters:
        """The counters of a subscription to ``address`` (and ``partition``)."""
        return SubMeters(self._metrics, (self.topic, self.channel, address,
                                         "" if partition is None else str(partition)))

    def gap(self, partition: int) -> None:
        self._gaps.labels(self.topic, self.channel, str(partition)).inc()

    def violation(self, partition: int) -> None:
        self._violations.labels(self.topic, self.channel, str(partition)).inc()

    def watch(self, subs: Callable[[], Iterable[SubView]],
              in_backoff: Callable[[], bool]) -> None:
        """Register the gauges: in flight and RDY per live subscription (``subs()`` runs on
        the exporter's thread and must return a copy), backoff of the consumer."""
        topic, channel = self.topic, self.channel

        def labels(s: SubView) -> tuple[str, ...]:
            part = s.partition
            return (topic, channel, s.address, "" if part is None else str(part))

        def in_flight() -> Reading:
            return [(labels(s), float(s.outstanding)) for s in subs()]

        def rdy() -> Reading:
            return [(labels(s), float(s.conn.rdy if s.conn is not None else 0))
                    for s in subs()]

        def backoff() -> Reading:
            return [((topic, channel), 1.0 if in_backoff() else 0.0)]

        m = self._metrics
        self._registrations += [m.gauge(c.CONSUMER_IN_FLIGHT, in_flight),
                                m.gauge(c.CONSUMER_RDY, rdy),
                                m.gauge(c.CONSUMER_BACKOFF, backoff)]

    def close(self) -> None:
        """The consumer stopped: its gauges go (its counters stay, as counters do)."""
        registrations, self._registrations = self._registrations, []
        for r in registrations:
            r.close()


class _Conn(Protocol):
    @property
    def rdy(self) -> int: ...


class SubView(Protocol):
    """What the gauges read of a subscription (:class:`~smartnsq.consumer.sub.Sub`)."""

    @property
    def address(self) -> str: ...

    @property
    def partition(self) -> int | None: ...

    @property
    def outstanding(self) -> int: ...

    @property
    def conn(self) -> _Conn | None: ...
