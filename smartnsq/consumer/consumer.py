"""The asyncio consumer: discovery, one subscription per (nsqd, partition), RDY flow control,
backoff, attempts, handler dispatch or async iteration, graceful stop, stats, tracing.

Per-message path (kept short on purpose; a consume+FIN loop spends most of its time here):

1. ``Connection`` decodes a message frame and calls :meth:`Consumer._on_message`
   synchronously from its receive path.
2. ``_on_message`` wraps it in a :class:`Message`, counts it for RDY (flow-control events are
   reported once per loop turn with a ``count``, see :meth:`Consumer._flush`), applies the
   attempts limit and queues it.
3. A worker task awaits the handler for each queued message: no task per message. A
   callback scheduled once per batch notices when a handler suspends (inline handlers never
   yield to the loop); the worker then stays with that handler and other workers take over
   the queue, so slow handlers run concurrently (at most ``max_in_flight`` of them, which
   is all RDY can let in anyway).
4. Returning finishes the message (FIN), raising requeues it (REQ with the computed delay);
   FIN/REQ writes of one loop iteration go out in one socket write.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import types
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any, ClassVar

from smartnsq import trace as _trace
from smartnsq._checks import check_count, check_loop, check_optional_duration
from smartnsq.config import ConnectionConfig, ConsumerConfig, LookupConfig
from smartnsq.conn import Connection, SubscribeMode
from smartnsq.consumer.conns import ConnectionSet
from smartnsq.consumer.discovery import (
    NO_PARTITION,
    DirectDiscovery,
    Discovery,
    Endpoint,
    LookupDiscovery,
    Topology,
)
from smartnsq.consumer.positions import Positioner, StartGuard
from smartnsq.consumer.stats import ConsumerStats, SubscriptionStats
from smartnsq.errors import (
    AuthDisabledError,
    AuthFailedError,
    BadChannelError,
    BadPartitionError,
    BadTopicError,
    ClientClosedError,
    ConfigError,
    Flavour,
    InvalidError,
    NSQConnectionError,
    NSQError,
    ServerError,
    SubChannelNotRegisteredError,
    SubExtendForbiddenError,
    SubExtendNeedError,
    SubOrderIsMustError,
    UnauthorizedError,
    UnsupportedFeatureError,
)
from smartnsq.flow import Action, AttemptPolicy, RdyController, ScheduleTimer, SendRdy
from smartnsq.lookup import Lookup
from smartnsq.message import Message
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.messages import RawMessage
from smartnsq.protocol.validation import check_channel, check_topic

__all__ = ["Consumer", "GivingUpCallback", "Handler", "StartAt", "Sub"]

log = logging.getLogger("smartnsq.consumer")

#: ``async def handler(message) -> Any``: returning finishes, raising requeues
Handler = Callable[[Message], Awaitable[object]]
#: called with a message given up after ``max_attempts`` (already finished); may be async
GivingUpCallback = Callable[[Message], object]
#: a start position for every partition, or per partition id
StartAt = OffsetSpec | Mapping[int, OffsetSpec]

_PENDING = 0  # Message._state values (smartnsq.message)
_FINISHED = 1

#: errors that reconnecting cannot fix: the consumer stops and reports them
_CONFIG_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError, UnsupportedFeatureError, SubOrderIsMustError, SubExtendNeedError,
    SubExtendForbiddenError, SubChannelNotRegisteredError, BadTopicError, BadChannelError,
    BadPartitionError, InvalidError, AuthFailedError, UnauthorizedError, AuthDisabledError,
)
#: handler messages processed inline before the worker lets the loop run other callbacks
_INLINE_BATCH = 512
#: most workers one stalled handler wakes at once
_WAKE_BURST = 64
#: how long a subscription that is no longer listed may drain before it is closed
_RETIRE_DRAIN = 5.0


class _Stall:
    """A worker's batch, as its stall check sees it."""

    __slots__ = ("batch", "msg", "stalled")

    def __init__(self) -> None:
        self.batch = 0
        self.msg: Message | None = None
        self.stalled = False


def _is_async_callable(fn: object) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        return False
    # an object whose __call__ is async
    return any(inspect.iscoroutinefunction(k.__dict__.get("__call__"))
               for k in type(fn).__mro__)


class Sub:
    """One subscription: a connection to one endpoint. It answers messages for them
    (:class:`smartnsq.message.MessageOwner`) and is what the connection set runs
    (:class:`smartnsq.consumer.conns.Session`)."""

    __slots__ = (
        "address", "channel", "closed", "conn", "consumer", "dirty", "drained", "endpoint",
        "error",
        "fin_pending", "finished", "given_up", "guard", "local_address", "outstanding", "partition",
        "received", "recv_pending", "registered", "requeued", "retiring", "seeked", "topic",
        "youzan",
    )

    def __init__(self, consumer: Consumer, endpoint: Endpoint) -> None:
        self.consumer = consumer
        self.endpoint = endpoint
        self.conn: Connection | None = None
        self.topic = consumer.topic
        self.channel = consumer.channel
        self.address = endpoint.address
        self.partition: int | None = (
            endpoint.partition if endpoint.partition != NO_PARTITION else None)
        self.youzan = False
        self.local_address: str | None = None
        self.closed = False
        self.retiring = False
        self.registered = False
        #: its start position was set explicitly (start_at)
        self.seeked = False
        #: keeps deliveries from before the start position away from the handler
        self.guard: StartGuard | None = None
        self.error: BaseException | None = None
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        #: handed out and not answered yet
        self.outstanding = 0
        #: received / finished since the last flush: reported to the flow control and then
        #: added to ``received`` / ``finished`` (one counter per message, see _flush)
        self.recv_pending = 0
        self.fin_pending = 0
        self.dirty = False
        #: set while retiring, once nothing is outstanding
        self.drained: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"<subscription {self.endpoint}>"

    # -- MessageOwner (user calls: the dispatch path answers without them)
    def finish(self, msg: Message) -> bool:
        check_loop(self.consumer._loop, "this message's consumer")
        return self.consumer._finish(self, msg)

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> bool:
        check_loop(self.consumer._loop, "this message's consumer")
        return self.consumer._requeue(self, msg, delay, backoff)

    def touch(self, msg: Message) -> bool:
        check_loop(self.consumer._loop, "this message's consumer")
        conn = self.conn
        return conn is not None and conn.touch(msg.id)

    # -- Session
    async def wait_closed(self) -> None:
        if self.conn is not None:
            await self.conn.wait_closed()

    async def retire(self) -> None:
        await self.consumer._retire(self)

    @property
    def stale_leader(self) -> bool:
        err = self.error
        return isinstance(err, ServerError) and err.refresh_lookup


