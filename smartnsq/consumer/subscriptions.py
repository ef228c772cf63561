"""The consumer's subscription set: one :class:`~smartnsq.consumer.sub.Sub` per (nsqd,
partition) endpoint.

It opens subscriptions (connect, SUB in the right mode, start positions), registers them
with the flow control, closes them out (their counts move to the totals of closed
subscriptions) and retires those whose endpoint left the topology. It is the opener that
:class:`~smartnsq.consumer.conns.ConnectionSet` calls, so it follows leaders through
``conns.py``. Callers: the connection set (:meth:`SubscriptionSet.open`, ``Sub.retire``),
subscriptions (``Sub.on_close``: their connection ended), the consumer (stop: :meth:`cls`,
:meth:`close_all`; stats).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping

from smartnsq import trace as _trace
from smartnsq.config import ConnectionConfig, ConsumerConfig
from smartnsq.conn import Connection, SubscribeMode
from smartnsq.consumer.conns import ConnectionSet
from smartnsq.consumer.discovery import NO_PARTITION, Discovery, Endpoint, Topology
from smartnsq.consumer.dispatch import Dispatcher
from smartnsq.consumer.meters import ConsumerMeters
from smartnsq.consumer.policy import DeliveryPolicy
from smartnsq.consumer.positions import Positioner, StartGuard
from smartnsq.consumer.rdy_driver import RdyDriver
from smartnsq.consumer.stats import SubscriptionStats
from smartnsq.consumer.sub import Sub
from smartnsq.errors import (
    ClientClosedError,
    Flavour,
    NSQConnectionError,
    NSQError,
    SubOrderIsMustError,
    UnsupportedFeatureError,
)
from smartnsq.protocol.commands import OffsetSpec

__all__ = ["SubscriptionSet"]

log = logging.getLogger("smartnsq.consumer")

#: how long a subscription that is no longer listed may drain before it is closed
_RETIRE_DRAIN = 5.0


class SubscriptionSet:
    """The registered subscriptions of one consumer, and how they are opened and closed."""

    def __init__(self, topic: str, channel: str, config: ConsumerConfig,
                 policy: DeliveryPolicy, dispatch: Dispatcher, driver: RdyDriver,
                 start_at: Mapping[int, OffsetSpec] | OffsetSpec | None,
                 trace: _trace.Tracing, discovery: Discovery, *,
                 is_fatal: Callable[[BaseException, bool], bool],
                 on_fatal: Callable[[BaseException], None], rng: random.Random) -> None:
        self.topic = topic
        self.channel = channel
        self._config = config
        self._policy = policy
        self._dispatch = dispatch
        self._driver = driver
        self._start_at = start_at
        self._trace = trace
        #: runs one opener per endpoint and reconnects (it calls open())
        self.conns = ConnectionSet(
            discovery, self.open, is_fatal=is_fatal, on_fatal=on_fatal,
            reconnect_min=config.reconnect_min, reconnect_max=config.reconnect_max,
            rng=rng, max_connecting=config.max_concurrent_connects)
        #: registered (subscribed, not closed) subscriptions
        self.subs: set[Sub] = set()
        self._conn_configs: dict[bool, ConnectionConfig] = {}
        self._positioned: set[int] = set()
        #: per positioned partition, for the consumer's life (see consumer.positions)
        self._guards: dict[int, StartGuard] = {}
        #: totals of subscriptions that are gone: received, finished, requeued, given up
        self.gone = [0, 0, 0, 0]
        self.connects = 0
        #: the consumer is stopping: no new subscriptions
        self.closing = False
        self._discovery = discovery
        #: the last topology had nothing to subscribe to (said once, and when it ends)
        self._waiting = False
        #: a topology had endpoints once (an empty one later means they went)
        self._had_endpoints = False
        #: the consumer's metrics, set at start when they are on
        self.meters: ConsumerMeters | None = None

    def new_sub(self, ep: Endpoint) -> Sub:
        sub = Sub(ep, self.topic, self.channel, self._dispatch, self._retire, self._ended)
        if self.meters is not None:
            sub.meters = self.meters.sub(sub.address, sub.partition)
        return sub

    # ------------------------------------------------------------------ topology

    def check_topology(self, topology: Topology) -> None:
        """Raise the configuration error that subscribing to ``topology`` would meet."""
        ordered = self._policy.ordered
        if topology.flavour is Flavour.STOCK:
            if ordered:
                raise UnsupportedFeatureError(
                    f"topic {self.topic!r}: ordered consumption (SUB_ORDERED) needs youzan "
                    "nsqd; the lookupds are stock nsqlookupd")
            if self._start_at is not None:
                raise UnsupportedFeatureError(
                    f"topic {self.topic!r}: start positions (SUB_ADVANCED) need youzan nsqd; "
                    "the lookupds are stock nsqlookupd")
        if topology.ordered and not ordered:
            raise SubOrderIsMustError(
                "this topic is configured only allow ordered sub: use smartnsq.ordered."
                "OrderedConsumer", topic=self.topic, fatal=False)

    def follow(self, topology: Topology) -> None:
        """Caller: the consumer, with every topology. Check it (raises the configuration
        error subscribing would meet), say when there is nothing to subscribe to and when
        that ends, and reconcile the connections with it."""
        self.check_topology(topology)
        if not topology.endpoints:
            if not self._waiting:
                # a topic whose every nsqd went (a leader lost) is not one still to come
                log.warning("consumer of %s/%s: %s; waiting for it to %s", self.topic,
                            self.channel, self._discovery.describe_empty(),
                            "come back" if self._had_endpoints else "appear")
            self._waiting = True
        else:
            if self._waiting:
                self._waiting = False
                log.info("consumer of %s/%s: the topic %s (%d endpoint(s))", self.topic,
                         self.channel, "came back" if self._had_endpoints else "appeared",
                         len(topology.endpoints))
            self._had_endpoints = True
        self.conns.reconcile(topology)

    def start_bound(self) -> float | None:
        """How long start() waits for first attempts: all of them when they can all run at
        once, else one connect's time (the rest queue for a slot in the background)."""
        if len(self.conns) <= self._config.max_concurrent_connects:
            return None
        c = self._config.connection
        return c.dial_timeout + 2 * c.handshake_timeout

    def stats(self) -> tuple[tuple[SubscriptionStats, ...], tuple[int, int, int, int]]:
        """Per registered subscription, and totals (received, finished, requeued, given up)
        including the subscriptions that are gone."""
        subs = sorted(self.subs, key=lambda s: (
            s.address, s.partition if s.partition is not None else NO_PARTITION))
        per = tuple(
            SubscriptionStats(
                address=s.address, partition=s.partition,
                connected=s.conn is not None and s.conn.is_connected,
                rdy=s.conn.rdy if s.conn is not None else 0, in_flight=s.outstanding,
                received=s.received, finished=s.finished, requeued=s.requeued,
                given_up=s.given_up)
            for s in subs)
        gone = self.gone
        return per, (gone[0] + sum(s.received for s in subs),
                     gone[1] + sum(s.finished for s in subs),
                     gone[2] + sum(s.requeued for s in subs),
                     gone[3] + sum(s.given_up for s in subs))

    # ------------------------------------------------------------------ opening

    def _connection_config(self, ext: bool) -> ConnectionConfig:
        cfg = self._conn_configs.get(ext)
        if cfg is None:
            base = self._config.connection
            cfg = base if base.extend_support == ext else base.replace(extend_support=ext)
            self._conn_configs[ext] = cfg
        return cfg

    async def open(self, ep: Endpoint) -> Sub:
        """Connect and subscribe to ``ep``; return the registered subscription."""
        if self.closing:
            raise ClientClosedError(f"consumer of {self.topic}/{self.channel} is closed")
        topology = self.conns.topology
        ext = topology.ext if topology.ext is not None else self._config.connection.extend_support
        ordered = self._policy.ordered
        if ordered and ep.partition == NO_PARTITION:
            raise UnsupportedFeatureError(
                f"topic {self.topic!r}: ordered consumption needs a partitioned youzan topic, "
                f"but nsqd {ep.address} serves it without partitions")
        sub = self.new_sub(ep)
        conn = Connection(ep.host, ep.port, self._connection_config(ext), delegate=sub)
        sub.conn = conn
        positioner: Positioner | None = None
        try:
            await conn.connect()
            sub.youzan = conn.flavour is Flavour.YOUZAN
            if conn.flavour is Flavour.STOCK and (ordered or self._start_at is not None):
                raise UnsupportedFeatureError(
                    f"nsqd {ep.address} is stock nsqd: "
                    + ("ordered consumption (SUB_ORDERED)" if ordered
                       else "start positions (SUB_ADVANCED)") + " needs youzan nsqd")
            mode, offset, seek = self._subscription(ep, topology, conn)
            start = offset if offset is not None else seek
            if sub.partition is not None and start is not None:
                # read the queue end and the channel's position first: "end" becomes an
                # offset, and the channel's read-ahead is known (consumer.positions)
                positioner = Positioner(
                    self.topic, self.channel, ep, start,
                    timeout=self._config.connection.handshake_timeout, ordered=ordered)
                spec = await positioner.prepare()  # None: already there, not moved
                if offset is not None:
                    offset = spec
            sub.subscriber = await conn.subscribe(
                self.topic, self.channel, sub.partition, mode, offset, ext=ext,
                timeout=self._config.connection.handshake_timeout)
            if positioner is not None or ordered:
                # youzan delivers a repositioned channel's read-ahead, and the first
                # message of a channel's first ordered reader twice, outside RDY
                # (docs/protocol.md §13.2.2)
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
            if positioner is not None:
                await positioner.close()  # settle() never ran: its HTTP session is still open
            await conn.close()
            raise
        if self.closing:
            sub.closed = True
            await conn.close()
            raise ClientClosedError("the consumer is stopping")
        if conn.is_closed:
            raise sub.error if isinstance(sub.error, NSQError) else NSQConnectionError(
                f"nsqd {ep.address} closed the connection right after SUB")
        self.subs.add(sub)
        self.connects += 1
        if sub.meters is not None:
            sub.meters.connects.inc()
        sub.registered = True
        self._policy.on_subscribed(sub)
        self._driver.added(sub, conn.max_rdy_count)
        log.info("subscribed to %s/%s at %s (%s)", self.topic, self.channel, ep, mode)
        return sub

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
        offset`` lands on the node's default partition (docs/protocol.md §12.2). That is exact
        only when the node leads one partition of the topic; otherwise the channel is
        positioned with ``POST /channel/setoffset`` on the leader before the first RDY.
        """
        partition = ep.partition if ep.partition != NO_PARTITION else None
        start = self._start_position(partition)
        youzan = conn.flavour is not Flavour.STOCK
        if self._policy.ordered:
            return "ordered", None, start
        if start is not None:
            if topology.partitions_led.get(ep.address, 0) == 1:
                return "advanced", start, None
            return "advanced", None, start
        if youzan and partition is not None and self._trace.positions:
            # positions (offset, raw size) for the trace log
            return "advanced", None, None
        return "plain", None, None

    # ------------------------------------------------------------------ closing

    def _ended(self, sub: Sub, exc: BaseException | None) -> None:
        """Caller: ``sub.on_close``, once its connection is closed (``exc``: why, None after
        a clean close). A registered subscription leaves the set and the flow control; its
        counts move to the totals."""
        if sub.registered:
            sub.registered = False
            self.subs.discard(sub)
            # the driver flushes this turn's pending received/finished counts into the
            # subscription first, so they reach the totals with the rest
            self._driver.removed(sub)
            gone = self.gone
            gone[0] += sub.received
            gone[1] += sub.finished
            gone[2] += sub.requeued
            gone[3] += sub.given_up
            sub.received = sub.finished = sub.requeued = sub.given_up = 0
        if exc is not None and not self.closing:
            log.warning("subscription at %s ended: %s", sub.endpoint, exc)

    async def _retire(self, sub: Sub) -> None:
        """``sub``'s endpoint left the topology: stop its deliveries, give its in-flight
        messages a short while, then close."""
        conn = sub.conn
        if conn is None or sub.closed:
            return
        sub.retiring = True
        if sub.registered:
            self._driver.removed(sub)
        conn.send_rdy(0)
        await self.cls(sub)
        if sub.outstanding and not sub.closed:
            sub.drained = asyncio.Event()
            try:
                async with asyncio.timeout(min(_RETIRE_DRAIN, self._config.drain_timeout)):
                    await sub.drained.wait()
            except TimeoutError:
                pass
        await conn.close()

    async def cls(self, sub: Sub) -> None:
        """CLS on ``sub`` and wait for CLOSE_WAIT (bounded by the close timeout)."""
        conn = sub.conn
        if conn is None or not conn.is_connected or not conn.subscribed:
            return
        try:
            await conn.cls(timeout=self._config.connection.close_timeout)
        except (NSQError, TimeoutError) as exc:
            log.debug("CLS at %s: %r", sub.endpoint, exc)

    def rdy_zero(self) -> None:
        """Caller: stop(). RDY 0 on every subscription that has RDY."""
        for sub in list(self.subs):
            if sub.conn is not None and sub.conn.is_connected and sub.conn.rdy:
                sub.conn.send_rdy(0)

    async def cls_all(self) -> None:
        await asyncio.gather(*(self.cls(sub) for sub in list(self.subs)))

    async def close_all(self, within: float) -> None:
        """Close every connection within ``within`` seconds; what was written goes out
        first."""
        await asyncio.gather(*(sub.conn.close(within)
                               for sub in list(self.subs) if sub.conn is not None),
                             return_exceptions=True)
