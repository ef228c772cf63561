"""The ordered consumer: SUB_ORDERED on every partition, position validation, blocked-message
policy, per-partition positions (youzan nsqd only).

youzan delivers an ordered partition one message at a time: the next one only after the
current one is finished (docs/protocol.md §5.4). Partitions are consumed concurrently, each in
order. On top of :class:`smartnsq.consumer.Consumer` this class

* validates every delivery (:mod:`smartnsq.ordered.offsets`) before the handler sees it:
  gaps and rewinds are logged with the numbers; a position that goes backwards is an order
  violation that never reaches the handler unasked (``on_violation``, else the consumer
  stops with :class:`~smartnsq.errors.OrderViolationError`);
* retries a failed message with ``REQ <id> 0`` after ``config.ordered_retry_pause`` (a
  delayed REQ is silently ignored on ordered channels), never skips it unless
  ``on_blocked`` says so (:mod:`smartnsq.ordered.policy`); ``max_attempts`` does not apply;
* keeps the position (offset of the last finished message) of every partition;
* hands a message nsqd sends twice in a row with the same attempts (its read-ahead copy,
  then the tracked one: a channel's first ordered reader, or a repositioned channel) to the
  handler once, and answers both copies together;
* holds the redelivery of a message the server timed out (msg_timeout) while its handler
  still runs, and answers it with the first copy: the handler never runs one message twice
  at once, nor the next message of the partition before the first call ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from smartnsq import trace as _trace
from smartnsq.addresses import LookupdSpec, NsqdSpec, resolve_source
from smartnsq.config import ConsumerConfig
from smartnsq.consumer.arguments import check_handler
from smartnsq.consumer.consumer import Consumer, Handler, StartAt
from smartnsq.consumer.meters import APPLICATION, HANDLER_ERROR, STOP, RequeueReason
from smartnsq.consumer.observe import Observability
from smartnsq.consumer.policy import DeliveryPolicy, PolicyHost
from smartnsq.consumer.sub import Sub
from smartnsq.consumer.unseen import unseen
from smartnsq.errors import BlockedMessageError, ConfigError, OrderViolationError
from smartnsq.message import PENDING, Message
from smartnsq.metrics.api import Metrics
from smartnsq.ordered.offsets import Check, CheckKind, OffsetValidator, Position
from smartnsq.ordered.policy import (
    BlockedAction,
    DeadLetterCallback,
    OnBlocked,
    OnViolation,
    ViolationAction,
    decide,
)
from smartnsq.protocol.messages import ATTEMPTS, ID, OFFSET, RAW_SIZE, split_youzan_id

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["OrderedConsumer", "OrderedPolicy"]

log = logging.getLogger("smartnsq.ordered")



def _position(msg: Message) -> Position | None:
    """Where ``msg`` lies in its partition (None without a position: not SUB_ORDERED)."""
    raw = msg._raw
    offset, size = raw[OFFSET], raw[RAW_SIZE]
    if offset is None or size is None:
        return None
    return Position(split_youzan_id(raw[ID])[0], offset, size, raw[ATTEMPTS])


class OrderedConsumer(Consumer):
    """Consume an ordered youzan topic (or consume any youzan topic in order): one
    SUB_ORDERED subscription per partition, found through lookupds.

    ``on_blocked(message) -> "retry" | "skip" | "stop"`` is asked each time a message that
    has been tried ``config.blocked_attempts`` times or more fails again (default: always
    retry). ``dead_letter(message)`` receives a message before it is skipped; if it raises,
    the message is not skipped. ``on_violation(message, error) -> "accept" | "skip" |
    "stop"`` decides about a delivery whose position went backwards (default: stop with the
    error). Callbacks may be sync or async. ``metrics``, ``tracer_provider`` and
    ``trace_envelope`` as for :class:`~smartnsq.consumer.Consumer` (offset gaps and order
    violations are counted too).

    ``start_at`` positions the channel once per partition (``POST /channel/setoffset`` on the
    leader before the first RDY; SUB_ADVANCED cannot be used on ordered subscriptions).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler | None = None,
        *,
        lookupd: LookupdSpec | None = None,
        config: ConsumerConfig | None = None,
        on_blocked: OnBlocked | None = None,
        dead_letter: DeadLetterCallback | None = None,
        on_violation: OnViolation | None = None,
        start_at: StartAt | None = None,
        trace: bool = False,
        trace_switch: _trace.TraceToggle | None = None,
        partitions: Collection[int] | None = None,
        nsqd: NsqdSpec | None = None,
        metrics: Metrics | None = None,
        tracer_provider: TracerProvider | None = None,
        trace_envelope: bool = False,
    ) -> None:
        for name, cb in (("on_blocked", on_blocked), ("dead_letter", dead_letter),
                         ("on_violation", on_violation)):
            if cb is not None and not callable(cb):
                raise ConfigError(f"{name} must be callable")
        if nsqd is not None:
            raise ConfigError("OrderedConsumer needs lookupd= (nsqlookupd HTTP addresses or a "
                              "Lookup), not nsqd=: it subscribes per partition, and partition "
                              "leaders move")
        check_handler(handler)  # before the source: an address given as the handler
        source = resolve_source("OrderedConsumer", None, lookupd)
        made: list[OrderedPolicy] = []

        def make_policy(config: ConsumerConfig) -> DeliveryPolicy:
            made.append(OrderedPolicy(config, on_blocked, dead_letter, on_violation))
            return made[0]

        self._setup(topic, channel, handler, make_policy, source, config=config,
                    start_at=start_at, trace=trace, trace_switch=trace_switch,
                    partitions=partitions,
                    observe=Observability(metrics, tracer_provider, trace_envelope))
        self._ordered_policy = made[0]

    @property
    def skipped(self) -> int:
        """Messages skipped because on_blocked or on_violation said so."""
        return self._ordered_policy.skipped

    def validator(self, partition: int) -> OffsetValidator:
        return self._ordered_policy.validator(partition)

    def position(self, partition: int) -> int | None:
        """Disk-queue offset of the last message finished on ``partition`` (None before)."""
        return self._ordered_policy.position(partition)

    def positions(self) -> dict[int, int]:
        """``{partition: offset of the last finished message}`` for every partition that
        finished one."""
        return self._ordered_policy.positions()


