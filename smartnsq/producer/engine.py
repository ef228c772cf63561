"""The one retry loop for every publish, TCP and HTTP: :class:`RetryEngine`.

Who calls what:

* :class:`~smartnsq.producer.Producer` holds a :class:`TcpEngine`. A plain PUB in direct mode
  goes to :meth:`TcpEngine.pub`, every other publish (PUB to a partition, traced or with an
  ext header, MPUB, DPUB, encoded and ext batches, auto-batched MPUBs, ordered lanes' sends) is
  an op (:mod:`smartnsq.producer.ops`) for :meth:`TcpEngine.run`. The first attempt is a
  fast path: in direct mode a plain command goes straight to a connection that can write at
  once, in lookupd mode any op to the connected leader the cached route names (no plan, no
  loop frame); when it fails, or nothing is ready, :meth:`RetryEngine.attempts` takes over,
  that attempt counted (or its choice of leader kept).
* :class:`~smartnsq.producer.HttpProducer` holds a ``RetryEngine[HttpNode]`` and calls
  :meth:`RetryEngine.retry` with its requests (:mod:`smartnsq.producer.http_targets`).

:meth:`RetryEngine.attempts` is the loop: the publish's plan (:mod:`smartnsq.producer.plans`:
the listed nsqd, or the partition leaders a lookup names) picks each target
(:mod:`smartnsq.producer.targets`), the engine gets a channel from it, sends with the
per-attempt wait (``request_timeout``, never past the deadline), classifies a failure
(:func:`~smartnsq.producer.retry.classify`), counts it, pauses before the same target again
(the policy's backoff) and raises the error that ends the publish
(:mod:`smartnsq.producer.failures`). The engine also counts the publishes in flight, so that
closing a producer can wait for them.

Metrics (:mod:`smartnsq.producer.observe`) are the engine's too, once a producer with
metrics on called :meth:`RetryEngine.observe`: each attempt where it went, and each publish
with its outcome and duration where it ends (a fast path's success tests
:attr:`RetryEngine.obs` once; the loop counts everything else). With metrics off nothing else
changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Generic, TypeVar

from smartnsq.conn import Connection
from smartnsq.producer.failures import failure, late_attempt, late_connection, sleep_before
from smartnsq.producer.observe import PublishMetrics
from smartnsq.producer.ops import Op, Pub, Publish
from smartnsq.producer.plans import DirectPlan, Leaders, Plan, RoutedPlan
from smartnsq.producer.pool import NodePool
from smartnsq.producer.retry import Action, RetryPolicy, classify
from smartnsq.producer.routing import Router, check_features, choose_target
from smartnsq.producer.targets import DirectTargets, Endpoints, Target
from smartnsq.producer.types import PublishReceipt
from smartnsq.protocol.frames import OK

__all__ = ["RetryEngine", "TcpEngine"]

logger = logging.getLogger("smartnsq.producer")

C = TypeVar("C")

Result = Coroutine[Any, Any, PublishReceipt | None]


class RetryEngine(Generic[C]):
    """Runs publishes with retries over targets handing out channels of type ``C``: the
    listed nsqd (``direct``) or, with a ``router``, the nsqd its routes name, reached through
    ``endpoints`` (see the module docstring)."""

    def __init__(self, policy: RetryPolicy, *, direct: DirectTargets[Target[C]] | None = None,
                 router: Router | None = None, endpoints: Endpoints[C] | None = None) -> None:
        if (router is None) == (direct is None) or (router is None) != (endpoints is None):
            raise ValueError("a retry engine needs direct targets, or a router and endpoints")
        self.policy = policy
        #: the longest one attempt waits for an answer
        self.request_timeout = policy.request_timeout
        self._direct = direct
        #: lookupd mode's targets
        self._leaders = Leaders(policy, router, endpoints) \
            if router is not None and endpoints is not None else None
        #: publishes in flight (the loops, and the fast first attempts)
        self.active = 0
        self._idle: asyncio.Future[None] | None = None
        #: the producer's loop, once bound (asyncio.get_running_loop costs a getpid system
        #: call per call on Python 3.11)
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the producer's metrics (None: metrics off)
        self.obs: PublishMetrics | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def observe(self, obs: PublishMetrics | None) -> None:
        """Count attempts, retries, redirects and leader waits into ``obs`` (None: stop)."""
        self.obs = obs
        if self._leaders is not None:
            self._leaders.obs = obs
        if self._direct is not None:
            self._direct.obs = obs

    def _time(self) -> float:
        loop = self._loop
        return (loop if loop is not None else asyncio.get_running_loop()).time()

    def plan(self, op: Publish[C], start: Target[C] | None = None) -> Plan[C]:
        """A fresh plan for ``op`` (``start``: direct mode's first pick, made already)."""
        if self._direct is not None:
            return DirectPlan(op, self.policy, self._direct, start)
        assert self._leaders is not None
        return RoutedPlan(op, self._leaders, self._time())

    def retry(self, op: Publish[C], deadline: float) -> Result:
        """``op`` from its first attempt to its answer or final error."""
        return self.attempts(op, deadline, self.plan(op))

    async def wait_idle(self) -> None:
        """Until no publish is in flight."""
        while self.active:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)

    def leave(self) -> None:
        """The end of a publish counted in :attr:`active` (wait_idle() may be waiting)."""
        self.active -= 1
        if not self.active:
            self.idle()

    def idle(self) -> None:
        """No publish is in flight any more: wake wait_idle()."""
        if self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def attempts(self, op: Publish[C], deadline: float, plan: Plan[C],
                 first: tuple[Target[C], Exception] | None = None,
                 start: float | None = None) -> Result:
        """The retry loop of ``op`` under ``plan``; ``first``: the target and error of a
        first attempt already made (the fast path), which counts as attempt 1; ``start``:
        the loop time the publish began (for metrics; default now)."""
        obs = self.obs
        if obs is None:
            return self._attempts(op, deadline, plan, first, None)
        return self._counted(op, deadline, plan, first, obs,
                             self._time() if start is None else start)

    async def _counted(self, op: Publish[C], deadline: float, plan: Plan[C],
                       first: tuple[Target[C], Exception] | None, obs: PublishMetrics,
                       start: float) -> PublishReceipt | None:
        """:meth:`attempts` with metrics on: the publish counted when it ends."""
        try:
            result = await self._attempts(op, deadline, plan, first, obs)
        except Exception as exc:
            obs.failed(op.topic, op.command, op.count, start, exc)
            raise
        obs.published(op.topic, op.command, op.count, start)
        return result

    async def _attempts(self, op: Publish[C], deadline: float, plan: Plan[C],
                        first: tuple[Target[C], Exception] | None,
                        obs: PublishMetrics | None) -> PublishReceipt | None:
        self.active += 1
        try:
            loop = self._loop if self._loop is not None else asyncio.get_running_loop()
            policy = self.policy
            last: Target[C] | None = None
            last_partition: int | None = None
            target: Target[C] | None = None
            exc: Exception | None = None
            if first is not None:
                target, exc = first
                plan.attempt = 1
            while True:
                if exc is None:
                    target = plan.pick(loop.time())
                    if target is None:
                        await plan.wait(deadline)
                        last = None  # the wait was the pause before the next target
                        continue
                    partition = plan.partition
                    if target is last and partition == last_partition:
                        # the same target again (lookupd still names the old leader, one
                        # nsqd listed ...)
                        await sleep_before(
                            policy.backoff.compute(max(plan.attempt, plan.waits)), deadline)
                    plan.attempt += 1
                    if obs is not None and plan.attempt > 1:
                        obs.retry(op.topic)
                    try:
                        channel = target.pick()
                        dialled = channel is None
                        if channel is None:
                            channel = await _connection(op, target, partition, plan, deadline)
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            # a dial that ended at the deadline, or a backoff that did (HTTP)
                            raise (late_connection if dialled else late_attempt)(
                                op, target.address, partition, plan.last_exc)
                        result = await op.send(channel, partition,
                                               min(remaining, self.request_timeout))
                        if obs is not None:
                            obs.attempt(op.topic, target.address)
                        return result
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:
                        exc = e
                assert target is not None
                # the attempt on ``target`` failed with ``exc``
                action = classify(exc)
                plan.last_exc = exc
                if obs is not None:
                    obs.attempt(op.topic, target.address, exc)
                    if action is Action.REFRESH:
                        obs.redirect(op.topic, target.address)
                if plan.counts(action):
                    plan.counted += 1
                else:
                    plan.waits += 1
                if action is Action.RAISE or plan.counted >= policy.max_attempts or \
                        loop.time() >= deadline:
                    err = failure(op, plan.attempt, exc, deadline)
                    if err is exc:
                        raise exc
                    raise err from exc
                logger.debug("%s to topic %r partition %s on nsqd %s failed (attempt %d, %s): "
                             "%s", op.what, op.topic, plan.partition, target.address,
                             plan.attempt, action.value, exc)
                last, last_partition, exc = target, plan.partition, None
                await plan.failed(target, action, deadline)
        finally:
            self.leave()


