"""``smartnsq bridge``'s handler: publish each source message to the destination, then
return (FIN on the source).

A message is held (in the handler, in flight on the source) while its publish is retried,
and touched meanwhile, so the source does not time it out and hand it over a second time.
A publish the destination refuses for good (a body over its max message size, a bad topic,
an auth error: what :func:`refused_for_good` finds) is not retried: the run stops with
that reason. Every message the run does not forward goes back to the source once, after the
consumer's RDY 0 (see :meth:`Forwarder.end`), so nsqd does not hand it straight back.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from smartnsq.cli.common import CliError, describe, err_print
from smartnsq.cli.connections import POLL_SECONDS, REMIND_SECONDS
from smartnsq.cli.records import ShardKeyRule
from smartnsq.errors import ConfigError, ServerError, TLSError, UnsupportedFeatureError
from smartnsq.message import Message

if TYPE_CHECKING:  # the producer (aiohttp, pydantic) loads when bridge runs
    from smartnsq.producer import Producer

#: a held message is touched this often: well within the shortest in-flight timeout nsqd
#: lets a client ask for (1 s); the negotiated one is not known to a handler
TOUCH_SECONDS = 0.5
#: pause between two publishes of a held message while the destination fails
RETRY_SECONDS = 0.5
#: longest a message is held; then it goes back to the source once and is taken again.
#: Below nsqd's --max-msg-timeout (15 min by default), past which TOUCH no longer helps
HOLD_SECONDS = 300.0
#: on a stop, a publish still unanswered after this is given up (its message goes back):
#: ProducerConfig.request_timeout's default, the time the producer gives an nsqd to answer
STOP_GRACE = 5.0


def refused_for_good(exc: BaseException) -> BaseException | None:
    """The error in ``exc``'s cause chain that says the same publish can never succeed
    unchanged (nsqd's non-retryable error frames, the producer's own refusals), or None when
    retrying may help (a connection refused or lost, a timeout, E_PUB_FAILED ...)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ServerError):
            return None if seen.retryable or seen.refresh_lookup else seen
        if isinstance(seen, ConfigError | TLSError | UnsupportedFeatureError):
            return seen
        seen = seen.__cause__
    return None


