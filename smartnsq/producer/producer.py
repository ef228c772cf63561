"""The asyncio :class:`Producer` for stock nsqd and youzan's partitioned NSQ.

Two ways to find nsqd:

* ``nsqd_tcp_addresses=[...]`` — publishes go round-robin to the healthy nodes; a node that
  is unreachable or whose connection dies is skipped (and redialled in the background with
  capped backoff) and its unacknowledged publishes are retried on another node.
* ``lookupd=...`` — the lookup component (``access=w``, ``metainfo=true``) says where each
  topic lives: on youzan, which node leads which partition (round-robin over the writable
  partitions, or ``partition=p``, or the shard key's partition); on stock lookupds, which nodes
  carry the topic. Leader-type errors drop the mapping and trigger one coalesced refresh.

Every publish is bounded by its ``timeout`` (default ``publish_timeout``) and by
``max_attempts`` (waiting for a partition leader, or for our own connection to a node to be
redialled, counts against the timeout only);
:mod:`smartnsq.producer.retry` holds the rule. A publish that could not be
acknowledged raises :class:`PublishError` (``__cause__``: the error that finally failed it),
or :class:`PublishTimeoutError` when its time ran out; one acknowledged with OK is done and
never resent. Cancelling a publish never corrupts its connection (the response still takes its
FIFO slot). Bad arguments raise :class:`ConfigError` (or :class:`InvalidNameError`) before any
I/O; youzan-only features against stock nsqd (and DPUB against youzan) raise
:class:`UnsupportedFeatureError`.
"""

# Per-call ``timeout`` arguments are the API (they bound the whole call, retries included);
# asyncio.timeout() around the call could not keep a timed-out publish's FIFO slot.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from smartnsq._checks import check_duration, check_loop
from smartnsq.config import LookupConfig, ProducerConfig
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    Flavour,
    LookupFailedError,
    NoLeaderError,
    NSQConnectionError,
    NSQError,
    PublishError,
    TopicNotFoundError,
    UnsupportedFeatureError,
)
from smartnsq.lookup import Lookup
from smartnsq.ordered.sharding import (
    ShardKey,
    ShardRule,
    check_shard_key,
    shard_partition,
    shard_trace_id,
)
from smartnsq.producer.batcher import Batcher, split_batches
from smartnsq.producer.checks import check_body, deadline
from smartnsq.producer.checks import delay_ms as dpub_delay_ms
from smartnsq.producer.lanes import ShardLanes
from smartnsq.producer.ops import (
    DPub,
    MPub,
    MPubExt,
    MPubTrace,
    Op,
    Pub,
    PubExt,
    PubTrace,
    check_trace_id,
    ext_header_bytes,
)
from smartnsq.producer.pool import NodePool
from smartnsq.producer.retry import Action, classify, retry_delay
from smartnsq.producer.router import Routes, TopicRoute
from smartnsq.producer.trace import TraceSwitch, log_receipt
from smartnsq.producer.trace import switch as trace_switch
from smartnsq.producer.types import PublishReceipt, PublishTimeoutError
from smartnsq.protocol.validation import (
    check_partition,
    check_topic,
    parse_tcp_address,
)

logger = logging.getLogger("smartnsq.producer")

ExtHeader = Mapping[str, Any]
LookupdSpec = LookupConfig | Lookup | str | Sequence[str]

#: per-message bytes inside an MPUB_TRACE element beyond the body (the trace id)
_TRACE_EXTRA = 8


