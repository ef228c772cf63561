"""The asyncio consumer: the public :class:`Consumer`, which checks its arguments and wires
the parts that do the work, each owning its state:

* :mod:`smartnsq.consumer.subscriptions`: one subscription per (nsqd, partition): connect,
  SUB, start positions, retire, totals of closed subscriptions (with
  :mod:`smartnsq.consumer.conns` for reconnects and :mod:`smartnsq.consumer.discovery`);
* :mod:`smartnsq.consumer.dispatch`: queue, workers, handler calls, answers, iteration (its
  docstring walks the per-message path);
* :mod:`smartnsq.consumer.rdy_driver`: executes :mod:`smartnsq.flow` actions (RDY, backoff);
* :mod:`smartnsq.consumer.policy`: admission, requeue and failure decisions (the ordered
  consumer brings its own);
* :mod:`smartnsq.consumer.stop_steps`: the stop sequence over those parts, graceful or cut
  short.

The consumer itself holds the lifecycle (start, stop and its flags, fatal errors), stats and
the public methods.
"""

from __future__ import annotations

import asyncio
import logging
import random
import types
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Self

from smartnsq import trace as _trace
from smartnsq._checks import check_count, check_loop, check_optional_duration
from smartnsq._entry import Entry
from smartnsq.addresses import LookupdSpec, NsqdSpec, Source, resolve_source
from smartnsq.config import ConsumerConfig
from smartnsq.consumer.arguments import (
    StartAt,
    check_config,
    check_handler,
    check_ordered_source,
    check_start_at,
    check_trace,
    discovery_of,
)
from smartnsq.consumer.conns import ConnectionSet
from smartnsq.consumer.discovery import Topology
from smartnsq.consumer.dispatch import Dispatcher, Handler
from smartnsq.consumer.life import ConsumerLife
from smartnsq.consumer.meters import HANDLER_ERROR, STOP
from smartnsq.consumer.observe import Observability
from smartnsq.consumer.policy import AttemptsPolicy, DeliveryPolicy, GivingUpCallback
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.snapshot import consumer_stats
from smartnsq.consumer.stats import ConsumerStats
from smartnsq.consumer.stop_steps import StopSteps
from smartnsq.consumer.sub import Sub
from smartnsq.consumer.sub_errors import ends_consumer
from smartnsq.consumer.subscriptions import SubscriptionSet
from smartnsq.errors import ConfigError, NSQError
from smartnsq.flow import RdyController
from smartnsq.message import Message
from smartnsq.metrics.api import Metrics
from smartnsq.protocol.validation import check_channel, check_topic
from smartnsq.stop_run import StopRun

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Consumer", "GivingUpCallback", "Handler", "StartAt", "Sub"]

log = logging.getLogger("smartnsq.consumer")


