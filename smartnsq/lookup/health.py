"""Per-lookupd health: demotion after repeated failures, backoff, promotion.

A lookupd that fails ``failure_threshold`` requests in a row is *demoted*: rounds stop
waiting for it and only probe it when its backoff has expired (``demoted_retry_min``
doubling up to ``demoted_retry_max``). Any answer promotes it again. When no lookupd is
healthy and none is due, the one due soonest is probed anyway so a round always tries
something.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("smartnsq.lookup")

#: the same failure of the same lookupd is logged as a warning at most this often (seconds)
REPEAT_WARNING_EVERY = 300.0


@dataclass(frozen=True, slots=True)
class LookupdStatus:
    """A snapshot of one known lookupd, for logs, tools and tests."""

    address: str
    seed: bool
    leader: bool
    demoted: bool
    consecutive_failures: int
    last_error: str | None
    #: seconds until a demoted lookupd is probed again (0 when healthy or due)
    retry_in: float


@dataclass
class _Health:
    address: str
    seed: bool
    failures: int = 0
    demoted: bool = False
    backoff: float = 0.0
    retry_at: float = 0.0
    last_error: str | None = None
    #: a probe of the demoted lookupd was claimed (plan): from then on its failures double
    #: the backoff; before, they are requests sent while it was healthy, which a burst of
    #: rounds makes many (20 rounds at once took the backoff from 1 s to its 60 s cap)
    probed: bool = False
    #: the failure last logged as a warning, and when (kept across answers: a lookupd that
    #: answers /listlookup but refuses /lookup would otherwise warn every poll)
    warned: str | None = None
    warned_at: float = 0.0


class HealthBook:
    """Known lookupds in insertion order (seeds first), with their health."""

    def __init__(self, *, failure_threshold: int, retry_min: float, retry_max: float,
                 clock: Callable[[], float]) -> None:
        self._threshold = failure_threshold
        self._retry_min = retry_min
        self._retry_max = max(retry_max, retry_min)
        self._clock = clock
        self._entries: dict[str, _Health] = {}
        #: called with a lookupd's address each time it is demoted (metrics)
        self.on_demote: Callable[[str], None] | None = None

    def add(self, address: str, *, seed: bool = False) -> bool:
        """Track ``address``; False when it was already known."""
        if address in self._entries:
            return False
        self._entries[address] = _Health(address, seed)
        return True

    def remove(self, address: str) -> None:
        self._entries.pop(address, None)

    def __contains__(self, address: object) -> bool:
        return address in self._entries

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def is_seed(self, address: str) -> bool:
        h = self._entries.get(address)
        return h is not None and h.seed

    def is_demoted(self, address: str) -> bool:
        h = self._entries.get(address)
        return h is not None and h.demoted

    def ordered(self) -> list[str]:
        """Healthy lookupds (fewest recent failures first), then demoted ones (due first)."""
        healthy = [h for h in self._entries.values() if not h.demoted]
        demoted = [h for h in self._entries.values() if h.demoted]
        healthy.sort(key=lambda h: h.failures)
        demoted.sort(key=lambda h: h.retry_at)
        return [h.address for h in healthy + demoted]

    def plan(self) -> tuple[list[str], list[str]]:
        """(healthy lookupds to query, demoted lookupds to probe) for one round.

        Probes are claimed: their next retry moves forward now, so rounds for other topics
        running at the same time do not probe the same lookupd again.
        """
        now = self._clock()
        healthy = [h.address for h in self._entries.values() if not h.demoted]
        demoted = sorted((h for h in self._entries.values() if h.demoted),
                         key=lambda h: h.retry_at)
        due = [h for h in demoted if h.retry_at <= now]
        if not healthy and not due and demoted:
            due = demoted[:1]
        for h in due:
            h.retry_at = now + h.backoff
            h.probed = True
        return healthy, [h.address for h in due]

    def success(self, address: str) -> None:
        h = self._entries.get(address)
        if h is None:
            return
        if h.demoted:
            log.info("lookupd %s answered again; promoted after %d consecutive failures",
                     address, h.failures)
        h.failures = 0
        h.demoted = False
        h.backoff = 0.0
        h.retry_at = 0.0
        h.probed = False
        h.last_error = None

    def failure(self, address: str, reason: str) -> bool:
        """Record a failed request; True when this failure demoted the lookupd."""
        h = self._entries.get(address)
        if h is None:
            return False
        now = self._clock()
        h.failures += 1
        h.last_error = reason
        if h.demoted:
            if not h.probed:
                return False
            h.backoff = min(h.backoff * 2, self._retry_max)
            h.retry_at = now + h.backoff
            # with no healthy lookupd a demoted one is asked on every round, not only when due
            log.log(logging.DEBUG if self._repeated(h, reason, now) else logging.INFO,
                    "demoted lookupd %s still failing (%s); probed again in %.3gs, or "
                    "sooner while no other lookupd answers", address, reason, h.backoff)
            return False
        if h.failures >= self._threshold:
            h.demoted = True
            h.backoff = self._retry_min
            h.retry_at = now + h.backoff
            log.warning("lookupd %s demoted after %d consecutive failures (last: %s); "
                        "next probe in %.3gs", address, h.failures, reason, h.backoff)
            if self.on_demote is not None:
                self.on_demote(address)
            return True
        log.log(logging.DEBUG if self._repeated(h, reason, now) else logging.WARNING,
                "lookupd %s failed (%s); %d/%d failures before demotion", address, reason,
                h.failures, self._threshold)
        return False

    @staticmethod
    def _repeated(h: _Health, reason: str, now: float) -> bool:
        """Whether ``reason`` was logged for ``h`` less than :data:`REPEAT_WARNING_EVERY`
        ago (then it goes to DEBUG: a lookupd failing the same way is said once a while);
        else it counts as logged now."""
        if h.warned == reason and now - h.warned_at < REPEAT_WARNING_EVERY:
            return True
        h.warned, h.warned_at = reason, now
        return False

    def snapshot(self, leader: str | None) -> tuple[LookupdStatus, ...]:
        now = self._clock()
        return tuple(
            LookupdStatus(
                address=h.address,
                seed=h.seed,
                leader=h.address == leader,
                demoted=h.demoted,
                consecutive_failures=h.failures,
                last_error=h.last_error,
                retry_in=max(0.0, h.retry_at - now) if h.demoted else 0.0,
            )
            for h in self._entries.values()
        )
