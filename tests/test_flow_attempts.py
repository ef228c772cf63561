"""Attempt limits and requeue delays (smartnsq.flow.attempts)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.config import ConsumerConfig
from smartnsq.errors import ConfigError
from smartnsq.flow.attempts import AttemptPolicy, requeue_delay, should_give_up


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "expected"),
    [
        (1, 5, False),
        (5, 5, False),  # the limit itself is still handled
        (6, 5, True),
        (1, 1, False),
        (2, 1, True),
        (65535, 0, False),  # 0 = unlimited
    ],
)
def test_should_give_up(attempts: int, max_attempts: int, expected: bool) -> None:
    assert should_give_up(attempts, max_attempts) is expected


def test_should_give_up_rejects_negative() -> None:
    with pytest.raises(ConfigError):
        should_give_up(-1, 5)
    with pytest.raises(ConfigError):
        should_give_up(1, -5)


def delay(attempts: int, explicit: float | None = None) -> int:
    return requeue_delay(
        attempts, explicit, default_requeue_delay=90.0, max_requeue_delay=900.0
    )


@pytest.mark.parametrize(
    ("attempts", "explicit", "ms"),
    [
        (0, None, 0),
        (1, None, 90_000),
        (3, None, 270_000),
        (10, None, 900_000),
        (11, None, 900_000),  # capped at 15 min
        (1, 0.0, 0),
        (1, 2.5, 2_500),
        (7, 2.5, 2_500),  # an explicit delay ignores the attempts
        (1, 1.005, 1_005),  # rounded, not truncated to 1004
        (1, 5000.0, 900_000),  # an explicit delay is capped too
    ],
)
def test_requeue_delay(attempts: int, explicit: float | None, ms: int) -> None:
    assert delay(attempts, explicit) == ms


def test_requeue_delay_rejects_negative() -> None:
    with pytest.raises(ConfigError):
        delay(-1)
    with pytest.raises(ConfigError):
        delay(1, -0.5)


def test_policy_from_config() -> None:
    policy = AttemptPolicy.from_config(
        ConsumerConfig(max_attempts=2, default_requeue_delay=1.5, max_requeue_delay=4.0)
    )
    assert policy == AttemptPolicy(2, 1.5, 4.0)
    assert not policy.should_give_up(2)
    assert policy.should_give_up(3)
    assert policy.requeue_delay_ms(1) == 1_500
    assert policy.requeue_delay_ms(2) == 3_000
    assert policy.requeue_delay_ms(3) == 4_000
    assert policy.requeue_delay_ms(3, explicit=0.25) == 250


@settings(max_examples=200, deadline=None)
@given(
    attempts=st.integers(0, 65535),
    default=st.floats(0.0, 1000.0),
    maximum=st.floats(0.0, 3600.0),
)
def test_computed_delay_is_linear_then_capped(
    attempts: int, default: float, maximum: float
) -> None:
    got = requeue_delay(attempts, default_requeue_delay=default, max_requeue_delay=maximum)
    assert 0 <= got <= round(maximum * 1000)
    assert got == round(min(default * attempts, maximum) * 1000)
    more = requeue_delay(attempts + 1, default_requeue_delay=default, max_requeue_delay=maximum)
    assert more >= got