class Consumer:
    """Consume ``topic`` on ``channel`` from stock or youzan nsqd.

    Give exactly one source (:mod:`smartnsq.addresses`): ``nsqd=`` (nsqd TCP addresses, one
    ``"host:port"`` or several), or ``lookupd=`` (nsqlookupd HTTP addresses, polled every
    ``config.lookupd_poll_interval`` with jitter, or a shared :class:`smartnsq.lookup.Lookup`).
    On youzan clusters (lookupd) one subscription is made per partition; elsewhere one per
    nsqd.

    Messages go to ``handler`` (an ``async`` callable taking one :class:`Message`:
    returning finishes the message, raising requeues it) or, without a handler, to
    ``async for message in consumer`` (then answer each message yourself).

    ``giving_up`` receives messages delivered more than ``config.max_attempts`` times, instead
    of the handler; each is finished once the callback returned, and requeued if it raised
    (default: a warning is logged and the message finished).
    ``start_at`` (youzan, lookups only) positions the channel once per partition at start,
    exactly: the position is checked on the leader and retried within a bound, and nothing
    below it reaches the handler (``stats().dropped_before_start`` counts what nsqd's
    read-ahead delivered from before it; :mod:`smartnsq.consumer.positions`).
    ``partitions`` (youzan, lookupd only) subscribes to those partitions only.
    ``trace=True`` traces this consumer's deliveries: on youzan it subscribes with
    SUB_ADVANCED so each message carries its queue offset and raw size, and every delivery
    is logged to ``smartnsq.trace``. ``trace_switch`` (default: the process-wide
    ``smartnsq.trace.switch``; any object with ``is_on(topic)``) only turns that logging
    on for other consumers too; it never changes what goes on the wire.
    ``metrics`` (default: :func:`smartnsq.metrics.get_metrics` at ``start()``) receives the
    consumer's figures (:mod:`smartnsq.metrics.catalog`); ``tracer_provider`` (default: the
    global OpenTelemetry one) makes a ``process {topic}`` span per message, child of the
    producer's when the message carries its context (youzan ext topics; on stock nsqd with
    ``trace_envelope=True`` on both sides, which also removes the envelope from the body).

    Use ``async with Consumer(...) as c:`` or ``await start()`` / ``await stop()``; iterating
    (``async for``) needs a started consumer.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,
        *,
        nsqd: NsqdSpec | None = None,
        lookupd: LookupdSpec | None = None,
        config: ConsumerConfig | None = None,
        giving_up: GivingUpCallback | None = None,
        start_at: StartAt | None = None,
        trace: bool = False,
        trace_switch: _trace.TraceToggle | None = None,
        partitions: Collection[int] | None = None,
        metrics: Metrics | None = None,
        tracer_provider: TracerProvider | None = None,
        trace_envelope: bool = False,
    ) -> None:
        def policy(config: ConsumerConfig) -> DeliveryPolicy:
            if giving_up is not None and not callable(giving_up):
                raise ConfigError("giving_up must be callable")
            return AttemptsPolicy(config, giving_up)

        # before the source: an address given as the third argument (gnsq, pynsq) is
        # named as such, not reported as a missing nsqd=
        check_handler(handler)
        self._setup(topic, channel, handler, policy, resolve_source("Consumer", nsqd, lookupd),
                    config=config, start_at=start_at, trace=trace, trace_switch=trace_switch,
                    partitions=partitions,
                    observe=Observability(metrics, tracer_provider, trace_envelope))

    def _setup(
        self,
        topic: str,
        channel: str,
        handler: Handler | None,
        make_policy: Callable[[ConsumerConfig], DeliveryPolicy],
        source: Source,
        *,
        config: ConsumerConfig | None,
        start_at: StartAt | None,
        trace: bool,
        trace_switch: _trace.TraceToggle | None,
        partitions: Collection[int] | None,
        observe: Observability,
    ) -> None:
        """Check the arguments and build the parts; ``make_policy`` decides what happens to
        deliveries besides the handler call (the ordered consumer passes its own)."""
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        check_handler(handler)
        config = check_config(config)
        policy = make_policy(config)
        check_trace(trace, trace_switch)
        discovery = discovery_of(self.topic, source, config, partitions)
        self._start_at = check_start_at(start_at, discovery)
        check_ordered_source(policy.ordered, discovery)

        self._config = config
        self._handler = handler
        self._policy = policy
        self._observe = observe
        #: the trace switch whose setting turns logging on (default: the process-wide one)
        self.trace_switch: _trace.TraceToggle = (
            trace_switch if trace_switch is not None else _trace.switch)
        #: this consumer traces its deliveries (positions on youzan, a log record each)
        self.trace = trace
        tracing = _trace.Tracing(trace, self.trace_switch)
        self._discovery = discovery
        self._max_in_flight = config.max_in_flight
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver = RdyDriver(config, self._rng, f"{self.topic}/{self.channel}",
                                 one_per_connection=policy.ordered)
        self._dispatch = Dispatcher(self.topic, self.channel, handler, policy, self._driver,
                                    tracing, self._fatal)
        self._subscriptions = SubscriptionSet(
            self.topic, self.channel, config, policy, self._dispatch, self._driver,
            self._start_at, tracing, discovery, is_fatal=ends_consumer,
            on_fatal=self._fatal, rng=self._rng)

        self._stop_steps = StopSteps(config, self._driver, self._subscriptions, discovery,
                                     self._dispatch, observe)

        # lifecycle
        self._entry = Entry(type(self).__name__)
        self._life = ConsumerLife(f"{self.topic}/{self.channel}")
        #: stop(): graceful, cut short when a caller is cancelled while it waits
        self._stop_run = StopRun(self._cut_short)

    # the parts, under the names tests reach for
    @property
    def _conns(self) -> ConnectionSet:
        return self._subscriptions.conns

    @property
    def _subs(self) -> set[Sub]:
        return self._subscriptions.subs

    @property
    def _workers(self) -> set[asyncio.Task[None]]:
        workers = self._dispatch.workers
        return workers.tasks if workers is not None else set()

    @property
    def _queue(self) -> Collection[object]:
        return self._dispatch.queue.items

    @property
    def _flow(self) -> RdyController[Sub] | None:
        return self._driver.flow

    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the consumer and its parts to the running loop."""
        self._loop = loop
        self._dispatch.bind(loop)
        self._driver.start(loop, self._max_in_flight)

    # ------------------------------------------------------------------ validation

    def _check_open(self) -> None:
        check_loop(self._loop, "this Consumer")
        self._life.check_open()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        # one block at a time, and none around a started consumer (smartnsq._entry)
        await self._entry.enter(self.is_running, self.start)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: types.TracebackType | None) -> None:
        await self._entry.leave(self.stop)

    async def start(self) -> None:
        """Discover, connect and subscribe. Returns once every endpoint known at start was
        tried once (with more endpoints than ``max_concurrent_connects``, at most one
        connect's time: dial, handshake and SUB); unreachable ones keep being retried in
        the background. Raises
        configuration errors (ordered/ext/channel mismatches, stock nsqd asked for youzan
        features, auth refused, IDENTIFY settings refused) instead of retrying them. A call
        while another is starting the consumer waits for that start and ends as it did."""
        self._check_open()
        life = self._life
        if life.started:
            await life.join_start()
            return
        life.begin_start()
        self._bind_loop(asyncio.get_running_loop())
        try:
            await self._start()
        finally:
            life.start_ended()  # however it ended (the calls waiting for it see how)

    async def _start(self) -> None:
        obs, driver = self._observe, self._driver
        obs.start(self.topic, self.channel, lambda: list(self._subs),
                  lambda: driver.flow is not None and driver.flow.in_backoff)
        self._subscriptions.meters = obs.meters
        self._dispatch.observe(obs.meters, obs.spans)
        self._discovery.report_to(obs.metrics)
        try:
            self._subscriptions.follow(await self._discovery.start(self._on_topology))
            await self._conns.wait_first_attempts(self._subscriptions.start_bound())
            self._life.raise_error()
        except BaseException as exc:
            if ends_consumer(exc):
                self._life.failed(exc)
            self._life.start_ended()
            await self._shutdown(0.0)
            raise
        self._life.start_ended()
        self._driver.start_redistributing()
        log.info("consumer of %s/%s started: %d subscription(s) (%s)", self.topic,
                 self.channel, len(self._subs), self._discovery.kind)

    def _on_topology(self, topology: Topology) -> None:
        if self._life.stopping or self._life.closed:
            return
        try:
            self._subscriptions.follow(topology)
        except NSQError as exc:
            self._fatal(exc)

    @property
    def error(self) -> BaseException | None:
        """The configuration error that stopped the consumer, if any."""
        return self._life.error

    @property
    def is_running(self) -> bool:
        return self._life.running

    @property
    def is_closed(self) -> bool:
        return self._life.closed

    async def wait_closed(self) -> None:
        """Wait until the consumer is stopped; raise the error that stopped it, if any."""
        check_loop(self._loop, "this Consumer")
        await self._life.wait_closed()

    def _fatal(self, exc: BaseException) -> None:
        life = self._life
        if life.failed(exc):
            log.error("consumer of %s/%s stops: %s", self.topic, self.channel, exc)
        if life.starting or life.stopping or life.closed:
            return
        # no more deliveries from now on, not only once the stop task runs
        self._driver.set_max_in_flight(0)
        self._dispatch.spawn(self.stop())

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop gracefully: RDY 0 everywhere, CLS and wait for CLOSE_WAIT (after it no
        message can still be on its way), let messages in flight be answered (those still
        unanswered after ``drain_timeout`` seconds, default ``config.drain_timeout``, are
        requeued), close.
        Idempotent; safe to call from a handler (it then returns without waiting for
        that handler)."""
        drain_timeout = check_optional_duration(drain_timeout, "drain_timeout")
        check_loop(self._loop, "this Consumer")
        life = self._life
        if life.closed:
            return
        if not life.started:
            life.stopping = True
            life.set_closed()
            self._subscriptions.closing = True
            self._dispatch.stopping = True
            await self._discovery.close()
            return
        timeout = self._config.drain_timeout if drain_timeout is None else drain_timeout
        self._stop_run.start(lambda: self._shutdown(timeout))
        me = asyncio.current_task()
        if me is not None and me in self._workers:
            return  # a handler stopping its own consumer must not wait for itself
        # a caller cancelled while it waits (a timeout around it) cuts the stop short rather
        # than leave a graceful stop unwatched, holding messages in flight
        await self._stop_run.wait()

    async def _cut_short(self) -> None:
        """End a cancelled stop at once (:meth:`StopSteps.cut_short`)."""
        if self._life.closed:
            return
        await self._stop_steps.cut_short()
        self._life.set_closed()
        log.warning("consumer of %s/%s: stop() was cancelled; closed without draining (the "
                    "messages in flight were requeued)", self.topic, self.channel)

    async def _shutdown(self, drain_timeout: float) -> None:
        self._life.stopping = True
        self._subscriptions.closing = True
        self._dispatch.stopping = True
        await self._stop_steps.graceful(drain_timeout)
        self._life.set_closed()
        log.info("consumer of %s/%s stopped", self.topic, self.channel)

    # ------------------------------------------------------------------ handler wrappers

    def give_back(self, msg: Message) -> None:
        """For code that wraps the handler (the sync facade): ``msg`` was not processed
        because the consumer is stopping; requeue it at once, without backoff."""
        self._dispatch.requeue_as(msg, STOP, 0, backoff=False)

    def requeue_and_stop(self, msg: Message, error: BaseException) -> None:
        """For code that wraps the handler: ``msg`` was not processed, and no message would
        be (the handler exited, or cannot run): requeue it at once, without backoff (counted
        as a handler error), and stop the consumer with ``error`` (:attr:`error`;
        :meth:`wait_closed` raises it)."""
        self._dispatch.requeue_as(msg, HANDLER_ERROR, 0, backoff=False)
        self._fatal(error)

    # ------------------------------------------------------------------ flow control

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at run time; 0 pauses every subscription."""
        check_count(max_in_flight, "max_in_flight")
        self._check_open()
        self._max_in_flight = max_in_flight
        self._driver.set_max_in_flight(max_in_flight)
        if self._driver.flow is not None and self._dispatch.workers is not None:
            self._dispatch.workers.wake_if_idle()

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def config(self) -> ConsumerConfig:
        """The configuration given (checked), read-only."""
        return self._config

    def is_starved(self) -> bool:
        """True when some subscription has messages in flight and ≥ 85 % of its RDY used:
        a batching handler should process what it holds now ("Building Client
        Libraries")."""
        check_loop(self._loop, "this Consumer")
        return self._driver.is_starved()

    # ------------------------------------------------------------------ iteration

    def __aiter__(self) -> Consumer:
        if self._handler is not None:
            raise ConfigError("this consumer has a handler; iterate a consumer created "
                              "without one")
        return self

    async def __anext__(self) -> Message:
        check_loop(self._loop, "this Consumer")
        if self._handler is not None:
            raise ConfigError("this consumer has a handler; iterate a consumer created "
                              "without one")
        self._life.check_started(": use 'async with Consumer(...) as c:' or 'await "
                                 "c.start()' before iterating")
        msg = await self._dispatch.next_message()
        if msg is not None:
            return msg
        self._life.raise_error()
        raise StopAsyncIteration

    # ------------------------------------------------------------------ stats

    def stats(self) -> ConsumerStats:
        """Totals and per-subscription counters, backoff state."""
        flow = self._driver.flow
        self._dispatch.settle()  # the handlers' FIN runs count (consumer.workers)
        if flow is not None and self._loop is not None and not self._life.closed:
            self._driver.flush()
        return consumer_stats(self.topic, self.channel, self._max_in_flight, flow,
                              self._subscriptions, self._dispatch)

    def __repr__(self) -> str:
        if not hasattr(self, "_subscriptions"):  # the constructor refused its arguments
            return f"<{type(self).__name__} (not constructed)>"
        return (f"<{type(self).__name__} {self.topic}/{self.channel} {self._life.state} "
                f"subscriptions={len(self._subs)}>")