class Producer:
    """Publishes to stock or youzan nsqd (see the module docstring).

    Use as ``async with Producer(...) as p:`` or call :meth:`close` when done. Connections are
    made on first use. ``trace`` is the run-time trace switch (``producer.trace``): by
    default the process-wide :data:`smartnsq.trace.switch`, shared with consumers.
    """

    def __init__(self, nsqd_tcp_addresses: Sequence[str] | None = None, *,
                 lookupd: LookupdSpec | None = None, config: ProducerConfig | None = None,
                 trace: TraceSwitch | None = None) -> None:
        if config is None:
            config = ProducerConfig()
        elif not isinstance(config, ProducerConfig):
            raise ConfigError(f"config must be a ProducerConfig, got {type(config).__name__}")
        if (nsqd_tcp_addresses is None) == (lookupd is None):
            raise ConfigError("give either nsqd_tcp_addresses or lookupd (not both)")
        self.config = config
        #: the trace switch: the process-wide ``smartnsq.trace.switch`` unless one is given
        self.trace = trace if trace is not None else trace_switch
        self._max_msg = config.max_msg_size
        self._max_body = config.max_body_size
        self._max_attempts = config.max_attempts
        self._timeout = config.publish_timeout
        self._pools: dict[str, NodePool] = {}
        self._direct: list[NodePool] = []
        self._rr = 0
        self._rng = random.Random()
        #: bounds dials across all nodes (many nodes listed must not mean as many dials)
        self._connect_slots = asyncio.Semaphore(config.max_concurrent_connects)
        self._routes: Routes | None = None
        self._lookup: Lookup | None = None
        self._own_lookup = False
        if nsqd_tcp_addresses is not None:
            if isinstance(nsqd_tcp_addresses, str):
                nsqd_tcp_addresses = [nsqd_tcp_addresses]
            if not nsqd_tcp_addresses:
                raise ConfigError("nsqd_tcp_addresses is empty")
            for a in nsqd_tcp_addresses:
                parse_tcp_address(a)
                if a not in self._pools:
                    pool = self._new_pool(a, auto_reconnect=True)
                    self._direct.append(pool)
        else:
            self._lookup, self._own_lookup = make_lookup(lookupd)
            self._routes = Routes(self._lookup)
        self._batcher: Batcher | None = None
        if config.linger > 0:
            self._batcher = Batcher(self._send_batch, linger=config.linger,
                                    max_batch=config.max_batch, max_body_size=self._max_body)
        self._lanes = ShardLanes(self._publish_shard)
        self._topics_ok: set[str] = set()
        self._up_waiters: set[asyncio.Future[None]] = set()
        self._active = 0
        self._idle: asyncio.Future[None] | None = None
        self._closed = False
        self._started = False
        #: the event loop this producer runs on: bound by the first call (see _on_loop)
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        mode = "lookupd" if self._routes is not None else "direct"
        return f"<Producer {mode} nodes={list(self._pools)} closed={self._closed}>"

    # ------------------------------------------------------------------ life cycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the lookup component (lookupd mode); connections are still made lazily."""
        self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is closed")
        if self._started:
            return
        self._started = True
        if self._lookup is not None and self._own_lookup:
            await self._lookup.start()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self, timeout: float | None = None) -> None:
        """Stop accepting publishes, let the ones already accepted finish (batches and ordered
        lanes included) within ``timeout`` seconds (default ``publish_timeout``), then close
        the connections (outstanding answers are awaited up to the connections'
        ``close_timeout``) and the lookup component if this producer made it. Idempotent."""
        # checked before anything changes: a bad value must not leave a half-closed producer
        limit = self.config.publish_timeout if timeout is None else check_duration(
            timeout, "timeout")
        self._on_loop()
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(limit):
                await self._lanes.drain()
                if self._batcher is not None:
                    await self._batcher.drain()
                await self._wait_idle()
        except TimeoutError:
            logger.warning("producer closed with publishes still in flight after %.1fs", limit)
        await self._lanes.abort()
        if self._batcher is not None:
            await self._batcher.abort()
        for fut in self._up_waiters:
            if not fut.done():
                fut.set_result(None)
        if self._routes is not None:
            await self._routes.close()
        await asyncio.gather(*(p.close() for p in self._pools.values()), return_exceptions=True)
        if self._lookup is not None and self._own_lookup:
            await self._lookup.close()

    async def _wait_idle(self) -> None:
        while self._active:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)

    # ------------------------------------------------------------------ introspection

    @property
    def lookup(self) -> Lookup | None:
        """The lookup component (lookupd mode)."""
        return self._lookup

    @property
    def pools(self) -> Mapping[str, NodePool]:
        """Connection pools by nsqd address (``host:port``)."""
        return dict(self._pools)

    @property
    def refreshes(self) -> int:
        """Lookup refreshes this producer asked for after leader-type errors (each shared by
        every publish that needed it)."""
        return self._routes.refreshes if self._routes is not None else 0

    @property
    def batcher(self) -> Batcher | None:
        return self._batcher

    def route(self, topic: str) -> TopicRoute | None:
        """The cached route of ``topic`` (lookupd mode), without I/O."""
        if self._routes is None:
            return None
        return self._routes.cached(topic, asyncio.get_running_loop().time())

    # ------------------------------------------------------------------ validation

    def _on_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop, which must be this producer's: its connections, futures and
        timers belong to one loop, and a publish from another one would go out and then
        fail (a retry would duplicate it). Refused before anything is written."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is None:
                self._loop = loop
            else:
                check_loop(self._loop, "this Producer")
        return loop

    def _check_open(self) -> None:
        self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is closed")

    def _check_topic(self, topic: str) -> None:
        if topic.__class__ is not str or topic not in self._topics_ok:
            check_topic(topic)
            if len(self._topics_ok) < 10000:
                self._topics_ok.add(topic)

    def _check_body(self, body: object) -> bytes:
        return check_body(body, self._max_msg)

    def _deadline(self, timeout: float | None) -> float:
        return deadline(timeout, self.config.publish_timeout)

    # ------------------------------------------------------------------ public API

    async def publish(self, topic: str, body: bytes, *, partition: int | None = None,
                      trace_id: int | None = None, ext: ExtHeader | None = None,
                      timeout: float | None = None) -> PublishReceipt | None:
        """Publish one message; returns its :class:`PublishReceipt` when it was traced
        (``trace_id`` given, or tracing on for the topic, on youzan), else None.

        ``partition``: youzan partition (default: round-robin over writable partitions).
        ``trace_id``: PUB_TRACE with this uint64 trace id (youzan). ``ext``: JSON header dict
        → PUB_EXT (youzan ext topics; with ``trace_id`` it is sent as ``##trace_id`` and the
        answer is a receipt). With auto-batching on (``linger`` > 0) plain publishes are
        sent in MPUBs shared with concurrent callers.
        """
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._on_loop()
        if self._closed:
            raise ClientClosedError("the producer is closed")
        # the type test first: an unhashable topic must not reach the set lookup
        if topic.__class__ is not str or topic not in self._topics_ok:
            self._check_topic(topic)
        if type(body) is not bytes or not 0 < len(body) <= self._max_msg:
            body = self._check_body(body)
        if partition is not None:
            check_partition(partition)
        deadline = loop.time() + self._timeout if timeout is None else self._deadline(timeout)
        op: Op
        if ext is None and trace_id is None and self._batcher is not None:
            # tracing is decided per batch when it is sent
            await self._batcher.add((topic, partition), body, deadline)
            return None
        traced = self.trace.is_on(topic)
        if ext is not None:
            header = ext_header_bytes(ext, trace_id)
            op = PubExt(topic, partition, body, header, trace_id is not None)
        elif trace_id is not None:
            op = PubTrace(topic, partition, body, check_trace_id(trace_id))
        else:
            op = Pub(topic, partition, body, traced)
        receipt = await self._execute(op, deadline)
        if receipt is not None and traced:
            log_receipt(receipt)
        return receipt

    async def publish_many(self, topic: str, bodies: Sequence[bytes], *,
                           partition: int | None = None, trace_id: int | None = None,
                           ext: ExtHeader | None = None,
                           timeout: float | None = None) -> list[PublishReceipt]:
        """Publish ``bodies`` with MPUB (MPUB_TRACE with ``trace_id``, MPUB_EXT with
        ``ext``), split into several MPUBs when one would exceed ``max_body_size``. Each MPUB
        is atomic and acknowledged on its own; they are sent one after another, in order.
        Returns the receipt of every MPUB_TRACE (first message's id and offset, batch raw
        size), or ``[]`` when nothing was traced. On failure the raised error's
        ``sent`` attribute says how many leading messages were acknowledged."""
        self._check_open()
        self._check_topic(topic)
        if isinstance(bodies, bytes | str) or not isinstance(bodies, Sequence):
            raise ConfigError("bodies must be a sequence of bytes")
        if not bodies:
            raise ConfigError("publish_many needs at least one message")
        checked = [self._check_body(b) for b in bodies]
        if partition is not None:
            check_partition(partition)
        deadline = self._deadline(timeout)
        traced = self.trace.is_on(topic)
        header: bytes | None = None
        extra = 0
        if ext is not None:
            header = ext_header_bytes(ext, trace_id)
            extra = 2 + len(header)
        elif trace_id is not None:
            check_trace_id(trace_id)
            extra = _TRACE_EXTRA
        elif traced:
            extra = _TRACE_EXTRA  # may go out as MPUB_TRACE
        receipts: list[PublishReceipt] = []
        sent = 0
        for chunk in split_batches(checked, self._max_body, extra):
            op: Op
            if header is not None:
                op = MPubExt(topic, partition, chunk, header)
            elif trace_id is not None:
                op = MPubTrace(topic, partition, chunk, trace_id)
            else:
                op = MPub(topic, partition, chunk, traced)
            try:
                receipt = await self._execute(op, deadline)
            except PublishError as exc:
                exc.sent = sent  # type: ignore[attr-defined]
                raise
            sent += len(chunk)
            if receipt is not None:
                receipts.append(receipt)
                if traced:
                    log_receipt(receipt)
        return receipts

    async def publish_deferred(self, topic: str, body: bytes, delay: float, *,
                               timeout: float | None = None) -> None:
        """DPUB: deliver ``body`` after ``delay`` seconds (stock nsqd only; youzan nsqd has
        no DPUB and raises UnsupportedFeatureError)."""
        self._check_open()
        self._check_topic(topic)
        body = self._check_body(body)
        ms = dpub_delay_ms(delay)
        deadline = self._deadline(timeout)
        await self._execute(DPub(topic, None, body, ms), deadline)

    async def publish_ordered(self, topic: str, shard_key: ShardKey, body: bytes, *,
                              trace_id: int | None = None, timeout: float | None = None,
                              rule: ShardRule | None = None) -> PublishReceipt | None:
        """Publish ``body`` to the partition of ``shard_key`` (youzan, lookupd mode), in
        order with every other message of that key (see :mod:`smartnsq.producer.lanes`).

        ``rule`` (default ``config.shard_hash``): ``"murmur3"`` (youzan go-nsq) or
        ``"java"``. With tracing on for the topic the message goes out with PUB_TRACE and the
        trace id is the key's murmur3 hash unless ``trace_id`` is given; a receipt is then
        returned. ``timeout`` covers waiting for the key's previous messages too.
        """
        self._check_open()
        self._check_topic(topic)
        body = self._check_body(body)
        rule = self.config.shard_hash if rule is None else rule
        if rule not in ("murmur3", "java"):
            raise ConfigError(f"rule must be 'murmur3' or 'java', got {rule!r}")
        check_shard_key(shard_key, rule)
        if trace_id is not None:
            check_trace_id(trace_id)
        if self._routes is None:
            raise ConfigError("ordered publishing needs lookupd (the partition count comes "
                              "from the topic's lookup meta), not nsqd_tcp_addresses")
        deadline = self._deadline(timeout)
        return await self._lanes.submit(topic, shard_key, rule, body, trace_id, deadline)

    # ------------------------------------------------------------------ internals: entry points

    async def _publish_shard(self, topic: str, key: ShardKey, rule: ShardRule, body: bytes,
                             trace_id: int | None, deadline: float) -> PublishReceipt | None:
        """One ordered message (called by its lane when its turn comes)."""
        traced = self.trace.is_on(topic)
        if traced and trace_id is None:
            trace_id = shard_trace_id(key)
        op: Op
        if trace_id is not None:
            op = PubTrace(topic, None, body, trace_id)
        elif self._batcher is not None:
            partition = await self._shard_partition(topic, key, rule, deadline)
            await self._batcher.add((topic, partition), body, deadline)
            return None
        else:
            op = Pub(topic, None, body, False)
        op.shard = key
        op.rule = rule
        receipt = await self._execute(op, deadline)
        if receipt is not None and traced:
            log_receipt(receipt)
        return receipt

    async def _shard_partition(self, topic: str, key: ShardKey, rule: ShardRule,
                               deadline: float) -> int:
        """The key's partition from the current route (waiting, bounded, for a first one)."""
        assert self._routes is not None
        loop = asyncio.get_running_loop()
        waits = 0
        while True:
            route = self._routes.cached(topic, loop.time())
            if route is None:
                route = await self._get_route(topic, deadline)
            if route is not None:
                self._check_route_features(route, Pub(topic, None, b"x", False), shard=True)
                if route.partition_num > 0:
                    return shard_partition(key, route.partition_num, rule)
            waits += 1
            await self._wait_for_topic(topic, route, waits, deadline, None)

    async def _send_batch(self, key: tuple[str, int | None], bodies: list[bytes],
                          deadline: float) -> None:
        topic, partition = key
        traced = self.trace.is_on(topic)
        receipt = await self._execute(MPub(topic, partition, bodies, traced), deadline)
        if receipt is not None and traced:
            log_receipt(receipt)

    def _execute(self, op: Op, deadline: float) -> Coroutine[Any, Any, PublishReceipt | None]:
        """The retry loop for ``op`` (no coroutine of its own: one frame less per publish)."""
        if self._routes is None:
            return self._execute_direct(op, deadline)
        return self._execute_routed(op, deadline)

    def _done(self) -> None:
        self._active -= 1
        if not self._active and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    # ------------------------------------------------------------------ errors

    def _failure(self, op: Op, attempts: int, exc: BaseException, deadline: float) -> BaseException:
        """The exception that ends ``op`` after ``exc``."""
        if isinstance(exc, UnsupportedFeatureError | ConfigError | ClientClosedError):
            return exc
        if isinstance(exc, PublishError):
            return exc
        where = f"topic {op.topic!r}" + (f" partition {op.partition}"
                                          if op.partition is not None else "")
        if asyncio.get_running_loop().time() >= deadline:
            err: PublishError = PublishTimeoutError(
                f"{op.what} to {where} not acknowledged in time "
                f"({attempts} attempt(s)); last error: {exc}")
        else:
            err = PublishError(f"{op.what} to {where} failed after {attempts} attempt(s): {exc}")
        err.__cause__ = exc
        return err

    async def _sleep(self, seconds: float, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        seconds = min(seconds, deadline - loop.time())
        if seconds > 0:
            await asyncio.sleep(seconds)

    # ------------------------------------------------------------------ direct nsqd addresses

    def _new_pool(self, address: str, *, auto_reconnect: bool) -> NodePool:
        pool = NodePool(address, self.config, auto_reconnect=auto_reconnect,
                        on_up=self._on_pool_up, rng=self._rng,
                        connect_slots=self._connect_slots)
        self._pools[address] = pool
        return pool

    def _pool_for(self, address: str) -> NodePool:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._new_pool(address, auto_reconnect=False)
        return pool

    def _on_pool_up(self, pool: NodePool) -> None:
        waiters = self._up_waiters
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def _wait_for_node(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        handle = loop.call_at(until, _wake, fut)
        self._up_waiters.add(fut)
        try:
            await fut
        finally:
            handle.cancel()
            self._up_waiters.discard(fut)

    def _pick_direct(self, avoid: set[str] | None, now: float) -> NodePool | None:
        pools = self._direct
        n = len(pools)
        if n == 1:
            p = pools[0]
            return p if p.available(now) else None
        fallback: NodePool | None = None
        for _ in range(n):
            self._rr += 1
            p = pools[self._rr % n]
            if p.available(now):
                if avoid is None or p.address not in avoid:
                    return p
                if fallback is None:
                    fallback = p
        return fallback

    def _dial_failures(self) -> int:
        return sum(p.dial_failures for p in self._direct)

    def _no_node_error(self) -> NSQError:
        reasons = "; ".join(f"{p.address}: {p.last_error}" for p in self._direct
                            if p.last_error is not None)
        err = NSQConnectionError(f"no nsqd reachable ({reasons or 'all in backoff'})")
        last = next((p.last_error for p in self._direct if p.last_error is not None), None)
        err.__cause__ = last
        return err

    async def _execute_direct(self, op: Op, deadline: float) -> PublishReceipt | None:
        self._active += 1
        try:
            loop = asyncio.get_running_loop()
            max_attempts = self._max_attempts
            attempt = 0
            avoid: set[str] | None = None
            last_pool: NodePool | None = None
            seen = self._dial_failures()
            waits = 0
            while True:
                now = loop.time()
                pool = self._pick_direct(avoid, now)
                if pool is None:
                    # Every node is in its reconnect backoff and the pools redial by themselves.
                    # That refusal is our own backoff, not an attempt (chaos finding
                    # drop_conns): a redial that failed meanwhile is, and the deadline bounds
                    # the wait; woken at once when a pool comes up.
                    exc: BaseException = self._no_node_error()
                    failed = self._dial_failures()
                    if failed > seen:
                        attempt += 1
                        seen = failed
                    if attempt >= max_attempts or now >= deadline:
                        raise self._failure(op, attempt, exc, deadline) from exc.__cause__
                    waits += 1
                    await self._wait_for_node(min(deadline, now + retry_delay(waits)))
                    last_pool = None
                    continue
                if pool is last_pool:
                    await self._sleep(retry_delay(attempt), deadline)
                attempt += 1
                try:
                    conn = pool.pick()
                    if conn is None:
                        conn = await pool.get()
                    if op.partition is not None and conn.flavour is Flavour.STOCK:
                        raise UnsupportedFeatureError(
                            f"partition={op.partition} needs youzan nsqd; {conn.address} is stock "
                            "nsqd")
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise self._late_connection(op, pool.address, op.partition, None)
                    return await op.send(conn, op.partition, remaining)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    seen = self._dial_failures()  # our own failed dial is counted here
                    action = classify(exc)
                    if action is Action.RAISE or attempt >= max_attempts or \
                            loop.time() >= deadline:
                        err = self._failure(op, attempt, exc, deadline)
                        if err is exc:
                            raise
                        raise err from exc
                    logger.debug("%s to topic %r on nsqd %s failed (attempt %d, %s): %s", op.what,
                                 op.topic, pool.address, attempt, action.value, exc)
                    last_pool = pool
                    if avoid is None:
                        avoid = set()
                    avoid.add(pool.address)
        finally:
            self._done()

    # ------------------------------------------------------------------ lookupd (routes)

    async def _get_route(self, topic: str, deadline: float) -> TopicRoute | None:
        """The topic's route, looking it up if needed; None if the lookup failed."""
        assert self._routes is not None
        try:
            async with asyncio.timeout_at(deadline):
                return await self._routes.get(topic)
        except LookupFailedError as exc:
            logger.debug("lookup of topic %r failed: %s", topic, exc)
            return None
        except TimeoutError:
            return None

    async def _wait_for_topic(self, topic: str, route: TopicRoute | None, waits: int,
                              deadline: float, last: BaseException | None) -> TopicRoute | None:
        """No writable partition (yet): bounded by the deadline, re-look the topic up after a
        growing pause; raise a clear PublishError when time is up."""
        assert self._routes is not None
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline:
            reason = ""
            if route is not None and route.view.not_found_reason:
                reason = f" (lookupd: {route.view.not_found_reason})"
            elif self._lookup is not None:
                err = self._lookup.last_error(topic, "w")
                if err is not None:
                    reason = f" ({err})"
            cause = TopicNotFoundError(
                f"no writable partition or nsqd for topic {topic!r}{reason}; youzan topics must "
                "be created on nsqlookupd and need a channel on every partition before they "
                "are writable")
            cause.__cause__ = last
            err2 = PublishTimeoutError(
                f"topic {topic!r} had no writable partition or nsqd before the publish timed "
                f"out{reason}")
            raise err2 from cause
        await self._sleep(retry_delay(waits), deadline)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._routes.refresh(topic, route)
        except (LookupFailedError, TimeoutError):
            return None

    def _check_route_features(self, route: TopicRoute, op: Op, shard: bool = False) -> None:
        if route.partitioned:
            if op.stock_only:
                raise UnsupportedFeatureError(
                    f"{op.what} is not supported by youzan nsqd (topic {route.topic!r})")
            return
        if (route.stock or route.legacy) and (
                op.youzan_only or op.partition is not None or shard or op.shard is not None):
            what = "ordered publishing" if shard or op.shard is not None else (
                op.what if op.youzan_only else f"partition={op.partition}")
            where = "stock nsqd/nsqlookupd" if route.stock else "non-partitioned nsqd"
            raise UnsupportedFeatureError(
                f"{what} needs a partitioned youzan topic; topic {route.topic!r} is served "
                f"by {where}")

    async def _execute_routed(self, op: Op, deadline: float) -> PublishReceipt | None:
        self._active += 1
        try:
            routes = self._routes
            assert routes is not None
            loop = asyncio.get_running_loop()
            topic = op.topic
            max_attempts = self._max_attempts
            attempt = 0  # every send
            counted = 0  # sends that failed in a way max_attempts bounds
            waits = 0  # waits for a leader (bounded by the deadline only)
            last_exc: BaseException | None = None
            avoid_parts: set[int] | None = None
            avoid_nodes: set[str] | None = None
            last_target: tuple[str, int | None] | None = None
            route = routes.cached(topic, loop.time())
            while True:
                if route is None:
                    route = await self._get_route(topic, deadline)
                    if route is None:
                        waits += 1
                        route = await self._wait_for_topic(topic, None, waits, deadline, last_exc)
                        continue
                self._check_route_features(route, op)
                address: str | None
                partition: int | None = op.partition
                if route.partitioned:
                    if partition is None and op.shard is not None and route.partition_num > 0:
                        # pinned once: the message never goes to another partition
                        partition = op.partition = shard_partition(op.shard, route.partition_num,
                                                                   op.rule)
                    if partition is not None:
                        if route.view.meta.valid and partition >= route.partition_num:
                            raise ConfigError(
                                f"partition {partition} out of range: topic {topic!r} has "
                                f"{route.partition_num} partitions")
                        address = route.leader(partition)
                    elif op.shard is not None:
                        address = None  # no partition count yet
                    else:
                        partition = route.pick(avoid_parts)
                        if partition is None and avoid_parts:
                            partition = route.pick()  # everything was tried: start over
                        address = route.leader(partition) if partition is not None else None
                else:
                    partition = None
                    address = route.pick_legacy(avoid_nodes) if route.legacy else None
                    if address is None and avoid_nodes and route.legacy:
                        address = route.pick_legacy()
                if address is None:
                    waits += 1
                    if attempt == 0 and op.partition is None:
                        # nothing to try yet (fresh topic): wait, bounded by the deadline
                        route = await self._wait_for_topic(topic, route, waits, deadline, last_exc)
                        continue
                    # A pinned partition without leader, or every partition failed: a leader
                    # move (seconds on real clusters) or writes switched off. Waiting for a
                    # leader burns no attempts: only the deadline bounds it (PROTOCOL.md §13.1).
                    missing = NoLeaderError(
                        (f"partition {partition} of topic {topic!r} has no writable leader"
                         if partition is not None else
                         f"topic {topic!r} has no writable partition left")
                        + (f" (last error: {last_exc})" if last_exc is not None else ""))
                    missing.__cause__ = last_exc
                    if loop.time() >= deadline:
                        raise self._failure(op, attempt, missing, deadline) from missing
                    await self._sleep(retry_delay(waits), deadline)
                    route = await self._refreshed(topic, route, deadline)
                    continue
                pool = self._pools.get(address)
                if pool is None:
                    pool = self._new_pool(address, auto_reconnect=False)
                if not pool.available(loop.time()):
                    # Our connection to the leader the lookup names is in its reconnect backoff
                    # (it dropped, or a dial failed). That refusal is ours, not the node's: wait
                    # for the redial, bounded by the deadline, instead of spending an attempt
                    # (the chaos soak's drop_conns finding). A dial that fails meanwhile counts.
                    seen = pool.dial_failures
                    await self._wait_reconnect(op, pool, partition, deadline, last_exc)
                    if pool.dial_failures > seen and not pool.is_up:
                        counted += 1
                        last_exc = pool.last_error or last_exc
                        if counted >= max_attempts and last_exc is not None:
                            raise self._failure(op, attempt, last_exc, deadline) from last_exc
                    last_target = None  # the wait was the pause before the same target
                    continue
                if last_target is not None and last_target == (address, partition):
                    # the same target again (e.g. lookupd still names the old leader)
                    await self._sleep(retry_delay(max(attempt, waits)), deadline)
                attempt += 1
                try:
                    conn = pool.pick()
                    if conn is None:
                        conn = await pool.get()
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise self._late_connection(op, address, partition, last_exc)
                    return await op.send(conn, partition, remaining)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    last_exc = exc
                    action = classify(exc)
                    if action is Action.REFRESH:
                        # a leader-type refusal stored nothing: retrying is safe, and waiting
                        # for the new leader is bounded by the deadline, not by attempts
                        waits += 1
                    else:
                        counted += 1
                    if action is Action.RAISE or counted >= max_attempts or \
                            loop.time() >= deadline:
                        err = self._failure(op, attempt, exc, deadline)
                        if err is exc:
                            raise
                        raise err from exc
                    logger.debug("%s to topic %r partition %s on nsqd %s failed (attempt %d, %s): "
                                 "%s", op.what, topic, partition, address, attempt, action.value,
                                 exc)
                    last_target = (address, partition)
                    if action is Action.RETRY:
                        if op.partition is None and partition is not None:
                            avoid_parts = (avoid_parts or set()) | {partition}
                        continue
                    # REFRESH / FAILOVER: the mapping (or the node) is bad
                    if partition is not None:
                        route.drop(partition, address)
                    else:
                        avoid_nodes = (avoid_nodes or set()) | {address}
                    if op.partition is None and route.partitioned and route.writable > 0:
                        # round-robin: carry on on another partition, refresh in the background
                        assert partition is not None
                        avoid_parts = (avoid_parts or set()) | {partition}
                        routes.refresh_soon(topic, route)
                        continue
                    if not route.partitioned and op.partition is None and route.legacy and \
                            action is Action.FAILOVER and len(route.legacy) > 1:
                        routes.refresh_soon(topic, route)
                        continue
                    route = await self._refreshed(topic, route, deadline)
        finally:
            self._done()

    async def _wait_reconnect(self, op: Op, pool: NodePool, partition: int | None,
                              deadline: float, last: BaseException | None) -> None:
        """Wait until ``pool`` is connected again (woken at once when it comes up) or its
        backoff ends, whichever is first; raise PublishTimeoutError naming the nsqd and why it
        is down when the deadline comes first."""
        loop = asyncio.get_running_loop()
        until = min(deadline, pool.retry_at)
        if loop.time() < until:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(until):
                    await pool.wait_up()
        if not pool.is_up and loop.time() >= deadline:
            cause = pool.last_error or last
            where = f"topic {op.topic!r}" + (
                f" partition {partition}" if partition is not None else "")
            err = PublishTimeoutError(
                f"{op.what} to {where} timed out waiting to reconnect to nsqd {pool.address}"
                + (f"; last error: {cause}" if cause is not None else ""))
            raise err from cause

    def _late_connection(self, op: Op, address: str, partition: int | None,
                         last: BaseException | None) -> PublishTimeoutError:
        """The deadline passed while the connection to ``address`` was being made."""
        where = f"topic {op.topic!r}" + (f" partition {partition}" if partition is not None
                                          else "")
        err = PublishTimeoutError(
            f"{op.what} to {where} timed out: the connection to nsqd {address} came up too "
            "late" + (f" (last error: {last})" if last is not None else ""))
        err.__cause__ = last
        return err

    async def _refreshed(self, topic: str, route: TopicRoute, deadline: float) -> TopicRoute:
        """A route newer than ``route`` (one coalesced refresh), or ``route`` if the lookup
        failed or the deadline came first."""
        assert self._routes is not None
        try:
            async with asyncio.timeout_at(deadline):
                return await self._routes.refresh(topic, route)
        except (LookupFailedError, TimeoutError):
            return route


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def make_lookup(spec: LookupdSpec | None) -> tuple[Lookup, bool]:
    if isinstance(spec, Lookup):
        return spec, False
    if isinstance(spec, LookupConfig):
        return Lookup(spec), True
    if isinstance(spec, str):
        return Lookup(LookupConfig(addresses=(spec,))), True
    if isinstance(spec, Sequence) and spec and all(isinstance(a, str) for a in spec):
        return Lookup(LookupConfig(addresses=tuple(spec))), True
    raise ConfigError("lookupd must be a LookupConfig, a Lookup, or nsqlookupd HTTP addresses")

