"""The lookup component: the client's source of truth for where topics live.

A round for ``(topic, access)`` asks every known lookupd concurrently (healthy ones first:
the round waits for them; demoted ones only when their backoff is due, and the round does not
wait for those once a healthy lookupd answered), then merges the answers (``view.py``).
When no lookupd answers, the previous view stays in force, the error is recorded
(:meth:`Lookup.last_error`) and subscribers get a :class:`LookupFailed` event; only a caller
that has no view at all gets :class:`LookupFailedError`. When every lookupd asked answered and
every answer was refused as invalid, the error is :class:`LookupRefusedError`: asking again
soon will not help, and callers with a deadline need not wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Self

import aiohttp

from smartnsq._checks import check_optional_duration
from smartnsq._entry import Entry
from smartnsq.config import LookupConfig
from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    LookupdError,
    LookupFailedError,
)
from smartnsq.lookup.admin import AdminSource, LookupAdmin
from smartnsq.lookup.client import LookupdClient
from smartnsq.lookup.coalesce import Coalescer, until_answered
from smartnsq.lookup.events import TopicChange, diff_views
from smartnsq.lookup.health import HealthBook, LookupdStatus
from smartnsq.lookup.meters import LookupMeters
from smartnsq.lookup.parse import not_found_answer, not_found_reason, parse_lookup
from smartnsq.lookup.refresher import jittered_delay, run_periodically
from smartnsq.lookup.roster import LookupdRoster
from smartnsq.lookup.subscription import ChangeCallback, Subscription
from smartnsq.lookup.topics import TopicState, TopicTable, refused
from smartnsq.lookup.view import Access, LookupAnswer, TopicView, merge_answers
from smartnsq.metrics import Metrics
from smartnsq.protocol.validation import check_topic, parse_http_address

log = logging.getLogger("smartnsq.lookup")

STOPPED = ("this Lookup was stopped (Lookup.stop() or the end of its 'async with') and cannot "
           "be started again; stop the clients that share it first, or give them a new Lookup")


def check_access(access: str) -> Access:
    if access == "r":
        return "r"
    if access == "w":
        return "w"
    raise ConfigError(f"access must be 'r' (consumers) or 'w' (producers), got {access!r}")


def _seed_urls(addresses: Sequence[str]) -> tuple[str, ...]:
    """The configured lookupds as base URLs, without duplicates, in order."""
    seeds: list[str] = []
    for a in addresses:
        url = parse_http_address(a)
        if url not in seeds:
            seeds.append(url)
    return tuple(seeds)


def _health_book(config: LookupConfig, seeds: tuple[str, ...],
                 clock: Callable[[], float]) -> HealthBook:
    health = HealthBook(failure_threshold=config.failure_threshold,
                        retry_min=config.demoted_retry_min,
                        retry_max=config.demoted_retry_max, clock=clock)
    for s in seeds:
        health.add(s, seed=True)
    return health


def _own_session() -> aiohttp.ClientSession:
    # no pool limit of its own: the client's slots (http_limits.ServerGates) bound the
    # connections, and a request queued in the pool would spend its timeout there
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


class Lookup:
    """Discovers lookupds, keeps merged topic views fresh and tells subscribers what changed.

    ``async with Lookup(LookupConfig(addresses=(...,))) as lookup:``, or :meth:`start` and
    :meth:`stop`. Shared with clients (``lookupd=``), it stays the caller's: they neither
    start nor stop it; its methods start it on first use. A topic nobody asked about (lookup,
    refresh, view, stale report) or subscribes to for ``config.idle_polls`` poll intervals is
    forgotten. ``clock`` (monotonic seconds) and ``rng`` can be injected for tests.
    ``metrics``: where its ``LOOKUP_*`` metrics go (:mod:`smartnsq.lookup.meters`; None: the
    process default, read at :meth:`start`; a client that makes its lookup gives it its own).
    """

    def __init__(self, config: LookupConfig, *, session: aiohttp.ClientSession | None = None,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 metrics: Metrics | None = None) -> None:
        if not isinstance(config, LookupConfig):
            raise ConfigError(f"Lookup needs a LookupConfig, got {type(config).__name__}")
        self._config = config
        self._seeds = _seed_urls(config.addresses)
        self._clock = clock
        self._rng = rng or random.Random()
        self._session = session
        self._own_session = session is None
        self._health = _health_book(config, self._seeds, clock)
        self._client: LookupdClient | None = None
        self._roster: LookupdRoster | None = None
        self._discover_once: Coalescer[tuple[str, ...]] | None = None
        #: set after the first /listlookup pass, which the first lookup round waits for
        self._discovered = asyncio.Event()
        self._discovery_task: asyncio.Task[None] | None = None
        #: set at the next discovery pass's first answer (or its end); see _answered_pass
        self._pass_waiters: list[asyncio.Event] = []
        self._topics = TopicTable(self._round, delay=self._poll_delay, clock=clock,
                                  idle_after=config.idle_polls * config.poll_interval,
                                  spawn=self._spawn)
        self._background: set[asyncio.Task[Any]] = set()
        self._started = False
        self._closed = False
        #: one ``async with`` at a time, none around a started Lookup (smartnsq._entry)
        self._entry = Entry("Lookup")
        self._admin: LookupAdmin | None = None
        #: its metrics (``meters.use(m)`` before start: a client's that made it)
        self.meters = LookupMeters(metrics)

    async def __aenter__(self) -> Self:
        # a first lookup() starts a Lookup by itself: a started one may still be entered
        await self._entry.enter(False, self.start)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self._entry.leave(self.stop)

    async def start(self) -> None:
        """Open the HTTP session and start the periodic ``/listlookup`` pass."""
        if self._closed:
            raise ClientClosedError(STOPPED)
        if self._started:
            return
        self._started = True
        if self._session is None:
            self._session = _own_session()
        self._client = LookupdClient(self._session, self._config.request_timeout)
        self.meters.start(self._client, self._health, self._topics)
        self._roster = LookupdRoster(self._seeds, self._health, self._client,
                                 enabled=self._config.use_listlookup)
        self._discover_once = Coalescer(self._discover_round)
        if self._config.use_listlookup:
            self._discovery_task = asyncio.create_task(run_periodically(
                "lookupd discovery", self._discover_once, self._poll_delay, immediately=True))

    @property
    def is_closed(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._closed

    async def stop(self) -> None:
        """Stop every task, end subscriptions, close the session we opened. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if followed := self._topics.followed():
            # running consumers keep their connections but hear of no new nsqd or leader
            log.warning("Lookup stopped while clients still follow %s: they get no more "
                        "updates; stop the clients before the Lookup they share", followed)
        tasks: list[asyncio.Task[Any]] = list(self._background)
        if self._discovery_task is not None:
            tasks.append(self._discovery_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._topics.close()
        if self._discover_once is not None:
            await self._discover_once.close()
        if self._own_session and self._session is not None:
            await self._session.close()
        self.meters.close()

    async def _ready(self) -> LookupdClient:
        if self._closed:
            raise ClientClosedError(STOPPED)
        await self.start()
        assert self._client is not None
        return self._client

    @property
    def config(self) -> LookupConfig:
        return self._config

    @property
    def seeds(self) -> tuple[str, ...]:
        """Configured lookupds as base URLs (``http://host:port``)."""
        return self._seeds

    @property
    def leader(self) -> str | None:
        """Base URL of the lookupd leader named by ``/listlookup`` (None: unknown/none)."""
        return self._roster.leader if self._roster is not None else None

    def lookupds(self) -> tuple[LookupdStatus, ...]:
        """Every known lookupd with its health, seeds first."""
        return self._health.snapshot(self.leader)

    def view(self, topic: str, access: str = "r") -> TopicView | None:
        """The current view, without any I/O (None before the first successful round, and
        once the topic was forgotten). Reading it counts as using the topic."""
        state = self._topics.get((check_topic(topic), check_access(access)), use=True)
        return state.view if state is not None else None

    def tracked(self) -> tuple[tuple[str, Access], ...]:
        """Every ``(topic, access)`` refreshed in the background now."""
        return self._topics.keys()

    def last_error(self, topic: str, access: str = "r") -> LookupFailedError | None:
        """Why the latest round for ``(topic, access)`` failed; None after a good round."""
        state = self._topics.get((check_topic(topic), check_access(access)))
        return state.last_error if state is not None else None

    def rounds(self, topic: str, access: str = "r") -> int:
        """How many lookup rounds ran for ``(topic, access)`` (coalescing made visible)."""
        state = self._topics.get((check_topic(topic), check_access(access)))
        return state.coalescer.rounds if state is not None else 0

    @property
    def admin(self) -> LookupAdmin:
        """Read-only helpers and youzan topic administration (see ``admin.py``)."""
        if self._admin is None:
            self._admin = LookupAdmin(AdminSource(
                self._ready, self._ensure_discovered, self.discover, lambda: self.leader,
                self._health,
                lambda: self._roster.timed_out if self._roster is not None else {},
                self._answered_pass))
        return self._admin

    # -- discovery -------------------------------------------------------------------------

    def _poll_delay(self) -> float:
        return jittered_delay(self._config.poll_interval, self._config.poll_jitter, self._rng)

    async def _discover_round(self) -> tuple[str, ...]:
        assert self._roster is not None
        waiters, self._pass_waiters = self._pass_waiters, []

        def answered() -> None:
            self._discovered.set()
            for w in waiters:
                w.set()

        try:
            return await self._roster.run(answered=answered)
        finally:
            answered()

    async def _answered_pass(self) -> None:
        """Run ``/listlookup`` now and return once one lookupd answered it (or the pass
        ended): a write whose leader went silent does not wait for its /listlookup too."""
        await self._ready()
        assert self._discover_once is not None
        await until_answered(self._discover_once, self._pass_waiters)

    async def discover(self) -> tuple[str, ...]:
        """Run ``/listlookup`` now (coalesced with a pass in progress); the known lookupds."""
        await self._ready()
        assert self._discover_once is not None
        return await self._discover_once()

    async def _ensure_discovered(self) -> None:
        if self._config.use_listlookup and not self._discovered.is_set():
            # the first pass is bounded by the request timeout; the bound here is a backstop
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._discovered.wait(),
                                       self._config.request_timeout * 2)

    # -- topics ----------------------------------------------------------------------------

    def _use(self, topic: str, access: str, metainfo: bool) -> TopicState:
        return self._topics.use((check_topic(topic), check_access(access)), metainfo)

    async def lookup(self, topic: str, access: str = "r", *, metainfo: bool = True,
                     max_age: float | None = None) -> TopicView:
        """The view of ``topic`` for producers (``"w"``) or consumers (``"r"``).

        Returns the current view when there is one (younger than ``max_age`` seconds if
        given), else runs a round. From now on the topic is refreshed in the background
        every ``poll_interval`` (+ jitter) until :meth:`forget`, or until nobody used it
        for ``config.idle_polls`` polls. ``metainfo`` asks youzan lookupds for ``meta``
        (partition count, ordered, ext ...).
        Raises :class:`LookupFailedError` only when no view could ever be built
        (:class:`LookupRefusedError` when every lookupd answered and none was believed).
        """
        max_age = check_optional_duration(max_age, "max_age")
        await self._ready()
        state = self._use(topic, access, metainfo)
        # tracked even if this first round fails: the refresher retries every poll
        self._topics.track(state, immediately=False)
        view = state.view
        if view is not None and (max_age is None or self._clock() - view.built_at <= max_age):
            return view
        return await state.coalescer()

    async def refresh(self, topic: str, access: str = "r", *,
                      metainfo: bool = True) -> TopicView:
        """Run a round now; concurrent callers share it (see ``coalesce.py``).

        Returns the new view, or the previous one if every lookupd failed (check
        :meth:`last_error`); raises :class:`LookupFailedError` if there is no view at all.
        """
        await self._ready()
        state = self._use(topic, access, metainfo)
        self._topics.track(state, immediately=False)
        return await state.coalescer()

    def report_stale(self, topic: str, partition: int | None = None, *,
                     access: str | None = None) -> None:
        """A connection saw a leader that is not the leader any more (E_FAILED_ON_NOT_LEADER,
        E_TOPIC_NOT_EXIST ...): refresh that topic's tracked views soon, coalesced.

        Does not wait; subscribers hear about the result.
        """
        check_topic(topic)
        modes: tuple[Access, ...] = (check_access(access),) if access is not None else ("r", "w")
        if self._closed:
            return
        for mode in modes:
            state = self._topics.get((topic, mode), use=True)
            if state is None or state.coalescer.queued:
                continue  # a round not started yet answers this report too
            where = f" partition {partition}" if partition is not None else ""
            log.info("stale leader reported for topic %r%s (access=%s); refreshing",
                     topic, where, mode)
            self._spawn(functools.partial(asyncio.shield, state.coalescer.request()),
                        f"refresh of topic {topic!r} (access={mode})")

    def subscribe(self, topic: str, access: str = "r", callback: ChangeCallback | None = None,
                  *, metainfo: bool = True, maxsize: int = 1000) -> Subscription:
        """Receive a :class:`TopicChange` after every round that changed ``(topic, access)``
        or failed. Tracks the topic (starting its refresher); if a view exists, the
        subscriber first gets it as a snapshot change (``previous=None``).
        """
        if self._closed:
            raise ClientClosedError(STOPPED)
        state = self._use(topic, access, metainfo)
        sub = Subscription(state.topic, state.access, callback=callback, maxsize=maxsize,
                           on_close=lambda s: self._topics.unsubscribe(state, s))
        state.subscribers.append(sub)
        if state.view is not None:
            sub.deliver(TopicChange(state.topic, state.access, None, state.view,
                                    diff_views(None, state.view)))
        if self._started:
            self._topics.track(state, immediately=state.view is None)
        else:
            self._spawn(lambda: self._start_tracking(state), "lookup start")
        return sub

    async def _start_tracking(self, state: TopicState) -> None:
        await self._ready()
        self._topics.track(state, immediately=state.view is None)

    def forget(self, topic: str, access: str = "r") -> None:
        """Stop refreshing ``(topic, access)``, drop its view and end its subscriptions."""
        self._topics.forget((check_topic(topic), check_access(access)))

    def _spawn(self, start: Callable[[], Awaitable[Any]], what: str) -> None:
        # the coroutine is created inside the task, so cancelling the task early leaves
        # no never-awaited coroutine behind; a cancelled task ends cancelled
        async def guarded() -> None:
            try:
                await start()
            except LookupFailedError as exc:
                log.debug("%s: %s", what, exc)
            except ClientClosedError:
                pass
            except Exception:
                log.exception("%s: unexpected error", what)

        task = asyncio.get_running_loop().create_task(guarded(), name=f"smartnsq lookup: {what}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- one round -------------------------------------------------------------------------

    async def _query(self, lookupd: str, state: TopicState) -> LookupAnswer | LookupdError:
        assert self._client is not None
        params = {"topic": state.topic, "access": state.access}
        if state.metainfo:
            params["metainfo"] = "true"
        try:
            payload = await self._client.get(lookupd, "/lookup", params)
            previous = state.answers.get(lookupd)
            answer = parse_lookup(payload, lookupd=lookupd, received_at=self._clock(),
                                  topic=state.topic,
                                  reported=previous.skipped if previous is not None else ())
        except LookupdError as exc:
            reason = not_found_reason(exc)
            if reason is None:
                self._health.failure(lookupd, f"/lookup topic={state.topic} "
                                              f"access={state.access}: {exc.detail}")
                self._on_failure(lookupd)
                return exc
            answer = not_found_answer(reason, lookupd=lookupd, received_at=self._clock())
        self._health.success(lookupd)
        answer = state.hold_empty(answer, self._clock(), 2 * self._config.poll_interval)
        state.answers[lookupd] = answer
        return answer

    def _on_failure(self, lookupd: str) -> None:
        # A discovered lookupd that stops answering may have left the cluster: ask again.
        if (self._health.is_demoted(lookupd) and not self._health.is_seed(lookupd)
                and self._discover_once is not None and not self._discover_once.busy
                and self._config.use_listlookup):
            self._spawn(self._discover_once, "lookupd discovery")

    async def _round(self, state: TopicState) -> TopicView:
        tasks: dict[str, asyncio.Task[LookupAnswer | LookupdError]] = {}
        try:
            if self._config.use_listlookup and not self._discovered.is_set():
                # the first round asks the seeds while the first /listlookup pass runs: a
                # silent seed then costs the caller one request timeout, not two in a row
                healthy, probes = self._health.plan()
                tasks = {a: asyncio.create_task(self._query(a, state)) for a in healthy + probes}
                await self._ensure_discovered()
            healthy, probes = self._health.plan()
            tasks.update({a: asyncio.create_task(self._query(a, state))
                          for a in healthy + probes if a not in tasks})
            if healthy:
                await asyncio.wait([tasks[a] for a in healthy])
            fresh = {a: t.result() for a, t in tasks.items() if t.done()}
            pending = [t for t in tasks.values() if not t.done()]
            if pending and not any(isinstance(r, LookupAnswer) for r in fresh.values()):
                await asyncio.wait(pending)
                fresh = {a: t.result() for a, t in tasks.items() if t.done()}
        except asyncio.CancelledError:
            for t in tasks.values():
                t.cancel()
            raise
        for t in tasks.values():
            if not t.done():
                # A slow demoted lookupd: let it finish without us; if it turns out to be
                # back, run another round so its answer is used now rather than next poll.
                self._background.add(t)
                t.add_done_callback(self._background.discard)
                t.add_done_callback(lambda t: self._probe_done(t, state))

        answers = {a: r for a, r in fresh.items() if isinstance(r, LookupAnswer)}
        failed = {a: r.detail for a, r in fresh.items() if isinstance(r, LookupdError)}
        for a, t in tasks.items():
            if not t.done():
                failed[a] = "demoted; its answer came too late for this round"
        for st in self._health.snapshot(None):
            if st.address not in tasks:
                failed[st.address] = f"demoted, not asked (last error: {st.last_error})"
        if not answers:
            refusals = {a: r.reason for a, r in fresh.items()
                        if isinstance(r, LookupdError) and refused(r)}
            # refused only when every lookupd asked answered and was refused: one that is
            # down or slow may still come back with a good answer
            return state.round_failed(failed, refusals if len(refusals) == len(tasks) else None,
                                      self._clock())

        carried = [a for a in failed
                   if a in state.answers and a in self._health
                   and not self._health.is_demoted(a)]
        merged = list(answers.values()) + [state.answers[a] for a in carried]
        view = merge_answers(state.topic, state.access, merged, leader=self.leader,
                             built_at=self._clock(), carried=carried, failed=failed)
        state.drop_answers(self._health)
        previous, state.view, state.last_error = state.view, view, None
        events = diff_views(previous, view)
        if events:
            state.notify(TopicChange(state.topic, state.access, previous, view, events))
        return view

    def _probe_done(self, task: asyncio.Task[LookupAnswer | LookupdError],
                    state: TopicState) -> None:
        if task.cancelled() or self._closed or self._topics.get(
                (state.topic, state.access)) is not state:
            return
        if task.exception() is None and isinstance(task.result(), LookupAnswer):
            self._spawn(state.coalescer, f"refresh of topic {state.topic!r} "
                                           f"(access={state.access})")