async def _connection(op: Publish[C], target: Target[C], partition: int | None,
                      plan: Plan[C], deadline: float) -> C:
    """``target``'s channel, dialled if need be, by loop time ``deadline``: the handshake
    with a silent nsqd (``handshake_timeout``) must not hold a publish past its own
    timeout. The dial goes on in the background, for the publishes that come after."""
    until = asyncio.timeout_at(deadline)
    try:
        async with until:
            return await target.get()
    except TimeoutError:
        if until.expired():
            raise late_connection(op, target.address, partition, plan.last_exc) \
                from plan.last_exc
        raise


class TcpEngine(RetryEngine[Connection]):
    """The TCP producer's engine, with the fast first attempts (see the module docstring;
    ``direct``: the listed nsqd's connection pools)."""

    def __init__(self, policy: RetryPolicy, *, direct: DirectTargets[NodePool] | None = None,
                 router: Router | None = None, endpoints: Endpoints[Connection] | None = None
                 ) -> None:
        super().__init__(policy, direct=direct, router=router, endpoints=endpoints)
        self._pools = direct
        #: the one listed pool, when only one is listed (its pick() says whether it is up)
        self._only = direct.targets[0] if direct is not None and len(direct.targets) == 1 \
            else None

    def run(self, op: Op, deadline: float) -> Result:
        """``op`` with retries (no coroutine of its own: one frame less per publish)."""
        leaders = self._leaders
        if leaders is not None:
            return self._routed(op, deadline, leaders)
        if op.partition is None:
            parts = op.plain_command()
            if parts is not None:
                return self._plain(op, parts, deadline)
        return self.attempts(op, deadline, self.plan(op))

    async def pub(self, topic: str, body: bytes, deadline: float, now: float) -> None:
        """A plain PUB in direct mode (``now``: the loop's time, which the caller has): sent
        at once on a connection that can write; without one, or when it fails, the retry
        loop carries on (the failure counted as attempt 1)."""
        # one nsqd listed (the common case): its pick() alone says whether it can take it
        pool = self._only
        if pool is None:
            assert self._pools is not None
            pool = self._pools.pick(None, now)
        conn = pool.pick(True) if pool is not None else None
        if conn is None or deadline <= now:
            direct = self._pools
            assert direct is not None
            if pool is self._only and pool is not None and not pool.available(now):
                pool = None  # in its backoff: the plan waits for it
            # the picked pool takes the attempt: a second pick would skip it, and with two
            # nodes every other pick (always the same one) would never be dialled
            op = Pub(topic, None, body, False)
            await self.attempts(op, deadline, DirectPlan(op, self.policy, direct, pool),
                                start=now)
            return
        self.active += 1
        wait = deadline - now
        if wait > self.request_timeout:
            wait = self.request_timeout
        try:
            answer = await conn.send_pub(topic, body, wait)
            if answer is not OK:  # the OK frame's own object; anything else gets the rule
                conn.check_publish_answer(answer, "PUB")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            assert pool is not None and self._pools is not None
            op = Pub(topic, None, body, False)
            await self.attempts(op, deadline, DirectPlan(op, self.policy, self._pools),
                                (pool, exc), now)
        else:
            if self.obs is not None:
                self.obs.sent_at_once(topic, "PUB", 1, conn.address, now)
        finally:
            # leave(), inline: one call less per publish
            self.active -= 1
            if not self.active:
                self.idle()

    async def _routed(self, op: Op, deadline: float,
                      leaders: Leaders[Connection]) -> PublishReceipt | None:
        """lookupd mode: the first attempt goes to the leader the cached route names when a
        connection to it is up, without a plan (every publish in lookupd mode comes here);
        anything else, and a failure, is the plan's."""
        loop = self._loop
        assert loop is not None
        now = loop.time()
        route = leaders.router.routes.cached(op.topic, now)
        if route is not None and deadline > now:
            check_features(route, op)
            address, partition = choose_target(route, op, None, None)
            if address is not None:
                target = leaders.endpoints.target(route, address)
                conn = target.pick() if target is not None else None
                if conn is None or target is None:
                    # not connected (yet): the plan takes this choice, and waits or dials
                    plan = RoutedPlan(op, leaders, now)
                    plan.first = (address, partition)
                    return await self.attempts(op, deadline, plan, None, now)
                self.active += 1
                wait = deadline - now
                if wait > self.request_timeout:
                    wait = self.request_timeout
                try:
                    result = await op.send(conn, partition, wait)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    plan = RoutedPlan(op, leaders, now)
                    plan.address, plan.partition = address, partition
                    return await self.attempts(op, deadline, plan, (target, exc), now)
                finally:
                    self.leave()
                if self.obs is not None:
                    self.obs.sent_at_once(op.topic, op.what, op.count, conn.address, now)
                return result
        return await self.attempts(op, deadline, RoutedPlan(op, leaders, now), None, now)

    async def _plain(self, op: Op, parts: tuple[bytes, bytes | None], deadline: float) -> None:
        """``op``, a plain publish encoded as ``parts``: the first attempt goes straight to a
        connection that can take it at once, as :meth:`pub`'s."""
        only = self._only
        direct = self._pools
        assert direct is not None
        now = self._time()
        pool = only if only is not None else direct.pick(None, now)
        conn = pool.pick(True) if pool is not None else None
        if conn is None or deadline <= now:
            if pool is only and pool is not None and not pool.available(now):
                pool = None
            await self.attempts(op, deadline, DirectPlan(op, self.policy, direct, pool),
                                start=now)
            return
        self.active += 1
        try:
            answer = await conn.send_publish(
                parts[0], min(deadline - now, self.request_timeout), op.topic, parts[1])
            if answer is not OK:  # as in pub()
                conn.check_publish_answer(answer, op.what)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            assert pool is not None
            await self.attempts(op, deadline, DirectPlan(op, self.policy, direct), (pool, exc),
                                now)
        else:
            if self.obs is not None:
                self.obs.sent_at_once(op.topic, op.what, op.count, conn.address, now)
        finally:
            self.active -= 1  # leave(), inline
            if not self.active:
                self.idle()
