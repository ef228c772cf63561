"""The topics a :class:`~smartnsq.lookup.Lookup` keeps fresh, and when it lets them go.

Each ``(topic, access)`` asked about gets a :class:`TopicState` (its view, the lookupds'
last answers, its subscribers) and a refresher task that runs a round every poll. A topic
nobody used for ``idle_after`` seconds — no lookup, refresh, view read or stale-leader report,
and no subscription — is forgotten by its own refresher at its next wake-up, so a process
that looks up many topics once does not keep a task and a view per topic forever. A
subscribed topic is never forgotten while subscribed, nor one whose round is running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field
from typing import Any

from smartnsq.errors import LookupdError, LookupFailedError, LookupRefusedError
from smartnsq.lookup.coalesce import Coalescer
from smartnsq.lookup.events import LookupFailed, TopicChange
from smartnsq.lookup.health import REPEAT_WARNING_EVERY
from smartnsq.lookup.refresher import run_periodically
from smartnsq.lookup.subscription import Subscription
from smartnsq.lookup.view import Access, LookupAnswer, TopicView
from smartnsq.metrics import HistogramChild

log = logging.getLogger("smartnsq.lookup")

#: least time between two rounds of one topic when callers keep asking (youzan go-nsq
#: pauses 100 ms after a forced re-query)
MIN_ROUND_SPACING = 0.1

#: how long an answer listing no nsqd for a topic whose nsqds the lookupd listed before is not
#: believed: a restarted lookupd knows no nsqd until they register again (each pings every
#: 15 s and registers all its topics when it reconnects)
REGISTRATION_GRACE = 30.0

Key = tuple[str, Access]
Spawn = Callable[[Callable[[], Awaitable[Any]], str], None]


@dataclass(eq=False)
class TopicState:
    topic: str
    access: Access
    metainfo: bool
    coalescer: Coalescer[TopicView] = field(init=False)
    view: TopicView | None = None
    last_error: LookupFailedError | None = None
    #: when a failed round was last said as a warning (the Lookup's clock)
    warned_at: float = 0.0
    #: last good answer of each lookupd, reused while it fails without being demoted
    answers: dict[str, LookupAnswer] = field(default_factory=dict)
    refresher: asyncio.Task[None] | None = None
    subscribers: list[Subscription] = field(default_factory=list)
    #: when someone last asked for the topic (the Lookup's clock)
    last_used: float = 0.0
    #: lookupd → when it first listed no nsqd after listing some (see hold_empty)
    emptied: dict[str, float] = field(default_factory=dict)

    def hold_empty(self, answer: LookupAnswer, now: float, max_age: float) -> LookupAnswer:
        """``answer``, or the lookupd's previous one while ``answer`` lists no nsqd though
        the previous one (at most ``max_age`` old) did, for :data:`REGISTRATION_GRACE` from
        the first such answer: a restarted lookupd would otherwise remove every nsqd of the
        topic from the view and every consumer would unsubscribe from them."""
        lookupd = answer.lookupd
        previous = self.answers.get(lookupd)
        if (not _lists_nothing(answer) or previous is None or _lists_nothing(previous)
                or now - previous.received_at > max_age):
            self.emptied.pop(lookupd, None)
            return answer
        since = self.emptied.setdefault(lookupd, now)
        if now - since >= REGISTRATION_GRACE:
            del self.emptied[lookupd]
            return answer
        if since == now:
            log.info("lookupd %s lists no nsqd for topic %r (access=%s) but listed %d before "
                     "(restarted?); its previous answer is used for up to %gs while the nsqds "
                     "register again", lookupd, self.topic, self.access,
                     len(previous.partitions) + len(previous.legacy), REGISTRATION_GRACE)
        return previous

    def failed_again(self, err: LookupFailedError, now: float) -> bool:
        """Record ``err`` as the last error; True when it repeats the one before, so the
        log need not say it again. The same refused answer repeats until a good round or
        another answer (only an operator changes it); any other failure said the same way
        is said again after :data:`REPEAT_WARNING_EVERY` (a publish waiting for a route asks
        several times a second)."""
        previous, self.last_error = self.last_error, err
        if isinstance(err, LookupRefusedError):
            return isinstance(previous, LookupRefusedError) and previous.reason == err.reason
        if (previous is not None and str(previous) == str(err)
                and now - self.warned_at < REPEAT_WARNING_EVERY):
            return True
        self.warned_at = now
        return False

    def round_failed(self, failed: dict[str, str], refusals: dict[str, str] | None,
                     now: float) -> TopicView:
        """Keep the previous view (if any), record why, tell subscribers; raise without
        a view. ``refusals``: each lookupd's refused answer when every lookupd asked
        answered and none was believed (:class:`LookupRefusedError`)."""
        err = round_error(self, failed, refusals)
        level = logging.DEBUG if self.failed_again(err, now) else logging.WARNING
        if self.view is not None:
            log.log(level, "%s; keeping the view built %.1fs ago", err,
                    now - self.view.built_at)
        else:
            log.log(level, "%s", err)
        self.notify(TopicChange(self.topic, self.access, self.view, self.view,
                                (LookupFailed(err),)))
        if self.view is None:
            raise err
        return self.view

    def drop_answers(self, known: Container[str]) -> None:
        """Forget the answers of lookupds no longer ``known``; a demoted lookupd's answer
        stays (it is never carried: :meth:`hold_empty` compares with it)."""
        for lookupd in [a for a in self.answers if a not in known]:
            del self.answers[lookupd]
            self.emptied.pop(lookupd, None)

    def notify(self, change: TopicChange) -> None:
        for sub in list(self.subscribers):
            sub.deliver(change)


def _lists_nothing(answer: LookupAnswer) -> bool:
    return answer.not_found is not None or not (answer.partitions or answer.legacy)


def refused(err: LookupdError) -> bool:
    """The lookupd answered (2xx) but what it said was refused: not a lookup answer, a
    partition count beyond youzan's, a body over the cap. Asking again will not change it."""
    return err.status is not None and 200 <= err.status < 300


