"""The consumer's subscriptions: one per :class:`Endpoint` (nsqd, partition), each kept alive
by a small runner task that connects, waits for the connection to end and reconnects.

At most ``max_connecting`` connects (dial, handshake, SUB) run at once: a lookupd listing
thousands of nsqd makes the runners queue for a slot instead of dialling all of them at
the same moment (which would exhaust file descriptors and ephemeral ports, and time most of
them out).

Reconnects back off as the set's :class:`~smartnsq.backoff.Backoff` says: by default
:func:`reconnect_backoff`, exponential with equal jitter (``reconnect_min`` doubling up to
``reconnect_max``; each wait drawn from the upper half of the current step). Before each
retry the discovery is asked whether the endpoint is still wanted: always for direct
addresses, "does a fresh lookup still list it" with lookupds. Errors that retrying cannot
fix (configuration errors) end the runner and are reported to the consumer once.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

from smartnsq.backoff import Backoff, EqualJitterBackoff
from smartnsq.config import ConsumerConfig
from smartnsq.consumer.discovery import (
    NO_PARTITION,
    Discovery,
    Endpoint,
    EndpointKey,
    Topology,
)

__all__ = ["ConnectionSet", "Session", "Slot", "reconnect_backoff"]

log = logging.getLogger("smartnsq.consumer")


class Session(Protocol):
    """A subscribed connection as the consumer runs it."""

    async def wait_closed(self) -> None:
        """Return once the connection is closed, for whatever reason."""
        ...

    async def retire(self) -> None:
        """The endpoint is no longer wanted: stop delivery, drain briefly, close."""
        ...

    @property
    def stale_leader(self) -> bool:
        """The server said it does not lead (or hold) this partition any more."""
        ...


Opener = Callable[[Endpoint], Awaitable[Session]]


def reconnect_backoff(config: ConsumerConfig, rng: random.Random | None = None) -> Backoff:
    """The consumer's reconnect backoff from ``config``."""
    return EqualJitterBackoff(config.reconnect_min, config.reconnect_max, rng)


class Slot:
    """One endpoint's runner and state."""

    __slots__ = ("endpoint", "failures", "first_attempt", "session", "task", "wanted")

    def __init__(self, endpoint: Endpoint, first_attempt: asyncio.Future[None]) -> None:
        self.endpoint = endpoint
        self.wanted = True
        self.failures = 0
        self.session: Session | None = None
        self.task: asyncio.Task[None] | None = None
        #: resolved after the first connect attempt, whatever its outcome
        self.first_attempt = first_attempt