class Forwarder:
    """The source consumer's handler (see the module docstring). ``destination`` names the
    destination in errors (``nsqd host:port`` or the lookupds)."""

    def __init__(self, producer: Producer, topic: str, rule: ShardKeyRule | None,
                 limit: int | None = None, partitions: int | None = None,
                 destination: str = "") -> None:
        self.producer = producer
        self.topic = topic
        #: where a message's shard key is (``--shard-key-field``): published ordered
        self.rule = rule
        self.limit = limit
        #: the destination's partition count a source partition is mapped onto (None: the
        #: producer chooses)
        self.partitions = partitions
        self.destination = destination
        #: publishes started (a failed one is taken back) and acknowledged
        self.started = 0
        self.forwarded = 0
        self.done = asyncio.Event()
        self.error: CliError | None = None
        self.failed = asyncio.Event()
        #: the run is ending (before the consumer stops): held messages go back
        self.ending = False
        #: set and replaced whenever a held message may proceed (see _claim)
        self._change = asyncio.Event()
        #: loop time of the first failed publish since the last acknowledged one
        self.failing_since: float | None = None
        self.last_failure = ""
        #: the publishes under way, each in a cancel scope (see _abandon)
        self._publishing: set[asyncio.Timeout] = set()
        #: messages in the handler, by the loop time they were last touched (or taken)
        self._held: dict[Message, float] = {}
        self._toucher: asyncio.Task[None] | None = None
        #: set by :meth:`refuse`: every message is refused with it
        self._refusal: CliError | None = None

    def refuse(self, error: CliError) -> None:
        """Forward nothing: the first message stops the run with ``error`` (and goes back
        to the source once, with any other taken meanwhile)."""
        self._refusal = error

    async def __call__(self, msg: Message) -> None:
        self._hold(msg)
        try:
            if not await self._claim():
                # not needed (past the count, or stopping): back once, no backoff
                msg.requeue(0, backoff=False)
                return
            await self._forward(msg)
        finally:
            del self._held[msg]

    async def _forward(self, msg: Message) -> None:
        """Publish ``msg`` until acknowledged, refused for good, or the run ends."""
        taken = asyncio.get_running_loop().time()
        if self._refusal is not None:
            await self._stop_on(msg, self._refusal)
            return
        while True:
            try:
                abandoned = await self._publish_in_scope(msg)
            except CliError as exc:
                # a message we cannot route: stop rather than drop or loop on it
                await self._stop_on(msg, exc)
                return
            except Exception as exc:
                refusal = refused_for_good(exc)
                if refusal is not None:
                    await self._stop_on(msg, CliError(
                        f"the destination ({self.destination}) refused message "
                        f"{msg.id.hex()} ({len(msg.body)} bytes) for topic {self.topic!r} "
                        f"for good: {describe(refusal)}; not retried, since it cannot "
                        "succeed unchanged"))
                    return
                self._note_failure(exc)
                if await self._pause(taken):
                    continue
                abandoned = True
            except BaseException:
                self._take_back()
                raise
            if abandoned:
                self._take_back()
                await self._give_back(msg)
                return
            self.failing_since = None
            self.forwarded += 1
            if self.limit is not None and self.forwarded >= self.limit:
                self.done.set()
            return

    async def _pause(self, taken: float) -> bool:
        """After a failed publish: wait to retry; False when the message is not to be
        retried (the run stops or ends, or it was held for :data:`HOLD_SECONDS`)."""
        change = self._change
        if not self._wanted_still() or asyncio.get_running_loop().time() - taken >= HOLD_SECONDS:
            return False
        try:
            async with asyncio.timeout(RETRY_SECONDS):
                await change.wait()
        except TimeoutError:
            pass
        return self._wanted_still()

    def _wanted_still(self) -> bool:
        return not (self.ending or self.failed.is_set())

    async def _stop_on(self, msg: Message, error: CliError) -> None:
        """Stop the run on ``error`` (the first one told); ``msg`` goes back at the end."""
        if self.error is None:
            self.error = error
        self.failed.set()
        self._take_back()
        await self._give_back(msg)

    async def _give_back(self, msg: Message) -> None:
        """Requeue ``msg`` once, without backoff: when the run is stopping, only after
        :meth:`end` (after the consumer's RDY 0), so nsqd does not hand it straight back."""
        if self.failed.is_set() or self.done.is_set() or self.ending:
            while not self.ending:
                await self._change.wait()
        msg.requeue(0, backoff=False)

    async def _publish_in_scope(self, msg: Message) -> bool:
        """Publish ``msg``; True when :meth:`_abandon` gave the publish up."""
        scope = asyncio.timeout(None)
        try:
            async with scope:
                self._publishing.add(scope)
                try:
                    await self._publish(msg)
                finally:
                    self._publishing.discard(scope)
        except TimeoutError:
            if scope.expired():
                return True
            raise
        return False

    def _abandon(self) -> None:
        """Give up the publishes under way: the destination is failing and the run ends, and
        the consumer's stop would otherwise wait out their retries."""
        now = asyncio.get_running_loop().time()
        for scope in self._publishing:
            scope.reschedule(now)

    async def _publish(self, msg: Message) -> None:
        if self.rule is not None:
            key = self.rule.key_of(msg.body, f"message {msg.id.hex()}")
            await self.producer.publish_ordered(self.topic, key, msg.body)
        elif self.partitions is not None and msg.partition is not None:
            await self.producer.publish(self.topic, msg.body,
                                        partition=msg.partition % self.partitions)
        else:
            await self.producer.publish(self.topic, msg.body)

    # -- holding and touching

    def _hold(self, msg: Message) -> None:
        self._held[msg] = asyncio.get_running_loop().time()
        if self._toucher is None:
            self._toucher = asyncio.get_running_loop().create_task(self._touch_held())

    async def _touch_held(self) -> None:
        """While messages are held: touch each every :data:`TOUCH_SECONDS` (one task for
        all of them; a publish acknowledged at once is never touched)."""
        loop = asyncio.get_running_loop()
        try:
            while self._held:
                await asyncio.sleep(TOUCH_SECONDS / 5)
                now = loop.time()
                for msg, since in list(self._held.items()):
                    if now - since >= TOUCH_SECONDS:
                        msg.touch()
                        self._held[msg] = now
        finally:
            self._toucher = None

    # -- how many to take

    def _wanted(self) -> bool:
        if self.failed.is_set() or self.done.is_set():
            return False
        return self.limit is None or self.started < self.limit

    async def _claim(self) -> bool:
        """Whether to forward the message: yes while wanted; otherwise (at the count with
        publishes still out, or the run is ending) it is held until a publish fails (then
        it goes instead) or :meth:`end`, so a message not needed is requeued once, after
        the consumer's RDY 0, rather than bounced back and forth meanwhile."""
        while not self.ending:
            if self._wanted():
                self.started += 1
                return True
            await self._change.wait()
        return False

    def _take_back(self) -> None:
        self.started -= 1
        self._changed()

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    def _note_failure(self, exc: Exception) -> None:
        if self.failing_since is None:
            self.failing_since = asyncio.get_running_loop().time()
        self.last_failure = describe(exc)

    async def end(self) -> None:
        """Before the consumer stops: held messages go back to the source (publishes to a
        failing destination are given up). Woken one loop turn later, so that the
        consumer's stop (started next) sends RDY 0 before their REQs: nsqd must not hand
        them straight back to us. Publishes under way get :data:`STOP_GRACE` seconds
        (answered, they count as forwarded)."""
        self.ending = True
        loop = asyncio.get_running_loop()
        if self.failing_since is not None:
            self._abandon()
        elif self._publishing:
            # a silent destination would hold the stop for the publish's whole timeout
            loop.call_later(STOP_GRACE, self._abandon)
        loop.call_soon(self._changed)

    async def watch_destination(self, bound: float) -> None:
        """Beside the consumer: while publishes fail, say so on stderr (at once, then every
        :data:`REMIND_SECONDS`); after ``bound`` seconds without an acknowledged publish (0:
        never) set the error and stop the run."""
        loop = asyncio.get_running_loop()
        shown_at: float | None = None
        while True:
            since, now = self.failing_since, loop.time()
            if since is None:
                shown_at = None  # the next outage is told at once
            elif bound and now - since >= bound:
                if self.error is None:
                    self.error = CliError(f"the destination accepted no publish for {bound:g} "
                                          f"s (--connect-timeout): {self.last_failure}")
                self.failed.set()
                self._abandon()
                return
            elif shown_at is None or now - shown_at >= REMIND_SECONDS:
                err_print(f"smartnsq: warning: destination: {self.last_failure}; holding "
                          f"{len(self._held)} message(s) on the source{retrying(bound)}")
                shown_at = now
            await asyncio.sleep(POLL_SECONDS)


def retrying(bound: float) -> str:
    return f"; retrying for up to {bound:g} s (--connect-timeout)" if bound else "; retrying"