class OrderedPolicy:
    """The ordered consumer's :class:`~smartnsq.consumer.policy.DeliveryPolicy`: position
    validation at admission, twin deliveries, in-place retries and the blocked-message
    policy at failure."""

    ordered = True
    screens = True
    #: the blocked-message policy decides instead
    max_attempts = 0

    def __init__(self, config: ConsumerConfig, on_blocked: OnBlocked | None,
                 dead_letter: DeadLetterCallback | None,
                 on_violation: OnViolation | None) -> None:
        self._config = config
        self._on_blocked = on_blocked
        self._dead_letter = dead_letter
        self._on_violation = on_violation
        self._host: PolicyHost | None = None
        self._validators: dict[int, OffsetValidator] = {}
        self._retries: dict[Message, tuple[asyncio.TimerHandle, Sub, bool, RequeueReason]] = {}
        #: per partition, the last message handed over (kept across a reconnect while it is
        #: unanswered: the new connection redelivers it)
        self._last: dict[int, Message] = {}
        #: further copies of a pending message (see _twin), answered with the first
        self._twins: dict[Message, list[tuple[Sub, Message]]] = {}
        self.skipped = 0

    @property
    def host(self) -> PolicyHost:
        assert self._host is not None
        return self._host

    def attach(self, host: PolicyHost) -> None:
        self._host = host

    # ------------------------------------------------------------------ positions

    def validator(self, partition: int) -> OffsetValidator:
        v = self._validators.get(partition)
        if v is None:
            v = self._validators[partition] = OffsetValidator(partition)
        return v

    def position(self, partition: int) -> int | None:
        v = self._validators.get(partition)
        return v.position if v is not None else None

    def positions(self) -> dict[int, int]:
        return {p: v.position for p, v in sorted(self._validators.items())
                if v.position is not None}

    def on_subscribed(self, sub: Sub) -> None:
        if sub.partition is not None:
            self.validator(sub.partition).new_connection(seeked=sub.seeked)
            last = self._last.get(sub.partition)
            if last is not None and last._state != PENDING and last not in self._retries:
                del self._last[sub.partition]

    def finished(self, sub: Sub, msg: Message, written: bool) -> None:
        if self._twins:
            # a copy on a live connection answered: the position moves even when the first
            # copy's connection is gone
            written = self._answer_twin(msg, fin=True) or written
        # a FIN that could not be written does not move the position: the server redelivers
        if written and sub.partition is not None and (position := _position(msg)) is not None:
            self.validator(sub.partition).finished(position)

    # ------------------------------------------------------------------ validation

    def give_up(self, sub: Sub, msg: Message) -> None:
        raise AssertionError("max_attempts does not apply to ordered consumption")

    def admit(self, sub: Sub, msg: Message) -> bool:
        position = _position(msg)
        if sub.partition is None or position is None:
            return True  # not an ordered subscription (cannot happen: SUB_ORDERED only)
        v = self.validator(sub.partition)
        check = v.check(position)
        if check.kind is CheckKind.REDELIVERY and check.previous is not None and \
                self._twin(sub, msg, timed_out=check.previous.attempts != position.attempts):
            return False
        if v.last_seen is None and self._twin(sub, msg, timed_out=False, reconnected=True):
            v.accept(check)  # the new connection's first message: the next one follows it
            return False
        host = self.host
        if check.accepted:
            self._last[sub.partition] = msg
            v.accept(check)
            if check.kind is CheckKind.GAP or check.kind is CheckKind.REWIND:
                log.warning("topic %s: %s", host.topic, check.describe())
                if check.kind is CheckKind.GAP and host.meters is not None:
                    host.meters.gap(sub.partition)
            return True
        # a violation: hold the message (it counts as in flight) until decided
        if host.meters is not None:
            host.meters.violation(sub.partition)
        host.hold(sub, msg, track=True)
        error = OrderViolationError(f"topic {host.topic!r} channel {host.channel!r} "
                                    f"{check.describe()}")
        log.error("%s", error)
        if self._on_violation is None:
            v.reject(check)
            host.fatal(error)
            host.requeue_as(msg, STOP, 0, backoff=False)
        else:
            host.spawn(self._violation(msg, check, error))
        return False

    def _twin(self, sub: Sub, msg: Message, *, timed_out: bool,
              reconnected: bool = False) -> bool:
        """``msg`` repeats the last delivery. With the same attempts it is not a
        redelivery but nsqd's read-ahead copy followed by the tracked one (a channel's
        first ordered reader, or a repositioned channel; docs/protocol.md §13.2.1). With
        more attempts (``timed_out``) the server's msg_timeout ran out while the first copy
        was still unanswered: handing it over would run the message twice at once and let
        the next one of the partition start before the first handler ended. Either way
        both carry the same id, so the first copy's answer is all the server needs; the
        copy never reaches the handler. ``reconnected``: the first message of a new
        connection repeats the last one of the old connection, still unanswered (its handler
        runs, or its retry pause): the same holds. True when taken in charge."""
        assert sub.partition is not None
        first = self._last.get(sub.partition)
        if first is None or first.internal_id != msg.internal_id or first.offset != msg.offset:
            return False
        if first.finished:
            self.host.drop(sub, msg)
            return True
        if first in self._twins and not (timed_out or reconnected):
            return False
        if first._state != PENDING and first not in self._retries:
            return False  # the first copy's REQ went out: this one is its retry
        if timed_out:
            log.warning("%s/%s partition %s: message %s timed out on the server (attempt %d) "
                        "while still unanswered; its redelivery waits for the first copy's "
                        "finish() or requeue(). Call message.touch() in handlers longer than "
                        "msg_timeout",
                        self.host.topic, self.host.channel, sub.partition, msg.id.hex(),
                        msg.attempts)
        elif reconnected:
            log.info("%s/%s partition %s: message %s redelivered on a new connection while "
                     "still unanswered; the redelivery waits for the first copy's answer",
                     self.host.topic, self.host.channel, sub.partition, msg.id.hex())
        # the first copy is pending, or failed and waits for its retry pause: the copy is
        # answered together with it (with the REQ, when the pause ends), so the in-flight
        # counts stay right
        self.host.hold(sub, msg, track=False)
        self._twins.setdefault(first, []).append((sub, msg))
        return True

    def _answer_twin(self, first: Message, *, fin: bool,
                     reason: RequeueReason = APPLICATION) -> bool:
        """Answer the copies of ``first``; True when one went to a live connection."""
        live = False
        for sub, twin in self._twins.pop(first, ()):
            live = live or (not sub.closed and sub.subscriber is not None)
            log.debug("%s/%s partition %s: answering another copy of message at offset %s",
                      self.host.topic, self.host.channel, sub.partition, twin.offset)
            self.host.answer_copy(sub, twin, fin=fin, reason=reason)
        return live

    async def _violation(self, msg: Message, check: Check,
                         error: OrderViolationError) -> None:
        assert self._on_violation is not None
        try:
            action = await decide(ViolationAction, self._on_violation(msg, error))
        except Exception as exc:
            log.exception("on_violation failed; stopping")
            error.__cause__ = exc
            action = ViolationAction.STOP
        if msg._state != PENDING:
            return  # answered meanwhile (the consumer stopped)
        v = self.validator(check.partition)
        if action is ViolationAction.ACCEPT:
            v.accept(check)
            self.host.deliver(msg)
        elif action is ViolationAction.SKIP:
            v.accept(check)
            msg.finish()
            self.skipped += 1
        else:
            v.reject(check)
            self.host.fatal(error)
            self.host.requeue_as(msg, STOP, 0, backoff=False)

    # ------------------------------------------------------------------ failures

    def failed(self, msg: Message, exc: BaseException) -> None:
        if msg._state != PENDING:
            return
        host = self.host
        # deliveries returned unseen (a stopped reader's read-ahead) do not block
        blocked = unseen.handled_attempts(host.topic, host.channel, msg.id,
                                          msg.attempts) >= self._config.blocked_attempts
        log.warning("handler failed for message %s (attempt %d) on partition %s of %s/%s: "
                    "%r%s", msg.id.hex(), msg.attempts, msg.partition, host.topic,
                    host.channel, exc, "; the partition is blocked" if blocked else "",
                    exc_info=exc)
        if not msg._auto:
            host.track(msg)
            return
        if blocked and self._on_blocked is not None:
            host.track(msg)
            host.spawn(self._blocked(msg))
            return
        host.requeue_as(msg, HANDLER_ERROR)

    async def _blocked(self, msg: Message) -> None:
        assert self._on_blocked is not None
        try:
            action = await decide(BlockedAction, self._on_blocked(msg))
        except Exception:
            log.exception("on_blocked failed; retrying the message")
            action = BlockedAction.RETRY
        if msg._state != PENDING:
            return
        if action is BlockedAction.RETRY:
            self.host.requeue_as(msg, HANDLER_ERROR)
            return
        if action is BlockedAction.STOP:
            host = self.host
            self.host.fatal(BlockedMessageError(
                f"on_blocked stopped the consumer of {host.topic}/{host.channel} at message "
                f"{msg.id.hex()} (partition {msg.partition}, offset {msg.offset}) after "
                f"{msg.attempts} attempts"))
            host.requeue_as(msg, HANDLER_ERROR, 0, backoff=False)
            return
        if self._dead_letter is not None:
            try:
                result = self._dead_letter(msg)
                if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                    await result
            except Exception:
                log.exception("dead_letter failed for message %s; not skipping it",
                              msg.id.hex())
                self.host.requeue_as(msg, HANDLER_ERROR)
                return
        if msg._state != PENDING:
            return
        log.warning("skipping message %s (partition %s, offset %s) after %d attempts, as "
                    "on_blocked decided", msg.id.hex(), msg.partition, msg.offset,
                    msg.attempts)
        msg.finish()
        self.skipped += 1

    def requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool,
                reason: RequeueReason) -> bool:
        # a delayed REQ is ignored on ordered channels: wait here, then REQ <id> 0
        pause = self._config.ordered_retry_pause if delay is None else delay
        conn = sub.conn
        if conn is not None:
            # past the server's timeout the message is redelivered anyway (same id)
            pause = min(pause, 0.9 * conn.msg_timeout)
        host = self.host
        loop = host.loop
        if pause <= 0 or host.stopping or loop is None:
            return self._req_now(sub, msg, backoff, reason)
        host.track(msg)
        handle = loop.call_later(pause, self._retry_due, msg)
        self._retries[msg] = (handle, sub, backoff, reason)
        return True

    def _req_now(self, sub: Sub, msg: Message, backoff: bool, reason: RequeueReason) -> bool:
        ok = self.host.req(sub, msg, 0, backoff, reason)
        if self._twins:
            self._answer_twin(msg, fin=False, reason=reason)
        return ok

    def _retry_due(self, msg: Message) -> None:
        entry = self._retries.pop(msg, None)
        if entry is not None:
            _, sub, backoff, reason = entry
            self._req_now(sub, msg, backoff, reason)

    def before_drain(self) -> None:
        # retries waiting for their pause go now: nobody is going to handle them here
        for msg, (handle, sub, _, reason) in list(self._retries.items()):
            handle.cancel()
            del self._retries[msg]
            self._req_now(sub, msg, False, reason)
