"""Where a publish attempt can go: the :class:`Target` protocol and the listed nsqd
(:class:`DirectTargets`).

A target is one nsqd as a publisher sees it: a TCP connection pool
(:class:`~smartnsq.producer.pool.NodePool`) or an HTTP endpoint
(:class:`~smartnsq.producer.http_nsqd.HttpNode`). It hands out a *channel* an attempt is sent
on (a connection; for HTTP the node itself), and it may be in a backoff of our own after it
failed, during which the retry engine (:mod:`smartnsq.producer.engine`) waits for it instead of
spending an attempt. The engine reaches targets through its plans
(:mod:`smartnsq.producer.plans`): with nsqd addresses given directly, through
:class:`DirectTargets`, which picks the listed nsqd round-robin; with lookupd, through the
partition leaders the lookup names, turned into targets by an :class:`Endpoints`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from smartnsq.errors import ClientClosedError, NSQConnectionError, NSQError
from smartnsq.producer.observe import PublishMetrics
from smartnsq.producer.router import TopicRoute

__all__ = ["DirectTargets", "Endpoints", "Target"]

C_co = TypeVar("C_co", covariant=True)


class Target(Protocol[C_co]):
    """One nsqd an attempt can go to, handing out channels of type ``C_co``."""

    @property
    def address(self) -> str:
        """What errors and logs name it by."""
        ...

    @property
    def is_up(self) -> bool:
        """Not failed: connected (TCP), or its last request did not fail (HTTP)."""
        ...

    @property
    def failures(self) -> int:
        """Consecutive failures (0 while it is up)."""
        ...

    @property
    def last_error(self) -> BaseException | None:
        """Why it last failed."""
        ...

    @property
    def dial_failures(self) -> int:
        """Failed dials, ever (each one a spent attempt for a publish waiting meanwhile)."""
        ...

    def pick(self) -> C_co | None:
        """A channel that can take an attempt at once, or None."""
        ...

    async def get(self) -> C_co:
        """A channel, made if needed (its failure is the attempt's)."""
        ...

    def standing(self, now: float) -> int:
        """2: worth trying; 1: only with a wait (a dial under way); 0: in its backoff."""
        ...

    def available(self, now: float) -> bool:
        """Worth an attempt now: up, or its backoff over."""
        ...

    def redial_soon(self) -> None:
        """It was passed over while down: come up again in the background if it can."""
        ...

    async def recover(self, deadline: float) -> bool:
        """Wait, at most until loop time ``deadline``, until it is up again or its backoff
        ends; True if it failed again meanwhile (a dial refused: an attempt that counts)."""
        ...


T_co = TypeVar("T_co", bound=Target[object], covariant=True)


class Endpoints(Protocol[C_co]):
    """Lookupd mode: the target of an nsqd a route names."""

    def target(self, route: TopicRoute, address: str) -> Target[C_co] | None:
        """The target for nsqd ``address`` (the lookup's ``host:tcp_port``) of ``route``,
        or None when it cannot be reached this way (then it counts as no leader)."""
        ...


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class DirectTargets(Generic[T_co]):
    """The listed nsqd of a producer in direct mode, in the order given: picked
    round-robin, skipping those in their backoff and, while another one is up, those
    waiting for a redial; a publish can wait until one comes up (:meth:`up` wakes it)."""

    def __init__(self, targets: Sequence[T_co]) -> None:
        self.targets: tuple[T_co, ...] = tuple(targets)
        self._rr = 0
        self._waiters: set[asyncio.Future[None]] = set()
        #: the engine's metrics (None: off): failed dials a waiting publish counts
        self.obs: PublishMetrics | None = None
        #: the producer stopped: no target will come up again
        self.closed = False

    def pick(self, avoid: set[str] | None, now: float) -> T_co | None:
        """The next target not in its backoff, preferring those not in ``avoid`` and those
        not waiting for a redial (taken only when nothing better is left)."""
        targets = self.targets
        n = len(targets)
        if n == 1:
            t = targets[0]
            return t if t.available(now) else None
        fallback: T_co | None = None
        for _ in range(n):
            self._rr += 1
            t = targets[self._rr % n]
            standing = t.standing(now)
            if standing:
                if standing == 2 and (avoid is None or t.address not in avoid):
                    return t
                if fallback is None:
                    fallback = t
        return fallback

    def up(self) -> None:
        """A target came up: wake the publishes waiting for one."""
        for fut in self._waiters:
            _wake(fut)

    def close(self) -> None:
        """The producer stopped: the publishes waiting for a target fail now, with
        ClientClosedError, rather than at their deadline."""
        self.closed = True
        self.up()

    async def wait(self, until: float) -> None:
        """Until some target comes up or the loop time ``until``, whichever is first;
        ClientClosedError once :meth:`close` was called."""
        if not self.closed:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            handle = loop.call_at(until, _wake, fut)
            self._waiters.add(fut)
            try:
                await fut
            finally:
                handle.cancel()
                self._waiters.discard(fut)
        if self.closed:
            raise ClientClosedError("the producer stopped before nsqd answered the publish "
                                    "(nsqd may have stored it)")

    def dial_failures(self) -> int:
        """Failed dials so far over the listed targets (each one counts as an attempt)."""
        return sum(t.dial_failures for t in self.targets)

    def no_target_error(self) -> NSQError:
        """Why no listed nsqd can take a publish now (each one's last error)."""
        reasons = "; ".join(f"{t.address}: {t.last_error}" for t in self.targets
                            if t.last_error is not None)
        err = NSQConnectionError(f"no nsqd reachable ({reasons or 'all in backoff'})")
        err.__cause__ = next((t.last_error for t in self.targets if t.last_error is not None),
                             None)
        return err