def round_error(state: TopicState, failed: dict[str, str],
                 refusals: dict[str, str] | None) -> LookupFailedError:
    """Why a round for ``state`` got no answer (see ``Lookup._round_failed``)."""
    what = f"/lookup for topic {state.topic!r} (access={state.access})"
    if refusals:
        reason = "; ".join(f"{a}: {r}" for a, r in refusals.items())
        # lookupds not asked (demoted, not due) are named too, as in any failed round
        detail = "; ".join(f"{a}: {refusals.get(a, r)}" for a, r in failed.items())
        return LookupRefusedError(
            f"every lookupd's answer to {what} was refused as invalid: {detail}",
            reason=reason)
    detail = "; ".join(f"{a}: {r}" for a, r in failed.items()) or "no lookupd known"
    return LookupFailedError(f"no lookupd answered {what}: {detail}")


class TopicTable:
    """Every tracked ``(topic, access)``: states, refreshers, idle eviction.

    ``round_`` runs one lookup round for a state; ``spawn`` runs a coroutine function in the
    Lookup's background set (closing a coalescer without waiting for it).
    """

    def __init__(self, round_: Callable[[TopicState], Awaitable[TopicView]], *,
                 delay: Callable[[], float], clock: Callable[[], float], idle_after: float,
                 spawn: Spawn) -> None:
        self._round = round_
        self._delay = delay
        self._clock = clock
        self._idle_after = idle_after
        self._spawn = spawn
        self._states: dict[Key, TopicState] = {}
        self._closed = False
        #: the round duration histogram (metrics on), else None
        self.timer: HistogramChild | None = None

    def get(self, key: Key, *, use: bool = False) -> TopicState | None:
        """The state of ``key`` if tracked; ``use`` counts this as a use (keeps it)."""
        state = self._states.get(key)
        if state is not None and use:
            state.last_used = self._clock()
        return state

    def use(self, key: Key, metainfo: bool) -> TopicState:
        """The state of ``key``, made on first use; counts as a use."""
        state = self._states.get(key)
        if state is None:
            new = TopicState(key[0], key[1], metainfo)
            new.coalescer = Coalescer(lambda: self._timed_round(new),
                                      min_spacing=MIN_ROUND_SPACING)
            state = self._states[key] = new
        elif metainfo:
            state.metainfo = True  # once anyone wants meta, keep asking for it
        state.last_used = self._clock()
        return state

    async def _timed_round(self, state: TopicState) -> TopicView:
        timer = self.timer
        if timer is None:
            return await self._round(state)
        start = time.perf_counter()
        try:
            return await self._round(state)
        finally:
            timer.observe(time.perf_counter() - start)

    def keys(self) -> tuple[Key, ...]:
        return tuple(self._states)

    def followed(self) -> str:
        """``topic/access`` of every state with a subscriber, comma-separated ("" if none)."""
        return ", ".join(f"{t}/{a}" for (t, a), s in self._states.items() if s.subscribers)

    def track(self, state: TopicState, *, immediately: bool) -> None:
        """Start the state's refresher unless it runs (or the table is closed)."""
        if state.refresher is None and not self._closed:
            what = f"lookup refresher for topic {state.topic!r} (access={state.access})"
            state.refresher = asyncio.get_running_loop().create_task(run_periodically(
                what, state.coalescer, self._delay, immediately=immediately,
                stop=lambda: self._evict_if_idle(state)), name=f"smartnsq {what}")

    def unsubscribe(self, state: TopicState, sub: Subscription) -> None:
        if sub in state.subscribers:
            state.subscribers.remove(sub)
            state.last_used = self._clock()  # the idle time starts when the last one leaves

    def forget(self, key: Key) -> None:
        """Stop refreshing ``key``, drop its view and end its subscriptions."""
        state = self._states.pop(key, None)
        if state is None:
            return
        if state.refresher is not None:
            state.refresher.cancel()
        self._spawn(state.coalescer.close, "forget")
        for sub in list(state.subscribers):
            sub.close()

    def _evict_if_idle(self, state: TopicState) -> bool:
        """True (and the state dropped) when nobody needs ``state`` any more."""
        idle = self._clock() - state.last_used
        if state.subscribers or state.coalescer.busy or idle < self._idle_after:
            return False
        key = (state.topic, state.access)
        if self._states.get(key) is state:
            del self._states[key]
        state.refresher = None
        log.debug("topic %r (access=%s): not asked about for %.0fs; no longer refreshed",
                  state.topic, state.access, idle)
        return True

    async def close(self) -> None:
        """Stop every refresher and round, end every subscription."""
        self._closed = True
        states = list(self._states.values())
        refreshers = [s.refresher for s in states if s.refresher is not None]
        for t in refreshers:
            t.cancel()
        await asyncio.gather(*refreshers, return_exceptions=True)
        await asyncio.gather(*(s.coalescer.close() for s in states), return_exceptions=True)
        for state in states:
            for sub in list(state.subscribers):
                sub.close()
