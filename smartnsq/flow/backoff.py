"""Consumer backoff: strategies and the level/window state machine (docs/protocol.md §9.1).

Pure: no clocks, no timers. :class:`BackoffState` is fed the outcome of each handled message
and answers what should happen to message flow; the RDY controller
(:mod:`smartnsq.flow.rdy`) turns that answer into RDY commands and a timer.

Vocabulary:

* **level** -- how many unanswered failures deep the consumer is; 0 means "not backing off".
* **window** -- the pause after a failure, while every connection has RDY 0. Only one result
  counts per window: signals that arrive while it runs are ignored (the "Building Client
  Libraries" contract), so a burst of failures from one batch raises the level only once.
* When the window ends the caller "tests the waters" (RDY 1 on one connection); the next
  result decides: success lowers the level (and leaves backoff at 0), failure raises it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from smartnsq.config import ConsumerConfig

__all__ = [
    "BackoffState",
    "BackoffStrategy",
    "ExponentialStrategy",
    "FullJitterStrategy",
    "Pause",
    "Resume",
    "Transition",
    "exponential_backoff",
    "full_jitter_backoff",
    "strategy_from_config",
]


def exponential_backoff(level: int, multiplier: float) -> float:
    """``multiplier × 2**level`` seconds (go-nsq's ExponentialStrategy)."""
    if level < 0:
        raise ValueError(f"backoff level must be >= 0, got {level}")
    # ldexp scales by a power of two without building 2**level, so it cannot overflow
    # before the product does.
    return math.ldexp(multiplier, level)


def full_jitter_backoff(level: int, multiplier: float, rng: random.Random) -> float:
    """Uniform in ``[0, multiplier × 2**level)`` seconds ("full jitter")."""
    ceiling = exponential_backoff(level, multiplier)
    # random() is in [0, 1), so the product stays below the ceiling.
    return rng.random() * ceiling


class BackoffStrategy(Protocol):
    """How long a backoff window at a given level lasts."""

    def duration(self, level: int) -> float:
        """Seconds to pause at ``level`` (may be random)."""
        ...

    def ceiling(self, level: int) -> float:
        """The largest value :meth:`duration` can return for ``level``."""
        ...


@dataclass(frozen=True, slots=True)
class ExponentialStrategy:
    """``multiplier × 2**level``: 2, 4, 8 ... seconds for levels 1, 2, 3 with multiplier 1."""

    multiplier: float = 1.0

    def duration(self, level: int) -> float:
        return exponential_backoff(level, self.multiplier)

    def ceiling(self, level: int) -> float:
        return exponential_backoff(level, self.multiplier)


@dataclass(frozen=True, slots=True)
class FullJitterStrategy:
    """Uniform in ``[0, multiplier × 2**level)``; ``rng`` is injectable for tests."""

    multiplier: float = 1.0
    rng: random.Random = field(default_factory=random.Random)

    def duration(self, level: int) -> float:
        return full_jitter_backoff(level, self.multiplier, self.rng)

    def ceiling(self, level: int) -> float:
        return exponential_backoff(level, self.multiplier)


def strategy_from_config(
    config: ConsumerConfig, rng: random.Random | None = None
) -> BackoffStrategy:
    """The strategy ``config.backoff_strategy`` names, with ``config.backoff_multiplier``."""
    if config.backoff_strategy == "full_jitter":
        return FullJitterStrategy(config.backoff_multiplier, rng or random.Random())
    return ExponentialStrategy(config.backoff_multiplier)


@dataclass(frozen=True, slots=True)
class Pause:
    """Start a backoff window: RDY 0 everywhere, then test the waters after ``duration`` s."""

    duration: float
    level: int


@dataclass(frozen=True, slots=True)
class Resume:
    """The level is back to 0: leave backoff and give every connection its normal RDY."""


#: what a signal means for message flow; None = nothing changes
Transition = Pause | Resume | None


class BackoffState:
    """Backoff level and window for one consumer.

    Call :meth:`success` after a FIN, :meth:`failure` after a REQ that should slow the
    consumer down and :meth:`neutral` after a REQ that should not. A :class:`Pause` answer
    opens a window; call :meth:`window_ended` when its timer fires.
    """

    def __init__(
        self, strategy: BackoffStrategy, max_duration: float, *, enabled: bool = True
    ) -> None:
        if max_duration < 0:
            raise ValueError(f"max_duration must be >= 0, got {max_duration}")
        self.strategy = strategy
        self.max_duration = max_duration
        self.enabled = enabled
        self._level = 0
        self._window = False

    @classmethod
    def from_config(
        cls, config: ConsumerConfig, rng: random.Random | None = None
    ) -> BackoffState:
        return cls(
            strategy_from_config(config, rng),
            config.max_backoff_duration,
            enabled=config.backoff_enabled,
        )

    @property
    def level(self) -> int:
        return self._level

    @property
    def in_backoff(self) -> bool:
        """True from the first counted failure until the level is back to 0."""
        return self._level > 0

    @property
    def window_active(self) -> bool:
        """True while a backoff window (pause) runs; signals are ignored meanwhile."""
        return self._window

    def success(self) -> Transition:
        """A message was finished."""
        if not self._counts():
            return None
        if self._level == 0:
            return None
        self._level -= 1
        if self._level == 0:
            return Resume()
        return self._pause()

    def failure(self) -> Transition:
        """A message was requeued with backoff."""
        if not self._counts():
            return None
        # Only step up while the next level's pause still fits under the maximum; otherwise
        # stay at the current level (go-nsq). Using the strategy's ceiling rather than one
        # random draw keeps the level bounded for the jitter strategy too.
        if self.strategy.ceiling(self._level + 1) <= self.max_duration:
            self._level += 1
        return self._pause() if self._level > 0 else None

    def neutral(self) -> Transition:
        """A message was requeued without backoff: the level stays, but while backing off
        the result still uses up the test of the waters, so the pause starts again."""
        if not self._counts():
            return None
        return self._pause() if self._level > 0 else None

    def window_ended(self) -> None:
        """The pause is over; the next signal counts again."""
        self._window = False

    def _counts(self) -> bool:
        return self.enabled and not self._window

    def _pause(self) -> Pause:
        duration = min(self.strategy.duration(self._level), self.max_duration)
        self._window = True
        return Pause(max(0.0, duration), self._level)
