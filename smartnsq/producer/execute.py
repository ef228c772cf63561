"""The producer's retry loops: one publish command (:class:`~smartnsq.producer.ops.Op`) from
first attempt to acknowledgement or final error.

:class:`Executor` runs an op either over the listed nsqd addresses (round-robin, skipping
nodes in their reconnect backoff) or, in lookupd mode, to the leader of the chosen partition
(:mod:`smartnsq.producer.routing`). What each failure means — raise, refresh the lookup,
fail over, retry — and what counts as an attempt is :mod:`smartnsq.producer.retry`'s rule;
the exceptions that end a publish are built by :mod:`smartnsq.producer.failures`. The executor
also counts the publishes in flight, so closing the producer can wait for them.

Each attempt waits for nsqd's answer at most ``request_timeout`` (and never past the
publish's deadline): an nsqd that stays connected but stops answering costs one attempt, not
the whole timeout; its connection is failed by the response FIFO, which marks it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from smartnsq.config import ProducerConfig
from smartnsq.errors import Flavour, NoLeaderError, UnsupportedFeatureError
from smartnsq.producer.failures import (
    failure,
    late_connection,
    reconnect_timeout,
    sleep_before,
)
from smartnsq.producer.nodes import Nodes
from smartnsq.producer.ops import Op
from smartnsq.producer.pool import NodePool
from smartnsq.producer.retry import Action, classify, retry_delay
from smartnsq.producer.routing import Router, check_features, choose_target
from smartnsq.producer.types import PublishReceipt

__all__ = ["Executor"]

logger = logging.getLogger("smartnsq.producer")


class Executor:
    """Runs publish commands with retries (see the module docstring)."""

    def __init__(self, config: ProducerConfig, nodes: Nodes, router: Router | None) -> None:
        self._max_attempts = config.max_attempts
        #: the longest one attempt waits for an answer
        self.request_timeout = config.request_timeout
        self._nodes = nodes
        self._router = router
        #: publishes in flight (retry loops, and the producer's fast path, which counts itself)
        self.active = 0
        self._idle: asyncio.Future[None] | None = None
        #: the producer's loop, once bound (asyncio.get_running_loop costs a getpid system
        #: call per call on Python 3.11)
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop


    def run(self, op: Op, deadline: float) -> Coroutine[Any, Any, PublishReceipt | None]:
        """The retry loop for ``op`` (no coroutine of its own: one frame less per publish)."""
        if self._router is None:
            if op.partition is None:
                parts = op.plain_command()
                if parts is not None:
                    return self._plain_direct(op, parts, deadline)
            return self._direct(op, deadline)
        return self._routed(op, deadline, self._router)

    async def wait_idle(self) -> None:
        """Until no publish is in flight."""
        while self.active:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)

    def leave(self) -> None:
        """The end of a publish counted in :attr:`active` (wait_idle() may be waiting)."""
        self.active -= 1
        if not self.active and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    # ------------------------------------------------------------------ direct nsqd addresses

    async def retry_direct(self, op: Op, deadline: float, pool: NodePool,
                           exc: Exception) -> PublishReceipt | None:
        """The retry loop for ``op`` whose first attempt, made on ``pool`` by the caller's
        fast path (:meth:`Producer.publish`), failed with ``exc``."""
        return await self._direct(op, deadline, (pool, exc))

    async def direct_from(self, op: Op, deadline: float,
                          pool: NodePool | None) -> PublishReceipt | None:
        """The retry loop for ``op``, its first attempt on ``pool`` (the caller's fast path
        picked it, but it had no connection ready; None: none was available)."""
        return await self._direct(op, deadline, start=pool)

    async def _plain_direct(self, op: Op, parts: tuple[bytes, bytes | None],
                            deadline: float) -> None:
        """``op``, a plain publish encoded as ``parts``: its first attempt goes straight to
        a connection that can take it at once (no retry-loop or op coroutine in between);
        a failure continues in the retry loop as attempt 1, and without a ready connection
        the retry loop does it all."""
        loop = self._loop if self._loop is not None else asyncio.get_running_loop()
        now = loop.time()
        pool = self._nodes.pick_direct(None, now)
        conn = pool.pick() if pool is not None else None
        if conn is None or conn.write_paused or deadline <= now:
            # the picked pool takes the attempt: a second pick would skip it, and with two
            # nodes every other pick (always the same one) would never be dialled
            await self._direct(op, deadline, start=pool)
            return
        assert pool is not None
        self.active += 1
        try:
            conn.check_publish_answer(await conn.send_publish(
                parts[0], min(deadline - now, self.request_timeout), op.topic, parts[1]),
                op.what)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._direct(op, deadline, (pool, exc))
        finally:
            self.leave()

    def _after_failure(self, op: Op, attempt: int, exc: Exception, deadline: float,
                       pool: NodePool, now: float) -> None:
        """Raise the error that ends ``op`` when ``exc`` (its attempt number ``attempt``, on
        ``pool``) may not be retried."""
        action = classify(exc)
        if action is Action.RAISE or attempt >= self._max_attempts or now >= deadline:
            err = failure(op, attempt, exc, deadline)
            if err is exc:
                raise exc
            raise err from exc
        logger.debug("%s to topic %r on nsqd %s failed (attempt %d, %s): %s", op.what,
                     op.topic, pool.address, attempt, action.value, exc)

    async def _direct(self, op: Op, deadline: float,
                      first: tuple[NodePool, Exception] | None = None,
                      start: NodePool | None = None) -> PublishReceipt | None:
        self.active += 1
        try:
            nodes = self._nodes
            loop = self._loop if self._loop is not None else asyncio.get_running_loop()
            max_attempts = self._max_attempts
            attempt = 0
            avoid: set[str] | None = None
            last_pool: NodePool | None = None
            seen = nodes.dial_failures()
            waits = 0
            if first is not None:
                last_pool, first_exc = first
                attempt = 1
                self._after_failure(op, attempt, first_exc, deadline, last_pool, loop.time())
                avoid = {last_pool.address}
            while True:
                now = loop.time()
                pool: NodePool | None = start
                if pool is not None:
                    start = None
                else:
                    pool = nodes.pick_direct(avoid, now)
                if pool is None:
                    # Every node is in its reconnect backoff and the pools redial by themselves.
                    # That refusal is our own backoff, not an attempt (chaos finding
                    # drop_conns): a redial that failed meanwhile is, and the deadline bounds
                    # the wait; woken at once when a pool comes up.
                    exc: BaseException = nodes.no_node_error()
                    failed = nodes.dial_failures()
                    if failed > seen:
                        attempt += 1
                        seen = failed
                    if attempt >= max_attempts or now >= deadline:
                        raise failure(op, attempt, exc, deadline) from exc.__cause__
                    waits += 1
                    await nodes.wait_for_node(min(deadline, now + retry_delay(waits)))
                    last_pool = None
                    continue
                if pool is last_pool:
                    await sleep_before(retry_delay(attempt), deadline)
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
                        raise late_connection(op, pool.address, op.partition, None)
                    return await op.send(conn, op.partition,
                                         min(remaining, self.request_timeout))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    seen = nodes.dial_failures()  # our own failed dial is counted here
                    self._after_failure(op, attempt, exc, deadline, pool, loop.time())
                    last_pool = pool
                    if avoid is None:
                        avoid = set()
                    avoid.add(pool.address)
        finally:
            self.leave()

    # ------------------------------------------------------------------ lookupd (routes)

    async def _routed(self, op: Op, deadline: float, router: Router) -> PublishReceipt | None:
        self.active += 1
        try:
            routes = router.routes
            loop = self._loop if self._loop is not None else asyncio.get_running_loop()
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
                    route = await router.get(topic, deadline)
                    if route is None:
                        waits += 1
                        route = await router.wait_for_topic(topic, None, waits, deadline,
                                                            last_exc)
                        continue
                check_features(route, op)
                address, partition = choose_target(route, op, avoid_parts, avoid_nodes)
                if address is None:
                    waits += 1
                    if attempt == 0 and op.partition is None:
                        # nothing to try yet (fresh topic): wait, bounded by the deadline
                        route = await router.wait_for_topic(topic, route, waits, deadline,
                                                            last_exc)
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
                        raise failure(op, attempt, missing, deadline) from missing
                    await sleep_before(retry_delay(waits), deadline)
                    route = await router.refreshed(topic, route, deadline)
                    continue
                pool = self._nodes.pool_for(address)
                if op.partition is None and partition is not None and not pool.is_up and \
                        pool.failures and route.writable > 1 and \
                        (avoid_parts is None or partition not in avoid_parts):
                    # A round-robin publish and a leader we lost (down, or silent: redialling
                    # one can take the whole handshake timeout): another partition whose
                    # leader is connected takes it now, and the lost one is redialled in the
                    # background. Once every other partition was tried, it is waited for.
                    pool.redial_soon()
                    avoid_parts = (avoid_parts or set()) | {partition}
                    continue
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
                            raise failure(op, attempt, last_exc, deadline) from last_exc
                    last_target = None  # the wait was the pause before the same target
                    continue
                if last_target is not None and last_target == (address, partition):
                    # the same target again (e.g. lookupd still names the old leader)
                    await sleep_before(retry_delay(max(attempt, waits)), deadline)
                attempt += 1
                try:
                    conn = pool.pick()
                    if conn is None:
                        conn = await pool.get()
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise late_connection(op, address, partition, last_exc)
                    return await op.send(conn, partition, min(remaining, self.request_timeout))
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
                        err = failure(op, attempt, exc, deadline)
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
                    route = await router.refreshed(topic, route, deadline)
        finally:
            self.leave()

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
            raise reconnect_timeout(op, pool.address, partition, cause) from cause
