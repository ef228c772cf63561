"""Runs the consumer's flow control: the pure :class:`~smartnsq.flow.RdyController` decides,
this module executes its actions on the subscriptions' connections.

It owns the controller, the list of subscriptions with unreported counts and their
once-per-loop-turn flush, and the backoff and redistribution timers. Callers:

* the dispatcher: :meth:`RdyDriver.mark` once per subscription and loop turn (per-message
  counts live on :class:`~smartnsq.consumer.sub.Sub` until the flush), :meth:`requeued`;
* the subscription set: :meth:`added`, :meth:`removed`;
* the consumer: :meth:`start`, :meth:`set_max_in_flight`, :meth:`close`, the stats views.

Every event first flushes the pending counts, so the controller sees events in order.
"""

from __future__ import annotations

import asyncio
import logging
import random

from smartnsq.config import ConsumerConfig
from smartnsq.consumer.sub import Sub
from smartnsq.flow import Action, RdyController, ScheduleTimer, SendRdy

__all__ = ["RdyDriver"]

log = logging.getLogger("smartnsq.consumer")


class RdyDriver:
    """Executes :mod:`smartnsq.flow` actions for one consumer."""

    def __init__(self, config: ConsumerConfig, rng: random.Random, name: str, *,
                 one_per_connection: bool = False) -> None:
        self._config = config
        self._rng = rng
        #: "topic/channel", for logs
        self._name = name
        #: every subscription holds at least RDY 1 (ordered consumption: youzan delivers an
        #: ordered partition one message at a time, so a partition without RDY stalls)
        self._one_per_connection = one_per_connection
        #: max_in_flight as the user set it
        self._wanted = config.max_in_flight
        #: the effective max_in_flight: RDY budget and handler worker cap
        self.budget = config.max_in_flight
        #: the highest budget so far: messages let in under it may still be outstanding
        #: after it was lowered (a pause at 0, stop()), and they keep their workers
        self.most = config.max_in_flight
        #: the warning that RDY must rotate was given
        self._said_scarce = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.flow: RdyController[Sub] | None = None
        self._dirty: list[Sub] = []
        self._flush_scheduled = False
        #: no RDY above 0 any more, no timers (the consumer is stopping)
        self.closing = False
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._redistribute_handle: asyncio.TimerHandle | None = None

    def start(self, loop: asyncio.AbstractEventLoop, max_in_flight: int) -> None:
        """Bind to the running loop; the controller starts with ``max_in_flight``."""
        self.loop = loop
        self._wanted = max_in_flight
        self._set_budget(max_in_flight)
        self.flow = RdyController(self._config.replace(max_in_flight=max_in_flight),
                                  rng=self._rng)

    def _effective(self, subscriptions: int) -> int:
        wanted = self._wanted
        if self._one_per_connection and wanted:
            return max(wanted, subscriptions)
        return wanted

    def _follow(self) -> None:
        """Keep the controller's budget at the effective max_in_flight."""
        flow = self.flow
        assert flow is not None and self.loop is not None
        budget = self._effective(len(flow))
        self._set_budget(budget)
        if budget != flow.max_in_flight:
            self.exec(flow.set_max_in_flight(budget, self.loop.time()))

    def start_redistributing(self) -> None:
        assert self.loop is not None
        self._redistribute_handle = self.loop.call_later(
            self._config.rdy_redistribute_interval, self._redistribute)

    def close(self) -> None:
        """Caller: the consumer's stop. Affects: no RDY above 0 from now on, timers end."""
        self.closing = True
        for handle in (self._redistribute_handle, self._backoff_handle):
            if handle is not None:
                handle.cancel()
        self._redistribute_handle = self._backoff_handle = None

    # ------------------------------------------------------------------ events

    def added(self, sub: Sub, max_rdy: int) -> None:
        """Caller: the subscription set, once ``sub`` is subscribed."""
        flow = self.flow
        assert flow is not None and self.loop is not None
        self.flush()
        self.exec(flow.add_connection(sub, max_rdy, self.loop.time()))
        if self._one_per_connection:
            self._follow()
        elif not self._said_scarce and 0 < self.budget < len(flow):
            self._said_scarce = True
            log.warning("consumer of %s: max_in_flight %d is below its %d subscriptions, so "
                        "RDY rotates between them (a subscription that delivers nothing "
                        "gives it up after low_rdy_idle_timeout, %g s); raise max_in_flight "
                        "to read every partition/nsqd at once", self._name, self.budget,
                        len(flow), self._config.low_rdy_idle_timeout)

    def removed(self, sub: Sub) -> None:
        """Caller: the subscription set (connection closed, or retiring)."""
        if self.flow is not None and self.loop is not None:
            self.flush()
            self.exec(self.flow.remove_connection(sub, self.loop.time()))
            if self._one_per_connection:
                self._follow()

    def requeued(self, sub: Sub, backoff: bool) -> None:
        """Caller: the dispatcher, for each REQ."""
        if self.flow is not None and self.loop is not None:
            self.flush()
            self.exec(self.flow.message_requeued(sub, self.loop.time(), backoff=backoff))

    def set_max_in_flight(self, max_in_flight: int) -> None:
        self._wanted = max_in_flight
        if self.flow is not None and self.loop is not None:
            self.flush()
            self._follow()
        else:
            self._set_budget(max_in_flight)

    def _set_budget(self, budget: int) -> None:
        self.budget = budget
        if budget > self.most:
            self.most = budget

    def is_starved(self) -> bool:
        if self.flow is None:
            return False
        self.flush()
        return self.flow.is_starved()

    # ------------------------------------------------------------------ execution

    def exec(self, actions: list[Action[Sub]]) -> None:
        for a in actions:
            if type(a) is SendRdy:
                conn = a.conn.conn
                if conn is not None and not a.conn.closed and not (
                        a.count and (self.closing or a.conn.retiring)):
                    conn.send_rdy(a.count)
            elif isinstance(a, ScheduleTimer):
                assert self.loop is not None and self.flow is not None
                if self._backoff_handle is not None:
                    self._backoff_handle.cancel()
                log.info("consumer of %s backing off for %.3fs (level %d)", self._name,
                         a.delay, self.flow.backoff_level)
                self._backoff_handle = self.loop.call_later(a.delay, self._backoff_ended,
                                                            a.token)

    def mark(self, sub: Sub) -> bool:
        """``sub`` has counts to report: flush them at the end of this loop turn. True when
        this starts a new turn's batch."""
        sub.dirty = True
        self._dirty.append(sub)
        if self._flush_scheduled:
            return False
        self._flush_scheduled = True
        self.loop.call_soon(self.flush)  # type: ignore[union-attr]
        return True

    def flush(self) -> None:
        """Report the received/finished counts gathered since the last flush.

        One call per connection and kind with a ``count``: the controller answers exactly as
        to that many single events, at a fraction of the cost at high message rates."""
        self._flush_scheduled = False
        dirty = self._dirty
        if not dirty:
            return
        flow = self.flow
        assert flow is not None and self.loop is not None
        now = self.loop.time()
        self._dirty = []
        for sub in dirty:
            sub.dirty = False
            meters = sub.meters
            n = sub.recv_pending
            if n:
                sub.recv_pending = 0
                sub.received += n
                if meters is not None:
                    meters.received.inc(n)
                self.exec(flow.message_received(sub, now, n))
            n = sub.fin_pending
            if n:
                sub.fin_pending = 0
                sub.finished += n
                if meters is not None:
                    meters.finished.inc(n)
                self.exec(flow.message_finished(sub, now, n))

    def _backoff_ended(self, token: int) -> None:
        self._backoff_handle = None
        if self.closing or self.flow is None or self.loop is None:
            return
        self.flush()
        log.info("consumer of %s: backoff pause over, testing the waters", self._name)
        self.exec(self.flow.timer_fired(token, self.loop.time()))

    def _redistribute(self) -> None:
        if self.closing or self.flow is None or self.loop is None:
            return
        self.flush()
        self.exec(self.flow.redistribute(self.loop.time()))
        self._redistribute_handle = self.loop.call_later(
            self._config.rdy_redistribute_interval, self._redistribute)
