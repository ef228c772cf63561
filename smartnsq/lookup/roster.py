"""Which lookupds exist: :class:`LookupdRoster` asks ``/listlookup`` of the known ones, falling
back to the seeds. (Where a consumer subscribes is :mod:`smartnsq.consumer.discovery`.)

One pass asks every known lookupd (demoted ones only when due) at the same time:

* if any answers with a list, the known set becomes seeds ∪ every listed lookupd (lookupds
  that are no longer listed are dropped, seeds never are) and the leader is the one named
  by the answer with the highest leader ``Epoch`` (the most recent election);
* if none has a list but some answered that they have none (stock 404, standalone youzan
  empty body or ``"data": null``), only the seeds are used and there is no leader;
* if every request failed, nothing changes: a network blip must not shrink the set.

The first answer of a pass is applied as it comes (it releases the round waiting for it), but
only to add lookupds and name the leader: which lookupds are dropped is decided by the pass's
merged answers, so one that only a slower lookupd lists is not dropped meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from smartnsq.errors import LookupdError
from smartnsq.lookup.client import NO_ANSWER, LookupdClient
from smartnsq.lookup.health import HealthBook
from smartnsq.lookup.parse import ClusterLookupds, parse_listlookup

log = logging.getLogger("smartnsq.lookup")


class _Unsupported:
    pass


_UNSUPPORTED = _Unsupported()


class LookupdRoster:
    """The known lookupds and their leader, kept by discovery passes (:meth:`run`)."""

    def __init__(self, seeds: Sequence[str], health: HealthBook, client: LookupdClient, *,
                 enabled: bool) -> None:
        self.seeds = tuple(seeds)
        self.enabled = enabled
        self._health = health
        self._client = client
        self.leader: str | None = None
        #: None until a pass got an answer; then whether the cluster has /listlookup
        self.supported: bool | None = None
        self.passes = 0
        #: answers applied to the known set (once a pass; twice when a list unlike the
        #: first ones came after the first answer released the round)
        self.applied = 0
        #: lookupd → (loop time, error) of its latest /listlookup when that timed out; an
        #: admin write just after the pass does not wait for such a lookupd a second time
        self.timed_out: dict[str, tuple[float, LookupdError]] = {}

    async def run(self, answered: Callable[[], None] | None = None) -> tuple[str, ...]:
        """One discovery pass; never raises for lookupd failures. Returns the known set.

        ``answered`` is called once, as soon as one lookupd answered (its answer applied): the
        first lookup round waits for that, not for a silent seed's whole request timeout.
        """
        if not self.enabled:
            return self._health.addresses
        self.passes += 1
        healthy, probes = self._health.plan()
        targets = healthy + probes
        tasks = [asyncio.ensure_future(self._ask(a)) for a in targets]
        pending = set(tasks)
        #: the lists the release applied (None: not released yet)
        applied: list[ClusterLookupds] | None = None
        try:
            while pending:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if answered is None:
                    continue
                # in target order (healthiest first), as the leader tie-break wants
                results = [t.result() for t in tasks if t.done()]
                if any(r is not None for r in results):
                    # only adds: a lookupd that a slower answer of this pass still lists
                    # must not be dropped (and re-added, its health reset) meanwhile
                    applied = self._use(results, targets, drop=False)
                    answered()
                    answered = None
        finally:
            for t in pending:  # cancelled with the pass: no request outlives it
                t.cancel()
        # Applied again only when a list unlike those applied came after the release: a
        # failure, "no /listlookup" or the same list (a healthy cluster's lookupds all list
        # the same) changes neither the set nor the leader (see _use); what the release
        # left for the pass's merged answer to decide is dropping lookupds nobody listed
        results = [t.result() for t in tasks]
        if applied is None or any(isinstance(r, ClusterLookupds) and r not in applied
                                  for r in results):
            self._use(results, targets)
        else:
            self._drop(applied)
        return self._health.addresses

    def _use(self, results: Sequence[ClusterLookupds | _Unsupported | None],
             targets: Sequence[str], *, drop: bool = True) -> list[ClusterLookupds]:
        """Apply a pass's results; the lists applied (empty when every request failed)."""
        self.applied += 1
        lists = [r for r in results if isinstance(r, ClusterLookupds)]
        if lists:
            self.supported = True
        elif any(r is _UNSUPPORTED for r in results):
            if self.supported is not False:
                log.info("lookupds have no /listlookup (stock or standalone youzan); "
                         "using the configured seeds %s", ", ".join(self.seeds))
            self.supported = False
            lists = [ClusterLookupds(self.seeds, None)]
        else:
            log.warning("/listlookup failed on every lookupd (%s); keeping %d known lookupds",
                        ", ".join(targets), len(self._health.addresses))
            return []
        self._apply(lists)
        if drop:
            self._drop(lists)
        return lists

    async def _ask(self, lookupd: str) -> ClusterLookupds | _Unsupported | None:
        try:
            payload = await self._client.get(lookupd, "/listlookup")
            result = parse_listlookup(payload, lookupd=lookupd)
        except LookupdError as exc:
            if exc.status is None and exc.reason.startswith(NO_ANSWER):
                self.timed_out[lookupd] = (asyncio.get_running_loop().time(), exc)
            else:
                self.timed_out.pop(lookupd, None)
            if exc.status == 404:
                self._health.success(lookupd)
                return _UNSUPPORTED
            self._health.failure(lookupd, f"/listlookup: {exc.detail}")
            return None
        self.timed_out.pop(lookupd, None)
        self._health.success(lookupd)
        return _UNSUPPORTED if result is None else result

    def _apply(self, lists: Sequence[ClusterLookupds]) -> None:
        for addr in _listed(lists):
            if self._health.add(addr):
                log.info("discovered lookupd %s", addr)
        # max() keeps the first of equal epochs, i.e. the answer of the healthiest lookupd
        best = max(lists, key=lambda cl: cl.leader_epoch if cl.leader else -1)
        if best.leader != self.leader:
            log.info("lookupd leader is now %s (was %s)", best.leader, self.leader)
        self.leader = best.leader

    def _drop(self, lists: Sequence[ClusterLookupds]) -> None:
        if not lists:
            return
        listed = _listed(lists)
        for addr in self._health.addresses:
            if addr not in listed and not self._health.is_seed(addr):
                self._health.remove(addr)
                log.info("lookupd %s is no longer listed by /listlookup; dropped", addr)


def _listed(lists: Sequence[ClusterLookupds]) -> list[str]:
    return list(dict.fromkeys(a for cl in lists for a in cl.lookupds))
