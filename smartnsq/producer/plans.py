"""The attempts of one publish: where each goes, and what happens when there is nowhere to go.

The retry engine (:mod:`smartnsq.producer.engine`) makes one plan per publish that does not
succeed on its fast first attempt and runs it: it asks :meth:`Plan.pick` for the next target,
sends, classifies a failure (:mod:`smartnsq.producer.retry`) and tells the plan
(:meth:`Plan.failed`); when the plan has no target it calls :meth:`Plan.wait`. A plan holds the
publish's tallies, which the engine and the plan both keep:

* ``attempt`` — sends, and failed dials seen while waiting (what errors report);
* ``counted`` — the attempts that ``max_attempts`` bounds (not the leader-type refusals of
  lookupd mode);
* ``waits`` — waits for a target (our own backoff, a leader, a fresh topic) and leader-type
  refusals: bounded by the deadline only.

:class:`DirectPlan`: nsqd addresses given directly (TCP or HTTP), round-robin over
:class:`~smartnsq.producer.targets.DirectTargets`, avoiding the nsqd that failed.
:class:`RoutedPlan`: lookupd mode, the leader of the chosen partition (or a non-partitioned
node) as :mod:`smartnsq.producer.routing` finds it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from typing import Generic, TypeVar

from smartnsq.errors import NoLeaderKnownError
from smartnsq.producer.failures import failure, reconnect_timeout, sleep_before
from smartnsq.producer.observe import PublishMetrics
from smartnsq.producer.ops import Publish
from smartnsq.producer.retry import Action, RetryPolicy
from smartnsq.producer.router import TopicRoute
from smartnsq.producer.routing import (
    Router,
    check_features,
    choose_target,
    out_of_range,
    out_of_range_error,
    unlisted_hint,
)
from smartnsq.producer.targets import DirectTargets, Endpoints, Target

__all__ = ["DirectPlan", "Leaders", "Plan", "RoutedPlan"]

C = TypeVar("C")

class Plan(ABC, Generic[C]):
    """The tallies of one publish and its choice of targets (see the module docstring)."""

    __slots__ = ("attempt", "counted", "last_exc", "op", "partition", "waits")

    def __init__(self, op: Publish[C]) -> None:
        self.op = op
        self.attempt = 0
        self.counted = 0
        self.waits = 0
        self.last_exc: BaseException | None = None
        #: the partition the picked target is sent to (None: none named)
        self.partition: int | None = op.partition

    @abstractmethod
    def pick(self, now: float) -> Target[C] | None:
        """The next target (:attr:`partition` says which partition), or None: call
        :meth:`wait`."""

    @abstractmethod
    async def wait(self, deadline: float) -> None:
        """No target now: wait for one (not an attempt, save failed dials seen meanwhile),
        or raise the error that ends the publish."""

    def counts(self, action: Action) -> bool:
        """Whether a failed send classified ``action`` is an attempt ``max_attempts``
        bounds."""
        return True

    @abstractmethod
    async def failed(self, target: Target[C], action: Action, deadline: float) -> None:
        """The send to ``target`` failed with :attr:`last_exc` and may be retried."""

    def _count_dial(self, address: str, cause: BaseException | None, max_attempts: int,
                    deadline: float, obs: PublishMetrics | None) -> None:
        """A dial to ``address`` failed while the publish waited: an attempt that counts."""
        self.attempt += 1
        self.counted += 1
        if obs is not None and cause is not None:
            obs.attempt(self.op.topic, address, cause)
            if self.attempt > 1:
                obs.retry(self.op.topic)
        if cause is not None:
            self.last_exc = cause
        if self.counted >= max_attempts and self.last_exc is not None:
            raise failure(self.op, self.attempt, self.last_exc, deadline) from self.last_exc


class DirectPlan(Plan[C]):
    """nsqd addresses given directly: round-robin, avoiding the nsqd that failed."""

    __slots__ = ("avoid", "each", "policy", "seen", "start", "targets")

    def __init__(self, op: Publish[C], policy: RetryPolicy,
                 targets: DirectTargets[Target[C]], start: Target[C] | None = None) -> None:
        super().__init__(op)
        self.policy = policy
        self.targets = targets
        #: the first pick, made by the caller's fast path
        self.start = start
        self.avoid: set[str] | None = None
        #: dials failed so far (one failing while we wait counts as an attempt)
        self.seen = targets.dial_failures()
        #: metrics on: the same per target, to say which one failed
        self.each = [t.dial_failures for t in targets.targets] \
            if targets.obs is not None else None

    def _report_dials(self, obs: PublishMetrics, exc: BaseException) -> None:
        """The dials that failed since the last look: attempts on their nsqd."""
        now = [t.dial_failures for t in self.targets.targets]
        if self.each is not None:
            for t, before, after in zip(self.targets.targets, self.each, now, strict=True):
                if after > before:
                    obs.attempt(self.op.topic, t.address, t.last_error or exc)
        if self.attempt > 1:
            obs.retry(self.op.topic)
        self.each = now

    def pick(self, now: float) -> Target[C] | None:
        start = self.start
        if start is not None:
            self.start = None
            return start
        return self.targets.pick(self.avoid, now)

    async def wait(self, deadline: float) -> None:
        # Every nsqd is in its backoff, and the pools redial by themselves. That refusal is
        # our own backoff, not an attempt (chaos finding drop_conns): a redial that failed
        # meanwhile is, and the deadline bounds the wait; woken at once when one comes up.
        targets = self.targets
        exc = targets.no_target_error()
        failed = targets.dial_failures()
        if failed > self.seen:
            self.attempt += 1
            self.counted += 1
            self.seen = failed
            if targets.obs is not None:
                self._report_dials(targets.obs, exc)
        now = asyncio.get_running_loop().time()
        if self.counted >= self.policy.max_attempts or now >= deadline:
            raise failure(self.op, self.attempt, exc, deadline) from exc.__cause__
        self.waits += 1
        await targets.wait(min(deadline, now + self.policy.backoff.compute(self.waits)))

    async def failed(self, target: Target[C], action: Action, deadline: float) -> None:
        self.seen = self.targets.dial_failures()  # our own failed dial was counted as the send
        if self.each is not None:
            self.each = [t.dial_failures for t in self.targets.targets]
        if self.avoid is None:
            self.avoid = set()
        self.avoid.add(target.address)


class Leaders(Generic[C]):
    """lookupd mode's targets, shared by the plans of one engine: the nsqd that ``router``'s
    routes name, reached through ``endpoints``, under ``policy``; ``obs``: the engine's
    metrics (None: off)."""

    __slots__ = ("endpoints", "obs", "policy", "router")

    def __init__(self, policy: RetryPolicy, router: Router, endpoints: Endpoints[C]) -> None:
        self.policy = policy
        self.router = router
        self.endpoints = endpoints
        self.obs: PublishMetrics | None = None


class RoutedPlan(Plan[C]):
    """lookupd mode: the leader of the partition (see :mod:`smartnsq.producer.routing`)."""

    __slots__ = ("address", "avoid_nodes", "avoid_parts", "first", "leaders", "range_checked",
                 "recovering", "route")

    #: the nsqd the route names for the picked target (what its slot holds; set by pick())
    address: str

    def __init__(self, op: Publish[C], leaders: Leaders[C], now: float) -> None:
        # every publish in lookupd mode makes one: no super().__init__ call
        self.op = op
        self.attempt = self.counted = self.waits = 0
        self.last_exc: BaseException | None = None
        self.partition: int | None = op.partition
        self.leaders = leaders
        self.route: TopicRoute | None = leaders.router.routes.cached(op.topic, now)
        self.avoid_parts: set[int] | None = None
        self.avoid_nodes: set[str] | None = None
        #: a target in our own backoff, which wait() waits for
        self.recovering: Target[C] | None = None
        #: the first choice (nsqd address, partition), made by the engine's fast path
        self.first: tuple[str, int | None] | None = None
        #: the route was refreshed because it did not know op.partition (an expansion)
        self.range_checked = False

    def counts(self, action: Action) -> bool:
        # a leader-type refusal stored nothing: retrying is safe, and waiting for the new
        # leader is bounded by the deadline, not by attempts
        return action is not Action.REFRESH

    def pick(self, now: float) -> Target[C] | None:
        route = self.route
        if route is None:
            return None  # wait() looks the topic up
        op = self.op
        check_features(route, op)
        if op.partition is not None and out_of_range(route, op.partition):
            if self.range_checked:
                raise out_of_range_error(route, op.partition)
            return None  # wait() looks the topic up again first
        while True:
            address: str | None
            if self.first is not None:
                # made already: choosing again would move the round-robin on once more
                address, partition = self.first
                self.first = None
            else:
                address, partition = choose_target(route, op, self.avoid_parts,
                                                   self.avoid_nodes)
            self.partition = partition
            target = self.leaders.endpoints.target(route, address) \
                if address is not None else None
            if address is None or target is None:
                return None  # wait() waits for a leader
            self.address = address
            if op.partition is None and partition is not None and not target.is_up and \
                    target.failures and route.writable > 1 and \
                    (self.avoid_parts is None or partition not in self.avoid_parts):
                # A round-robin publish and a leader we lost (down, or silent: redialling
                # one can take the whole handshake timeout): another partition whose
                # leader is up takes it now, and the lost one comes back in the background.
                # Once every other partition was tried, it is waited for.
                target.redial_soon()
                self.avoid_parts = (self.avoid_parts or set()) | {partition}
                continue
            if not target.available(now):
                # our own backoff with the leader the lookup names (its connection dropped,
                # a dial failed): wait for it instead of spending an attempt
                self.recovering = target
                return None
            return target

    async def wait(self, deadline: float) -> None:
        if self.recovering is not None:
            await self._recover(deadline)
        elif self.route is None:
            router = self.leaders.router
            self.route = await router.get(self.op.topic, deadline)
            if self.route is None:
                self.waits += 1
                self.route = await router.wait_for_topic(self.op.topic, None, self.waits,
                                                         deadline, self.last_exc)
        elif self.op.partition is not None and out_of_range(self.route, self.op.partition):
            # a cached route may predate an expansion of the topic: one fresh look decides
            self.range_checked = True
            self.route = await self.leaders.router.refreshed(self.op.topic, self.route,
                                                             deadline)
        else:
            await self._no_leader(deadline)

    async def _recover(self, deadline: float) -> None:
        """Our own backoff with the target: wait for it, bounded by the deadline. A dial
        that fails meanwhile counts; past the deadline the error names the nsqd and why it
        is down."""
        target = self.recovering
        assert target is not None
        self.recovering = None
        failed_again = await target.recover(deadline)
        if not target.is_up and asyncio.get_running_loop().time() >= deadline:
            cause = target.last_error or self.last_exc
            raise reconnect_timeout(self.op, target.address, self.partition, cause) from cause
        if failed_again and not target.is_up:
            self._count_dial(target.address, target.last_error,
                             self.leaders.policy.max_attempts, deadline, self.leaders.obs)

    async def _no_leader(self, deadline: float) -> None:
        route = self.route
        assert route is not None
        op = self.op
        self.waits += 1
        if self.leaders.obs is not None:
            self.leaders.obs.leader_wait(op.topic)
        if self.attempt == 0 and op.partition is None:
            # nothing to try yet (fresh topic): wait, bounded by the deadline
            self.route = await self.leaders.router.wait_for_topic(
                op.topic, route, self.waits, deadline, self.last_exc)
            return
        # A pinned partition without leader, or every partition failed: a leader move
        # (seconds on real clusters) or writes switched off. Waiting for a leader burns no
        # attempts: only the deadline bounds it (docs/protocol.md §13.2.5).
        partition, last = self.partition, self.last_exc
        missing = NoLeaderKnownError(
            (f"partition {partition} of topic {op.topic!r} has no writable leader"
             + unlisted_hint(route, partition) if partition is not None else
             f"topic {op.topic!r} has no writable partition left")
            + (f" (last error: {last})" if last is not None else ""))
        missing.__cause__ = last
        if asyncio.get_running_loop().time() >= deadline:
            raise failure(op, self.attempt, missing, deadline) from missing
        await sleep_before(self.leaders.policy.backoff.compute(self.waits), deadline)
        self.route = await self.leaders.router.refreshed(op.topic, route, deadline)

    async def failed(self, target: Target[C], action: Action, deadline: float) -> None:
        op = self.op
        partition = self.partition
        if action is Action.RETRY:
            if op.partition is None and partition is not None:
                self.avoid_parts = (self.avoid_parts or set()) | {partition}
            return
        # REFRESH / FAILOVER: the mapping (or the node) is bad
        route = self.route
        assert route is not None
        router = self.leaders.router
        routes = router.routes
        if partition is not None:
            route.drop(partition, self.address)
        else:
            self.avoid_nodes = (self.avoid_nodes or set()) | {self.address}
        if op.partition is None and route.partitioned and route.writable > 0:
            # round-robin: carry on on another partition, refresh in the background
            assert partition is not None
            self.avoid_parts = (self.avoid_parts or set()) | {partition}
            routes.refresh_soon(op.topic, route)
            return
        if not route.partitioned and op.partition is None and route.legacy and \
                action is Action.FAILOVER and len(route.legacy) > 1:
            routes.refresh_soon(op.topic, route)
            return
        self.route = await router.refreshed(op.topic, route, deadline)

