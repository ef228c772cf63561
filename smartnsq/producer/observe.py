"""The producer's metrics (:mod:`smartnsq.metrics.catalog`'s ``PRODUCER_*``), fed by the retry
engine (:mod:`smartnsq.producer.engine`) for the TCP and the HTTP producer alike.

A producer makes one :class:`PublishMetrics` at ``start()`` only when its metrics backend is
enabled; with metrics off the engine holds None and its publishes run the code they ran
before. What is counted where:

* per publish operation (one PUB, one MPUB chunk, one HTTP request ...): ``publishes`` and
  ``messages sent`` by command and result (``ok``, or the class name of the error the call
  raised), its duration (from the call to its answer, retries included) and, for the MPUB
  commands, the batch size (:meth:`PublishMetrics.published`, :meth:`PublishMetrics.failed`);
* per attempt sent to an nsqd: ``attempts`` by nsqd and result (the attempt's own error
  class), ``retries`` (every attempt after the first), ``leader redirects`` (a not-leader
  answer); waits for a leader (:meth:`PublishMetrics.leader_wait`);
* per connection pool: ``reconnects``, and the connections by state, read at scrape time.

The ``nsqd`` label is ``host:port`` (an HTTP target's address without its scheme).
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from smartnsq.metrics import CounterChild, HistogramChild, Metrics
from smartnsq.metrics import catalog as c

__all__ = ["PublishMetrics"]

K = TypeVar("K")
V = TypeVar("V")

#: commands whose messages are a batch (the batch size histogram)
_BATCHES = frozenset({"MPUB", "MPUB_TRACE", "MPUB_EXT", "HTTP_MPUB"})
#: entries each per-topic cache below keeps; a full one is emptied and fills again with the
#: topics in use, so a producer publishing to generated names (per tenant, per day) holds no
#: entry per topic for good and the topics of today, not the first ones, stay cached
CACHED = 1024


def _keep(cache: dict[K, V], key: K, value: V) -> V:
    if len(cache) >= CACHED:
        cache.clear()
    cache[key] = value
    return value


class _Ok:
    """The children a successful publish of one (topic, command) feeds, bound once (with
    ``attempt``: sent at once to one nsqd)."""

    __slots__ = ("attempt", "batch", "duration", "publishes", "sent")

    def __init__(self, publishes: CounterChild, sent: CounterChild,
                 duration: HistogramChild, batch: HistogramChild | None,
                 attempt: CounterChild | None = None) -> None:
        self.publishes = publishes
        self.sent = sent
        self.duration = duration
        self.batch = batch
        self.attempt = attempt


class PublishMetrics:
    """One producer's counters and histograms (see the module docstring); every method runs
    on the producer's loop."""

    def __init__(self, metrics: Metrics, loop: asyncio.AbstractEventLoop) -> None:
        self.metrics = metrics
        self._loop = loop
        self._sent = metrics.counter(c.PRODUCER_SENT)
        self._publishes = metrics.counter(c.PRODUCER_PUBLISHES)
        self._duration = metrics.histogram(c.PRODUCER_DURATION)
        self._batch = metrics.histogram(c.PRODUCER_BATCH)
        self._attempts = metrics.counter(c.PRODUCER_ATTEMPTS)
        self._retries = metrics.counter(c.PRODUCER_RETRIES)
        self._redirects = metrics.counter(c.PRODUCER_REDIRECTS)
        self._waits = metrics.counter(c.PRODUCER_LEADER_WAITS)
        self._reconnects = metrics.counter(c.PRODUCER_RECONNECTS)
        self._ok: dict[tuple[str, str], _Ok] = {}
        self._ok_attempts: dict[tuple[str, str], CounterChild] = {}
        self._at_once: dict[tuple[str, str, str], _Ok] = {}

    def _ok_children(self, topic: str, command: str) -> _Ok:
        key = (topic, command)
        ok = self._ok.get(key)
        if ok is None:
            ok = _Ok(self._publishes.labels(topic, command, "ok"),
                     self._sent.labels(topic, command, "ok"),
                     self._duration.labels(topic, command),
                     self._batch.labels(topic) if command in _BATCHES else None)
            _keep(self._ok, key, ok)
        return ok

    def published(self, topic: str, command: str, count: int, start: float) -> None:
        """A publish operation of ``count`` messages that began at loop time ``start`` was
        acknowledged."""
        self._count(self._ok_children(topic, command), count, start)

    def _count(self, ok: _Ok, count: int, start: float) -> None:
        ok.publishes.inc()
        ok.sent.inc(count)
        ok.duration.observe(self._loop.time() - start)
        if ok.batch is not None:
            ok.batch.observe(count)

    def sent_at_once(self, topic: str, command: str, count: int, address: str,
                     start: float) -> None:
        """A publish acknowledged on its first attempt, sent to nsqd ``address`` at once
        (the engine's fast paths: one lookup for all it feeds)."""
        key = (topic, command, address)
        ok = self._at_once.get(key)
        if ok is None:
            base = self._ok_children(topic, command)
            ok = _Ok(base.publishes, base.sent, base.duration, base.batch,
                     self._attempts.labels(topic, c.address_label(address), "ok"))
            _keep(self._at_once, key, ok)
        assert ok.attempt is not None
        ok.attempt.inc()
        self._count(ok, count, start)

    def failed(self, topic: str, command: str, count: int, start: float,
               exc: BaseException) -> None:
        """A publish operation that raised ``exc``."""
        result = type(exc).__name__
        self._publishes.labels(topic, command, result).inc()
        self._sent.labels(topic, command, result).inc(count)
        self._duration.labels(topic, command).observe(self._loop.time() - start)
        if command in _BATCHES:
            self._batch.labels(topic).observe(count)

    def attempt(self, topic: str, address: str, exc: BaseException | None = None) -> None:
        """One attempt sent to nsqd ``address``: answered OK, or failed with ``exc``."""
        if exc is None:
            key = (topic, address)
            child = self._ok_attempts.get(key)
            if child is None:
                child = self._attempts.labels(topic, c.address_label(address), "ok")
                _keep(self._ok_attempts, key, child)
            child.inc()
            return
        self._attempts.labels(topic, c.address_label(address), type(exc).__name__).inc()

    def retry(self, topic: str) -> None:
        self._retries.labels(topic).inc()

    def redirect(self, topic: str, address: str) -> None:
        """nsqd ``address`` answered that it does not lead the partition (any more)."""
        self._redirects.labels(topic, c.address_label(address)).inc()

    def leader_wait(self, topic: str) -> None:
        self._waits.labels(topic).inc()

    def reconnect(self, address: str) -> None:
        self._reconnects.labels(c.address_label(address)).inc()