class Consumer:
    """Consume ``topic`` on ``channel`` from stock or youzan nsqd.

    Give exactly one source: ``nsqd_tcp_addresses`` (``host:port`` list), or
    ``lookupd_http_addresses`` (polled every ``config.lookupd_poll_interval`` with
    jitter), or a shared :class:`smartnsq.lookup.Lookup`. On youzan clusters (lookups) one
    subscription is made per partition; elsewhere one per nsqd.

    Messages go to ``handler`` (an ``async`` callable taking one :class:`Message`:
    returning finishes the message, raising requeues it) or, without a handler, to
    ``async for message in consumer`` (then answer each message yourself).

    ``giving_up`` receives messages delivered more than ``config.max_attempts`` times; they
    are finished without reaching the handler (default: a warning is logged).
    ``start_at`` (youzan, lookups only) positions the channel once per partition at start,
    exactly: the position is checked on the leader and retried within a bound, and nothing
    below it reaches the handler (``stats().dropped_before_start`` counts what nsqd's
    read-ahead delivered from before it; :mod:`smartnsq.consumer.positions`).
    ``partitions`` (youzan, lookups only) subscribes to those partitions only.
    ``trace`` is the trace switch to obey (default: the process-wide
    ``smartnsq.trace.switch``); any object with ``is_on(topic)`` will do.

    Use ``async with Consumer(...) as c:`` or ``await start()`` / ``await stop()``.
    """

    #: set by the ordered consumer: SUB_ORDERED on every partition
    _ordered: ClassVar[bool] = False

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,
        *,
        nsqd_tcp_addresses: Sequence[str] | None = None,
        lookupd_http_addresses: Sequence[str] | None = None,
        lookup: Lookup | None = None,
        config: ConsumerConfig | None = None,
        giving_up: GivingUpCallback | None = None,
        start_at: StartAt | None = None,
        trace: _trace.TraceToggle | None = None,
        partitions: Collection[int] | None = None,
    ) -> None:
        self.topic = check_topic(topic)
        self.channel = check_channel(channel)
        if handler is not None:
            if not callable(handler):
                raise ConfigError(f"handler must be an async callable, got "
                                  f"{type(handler).__name__}")
            if not _is_async_callable(handler):
                raise ConfigError("handler must be an async function (async def) taking one "
                                  "Message; for a plain function use smartnsq.sync.Consumer")
        if config is None:
            config = ConsumerConfig()
        elif not isinstance(config, ConsumerConfig):
            raise ConfigError(f"config must be a ConsumerConfig, got {type(config).__name__}")
        if giving_up is not None and not callable(giving_up):
            raise ConfigError("giving_up must be callable")
        if trace is not None and not callable(getattr(trace, "is_on", None)):
            raise ConfigError("trace must be a trace switch (smartnsq.trace.TraceSwitch)")
        sources = sum(x is not None for x in (nsqd_tcp_addresses, lookupd_http_addresses,
                                              lookup))
        if sources != 1:
            raise ConfigError("give exactly one of nsqd_tcp_addresses, "
                              "lookupd_http_addresses and lookup")
        only = self._check_partitions(partitions)
        if only is not None and nsqd_tcp_addresses is not None:
            raise ConfigError("partitions= needs lookupd_http_addresses or lookup= (the "
                              "partition leaders come from the lookup)")
        discovery: Discovery
        if nsqd_tcp_addresses is not None:
            discovery = DirectDiscovery(nsqd_tcp_addresses)
        elif lookupd_http_addresses is not None:
            if isinstance(lookupd_http_addresses, str):
                raise ConfigError("lookupd_http_addresses must be a list of addresses")
            discovery = LookupDiscovery(self.topic, config=LookupConfig(
                addresses=tuple(lookupd_http_addresses),
                poll_interval=config.lookupd_poll_interval,
                poll_jitter=config.lookupd_poll_jitter), partitions=only)
        else:
            discovery = LookupDiscovery(self.topic, lookup=lookup, partitions=only)
        self._start_at = self._check_start_at(start_at, discovery)
        if self._ordered and discovery.kind != "lookupd":
            raise ConfigError("ordered consumption subscribes per partition, which needs "
                              "lookupd_http_addresses or lookup= (partition leaders move)")

        self._config = config
        self._handler = handler
        self._giving_up = giving_up
        #: the trace switch this consumer obeys (default: the process-wide one)
        self.trace: _trace.TraceToggle = trace if trace is not None else _trace.switch
        self._discovery = discovery
        self._policy = AttemptPolicy.from_config(config)
        self._max_attempts = 0 if self._ordered else config.max_attempts
        self._max_in_flight = config.max_in_flight
        self._rng = random.Random()
        self._conns = ConnectionSet(
            discovery, self._open, is_fatal=self._is_fatal, on_fatal=self._fatal,
            reconnect_min=config.reconnect_min, reconnect_max=config.reconnect_max,
            rng=self._rng, max_connecting=config.max_concurrent_connects)
        self._conn_configs: dict[bool, ConnectionConfig] = {}
        self._positioned: set[int] = set()
        #: per positioned partition, for the consumer's life (see consumer.positions)
        self._guards: dict[int, StartGuard] = {}
        #: deliveries finished without the handler: from before the start position, or a
        #: repositioned channel's read-ahead again (ConsumerStats.dropped_before_start)
        self._dropped_before_start = 0

        self._loop: asyncio.AbstractEventLoop | None = None
        self._flow: RdyController[Sub] | None = None
        self._subs: set[Sub] = set()
        self._dirty: list[Sub] = []
        self._flush_scheduled = False
        self._tracing = False
        self._backoff_handle: asyncio.TimerHandle | None = None
        self._redistribute_handle: asyncio.TimerHandle | None = None

        # dispatch
        self._queue: deque[Message] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._idle: list[asyncio.Future[None]] = []
        self._pumping = 0
        self._waking = False
        #: outstanding messages not in the queue and not being handled inline: handlers
        #: that suspended, messages held after disable_auto_response, iterated messages
        self._tracked: set[Message] = set()
        self._buffer: deque[Message] = deque()
        self._iter_waiters: deque[asyncio.Future[None]] = deque()
        self._outstanding = 0
        self._drained: asyncio.Event | None = None
        self._background: set[asyncio.Task[Any]] = set()

        # lifecycle
        self._started = False
        self._starting = False
        self._stopping = False
        self._closed = False
        self._stop_task: asyncio.Task[None] | None = None
        self._closed_event: asyncio.Event | None = None
        self._error: BaseException | None = None

        # totals of subscriptions that are gone
        self._gone = [0, 0, 0, 0]  # received, finished, requeued, given up
        self._connects = 0

    # ------------------------------------------------------------------ validation

    @staticmethod
    def _check_partitions(partitions: Collection[int] | None) -> frozenset[int] | None:
        if partitions is None:
            return None
        if isinstance(partitions, str | bytes) or not isinstance(partitions, Collection):
            raise ConfigError("partitions must be a collection of partition ids")
        for p in partitions:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise ConfigError(f"partitions: a partition id must be an int >= 0, got {p!r}")
        if not partitions:
            raise ConfigError("partitions must not be empty (None subscribes to all)")
        return frozenset(partitions)

    @staticmethod
    def _check_start_at(start_at: StartAt | None,
                        discovery: Discovery) -> dict[int, OffsetSpec] | OffsetSpec | None:
        if start_at is None:
            return None
        if discovery.kind != "lookupd":
            raise ConfigError("start_at needs lookupd_http_addresses or lookup= (positions "
                              "are per partition, and seeking uses the leader's HTTP port)")
        if isinstance(start_at, OffsetSpec):
            return start_at
        if not isinstance(start_at, Mapping):
            raise ConfigError("start_at must be an OffsetSpec or a {partition: OffsetSpec} "
                              "mapping")
        out: dict[int, OffsetSpec] = {}
        for p, spec in start_at.items():
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise ConfigError(f"start_at partition must be an int >= 0, got {p!r}")
            if not isinstance(spec, OffsetSpec):
                raise ConfigError(f"start_at[{p}] must be an OffsetSpec")
            out[p] = spec
        return out

    def _is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, _CONFIG_ERRORS)

    def _check_open(self) -> None:
        check_loop(self._loop, "this Consumer")
        if self._closed or self._stopping:
            raise ClientClosedError(f"consumer of {self.topic}/{self.channel} is closed")

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: types.TracebackType | None) -> None:
        await self.stop()

    async def start(self) -> None:
        """Discover, connect and subscribe. Returns once every endpoint known at start was
        tried once (with more endpoints than ``max_concurrent_connects``, at most one
        connect's time: dial, handshake and SUB); unreachable ones keep being retried in
        the background. Raises
        configuration errors (ordered/ext/channel mismatches, stock nsqd asked for youzan
        features, auth refused) instead of retrying them."""
        self._check_open()
        if self._started:
            return
        self._started = True
        self._starting = True
        loop = self._loop = asyncio.get_running_loop()
        self._closed_event = asyncio.Event()
        self._flow = RdyController(self._config.replace(max_in_flight=self._max_in_flight),
                                   rng=self._rng)
        try:
            topology = await self._discovery.start(self._on_topology)
            self._check_topology(topology)
            self._conns.reconcile(topology)
            await self._conns.wait_first_attempts(self._start_bound())
            if self._error is not None:
                raise self._error
        except BaseException as exc:
            if self._error is None and self._is_fatal(exc):
                self._error = exc
            self._starting = False
            await self._shutdown(0.0)
            raise
        self._starting = False
        self._redistribute_handle = loop.call_later(self._config.rdy_redistribute_interval,
                                                    self._redistribute)
        log.info("consumer of %s/%s started: %d subscription(s) (%s)", self.topic,
                 self.channel, len(self._subs), self._discovery.kind)

    def _start_bound(self) -> float | None:
        """How long start() waits for first attempts: all of them when they can all run at
        once, else one connect's time (the rest queue for a slot in the background)."""
        if len(self._conns) <= self._config.max_concurrent_connects:
            return None
        c = self._config.connection
        return c.dial_timeout + 2 * c.handshake_timeout

    def _check_topology(self, topology: Topology) -> None:
        if topology.flavour is Flavour.STOCK:
            if self._ordered:
                raise UnsupportedFeatureError(
                    f"topic {self.topic!r}: ordered consumption (SUB_ORDERED) needs youzan "
                    "nsqd; the lookupds are stock nsqlookupd")
            if self._start_at is not None:
                raise UnsupportedFeatureError(
                    f"topic {self.topic!r}: start positions (SUB_ADVANCED) need youzan nsqd; "
                    "the lookupds are stock nsqlookupd")
        if topology.ordered and not self._ordered:
            raise SubOrderIsMustError(
                "this topic is configured only allow ordered sub: use smartnsq.ordered."
                "OrderedConsumer", topic=self.topic, fatal=False)

    def _on_topology(self, topology: Topology) -> None:
        if self._stopping or self._closed:
            return
        try:
            self._check_topology(topology)
        except NSQError as exc:
            self._fatal(exc)
            return
        self._conns.reconcile(topology)

    @property
    def error(self) -> BaseException | None:
        """The configuration error that stopped the consumer, if any."""
        return self._error

    @property
    def is_running(self) -> bool:
        return self._started and not self._stopping and not self._closed

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def wait_closed(self) -> None:
        """Wait until the consumer is stopped; raise the error that stopped it, if any."""
        check_loop(self._loop, "this Consumer")
        if not self._started:
            raise ClientClosedError("the consumer was never started")
        assert self._closed_event is not None
        await self._closed_event.wait()
        if self._error is not None:
            raise self._error

    def _fatal(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
            log.error("consumer of %s/%s stops: %s", self.topic, self.channel, exc)
        if self._starting or self._stopping or self._closed:
            return
        if self._flow is not None and self._loop is not None:
            # no more deliveries from now on, not only once the stop task runs
            self._flush()
            self._exec(self._flow.set_max_in_flight(0, self._loop.time()))
        self._spawn(self.stop())

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self, drain_timeout: float | None = None) -> None:
        """Stop gracefully: RDY 0 everywhere, CLS and wait for CLOSE_WAIT (after it no
        message can still be on its way), let messages in flight be answered (those still
        unanswered after ``drain_timeout`` seconds, default ``config.drain_timeout``, are
        requeued), close.
        Idempotent; safe to call from a handler (it then returns without waiting for
        that handler)."""
        drain_timeout = check_optional_duration(drain_timeout, "drain_timeout")
        check_loop(self._loop, "this Consumer")
        if self._closed:
            return
        if not self._started:
            self._closed = True
            self._stopping = True
            await self._discovery.close()
            return
        if self._stop_task is None:
            timeout = self._config.drain_timeout if drain_timeout is None else drain_timeout
            assert self._loop is not None
            self._stop_task = self._loop.create_task(self._shutdown(timeout))
        me = asyncio.current_task()
        if me is not None and me in self._workers:
            return  # a handler stopping its own consumer must not wait for itself
        await asyncio.shield(self._stop_task)

    async def _shutdown(self, drain_timeout: float) -> None:
        self._stopping = True
        loop = self._loop
        assert loop is not None
        for handle in (self._redistribute_handle, self._backoff_handle):
            if handle is not None:
                handle.cancel()
        self._redistribute_handle = self._backoff_handle = None
        await self._conns.close()
        await self._discovery.close()
        # 1. no more deliveries: max_in_flight 0 in the flow keeps it from raising RDY again
        if self._flow is not None:
            self._flush()
            self._exec(self._flow.set_max_in_flight(0, loop.time()))
        for sub in list(self._subs):
            if sub.conn is not None and sub.conn.is_connected and sub.conn.rdy:
                sub.conn.send_rdy(0)
        # 2. CLS: only CLOSE_WAIT proves that no message is still on its way to us. CLS and
        # the final close share one close_timeout, so stop() takes at most drain_timeout +
        # close_timeout however the server behaves
        close_deadline = loop.time() + self._config.connection.close_timeout
        await asyncio.gather(*(self._cls(sub) for sub in list(self._subs)))
        # 3. iterated messages nobody took yet go back at once
        while self._buffer:
            self._buffer.popleft().requeue(0, backoff=False)
        self._wake_iterators()
        self._before_drain()
        # 4. let in-flight messages be answered
        if self._outstanding and drain_timeout > 0:
            self._drained = asyncio.Event()
            try:
                async with asyncio.timeout(drain_timeout):
                    await self._drained.wait()
            except TimeoutError:
                pass
        if self._outstanding:
            log.warning("consumer of %s/%s: %d message(s) still unanswered after the drain "
                        "timeout; requeueing them", self.topic, self.channel,
                        self._outstanding)
            self._requeue_outstanding()
        # 5. close (what was written goes out first)
        drain_end = loop.time()
        close_deadline = max(close_deadline, drain_end)
        await asyncio.gather(*(sub.conn.close(close_deadline - drain_end)
                               for sub in list(self._subs) if sub.conn is not None),
                             return_exceptions=True)
        workers = list(self._workers)
        for w in workers:
            w.cancel()
        for fut in self._idle:
            if not fut.done():
                fut.cancel()
        self._idle.clear()
        if workers:
            # a handler that swallows CancelledError must not hold stop() forever: what is
            # still running at the deadline is left behind (its message was requeued)
            _, stuck = await asyncio.wait(workers, timeout=max(0.0, close_deadline -
                                                                loop.time()))
            if stuck:
                log.warning("consumer of %s/%s: %d handler(s) ignored cancellation; "
                            "stopped without them", self.topic, self.channel, len(stuck))
        self._flush()
        self._closed = True
        self._wake_iterators()
        if self._closed_event is not None:
            self._closed_event.set()
        log.info("consumer of %s/%s stopped", self.topic, self.channel)

    def _before_drain(self) -> None:
        """Hook: stop is about to wait for outstanding messages."""

    async def _cls(self, sub: Sub) -> None:
        conn = sub.conn
        if conn is None or not conn.is_connected or not conn.subscribed:
            return
        try:
            await conn.cls(timeout=self._config.connection.close_timeout)
        except (NSQError, TimeoutError) as exc:
            log.debug("CLS at %s: %r", sub.endpoint, exc)

    def _requeue_outstanding(self) -> None:
        while self._queue:
            msg = self._queue.popleft()
            owner: Sub = msg._owner  # type: ignore[assignment]
            if owner.closed:
                self._discard(owner)
            else:
                msg.requeue(0, backoff=False)
        for msg in list(self._tracked):
            msg.requeue(0, backoff=False)

    # ------------------------------------------------------------------ connecting

    def _connection_config(self, ext: bool) -> ConnectionConfig:
        cfg = self._conn_configs.get(ext)
        if cfg is None:
            base = self._config.connection
            cfg = base if base.extend_support == ext else base.replace(extend_support=ext)
            self._conn_configs[ext] = cfg
        return cfg

    async def _open(self, ep: Endpoint) -> Sub:
        """Connect and subscribe to ``ep``; return the registered subscription."""
        self._check_open()
        topology = self._conns.topology
        ext = topology.ext if topology.ext is not None else self._config.connection.extend_support
        if self._ordered and ep.partition == NO_PARTITION:
            raise UnsupportedFeatureError(
                f"topic {self.topic!r}: ordered consumption needs a partitioned youzan topic, "
                f"but nsqd {ep.address} serves it without partitions")
        sub = self._new_sub(ep)
        conn = Connection(ep.host, ep.port, self._connection_config(ext),
                          on_message=functools.partial(self._on_message, sub),
                          on_error=self._on_conn_error,
                          on_close=functools.partial(self._on_conn_close, sub))
        sub.conn = conn
        try:
            await conn.connect()
            sub.youzan = conn.flavour is Flavour.YOUZAN
            if conn.flavour is Flavour.STOCK and (self._ordered or self._start_at is not None):
                raise UnsupportedFeatureError(
                    f"nsqd {ep.address} is stock nsqd: "
                    + ("ordered consumption (SUB_ORDERED)" if self._ordered
                       else "start positions (SUB_ADVANCED)") + " needs youzan nsqd")
            mode, offset, seek = self._subscription(ep, topology, conn)
            positioner = None
            start = offset if offset is not None else seek
            if sub.partition is not None and start is not None:
                # read the queue end and the channel's position first: "end" becomes an
                # offset, and the channel's read-ahead is known (consumer.positions)
                positioner = Positioner(
                    self.topic, self.channel, ep, start,
                    timeout=self._config.connection.handshake_timeout, ordered=self._ordered)
                spec = await positioner.prepare()  # None: already there, not moved
                if offset is not None:
                    offset = spec
            await conn.subscribe(self.topic, self.channel, sub.partition, mode, offset,
                                 ext=ext, timeout=self._config.connection.handshake_timeout)
            if positioner is not None or self._ordered:
                # youzan delivers a repositioned channel's read-ahead, and the first
                # message of a channel's first ordered reader twice, outside RDY (§13.1)
                conn.allow_read_ahead()
            if positioner is not None and sub.partition is not None:
                guard = await positioner.settle(already_sent=offset is not None)
                self._guards[sub.partition] = guard
                self._positioned.add(sub.partition)
                sub.seeked = True
                sub.guard = guard
            elif sub.partition is not None and sub.partition in self._guards:
                sub.guard = self._guards[sub.partition]
                sub.guard.new_session()
            sub.local_address = conn.local_address
        except BaseException:
            sub.closed = True
            await conn.close()
            raise
        if self._stopping:
            sub.closed = True
            await conn.close()
            raise ClientClosedError("the consumer is stopping")
        if conn.is_closed:
            raise sub.error if isinstance(sub.error, NSQError) else NSQConnectionError(
                f"nsqd {ep.address} closed the connection right after SUB")
        self._subs.add(sub)
        self._connects += 1
        sub.registered = True
        self._on_subscribed(sub)
        assert self._flow is not None and self._loop is not None
        self._exec(self._flow.add_connection(sub, conn.max_rdy_count, self._loop.time()))
        log.info("subscribed to %s/%s at %s (%s)", self.topic, self.channel, ep, mode)
        return sub

    def _new_sub(self, ep: Endpoint) -> Sub:
        return Sub(self, ep)

    def _on_subscribed(self, sub: Sub) -> None:
        """Hook: a subscription is about to receive RDY."""

    def _start_position(self, partition: int | None) -> OffsetSpec | None:
        start = self._start_at
        if start is None or partition is None or partition in self._positioned:
            return None
        if isinstance(start, OffsetSpec):
            return start
        return start.get(partition)

    def _subscription(self, ep: Endpoint, topology: Topology, conn: Connection
                      ) -> tuple[SubscribeMode, OffsetSpec | None, OffsetSpec | None]:
        """SUB command, SUB_ADVANCED offset, and an offset to set over HTTP instead.

        The server only reads the partition of a 4-token SUB line; ``SUB_ADVANCED t c p
        offset`` lands on the node's default partition (PROTOCOL.md §11.2). That is exact
        only when the node leads one partition of the topic; otherwise the channel is
        positioned with ``POST /channel/setoffset`` on the leader before the first RDY.
        """
        partition = ep.partition if ep.partition != NO_PARTITION else None
        start = self._start_position(partition)
        youzan = conn.flavour is not Flavour.STOCK
        if self._ordered:
            return "ordered", None, start
        if start is not None:
            if topology.partitions_led.get(ep.address, 0) == 1:
                return "advanced", start, None
            return "advanced", None, start
        if youzan and partition is not None and self.trace.is_on(self.topic):
            # positions (offset, raw size) for the trace log
            return "advanced", None, None
        return "plain", None, None

    def _on_conn_error(self, conn: Connection, exc: ServerError) -> None:
        # E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED: the message timed out on the
        # server and went to someone else; nothing to do
        log.debug("nsqd %s: %s", conn.address, exc)

    def _on_conn_close(self, sub: Sub, conn: Connection, exc: BaseException | None) -> None:
        sub.closed = True
        sub.error = exc
        if sub.registered:
            sub.registered = False
            self._subs.discard(sub)
            gone = self._gone
            gone[0] += sub.received
            gone[1] += sub.finished
            gone[2] += sub.requeued
            gone[3] += sub.given_up
            sub.received = sub.finished = sub.requeued = sub.given_up = 0
            if self._flow is not None and self._loop is not None:
                self._flush()
                self._exec(self._flow.remove_connection(sub, self._loop.time()))
        if exc is not None and not self._stopping:
            log.warning("subscription at %s ended: %s", sub.endpoint, exc)

    async def _retire(self, sub: Sub) -> None:
        """``sub``'s endpoint left the topology: stop its deliveries, give its in-flight
        messages a short while, then close."""
        conn = sub.conn
        if conn is None or sub.closed:
            return
        sub.retiring = True
        if sub.registered and self._flow is not None and self._loop is not None:
            self._flush()
            self._exec(self._flow.remove_connection(sub, self._loop.time()))
        conn.send_rdy(0)
        await self._cls(sub)
        if sub.outstanding and not sub.closed:
            sub.drained = asyncio.Event()
            try:
                async with asyncio.timeout(min(_RETIRE_DRAIN, self._config.drain_timeout)):
                    await sub.drained.wait()
            except TimeoutError:
                pass
        await conn.close()

    # ------------------------------------------------------------------ flow control

    def _exec(self, actions: list[Action[Sub]]) -> None:
        for a in actions:
            if type(a) is SendRdy:
                conn = a.conn.conn
                if conn is not None and not a.conn.closed and not (
                        a.count and (self._stopping or a.conn.retiring)):
                    conn.send_rdy(a.count)
            elif isinstance(a, ScheduleTimer):
                assert self._loop is not None and self._flow is not None
                if self._backoff_handle is not None:
                    self._backoff_handle.cancel()
                log.info("consumer of %s/%s backing off for %.3fs (level %d)", self.topic,
                         self.channel, a.delay, self._flow.backoff_level)
                self._backoff_handle = self._loop.call_later(a.delay, self._backoff_ended,
                                                             a.token)

    def _mark(self, sub: Sub) -> None:
        sub.dirty = True
        self._dirty.append(sub)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)  # type: ignore[union-attr]
            # the trace switch is read once per loop iteration, not per message
            self._tracing = self.trace.is_on(self.topic)

    def _flush(self) -> None:
        """Report the received/finished counts gathered since the last flush.

        One call per connection and kind with a ``count``: the controller answers exactly as
        to that many single events, at a fraction of the cost at high message rates."""
        self._flush_scheduled = False
        dirty = self._dirty
        if not dirty:
            return
        flow = self._flow
        assert flow is not None and self._loop is not None
        now = self._loop.time()
        self._dirty = []
        for sub in dirty:
            sub.dirty = False
            n = sub.recv_pending
            if n:
                sub.recv_pending = 0
                sub.received += n
                self._exec(flow.message_received(sub, now, n))
            n = sub.fin_pending
            if n:
                sub.fin_pending = 0
                sub.finished += n
                self._exec(flow.message_finished(sub, now, n))

    def _backoff_ended(self, token: int) -> None:
        self._backoff_handle = None
        if self._stopping or self._flow is None or self._loop is None:
            return
        self._flush()
        log.info("consumer of %s/%s: backoff pause over, testing the waters", self.topic,
                 self.channel)
        self._exec(self._flow.timer_fired(token, self._loop.time()))

    def _redistribute(self) -> None:
        if self._stopping or self._flow is None or self._loop is None:
            return
        self._flush()
        self._exec(self._flow.redistribute(self._loop.time()))
        self._redistribute_handle = self._loop.call_later(
            self._config.rdy_redistribute_interval, self._redistribute)

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` at run time; 0 pauses every subscription."""
        check_count(max_in_flight, "max_in_flight")
        self._check_open()
        self._max_in_flight = max_in_flight
        if self._flow is not None and self._loop is not None:
            self._flush()
            self._exec(self._flow.set_max_in_flight(max_in_flight, self._loop.time()))
            if self._queue and not self._pumping:
                self._wake()

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def is_starved(self) -> bool:
        """True when some subscription has messages in flight and ≥ 85 % of its RDY used:
        a batching handler should process what it holds now ("Building Client
        Libraries")."""
        check_loop(self._loop, "this Consumer")
        if self._flow is None:
            return False
        self._flush()
        return self._flow.is_starved()

    # ------------------------------------------------------------------ receiving

    def _on_message(self, sub: Sub, conn: Connection, raw: RawMessage) -> None:
        sub.recv_pending += 1
        if not sub.dirty:
            self._mark(sub)
        msg = Message(raw, sub)
        if self._tracing:
            self._trace_message(sub, msg)
        guard = sub.guard
        if guard is not None and not guard.admit(msg):
            self._drop_before_start(sub, msg)
            return
        if self._ordered:
            if not self._admit(sub, msg):
                return
        elif self._max_attempts and raw.attempts > self._max_attempts:
            self._give_up(sub, msg)
            return
        self._outstanding += 1
        sub.outstanding += 1
        # _enqueue inlined: this runs for every message
        if self._handler is not None:
            self._queue.append(msg)
            if not self._pumping and not self._waking:
                self._wake()
        else:
            self._enqueue(msg)

    def _enqueue(self, msg: Message) -> None:
        """Hand an outstanding message to the handler or the iterator."""
        if self._handler is not None:
            self._queue.append(msg)
            if not self._pumping and not self._waking:
                self._wake()
        elif self._stopping:
            msg.requeue(0, backoff=False)
        else:
            self._tracked.add(msg)
            self._buffer.append(msg)
            if self._iter_waiters:
                fut = self._iter_waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

    def _drop_before_start(self, sub: Sub, msg: Message) -> None:
        """Finish a delivery from before the start position without the handler; the
        base class's FIN, so an ordered partition's position does not move to it."""
        log.debug("%s/%s partition %s: finished message at offset %s before the start "
                  "position quietly", self.topic, self.channel, sub.partition, msg.offset)
        self._dropped_before_start += 1
        self._outstanding += 1
        sub.outstanding += 1
        msg._state = _FINISHED
        Consumer._finish(self, sub, msg)

    def _admit(self, sub: Sub, msg: Message) -> bool:
        """Hook of the ordered consumer: True to deliver ``msg``; on False the hook has
        taken charge of it (and counted it as outstanding if it keeps it)."""
        return True

    def _trace_message(self, sub: Sub, msg: Message) -> None:
        raw = msg._raw
        fields = {
            "event": "consume",
            "topic": self.topic,
            "channel": self.channel,
            "partition": sub.partition,
            "nsqd": sub.address,
            "local_address": sub.local_address,
            "internal_id": raw.internal_id if sub.youzan else None,
            "trace_id": raw.trace_id if sub.youzan else None,
            "offset": raw.offset,
            "raw_size": raw.raw_size,
            "attempts": raw.attempts,
            "message_id": raw.id.hex(),
        }
        _trace.trace_logger.info(
            "consumed topic=%s channel=%s partition=%s nsqd=%s local=%s internal_id=%s "
            "trace_id=%s offset=%s raw_size=%s attempts=%d", self.topic, self.channel,
            sub.partition, sub.address, sub.local_address, fields["internal_id"],
            fields["trace_id"], raw.offset, raw.raw_size, raw.attempts, extra=fields)

    def _give_up(self, sub: Sub, msg: Message) -> None:
        self._outstanding += 1
        sub.outstanding += 1
        msg.finish()
        sub.given_up += 1
        cb = self._giving_up
        if cb is None:
            log.warning("giving up on message %s of %s/%s after %d attempts (max_attempts "
                        "%d); finished it", msg.id.hex(), self.topic, self.channel,
                        msg.attempts, self._max_attempts)
            return
        self._call_user(cb, msg, what="giving_up callback")

    def _call_user(self, cb: Callable[..., object], *args: Any, what: str) -> None:
        """Run a user callback that may be sync or async; errors are logged."""
        try:
            result = cb(*args)
        except Exception:
            log.exception("%s failed", what)
            return
        if inspect.isawaitable(result):
            async def run(aw: Awaitable[object]) -> None:
                try:
                    await aw
                except Exception:
                    log.exception("%s failed", what)
            self._spawn(run(result))

    # ------------------------------------------------------------------ answering

    def _finish(self, sub: Sub, msg: Message) -> bool:
        conn = sub.conn
        ok = conn is not None and conn.fin(msg._raw.id)
        sub.outstanding -= 1
        sub.fin_pending += 1
        if not sub.dirty:
            self._mark(sub)
        self._outstanding -= 1
        if self._tracked:
            self._tracked.discard(msg)
        if self._drained is not None or sub.drained is not None:
            self._settled(sub)
        return ok

    def _requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool) -> bool:
        delay_ms = self._policy.requeue_delay_ms(msg._raw.attempts, delay)
        conn = sub.conn
        ok = conn is not None and conn.req(msg._raw.id, delay_ms)
        self._requeued(sub, msg, backoff)
        return ok

    def _requeued(self, sub: Sub, msg: Message, backoff: bool) -> None:
        sub.requeued += 1
        sub.outstanding -= 1
        self._outstanding -= 1
        self._tracked.discard(msg)
        if self._flow is not None and self._loop is not None:
            self._flush()
            self._exec(self._flow.message_requeued(sub, self._loop.time(),
                                                   backoff=backoff))
        self._settled(sub)

    def _discard(self, sub: Sub) -> None:
        """A queued message whose connection is gone: the server redelivers it."""
        sub.outstanding -= 1
        self._outstanding -= 1
        self._settled(sub)

    def _settled(self, sub: Sub) -> None:
        if self._drained is not None and not self._outstanding:
            self._drained.set()
        if sub.drained is not None and not sub.outstanding:
            sub.drained.set()

    # ------------------------------------------------------------------ handler workers

    def _wake(self, count: int = 1) -> None:
        """Get ``count`` more workers going (idle ones first), within the worker cap."""
        while count > 0 and self._idle:
            fut = self._idle.pop()
            if not fut.done():
                self._waking = True
                fut.set_result(None)
                count -= 1
        if count <= 0 or self._closed:
            return
        room = max(1, self._max_in_flight) - len(self._workers)
        assert self._loop is not None
        for _ in range(min(count, room)):
            self._waking = True
            task = self._loop.create_task(self._worker())
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _worker(self) -> None:
        queue = self._queue
        popleft = queue.popleft
        handler = self._handler
        finish = self._finish
        tracked = self._tracked
        assert handler is not None and self._loop is not None
        loop = self._loop
        me = asyncio.current_task()
        assert me is not None
        st = _Stall()
        while True:
            # whoever woke this worker is answered: the next arrival may wake another
            self._waking = False
            if not queue:
                if self._closed:
                    return
                fut: asyncio.Future[None] = loop.create_future()
                self._idle.append(fut)
                try:
                    await fut
                finally:
                    if fut in self._idle:
                        self._idle.remove(fut)
                continue
            self._pumping += 1
            st.batch += 1
            st.stalled = False
            # runs at the next loop turn: if this batch is still going then, a handler
            # suspended (inline handlers never yield to the loop)
            loop.call_soon(self._stall_check, st, st.batch)
            inline = 0
            try:
                while queue:
                    msg = popleft()
                    sub: Sub = msg._owner  # type: ignore[assignment]
                    if sub.closed and msg._state == _PENDING:
                        self._discard(sub)
                        continue
                    st.msg = msg
                    try:
                        await handler(msg)
                    except asyncio.CancelledError as exc:
                        if me.cancelling():
                            raise
                        self._handler_failed(msg, exc)
                    except Exception as exc:
                        self._handler_failed(msg, exc)
                    else:
                        if msg._state == _PENDING:
                            if msg._auto:
                                # Message.finish() without its two indirections
                                msg._state = _FINISHED
                                finish(sub, msg)
                            else:
                                tracked.add(msg)
                    if st.stalled:
                        # back from a suspension: pumping again, watched again
                        st.stalled = False
                        if msg._state != _PENDING:
                            tracked.discard(msg)
                        self._pumping += 1
                        st.batch += 1
                        loop.call_soon(self._stall_check, st, st.batch)
                    inline += 1
                    if inline >= _INLINE_BATCH:
                        # let I/O in; not a handler suspension, so the check is re-armed
                        inline = 0
                        st.batch += 1
                        await asyncio.sleep(0)
                        st.batch += 1
                        loop.call_soon(self._stall_check, st, st.batch)
            finally:
                st.msg = None
                st.batch += 1
                if not st.stalled:
                    self._pumping -= 1

    def _stall_check(self, st: _Stall, batch: int) -> None:
        """A worker's handler suspended: let other workers take the queue meanwhile."""
        if st.batch != batch or st.stalled:
            return
        st.stalled = True
        self._pumping -= 1
        msg = st.msg
        if msg is not None and msg._state == _PENDING:
            # outstanding outside the queue: stop() must be able to find it
            self._tracked.add(msg)
        if self._queue and not self._waking:
            # handlers that suspend probably all do: start several workers at once rather
            # than one per loop turn (each of them does the same when it stalls)
            self._wake(min(len(self._queue), _WAKE_BURST))

    def _handler_failed(self, msg: Message, exc: BaseException) -> None:
        log.warning("handler failed for message %s (attempt %d) of %s/%s: %r",
                    msg.id.hex(), msg.attempts, self.topic, self.channel, exc,
                    exc_info=log.isEnabledFor(logging.DEBUG))
        if msg._state == _PENDING:
            if msg._auto:
                msg.requeue()
            else:
                self._tracked.add(msg)

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
        if not self._started and not self._closed:
            await self.start()
        while True:
            buf = self._buffer
            while buf:
                msg = buf.popleft()
                owner: Sub = msg._owner  # type: ignore[assignment]
                if owner.closed and msg._state == _PENDING:
                    self._tracked.discard(msg)
                    self._discard(owner)
                    continue
                return msg
            if self._stopping or self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            assert self._loop is not None
            fut: asyncio.Future[None] = self._loop.create_future()
            self._iter_waiters.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    fut.cancel()

    def _wake_iterators(self) -> None:
        while self._iter_waiters:
            fut = self._iter_waiters.popleft()
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ stats

    def stats(self) -> ConsumerStats:
        """Totals and per-subscription counters, backoff state."""
        if self._flow is not None and self._loop is not None and not self._closed:
            self._flush()
        subs = sorted(self._subs, key=lambda s: (
            s.address, s.partition if s.partition is not None else NO_PARTITION))
        per = tuple(
            SubscriptionStats(
                address=s.address, partition=s.partition,
                connected=s.conn is not None and s.conn.is_connected,
                rdy=s.conn.rdy if s.conn is not None else 0, in_flight=s.outstanding,
                received=s.received, finished=s.finished, requeued=s.requeued,
                given_up=s.given_up)
            for s in subs)
        flow = self._flow
        gone = self._gone
        return ConsumerStats(
            topic=self.topic,
            channel=self.channel,
            received=gone[0] + sum(s.received for s in subs),
            finished=gone[1] + sum(s.finished for s in subs),
            requeued=gone[2] + sum(s.requeued for s in subs),
            given_up=gone[3] + sum(s.given_up for s in subs),
            in_flight=self._outstanding,
            max_in_flight=self._max_in_flight,
            total_rdy=flow.total_rdy if flow is not None else 0,
            backoff_level=flow.backoff_level if flow is not None else 0,
            in_backoff=flow.in_backoff if flow is not None else False,
            backoff_paused=flow.backoff_window_active if flow is not None else False,
            starved=flow.is_starved() if flow is not None else False,
            connects=self._connects,
            subscriptions=per,
            dropped_before_start=self._dropped_before_start,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "stopping" if self._stopping else \
            "running" if self._started else "new"
        return f"<Consumer {self.topic}/{self.channel} {state} subscriptions={len(self._subs)}>"
