"""What happens to a delivery besides the handler call: admission, requeueing, handler
failures. The dispatcher consults a :class:`DeliveryPolicy`; the policy acts on the
dispatcher only through the narrow :class:`PolicyHost`.

:class:`AttemptsPolicy` is the classic consumer's: ``max_attempts`` (checked inline by the
dispatcher, so the default path costs no call), REQ delays from
:class:`~smartnsq.flow.AttemptPolicy`, and requeue-on-failure. The ordered consumer's
policy (:mod:`smartnsq.ordered.consumer`) validates positions at admission, retries failed
messages in place and answers nsqd's twin deliveries.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from smartnsq.config import ConsumerConfig
from smartnsq.consumer.meters import HANDLER_ERROR, ConsumerMeters, RequeueReason
from smartnsq.consumer.sub import Sub
from smartnsq.flow import AttemptPolicy
from smartnsq.message import PENDING, Message

__all__ = ["AttemptsPolicy", "DeliveryPolicy", "GivingUpCallback", "PolicyHost"]

log = logging.getLogger("smartnsq.consumer")

#: called with a message given up after ``max_attempts``, before it is finished; may be
#: async. If it raises, the message is requeued instead (given up again next time)
GivingUpCallback = Callable[[Message], object]



class PolicyHost(Protocol):
    """What a policy may ask of the dispatcher (implemented by
    :class:`smartnsq.consumer.dispatch.Dispatcher`)."""

    topic: str
    channel: str
    #: the consumer's metrics (None: off)
    meters: ConsumerMeters | None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...

    @property
    def stopping(self) -> bool: ...

    def hold(self, sub: Sub, msg: Message, *, track: bool) -> None:
        """Count ``msg`` as outstanding without handing it out (``track``: stop() requeues
        it if it is still unanswered then)."""

    def track(self, msg: Message) -> None:
        """An outstanding message now lives outside the queue: stop() must find it."""

    def deliver(self, msg: Message) -> None:
        """Hand a held message to the handler or the iterator after all."""

    def drop(self, sub: Sub, msg: Message) -> None:
        """FIN a delivery the handler must not see (counted as dropped before start)."""

    def answer_copy(self, sub: Sub, msg: Message, *, fin: bool,
                    reason: RequeueReason) -> None:
        """Answer a held second copy with FIN or REQ 0 (counted as dropped before start);
        no policy hook runs for it."""

    def req(self, sub: Sub, msg: Message, delay_ms: int, backoff: bool,
            reason: RequeueReason) -> bool:
        """Write REQ and account for it (flow control, counts by ``reason``); True when
        written."""

    def requeue_as(self, msg: Message, reason: RequeueReason, delay: float | None = None,
                   backoff: bool = True) -> bool:
        """Requeue a pending message on the library's behalf (through the policy's
        :meth:`DeliveryPolicy.requeue`); False if it was answered already."""

    def fatal(self, exc: BaseException) -> None:
        """Stop the consumer with ``exc``."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background (stop() does not wait for it)."""

    def call_user(self, cb: Callable[..., object], *args: Any, what: str) -> None:
        """Run a user callback that may be sync or async; errors are logged."""


class DeliveryPolicy(Protocol):
    """Decisions the dispatcher leaves to its policy (see the module docstring)."""

    #: SUB_ORDERED on every partition (ordered consumption)
    ordered: bool
    #: deliveries after this many attempts are given up inline (0: never)
    max_attempts: int
    #: admit() is called for every delivery (else only ``max_attempts`` applies)
    screens: bool

    def attach(self, host: PolicyHost) -> None:
        """Caller: the dispatcher, once, when it is built."""

    def on_subscribed(self, sub: Sub) -> None:
        """A subscription is about to receive RDY."""

    def admit(self, sub: Sub, msg: Message) -> bool:
        """True to deliver ``msg``; on False the policy has taken charge of it."""

    def give_up(self, sub: Sub, msg: Message) -> None:
        """``msg`` went over ``max_attempts``: answer it without the handler."""

    def finished(self, sub: Sub, msg: Message, written: bool) -> None:
        """``msg`` was finished (``written``: the FIN went out)."""

    def requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool,
                reason: RequeueReason) -> bool:
        """Requeue ``msg`` (through :meth:`PolicyHost.req`, now or later)."""

    def failed(self, msg: Message, exc: BaseException) -> None:
        """The handler raised ``exc`` for ``msg``."""

    def before_drain(self) -> None:
        """stop() is about to wait for outstanding messages."""


