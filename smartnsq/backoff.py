"""How long to wait after the n-th failure: small policy objects with one method,
:meth:`Backoff.compute`.

Each place that waits after failures holds one, made from its config and handed to it, and
never computes a delay itself: the producer's connection pools and the consumer's
subscription runners (reconnects after a lost connection or a failed dial), the HTTP
producer's nodes (skipped after a failed request), and the retry engine
(:mod:`smartnsq.producer.engine`: the pause before retrying the same target, or before
looking again for a leader). Tests inject :class:`ConstantBackoff` where a real formula's
randomness or length gets in the way.

This module depends on nothing else in the package, so both the producer and the consumer
sit above it. (The consumer's message-flow backoff, :mod:`smartnsq.flow.backoff`, is another
concept: a window of RDY 0 per backoff level, with its own strategies.)
"""

from __future__ import annotations

import random
from typing import Protocol

__all__ = [
    "Backoff",
    "ConstantBackoff",
    "EqualJitterBackoff",
    "ExponentialBackoff",
    "GoNsqRetryBackoff",
    "SpreadJitterBackoff",
]

#: exponents past this cannot grow a capped delay any further (and 2.0 ** 1100 overflows)
_MAX_EXPONENT = 62


class Backoff(Protocol):
    """A delay policy: seconds to wait after ``failures`` consecutive failures."""

    def compute(self, failures: int) -> float:
        """Seconds to wait after failure number ``failures`` (1 for the first one; values
        below 1 are read as 1). May be random."""
        ...


def _step(base: float, cap: float, failures: int) -> float:
    """``base × 2^(failures-1)``, capped at ``cap``."""
    return min(cap, base * 2.0 ** min(max(failures, 1) - 1, _MAX_EXPONENT))


class ConstantBackoff:
    """The same delay after every failure."""

    __slots__ = ("delay",)

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def compute(self, failures: int) -> float:
        return self.delay

    def __repr__(self) -> str:
        return f"ConstantBackoff({self.delay})"


class ExponentialBackoff:
    """``base × 2^(n-1)``, capped at ``cap``, without jitter: the HTTP producer's pause before
    it tries a node again after the node failed."""

    __slots__ = ("base", "cap")

    def __init__(self, base: float, cap: float) -> None:
        self.base = base
        self.cap = max(cap, base)

    def compute(self, failures: int) -> float:
        return _step(self.base, self.cap, failures)

    def __repr__(self) -> str:
        return f"ExponentialBackoff({self.base}, {self.cap})"


class EqualJitterBackoff:
    """The step ``base × 2^(n-1)`` capped at ``cap``, then a uniformly random point of its upper
    half ("equal jitter": never below half the step, so retries stay spread but do not come
    back at once): the consumer's reconnects."""

    __slots__ = ("base", "cap", "rng")

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = max(cap, base)
        self.rng = rng if rng is not None else random.Random()

    def compute(self, failures: int) -> float:
        return _step(self.base, self.cap, failures) * (0.5 + 0.5 * self.rng.random())

    def __repr__(self) -> str:
        return f"EqualJitterBackoff({self.base}, {self.cap})"


class SpreadJitterBackoff:
    """``base × 2^(n-1)`` times a uniformly random factor in 0.75 … 1.25, then capped at
    ``cap`` (so a long backoff sits at the cap, a short one is spread ±25 %): the producer's
    reconnects to an nsqd it lost."""

    __slots__ = ("base", "cap", "rng")

    def __init__(self, base: float, cap: float, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = max(cap, base)
        self.rng = rng if rng is not None else random.Random()

    def compute(self, failures: int) -> float:
        raw = self.base * 2.0 ** min(max(failures, 1) - 1, _MAX_EXPONENT)
        return min(self.cap, raw * (0.75 + 0.5 * self.rng.random()))

    def __repr__(self) -> str:
        return f"SpreadJitterBackoff({self.base}, {self.cap})"


class GoNsqRetryBackoff:
    """go-nsq's producer retry pause, ``8 ms + 10 ms × (2 << n)``: 48, 88, 168, 328 ms … for
    n = 1, 2, 3, 4, capped at ``cap`` (default 1 s; go-nsq's own formula doubles without
    bound). The retry engine's pause before it retries the same target."""

    __slots__ = ("cap",)

    def __init__(self, cap: float = 1.0) -> None:
        self.cap = cap

    def compute(self, failures: int) -> float:
        if failures < 1:
            failures = 1
        if failures >= 16:  # (8 + 10 × (2 << 16)) ms is over 20 min: past any sane cap
            return self.cap
        return min(self.cap, (8 + 10 * (2 << failures)) / 1000.0)

    def __repr__(self) -> str:
        return f"GoNsqRetryBackoff({self.cap})"
