"""Attempt limits and requeue delays (go-nsq rules, docs/protocol.md §9.1).

nsqd counts delivery attempts per message (the ``attempts`` field, 1 on first delivery).
A consumer gives up on a message that has been tried more often than ``max_attempts`` and
requeues failed messages with a delay that grows linearly with the attempts.
"""

from __future__ import annotations

from dataclasses import dataclass

from smartnsq.config import ConsumerConfig
from smartnsq.errors import ConfigError

__all__ = ["AttemptPolicy", "requeue_delay", "should_give_up"]


def should_give_up(attempts: int, max_attempts: int) -> bool:
    """True when a message delivered for the ``attempts``-th time is past the limit.

    ``max_attempts`` 0 means unlimited. The limit is inclusive: with ``max_attempts=5`` the
    fifth delivery is still handled, the sixth is given up.
    """
    if attempts < 0 or max_attempts < 0:
        raise ConfigError(
            f"attempts and max_attempts must be >= 0, got {attempts} and {max_attempts}"
        )
    return max_attempts > 0 and attempts > max_attempts


def requeue_delay(
    attempts: int,
    explicit: float | None = None,
    *,
    default_requeue_delay: float,
    max_requeue_delay: float,
) -> int:
    """The REQ delay in whole milliseconds, as the wire wants it.

    Without ``explicit`` (seconds) the delay is ``default_requeue_delay × attempts``; either
    way it is capped at ``max_requeue_delay``. go-nsq caps only the computed delay; capping an
    explicit one too keeps every REQ this client sends within the configured maximum.
    """
    if attempts < 0:
        raise ConfigError(f"attempts must be >= 0, got {attempts}")
    if explicit is not None and explicit < 0:
        raise ConfigError(f"requeue delay must be >= 0 seconds, got {explicit}")
    seconds = default_requeue_delay * attempts if explicit is None else explicit
    seconds = min(seconds, max_requeue_delay)
    # Round rather than truncate: 1.005 s is 1004.999... ms in binary floating point.
    return round(seconds * 1000)


@dataclass(frozen=True, slots=True)
class AttemptPolicy:
    """The two rules bound to one consumer's settings."""

    max_attempts: int
    default_requeue_delay: float
    max_requeue_delay: float

    @classmethod
    def from_config(cls, config: ConsumerConfig) -> AttemptPolicy:
        return cls(config.max_attempts, config.default_requeue_delay, config.max_requeue_delay)

    def should_give_up(self, attempts: int) -> bool:
        """See :func:`should_give_up`."""
        return should_give_up(attempts, self.max_attempts)

    def requeue_delay_ms(self, attempts: int, explicit: float | None = None) -> int:
        """See :func:`requeue_delay`."""
        return requeue_delay(
            attempts,
            explicit,
            default_requeue_delay=self.default_requeue_delay,
            max_requeue_delay=self.max_requeue_delay,
        )
