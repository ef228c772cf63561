"""What an ordered consumer does with a message that blocks its partition, or that arrives
out of order.

On an ordered partition nothing after a failing message is delivered until it is finished,
so skipping it is a business decision, never the library's: the consumer keeps retrying
(``REQ <id> 0`` after ``config.ordered_retry_pause``) and, from
``config.blocked_attempts`` attempts on, asks ``on_blocked(message)`` for a
:class:`BlockedAction` each time the message fails again. ``skip`` hands the message to the
dead-letter callback first and finishes it only if that callback succeeded.

An order violation (a position that went backwards) goes to ``on_violation(message,
error)``, which returns a :class:`ViolationAction`; without it the consumer stops with the
:class:`~smartnsq.errors.OrderViolationError`.

Callbacks may be plain functions or coroutine functions; actions may be given as the enum or
its string value.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeVar

from smartnsq.errors import ConfigError, OrderViolationError
from smartnsq.message import Message

__all__ = ["BlockedAction", "DeadLetterCallback", "OnBlocked", "OnViolation", "ViolationAction",
           "always_retry", "decide", "skip_after"]


class BlockedAction(StrEnum):
    """``on_blocked`` answers."""

    #: keep retrying (the default)
    RETRY = "retry"
    #: dead-letter callback, then FIN: the partition moves on
    SKIP = "skip"
    #: requeue the message and stop the consumer with :class:`BlockedMessageError`
    STOP = "stop"


class ViolationAction(StrEnum):
    """``on_violation`` answers."""

    #: hand the message to the handler; the partition continues from its position
    ACCEPT = "accept"
    #: finish it without the handler; the partition continues from its position
    SKIP = "skip"
    #: requeue it and stop the consumer with the :class:`OrderViolationError`
    STOP = "stop"


OnBlocked = Callable[[Message], "BlockedAction | str | Awaitable[BlockedAction | str]"]
OnViolation = Callable[[Message, OrderViolationError],
                       "ViolationAction | str | Awaitable[ViolationAction | str]"]
DeadLetterCallback = Callable[[Message], "object | Awaitable[object]"]

E = TypeVar("E", BlockedAction, ViolationAction)


def always_retry(message: Message) -> BlockedAction:
    """The default: never skip."""
    return BlockedAction.RETRY


def skip_after(attempts: int) -> Callable[[Message], BlockedAction]:
    """A policy that skips a message once it has been tried ``attempts`` times."""
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigError(f"attempts must be an int >= 1, got {attempts!r}")

    def policy(message: Message) -> BlockedAction:
        return BlockedAction.SKIP if message.attempts >= attempts else BlockedAction.RETRY

    return policy


async def decide(kind: type[E], answer: object) -> E:
    """Await ``answer`` if needed and turn it into a ``kind`` member; anything else is a
    :class:`ConfigError` (a policy bug must not pass as "retry")."""
    if inspect.isawaitable(answer):
        answer = await answer
    if isinstance(answer, kind):
        return answer
    if isinstance(answer, str):
        try:
            return kind(answer)
        except ValueError:
            pass
    allowed = ", ".join(repr(m.value) for m in kind)
    raise ConfigError(f"the policy answered {answer!r}; expected one of {allowed}")