class ConnectionSet:
    """Reconciles running subscriptions against :class:`Topology` snapshots. ``backoff``
    (default: equal jitter from ``reconnect_min`` doubling up to ``reconnect_max``, drawn with
    ``rng``) says how long an endpoint's runner waits before retry number n."""

    def __init__(
        self,
        discovery: Discovery,
        opener: Opener,
        *,
        is_fatal: Callable[[BaseException, bool], bool],
        on_fatal: Callable[[BaseException], None],
        reconnect_min: float,
        reconnect_max: float,
        rng: random.Random | None = None,
        backoff: Backoff | None = None,
        max_connecting: int = 32,
    ) -> None:
        self._discovery = discovery
        self._open = opener
        self._is_fatal = is_fatal
        self._on_fatal = on_fatal
        #: the wait before an endpoint's retry number n
        self.backoff = backoff if backoff is not None else EqualJitterBackoff(
            reconnect_min, reconnect_max, rng)
        self._connecting = asyncio.Semaphore(max_connecting)
        self._slots: dict[EndpointKey, Slot] = {}
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False
        #: a subscription was opened: ``is_fatal``'s second argument
        self._subscribed = False
        self.topology = Topology()

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> tuple[Slot, ...]:
        return tuple(self._slots.values())

    def reconcile(self, topology: Topology) -> None:
        """Start runners for new endpoints; retire those no longer listed (a live stock
        subscription is kept until it ends, and then not reconnected)."""
        if self._closed:
            return
        self.topology = topology
        wanted = topology.endpoints
        for key, ep in wanted.items():
            slot = self._slots.get(key)
            if slot is None:
                self._start(ep)
            else:
                slot.endpoint = ep
        for key in [k for k in self._slots if k not in wanted]:
            slot = self._slots[key]
            if slot.session is not None and slot.endpoint.partition == NO_PARTITION:
                # stock nsqd: an unlisted nsqd keeps a live subscription until it ends, and
                # is then not reconnected unless listed again (go-nsq and pynsq alike). A
                # restarted nsqlookupd lists nothing until each nsqd re-registers on its
                # next 15 s ping; a deleted topic or a stopped nsqd closes the connection
                continue
            del self._slots[key]
            slot.wanted = False
            log.info("%s is no longer listed for this topic; unsubscribing", slot.endpoint)
            self._stop_slot(slot)

    async def wait_first_attempts(self, within: float | None = None) -> bool:
        """Wait until every current endpoint was tried once, or ``within`` seconds passed
        (the rest keep trying in the background); True if all were tried."""
        firsts = [s.first_attempt for s in self._slots.values()
                  if not s.first_attempt.done()]
        if not firsts:
            return True
        _, pending = await asyncio.wait(firsts, timeout=within)
        return not pending

    def _start(self, ep: Endpoint) -> None:
        loop = asyncio.get_running_loop()
        slot = Slot(ep, loop.create_future())
        self._slots[ep.key] = slot
        slot.task = loop.create_task(self._run(slot), name=f"smartnsq consumer {ep}")

    def _stop_slot(self, slot: Slot) -> None:
        session = slot.session
        if session is not None:
            # graceful: the runner ends when the retired connection closes
            task = asyncio.get_running_loop().create_task(self._retire(session))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        elif slot.task is not None:
            slot.task.cancel()

    async def _retire(self, session: Session) -> None:
        try:
            await session.retire()
        except Exception:
            log.exception("retiring a subscription failed")

    async def _run(self, slot: Slot) -> None:
        ep = slot.endpoint
        try:
            while slot.wanted and not self._closed:
                if slot.failures:
                    await asyncio.sleep(self.backoff.compute(slot.failures))
                    if not slot.wanted or self._closed:
                        break
                    if not await self._discovery.still_wanted(slot.endpoint):
                        log.info("%s is not listed any more; not reconnecting", ep)
                        break
                try:
                    async with self._connecting:
                        if not slot.wanted or self._closed:
                            break
                        session = await self._open(slot.endpoint)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if self._is_fatal(exc, self._subscribed):
                        self._on_fatal(exc)
                        return
                    slot.failures += 1
                    log.warning("cannot subscribe at %s (attempt %d): %s", ep, slot.failures,
                                exc)
                    self._discovery.connection_lost(ep, bool(getattr(exc, "refresh_lookup",
                                                                     False)))
                    continue
                finally:
                    if not slot.first_attempt.done():
                        slot.first_attempt.set_result(None)
                slot.failures = 0
                self._subscribed = True
                slot.session = session
                try:
                    await session.wait_closed()
                finally:
                    slot.session = None
                if not slot.wanted or self._closed:
                    break
                # a healthy subscription that ended: retry soon, via a fresh poll if lookupds
                slot.failures = 1
                self._discovery.connection_lost(ep, session.stale_leader)
        finally:
            if not slot.first_attempt.done():
                slot.first_attempt.set_result(None)
            if self._slots.get(ep.key) is slot and not self._closed:
                # gave up (fatal, or no longer listed): forget it, so that a later topology
                # listing the endpoint again starts a new runner
                del self._slots[ep.key]

    async def close(self) -> None:
        """Stop every runner (sessions are closed by the consumer). Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [s.task for s in self._slots.values() if s.task is not None]
        tasks.extend(self._retiring)
        for s in self._slots.values():
            s.wanted = False
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
