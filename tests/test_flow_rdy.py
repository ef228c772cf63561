"""RDY distribution rules (smartnsq.flow.rdy), with exact numbers."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.config import ConsumerConfig
from smartnsq.errors import ConfigError
from smartnsq.flow.rdy import (
    Action,
    RdyController,
    ScheduleTimer,
    SendRdy,
    _messages_until_due,
    is_conn_starved,
    per_connection_target,
    rdy_update_due,
)


def controller(seed: int = 0, **config: Any) -> RdyController[str]:
    return RdyController(ConsumerConfig(**config), rng=random.Random(seed))


def rdys(ctl: RdyController[str]) -> dict[str, int]:
    return {k: ctl.rdy(k) for k in ctl.connections}


def timer(actions: list[Action[str]]) -> ScheduleTimer:
    timers = [a for a in actions if isinstance(a, ScheduleTimer)]
    assert len(timers) == 1
    return timers[0]


def sends(actions: list[Action[str]]) -> list[SendRdy[str]]:
    return [a for a in actions if isinstance(a, SendRdy)]


# -- pure rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_in_flight", "n", "target"),
    [(1, 1, 1), (1, 3, 1), (0, 1, 0), (0, 4, 0), (10, 3, 3), (100, 3, 33), (7, 2, 3),
     (5, 5, 1), (2500, 1, 2500), (20, 20, 1), (20, 21, 1)],
)
def test_per_connection_target(max_in_flight: int, n: int, target: int) -> None:
    assert per_connection_target(max_in_flight, n) == target


@settings(max_examples=200, deadline=None)
@given(max_in_flight=st.integers(0, 10**6), n=st.integers(1, 10**4))
def test_per_connection_target_is_floor_share(max_in_flight: int, n: int) -> None:
    expected = 0 if max_in_flight == 0 else max(1, max_in_flight // n)
    assert per_connection_target(max_in_flight, n) == expected


def test_per_connection_target_needs_a_connection() -> None:
    with pytest.raises(ValueError):
        per_connection_target(5, 0)


@pytest.mark.parametrize(
    ("last_rdy", "received", "due"),
    [
        (0, 0, True),  # a zero window always needs an update
        (1, 0, False),
        (1, 1, True),
        (4, 3, False),  # 1 of 4 left is exactly 25 %, not below
        (4, 4, True),
        (10, 7, False),
        (10, 8, True),  # 2 of 10 left: below 25 %
        (100, 75, False),
        (100, 76, True),
        (100, 120, True),
    ],
)
def test_rdy_update_due(last_rdy: int, received: int, due: bool) -> None:
    assert rdy_update_due(last_rdy, received) is due


@pytest.mark.parametrize(
    ("in_flight", "last_rdy", "starved"),
    [(0, 0, False), (0, 10, False), (1, 1, True), (8, 10, False), (9, 10, True),
     (16, 20, False), (17, 20, True), (1, 0, True), (85, 100, True), (84, 100, False)],
)
def test_is_conn_starved(in_flight: int, last_rdy: int, starved: bool) -> None:
    assert is_conn_starved(in_flight, last_rdy) is starved


# -- bootstrap and distribution --------------------------------------------------------------


def test_new_connection_starts_at_one_then_ramps_to_target() -> None:
    ctl = controller(max_in_flight=10)
    assert ctl.add_connection("a", 2500, now=0.0) == [SendRdy("a", 1)]
    assert ctl.message_received("a", now=1.0) == [SendRdy("a", 10)]
    assert ctl.total_rdy == 10


def test_second_connection_lowers_the_first_before_starting() -> None:
    ctl = controller(max_in_flight=10)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_received("a", 0.0)
    # decreases come first so the wire total never exceeds max_in_flight
    assert ctl.add_connection("b", 2500, 1.0) == [SendRdy("a", 5), SendRdy("b", 1)]
    assert ctl.message_received("b", 2.0) == [SendRdy("b", 5)]
    assert rdys(ctl) == {"a": 5, "b": 5}


def test_new_connection_raises_earlier_ones_still_at_one() -> None:
    ctl = controller(max_in_flight=12)
    ctl.add_connection("a", 2500, 0.0)
    # "a" has received nothing yet; the next re-balance gives it the 3-way share
    assert ctl.add_connection("b", 2500, 0.0) == [SendRdy("a", 6), SendRdy("b", 1)]
    assert ctl.add_connection("c", 2500, 0.0) == [SendRdy("a", 4), SendRdy("b", 4),
                                                    SendRdy("c", 1)]


def test_messages_do_not_resend_an_unchanged_window() -> None:
    ctl = controller(max_in_flight=8)
    ctl.add_connection("a", 2500, 0.0)
    assert ctl.message_received("a", 0.0) == [SendRdy("a", 8)]
    # The server keeps RDY 8 as a window; sending it again would change nothing.
    for _ in range(20):
        assert ctl.message_received("a", 0.0) == []
        ctl.message_finished("a", 0.0)


def test_removal_raises_the_rest_to_the_new_target() -> None:
    ctl = controller(max_in_flight=12)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    ctl.message_received("b", 0.0)
    assert rdys(ctl) == {"a": 6, "b": 6}
    assert ctl.remove_connection("b", 1.0) == [SendRdy("a", 12)]


def test_ramp_respects_max_rdy_count() -> None:
    ctl = controller(max_in_flight=100)
    assert ctl.add_connection("a", 20, 0.0) == [SendRdy("a", 1)]
    assert ctl.message_received("a", 0.0) == [SendRdy("a", 20)]
    assert ctl.total_rdy == 20
    # already at its cap: later messages do not re-send
    for _ in range(30):
        assert ctl.message_received("a", 0.0) == []


def test_max_in_flight_below_connections_rotates() -> None:
    ctl = controller(seed=1, max_in_flight=1)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    ctl.add_connection("c", 2500, 0.0)
    assert rdys(ctl) == {"a": 1, "b": 0, "c": 0}
    # "a" got RDY at t=0: it is not idle until low_rdy_idle_timeout (10 s) has passed
    assert ctl.redistribute(5.0) == []
    assert ctl.redistribute(10.0) == []
    actions = ctl.redistribute(10.5)
    assert ctl.total_rdy == 1
    # the idle holder gives up; a connection that did not just give up gets RDY 1
    assert actions[0] == SendRdy("a", 0)
    [grant] = actions[1:]
    assert isinstance(grant, SendRdy) and grant.count == 1 and grant.conn in ("b", "c")


def test_two_connections_alternate_when_idle() -> None:
    ctl = controller(seed=11, max_in_flight=1)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    holders = []
    for i in range(1, 7):
        ctl.redistribute(11.0 * i)
        holders.append(next(k for k, v in rdys(ctl).items() if v))
    assert holders == ["b", "a", "b", "a", "b", "a"]


def test_rotation_reaches_every_connection() -> None:
    ctl = controller(seed=2, max_in_flight=2)
    keys = [f"c{i}" for i in range(8)]
    for key in keys:
        ctl.add_connection(key, 2500, 0.0)
    seen = {k for k, v in rdys(ctl).items() if v}
    now = 0.0
    for _ in range(40):
        now += 11.0
        ctl.redistribute(now)
        assert ctl.total_rdy == 2
        seen |= {k for k, v in rdys(ctl).items() if v}
    assert seen == set(keys)


def test_active_connection_keeps_rdy_until_low_rdy_timeout() -> None:
    ctl = controller(seed=3, max_in_flight=1)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    for t in range(1, 31):
        ctl.message_received("a", float(t))
        ctl.message_finished("a", float(t))
        assert ctl.redistribute(float(t)) == []
    assert rdys(ctl) == {"a": 1, "b": 0}


def test_low_rdy_timeout_forces_rotation() -> None:
    # "a" is busy but has held its RDY for more than 30 s: it goes to "b", not back to "a".
    ctl = controller(seed=0, max_in_flight=1)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    ctl.message_received("a", 30.0)
    ctl.message_finished("a", 30.0)
    assert ctl.redistribute(30.5) == [SendRdy("a", 0), SendRdy("b", 1)]


def test_removal_returns_rdy_to_the_budget() -> None:
    ctl = controller(seed=4, max_in_flight=1)
    for key in "abc":
        ctl.add_connection(key, 2500, 0.0)
    holder = next(k for k, v in rdys(ctl).items() if v)
    actions = ctl.remove_connection(holder, 1.0)
    assert ctl.total_rdy == 1
    assert len(actions) == 1
    assert actions[0] in [SendRdy(k, 1) for k in "abc" if k != holder]
    assert ctl.remove_connection(holder, 1.0) == []  # closing twice is harmless


def test_removal_into_balanced_mode_gives_everyone_rdy() -> None:
    ctl = controller(seed=5, max_in_flight=2)
    for key in "abc":
        ctl.add_connection(key, 2500, 0.0)
    assert ctl.total_rdy == 2
    zero = next(k for k, v in rdys(ctl).items() if v == 0)
    ctl.remove_connection(next(k for k in "abc" if k != zero), 1.0)
    assert sorted(rdys(ctl).values()) == [1, 1]


def test_set_max_in_flight_zero_pauses_and_resumes() -> None:
    ctl = controller(max_in_flight=6)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    ctl.message_received("b", 0.0)
    assert rdys(ctl) == {"a": 3, "b": 3}
    assert ctl.set_max_in_flight(0, 1.0) == [SendRdy("a", 0), SendRdy("b", 0)]
    assert ctl.set_max_in_flight(0, 1.0) == []
    # messages already in transit do not reopen the flow
    assert ctl.message_received("a", 1.5) == []
    assert ctl.redistribute(20.0) == []
    assert ctl.set_max_in_flight(4, 2.0) == [SendRdy("a", 2), SendRdy("b", 2)]


def test_lowering_max_in_flight_sheds_idle_connections_first() -> None:
    ctl = controller(seed=6, max_in_flight=3)
    for key in "abcd":
        ctl.add_connection(key, 2500, 0.0)
    holders = [k for k, v in rdys(ctl).items() if v]
    assert len(holders) == 3
    busy = holders[1]
    ctl.message_received(busy, 5.0)
    actions = ctl.set_max_in_flight(1, 6.0)
    assert rdys(ctl)[busy] == 1
    assert ctl.total_rdy == 1
    assert sorted(a.conn for a in sends(actions)) == sorted(k for k in holders if k != busy)


def test_straggler_on_connection_without_rdy_does_not_take_budget() -> None:
    ctl = controller(seed=7, max_in_flight=1)
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    idle = next(k for k, v in rdys(ctl).items() if v == 0)
    assert ctl.message_received(idle, 1.0) == []
    assert ctl.in_flight(idle) == 1
    assert ctl.total_rdy == 1


def test_is_starved_uses_the_last_rdy_sent() -> None:
    ctl = controller(max_in_flight=10)
    ctl.add_connection("a", 2500, 0.0)
    assert not ctl.is_starved()
    ctl.message_received("a", 0.0)  # in flight 1 of RDY 1 -> starved, and ramps to 10
    assert ctl.rdy("a") == 10
    for _ in range(7):
        ctl.message_received("a", 0.0)
    assert ctl.in_flight("a") == 8
    assert not ctl.is_starved()  # 8 < 8.5
    ctl.message_received("a", 0.0)
    assert ctl.is_starved()
    ctl.message_finished("a", 0.0)
    assert not ctl.is_starved()


def test_argument_errors() -> None:
    ctl = controller()
    ctl.add_connection("a", 2500, 0.0)
    with pytest.raises(ConfigError):
        ctl.add_connection("a", 2500, 0.0)
    with pytest.raises(ConfigError):
        ctl.add_connection("b", 0, 0.0)
    with pytest.raises(ConfigError):
        ctl.set_max_in_flight(-1, 0.0)
    with pytest.raises(ConfigError):
        ctl.message_received("a", 0.0, count=-1)
    with pytest.raises(ConfigError):
        ctl.message_finished("a", 0.0, count=-1)


def test_unknown_connection_events_are_harmless() -> None:
    ctl = controller(max_in_flight=2)
    assert ctl.message_received("ghost", 0.0) == []
    assert ctl.message_finished("ghost", 0.0) == []
    ctl.add_connection("a", 2500, 0.0)
    # a late REQ from a closed connection still counts for backoff
    assert ctl.message_requeued("ghost", 1.0) == [SendRdy("a", 0), ScheduleTimer(2.0, 1)]


def test_finish_without_in_flight_does_not_go_negative() -> None:
    ctl = controller(max_in_flight=2)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_finished("a", 0.0)
    assert ctl.in_flight("a") == 0


# -- backoff ---------------------------------------------------------------------------------


def two_busy_connections(**config: Any) -> RdyController[str]:
    ctl = controller(seed=8, **{"max_in_flight": 10, **config})
    ctl.add_connection("a", 2500, 0.0)
    ctl.add_connection("b", 2500, 0.0)
    ctl.message_received("b", 0.0)
    ctl.message_received("a", 0.0)
    assert rdys(ctl) == {"a": 5, "b": 5}
    return ctl


def test_backoff_cycle() -> None:
    ctl = two_busy_connections()
    actions = ctl.message_requeued("a", 1.0)
    assert actions == [SendRdy("a", 0), SendRdy("b", 0), ScheduleTimer(2.0, 1)]
    assert ctl.in_backoff and ctl.backoff_window_active and ctl.backoff_level == 1
    # one result per window: the rest of the batch is ignored
    assert ctl.message_requeued("b", 1.5) == []
    assert ctl.message_finished("a", 1.5) == []
    assert ctl.backoff_level == 1
    # nothing moves RDY during the window
    assert ctl.redistribute(2.0) == []
    assert ctl.set_max_in_flight(20, 2.0) == []
    # the window ends: test the waters on exactly one connection
    probe = ctl.timer_fired(1, 3.0)
    assert len(probe) == 1 and isinstance(probe[0], SendRdy) and probe[0].count == 1
    assert ctl.total_rdy == 1 and ctl.in_backoff and not ctl.backoff_window_active
    tester = probe[0].conn
    assert ctl.message_received(tester, 3.1) == []  # no ramp while backing off
    # success: level back to 0, everyone to the target of max_in_flight 20 / 2
    exit_actions = ctl.message_finished(tester, 3.2)
    assert sorted(sends(exit_actions), key=lambda a: a.conn) == [SendRdy("a", 10),
                                                                 SendRdy("b", 10)]
    assert not ctl.in_backoff


def test_backoff_levels_through_controller() -> None:
    ctl = two_busy_connections()
    assert timer(ctl.message_requeued("a", 0.0)) == ScheduleTimer(2.0, 1)
    ctl.timer_fired(1, 2.0)
    assert timer(ctl.message_requeued("a", 2.1)) == ScheduleTimer(4.0, 2)
    ctl.timer_fired(2, 6.1)
    assert ctl.backoff_level == 2
    # success steps down one level and pauses again, at the shorter duration
    actions = ctl.message_finished("b", 6.2)
    assert timer(actions) == ScheduleTimer(2.0, 3)
    assert ctl.total_rdy == 0
    ctl.timer_fired(3, 8.2)
    # requeue without backoff: same level, pause again
    assert timer(ctl.message_requeued("a", 8.3, backoff=False)) == ScheduleTimer(2.0, 4)
    assert ctl.backoff_level == 1


def test_stale_timer_is_ignored() -> None:
    ctl = two_busy_connections()
    ctl.message_requeued("a", 0.0)
    assert ctl.timer_fired(99, 1.0) == []
    assert ctl.backoff_window_active
    assert len(ctl.timer_fired(1, 2.0)) == 1
    assert ctl.timer_fired(1, 2.0) == []  # firing twice does nothing more


def test_requeue_without_backoff_outside_backoff_changes_nothing() -> None:
    ctl = two_busy_connections()
    assert ctl.message_requeued("a", 0.0, backoff=False) == []
    assert not ctl.in_backoff


def test_backoff_disabled() -> None:
    ctl = two_busy_connections(backoff_enabled=False)
    for _ in range(5):
        assert ctl.message_requeued("a", 0.0) == []
    assert rdys(ctl) == {"a": 5, "b": 5}


@pytest.mark.parametrize("seed", range(20))
def test_the_probe_goes_to_the_connection_whose_requeue_backed_off(seed: int) -> None:
    # the failed message comes back on its own connection: a random probe could sit on an idle
    # one for low_rdy_idle_timeout while the failed one waited (an ordered partition stalled)
    ctl = controller(seed=seed, max_in_flight=4)
    for key in "abcd":
        ctl.add_connection(key, 2500, 0.0)
    ctl.message_received("c", 0.1)
    ctl.message_requeued("c", 0.2)
    assert rdys(ctl) == {"a": 0, "b": 0, "c": 0, "d": 0}
    assert sends(ctl.timer_fired(1, 2.0)) == [SendRdy("c", 1)]


def test_a_neutral_requeue_does_not_choose_the_probe() -> None:
    picks = set()
    for seed in range(30):
        ctl = controller(seed=seed, max_in_flight=4)
        for key in "abcd":
            ctl.add_connection(key, 2500, 0.0)
        ctl.message_received("a", 0.1)
        ctl.message_received("d", 0.1)
        ctl.message_requeued("a", 0.2)            # the backoff failure
        ctl.message_requeued("d", 0.3, backoff=False)  # neutral: not a failure
        (probe,) = sends(ctl.timer_fired(1, 2.0))
        picks.add(probe.conn)
    assert picks == {"a"}


def test_a_removed_connection_is_not_the_probe() -> None:
    ctl = controller(seed=3, max_in_flight=4)
    for key in "ab":
        ctl.add_connection(key, 2500, 0.0)
    ctl.message_received("a", 0.1)
    ctl.message_requeued("a", 0.2)
    ctl.remove_connection("a", 0.5)
    assert sends(ctl.timer_fired(1, 2.0)) == [SendRdy("b", 1)]


def test_window_end_without_connections_probes_the_next_one() -> None:
    ctl = controller(max_in_flight=4)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_requeued("a", 0.0)
    ctl.remove_connection("a", 0.5)
    assert ctl.timer_fired(1, 2.0) == []
    assert ctl.add_connection("b", 2500, 3.0) == [SendRdy("b", 1)]
    assert ctl.add_connection("c", 2500, 3.0) == []  # only one tester while backing off


def test_window_end_with_max_in_flight_zero_probes_later() -> None:
    ctl = controller(max_in_flight=4)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_requeued("a", 0.0)
    ctl.set_max_in_flight(0, 0.5)
    assert ctl.timer_fired(1, 2.0) == []  # never RDY 1 with max_in_flight 0
    assert ctl.total_rdy == 0
    assert ctl.set_max_in_flight(3, 3.0) == [SendRdy("a", 1)]


def test_removing_the_tester_moves_the_probe() -> None:
    ctl = controller(seed=9, max_in_flight=4)
    for key in "abc":
        ctl.add_connection(key, 2500, 0.0)
    ctl.message_requeued("a", 0.0)
    [probe] = ctl.timer_fired(1, 2.0)
    assert isinstance(probe, SendRdy)
    actions = ctl.remove_connection(probe.conn, 2.5)
    assert len(actions) == 1 and ctl.total_rdy == 1


def test_idle_tester_rotates_during_backoff() -> None:
    ctl = controller(seed=10, max_in_flight=4)
    for key in "abc":
        ctl.add_connection(key, 2500, 0.0)
    ctl.message_requeued("a", 0.0)
    [probe] = ctl.timer_fired(1, 2.0)
    assert isinstance(probe, SendRdy)
    testers = {probe.conn}
    now = 2.0
    for _ in range(30):
        now += 11.0
        ctl.redistribute(now)
        assert ctl.total_rdy == 1
        testers |= {k for k, v in rdys(ctl).items() if v}
    assert testers == {"a", "b", "c"}


def test_single_connection_tester_is_not_churned() -> None:
    ctl = controller(max_in_flight=4)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_requeued("a", 0.0)
    ctl.timer_fired(1, 2.0)
    assert ctl.redistribute(100.0) == []
    assert ctl.rdy("a") == 1


def test_full_jitter_window_is_random_and_bounded() -> None:
    ctl = two_busy_connections(backoff_strategy="full_jitter")
    pause = timer(ctl.message_requeued("a", 0.0))
    assert 0.0 <= pause.delay < 2.0


# -- batched events ----------------------------------------------------------------------------


def state(ctl: RdyController[Any]) -> tuple[Any, ...]:
    """Everything that decides a controller's future answers, for comparing two of them.
    Private on purpose: equivalence must hold for the hidden counters too, not only for
    what the public views show."""
    conns = {k: dataclasses.replace(c) for k, c in ctl._conns.items()}
    return (conns, ctl._total, ctl._max_in_flight, ctl._timer_token, ctl._tokens,
            ctl._backoff.level, ctl._backoff.window_active, ctl._rng.getstate())


def test_messages_until_due_matches_the_25_percent_rule() -> None:
    for last_rdy in range(0, 60):
        for received in range(0, 70):
            n = _messages_until_due(last_rdy, received)
            assert n >= 1 and rdy_update_due(last_rdy, received + n)
            # the first such count: one message less is not due (a count of 0 never is)
            assert n == 1 or not rdy_update_due(last_rdy, received + n - 1)


def test_batched_receive_ramps_at_the_first_due_message() -> None:
    ctl = controller(max_in_flight=10)
    single = controller(max_in_flight=10)
    for c in (ctl, single):
        c.add_connection("a", 2500, 0.0)
    assert ctl.message_received("a", 1.0, count=4) == [SendRdy("a", 10)]
    assert [single.message_received("a", 1.0) for _ in range(4)] == [
        [SendRdy("a", 10)], [], [], []]
    assert ctl.in_flight("a") == 4
    # the 3 messages after the raise count against RDY 10, as one by one
    assert ctl._conns["a"].received == 3
    assert state(ctl) == state(single)


def test_batched_receive_below_the_threshold_sends_nothing() -> None:
    ctl = controller(max_in_flight=8)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_received("a", 0.0)
    assert ctl.message_received("a", 0.0, count=6) == []  # 7 of 8: 1 left, not below 25 %
    assert ctl.in_flight("a") == 7 and ctl.rdy("a") == 8


def test_batch_of_zero_changes_nothing() -> None:
    ctl = two_busy_connections()
    before = state(ctl)
    assert ctl.message_received("a", 5.0, count=0) == []
    assert ctl.message_finished("a", 5.0, count=0) == []
    assert state(ctl) == before


def test_batched_finish_clamps_in_flight() -> None:
    ctl = controller(max_in_flight=10)
    ctl.add_connection("a", 2500, 0.0)
    ctl.message_received("a", 0.0, count=3)
    assert ctl.message_finished("a", 0.0, count=5) == []
    assert ctl.in_flight("a") == 0


def test_batched_finish_is_one_backoff_success() -> None:
    # Level 2: a batch of finishes lowers the level by one and opens a window, exactly like
    # the same finishes one by one (the window ignores all but the first).
    ctl = two_busy_connections()
    ctl.message_requeued("a", 0.0)
    ctl.timer_fired(1, 2.0)
    ctl.message_requeued("a", 2.1)
    ctl.timer_fired(2, 6.1)
    assert ctl.backoff_level == 2
    tester = next(k for k, v in rdys(ctl).items() if v)
    ctl.message_received(tester, 6.15)
    assert ctl.message_finished(tester, 6.2, count=3) == [SendRdy(tester, 0),
                                                          ScheduleTimer(2.0, 3)]
    assert ctl.backoff_level == 1 and ctl.backoff_window_active
    # level 1: the batch ends backoff; the rest of it has no level left to lower
    ctl.timer_fired(3, 8.2)
    actions = ctl.message_finished("b", 8.3, count=4)
    assert sorted(sends(actions), key=lambda a: a.conn) == [SendRdy("a", 5), SendRdy("b", 5)]
    assert not ctl.in_backoff


# One event of a history: (name, connection index, count or other argument). Few
# connections and batched events drawn twice as often, so that batches meet connections
# with messages in flight and every RDY mode.
_KEY = st.integers(0, 3)
_RECV = st.tuples(st.just("recv"), _KEY, st.integers(0, 12))
_FIN = st.tuples(st.just("fin"), _KEY, st.integers(0, 12))
EVENTS = st.one_of(
    _RECV, _FIN, _RECV, _FIN,
    st.tuples(st.just("add"), _KEY, st.integers(1, 6)),
    st.tuples(st.just("remove"), _KEY, st.just(0)),
    st.tuples(st.sampled_from(["req", "req_no_backoff"]), _KEY, st.just(0)),
    st.tuples(st.just("timer"), st.just(0), st.just(0)),
    st.tuples(st.just("advance"), st.just(0), st.sampled_from([0, 1, 5, 11, 31])),
    st.tuples(st.just("max_in_flight"), st.just(0), st.integers(0, 12)),
    st.tuples(st.just("redistribute"), st.just(0), st.just(0)),
)


@settings(max_examples=400, deadline=None)
@given(
    max_in_flight=st.integers(1, 12),
    jitter=st.booleans(),
    max_backoff=st.sampled_from([120.0, 3.0, 0.0]),
    enabled=st.booleans(),
    seed=st.integers(0, 2**16),
    events=st.lists(EVENTS, min_size=10, max_size=80),
)
def test_batched_calls_equal_repeated_single_calls(
    max_in_flight: int, jitter: bool, max_backoff: float, enabled: bool, seed: int,
    events: list[tuple[str, int, int]],
) -> None:
    """Over any history, a controller fed ``count``-message events answers and ends up
    exactly like one fed the same messages one by one (same seed, so equal random draws
    too): per event the concatenated single-call actions equal the batched ones."""
    config = {"max_in_flight": max_in_flight, "max_backoff_duration": max_backoff,
              "backoff_enabled": enabled,
              "backoff_strategy": "full_jitter" if jitter else "exponential"}
    batched = controller(seed, **config)
    single = controller(seed, **config)
    now = 0.0
    keys = [f"c{i}" for i in range(4)]
    for name, i, arg in events:
        key = keys[i]
        if name == "recv":
            got = batched.message_received(key, now, count=arg)
            want: list[Action[str]] = []
            for _ in range(arg):
                want += single.message_received(key, now)
        elif name == "fin":
            got = batched.message_finished(key, now, count=arg)
            want = []
            for _ in range(arg):
                want += single.message_finished(key, now)
        elif name == "advance":
            now += arg
            continue
        else:
            got, want = (_single_event(c, name, key, arg, now) for c in (batched, single))
        assert got == want
        assert state(batched) == state(single)


def _single_event(ctl: RdyController[str], name: str, key: str, arg: int,
                  now: float) -> list[Action[str]]:
    if name == "add":
        return [] if key in ctl else ctl.add_connection(key, arg, now)
    if name == "remove":
        return ctl.remove_connection(key, now)
    if name in ("req", "req_no_backoff"):
        return ctl.message_requeued(key, now, backoff=name == "req")
    if name == "timer":
        return ctl.timer_fired(ctl._timer_token or 0, now)
    if name == "max_in_flight":
        return ctl.set_max_in_flight(arg, now)
    assert name == "redistribute"
    return ctl.redistribute(now)
