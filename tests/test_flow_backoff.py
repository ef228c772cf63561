"""Backoff strategies and the level/window state machine (smartnsq.flow.backoff)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.config import ConsumerConfig
from smartnsq.flow.backoff import (
    BackoffState,
    ExponentialStrategy,
    FullJitterStrategy,
    Pause,
    Resume,
    exponential_backoff,
    full_jitter_backoff,
    strategy_from_config,
)


def defaults() -> BackoffState:
    return BackoffState.from_config(ConsumerConfig())


def test_exponential_values() -> None:
    assert [exponential_backoff(k, 1.0) for k in range(8)] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert exponential_backoff(3, 0.5) == 4.0
    assert exponential_backoff(0, 0.25) == 0.25


def test_negative_level_rejected() -> None:
    with pytest.raises(ValueError):
        exponential_backoff(-1, 1.0)


def test_full_jitter_is_below_ceiling_and_seeded() -> None:
    draws = [full_jitter_backoff(4, 1.0, random.Random(7)) for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]  # same seed, same draw
    rng = random.Random(1)
    values = [full_jitter_backoff(3, 2.0, rng) for _ in range(500)]
    assert all(0.0 <= v < 16.0 for v in values)
    # It really spreads over the range rather than sticking to one end.
    assert min(values) < 2.0 and max(values) > 14.0


def test_strategy_from_config() -> None:
    assert strategy_from_config(ConsumerConfig()) == ExponentialStrategy(1.0)
    jitter = strategy_from_config(
        ConsumerConfig(backoff_strategy="full_jitter", backoff_multiplier=0.5), random.Random(3)
    )
    assert isinstance(jitter, FullJitterStrategy)
    assert jitter.multiplier == 0.5
    assert jitter.ceiling(2) == 2.0


def fail_through_windows(state: BackoffState, times: int) -> list[Pause | Resume | None]:
    """Fail once per window, ending each window before the next failure."""
    out: list[Pause | Resume | None] = []
    for _ in range(times):
        out.append(state.failure())
        state.window_ended()
    return out


def test_default_levels_and_durations() -> None:
    state = defaults()
    pauses = fail_through_windows(state, 9)
    # Level k pauses multiplier x 2**k: the first failure already pauses 2 s (go-nsq).
    assert pauses[:6] == [Pause(2.0, 1), Pause(4.0, 2), Pause(8.0, 3), Pause(16.0, 4),
                          Pause(32.0, 5), Pause(64.0, 6)]
    # 2**7 = 128 s exceeds the 120 s maximum: level 7 is never entered.
    assert pauses[6:] == [Pause(64.0, 6)] * 3
    assert state.level == 6


def test_signals_ignored_during_window() -> None:
    state = defaults()
    assert state.failure() == Pause(2.0, 1)
    assert state.window_active
    assert state.failure() is None
    assert state.success() is None
    assert state.neutral() is None
    assert state.level == 1
    state.window_ended()
    assert not state.window_active
    assert state.failure() == Pause(4.0, 2)


def test_success_steps_down_and_exits() -> None:
    state = defaults()
    fail_through_windows(state, 3)
    assert state.level == 3
    assert state.success() == Pause(4.0, 2)
    state.window_ended()
    assert state.success() == Pause(2.0, 1)
    state.window_ended()
    assert state.success() == Resume()
    assert state.level == 0
    assert not state.in_backoff
    assert not state.window_active


def test_success_outside_backoff_keeps_level_zero() -> None:
    state = defaults()
    for _ in range(5):
        assert state.success() is None
    assert state.level == 0
    assert state.failure() == Pause(2.0, 1)


def test_neutral_keeps_level_but_pauses_again() -> None:
    state = defaults()
    assert state.neutral() is None  # not backing off: no effect
    fail_through_windows(state, 2)
    assert state.neutral() == Pause(4.0, 2)
    assert state.level == 2


def test_disabled_never_pauses() -> None:
    state = BackoffState.from_config(ConsumerConfig(backoff_enabled=False))
    for signal in (state.failure, state.failure, state.neutral, state.success):
        assert signal() is None
    assert state.level == 0
    assert not state.window_active


def test_small_maximum_limits_level() -> None:
    state = BackoffState(ExponentialStrategy(1.0), 3.0)
    pauses = fail_through_windows(state, 3)
    assert pauses == [Pause(2.0, 1)] * 3  # 4 s > 3 s, so level 2 is never entered
    zero = BackoffState(ExponentialStrategy(1.0), 0.0)
    assert fail_through_windows(zero, 2) == [None, None]
    assert zero.level == 0


def test_duration_is_capped_at_maximum() -> None:
    class Wild:
        """A strategy whose draws exceed the ceiling it announces."""

        def duration(self, level: int) -> float:
            return 1000.0

        def ceiling(self, level: int) -> float:
            return 1.0

    state = BackoffState(Wild(), 5.0)
    assert state.failure() == Pause(5.0, 1)


def test_negative_maximum_rejected() -> None:
    with pytest.raises(ValueError):
        BackoffState(ExponentialStrategy(), -1.0)


def test_jitter_level_is_bounded_like_exponential() -> None:
    state = BackoffState(FullJitterStrategy(1.0, random.Random(5)), 120.0)
    pauses = fail_through_windows(state, 20)
    assert state.level == 6
    for pause in pauses:
        assert isinstance(pause, Pause)
        assert 0.0 <= pause.duration < exponential_backoff(pause.level, 1.0)


SIGNALS = st.sampled_from(["success", "failure", "neutral", "window_ended"])


@settings(max_examples=200, deadline=None)
@given(
    signals=st.lists(SIGNALS, max_size=60),
    multiplier=st.floats(0.01, 10.0),
    max_duration=st.floats(0.0, 300.0),
    jitter=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_random_signal_sequences_stay_in_bounds(
    signals: list[str], multiplier: float, max_duration: float, jitter: bool, seed: int
) -> None:
    strategy = (
        FullJitterStrategy(multiplier, random.Random(seed))
        if jitter
        else ExponentialStrategy(multiplier)
    )
    state = BackoffState(strategy, max_duration)
    max_level = 0
    while exponential_backoff(max_level + 1, multiplier) <= max_duration:
        max_level += 1
    for name in signals:
        window_before = state.window_active
        level_before = state.level
        if name == "window_ended":
            state.window_ended()
            continue
        result = getattr(state, name)()
        assert 0 <= state.level <= max_level
        if window_before:
            # one result per window: nothing changes while it runs
            assert result is None and state.level == level_before
        elif isinstance(result, Pause):
            assert 0.0 <= result.duration <= max_duration
            assert result.level == state.level > 0
            assert state.window_active
        elif isinstance(result, Resume):
            assert level_before == 1 and state.level == 0 and name == "success"
        else:
            assert state.level == 0 and not state.window_active