class AttemptsPolicy:
    """The classic consumer's policy: give up after ``max_attempts``, requeue failures with
    the computed delay."""

    ordered = False
    screens = False

    def __init__(self, config: ConsumerConfig, giving_up: GivingUpCallback | None) -> None:
        self.max_attempts = config.max_attempts
        self._attempts = AttemptPolicy.from_config(config)
        self._giving_up = giving_up
        self._host: PolicyHost | None = None

    def attach(self, host: PolicyHost) -> None:
        self._host = host

    def on_subscribed(self, sub: Sub) -> None:
        pass

    def admit(self, sub: Sub, msg: Message) -> bool:
        return True

    def give_up(self, sub: Sub, msg: Message) -> None:
        host = self._host
        assert host is not None
        cb = self._giving_up
        if cb is None:
            host.hold(sub, msg, track=False)
            msg.finish()
            self._count_given_up(sub)
            log.warning("giving up on message %s of %s/%s after %d attempts (max_attempts "
                        "%d); finished it", msg.id.hex(), host.topic, host.channel,
                        msg.attempts, self.max_attempts)
            return
        # the callback first, the FIN once it returned: a dead-letter store that fails keeps
        # the message in the channel instead of losing it. Tracked meanwhile, so that stop()
        # answers it if the callback is still running then.
        host.hold(sub, msg, track=True)
        try:
            result = cb(msg)
        except Exception as exc:
            self._kept(sub, msg, exc)
            return
        if inspect.isawaitable(result):
            host.spawn(self._after(sub, msg, result))
            return
        self._given_up(sub, msg)

    async def _after(self, sub: Sub, msg: Message, pending: Awaitable[object]) -> None:
        try:
            await pending
        except Exception as exc:
            self._kept(sub, msg, exc)
            return
        self._given_up(sub, msg)

    def _given_up(self, sub: Sub, msg: Message) -> None:
        self._count_given_up(sub)
        if not msg.has_responded:  # the callback may have answered it itself
            msg.finish()

    @staticmethod
    def _count_given_up(sub: Sub) -> None:
        sub.given_up += 1
        if sub.meters is not None:
            sub.meters.given_up.inc()

    def _kept(self, sub: Sub, msg: Message, exc: Exception) -> None:
        host = self._host
        assert host is not None
        log.error("giving_up callback failed for message %s of %s/%s (attempt %d): %r; "
                  "requeued it (it is given up again on its next delivery)", msg.id.hex(),
                  host.topic, host.channel, msg.attempts, exc, exc_info=exc)
        host.requeue_as(msg, HANDLER_ERROR, None, backoff=False)

    def finished(self, sub: Sub, msg: Message, written: bool) -> None:
        pass

    def requeue(self, sub: Sub, msg: Message, delay: float | None, backoff: bool,
                reason: RequeueReason) -> bool:
        assert self._host is not None
        delay_ms = self._attempts.requeue_delay_ms(msg.attempts, delay)
        return self._host.req(sub, msg, delay_ms, backoff, reason)

    def failed(self, msg: Message, exc: BaseException) -> None:
        host = self._host
        assert host is not None
        log.warning("handler failed for message %s (attempt %d) of %s/%s: %r",
                    msg.id.hex(), msg.attempts, host.topic, host.channel, exc,
                    exc_info=exc)
        if msg._state == PENDING:
            if msg._auto:
                host.requeue_as(msg, HANDLER_ERROR)
            else:
                host.track(msg)

    def before_drain(self) -> None:
        pass
