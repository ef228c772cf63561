"""Stateful hypothesis test of the RDY controller against a model of the wire.

The machine plays a consumer: it executes every action the controller returns against its
own record of what each nsqd has been told, delivers messages where that record allows it
(RDY above the in-flight count) plus stragglers nsqd sent before a lowered RDY reached it,
finishes and requeues them, moves time, fires the backoff
timer, changes max_in_flight and runs redistribution. After every step it checks the
contract's invariants and the controller's stronger mode invariants.

Messages are received and finished one at a time and also in batches (``count``), as the
consumer reports them. A twin controller with the same seed is fed every event too, but
each batch as that many single calls: it must answer with the same actions, and end up in
the same state, at every step.

max_in_flight 0 while a backoff window ends is covered: the controller then hands out no
test-the-waters RDY at all (it would break total <= max_in_flight), and gives it when
max_in_flight is raised again, so the bound below holds with no exception.
"""

from __future__ import annotations

import random
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from smartnsq.config import ConsumerConfig
from smartnsq.flow.backoff import exponential_backoff
from smartnsq.flow.rdy import (
    Action,
    RdyController,
    ScheduleTimer,
    SendRdy,
    is_conn_starved,
    per_connection_target,
)

GONE = -1  # key of a connection that closed with messages still in flight


class FlowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.keys = 0
        self.wire: dict[int, int] = {}  # RDY each nsqd was last sent
        self.max_rdy: dict[int, int] = {}
        self.in_flight: dict[int, int] = {}
        self.orphans = 0  # in flight on connections that are gone
        # messages nsqd may have sent under a larger window before a lower RDY reached it
        self.in_transit: dict[int, int] = {}
        self.timer: tuple[int, float] | None = None  # pending (token, due time)
        self.stale: list[int] = []
        self.config = ConsumerConfig()
        self.ctl: RdyController[int] = RdyController(self.config)
        self.twin: RdyController[int] = RdyController(self.config)

    @initialize(
        max_in_flight=st.integers(1, 6),
        max_rdys=st.lists(st.integers(1, 5), min_size=1, max_size=4),
        jitter=st.booleans(),
        # Hypothesis leans towards the first choice, so list the backoff-capable ones first.
        multiplier=st.sampled_from([1.0, 0.5, 3.0]),
        max_backoff=st.sampled_from([120.0, 10.0, 1.0, 0.0]),
        enabled=st.sampled_from([True, False]),
        seed=st.integers(0, 2**16),
    )
    def setup(
        self,
        max_in_flight: int,
        max_rdys: list[int],
        jitter: bool,
        multiplier: float,
        max_backoff: float,
        enabled: bool,
        seed: int,
    ) -> None:
        self.config = ConsumerConfig(
            max_in_flight=max_in_flight,
            backoff_strategy="full_jitter" if jitter else "exponential",
            backoff_multiplier=multiplier,
            max_backoff_duration=max_backoff,
            backoff_enabled=enabled,
        )
        self.ctl = RdyController(self.config, rng=random.Random(seed))
        self.twin = RdyController(self.config, rng=random.Random(seed))
        for max_rdy in max_rdys:
            self.add_connection(max_rdy)

    # -- feeding events to both controllers -------------------------------------------------

    def event(self, method: str, *args: Any, **kwargs: Any) -> list[Action[int]]:
        """Call ``method`` on the controller and its twin; both must answer the same."""
        actions: list[Action[int]] = getattr(self.ctl, method)(*args, **kwargs)
        assert getattr(self.twin, method)(*args, **kwargs) == actions
        return actions

    def batch(self, method: str, key: int, count: int) -> list[Action[int]]:
        """``count`` messages in one call; the twin gets ``count`` single calls."""
        actions: list[Action[int]] = getattr(self.ctl, method)(key, self.now, count=count)
        unrolled: list[Action[int]] = []
        for _ in range(count):
            unrolled += getattr(self.twin, method)(key, self.now)
        assert unrolled == actions
        return actions

    # -- executing actions like a consumer -------------------------------------------------

    def execute(self, actions: list[Action[int]]) -> None:
        seen: set[int] = set()
        raising = False
        for action in actions:
            if isinstance(action, SendRdy):
                key, count = action.conn, action.count
                assert key in self.wire, "RDY for a connection that is not registered"
                assert key not in seen, "two RDY commands for one connection in one batch"
                seen.add(key)
                assert count != self.wire[key], "redundant RDY"
                assert 0 <= count <= self.max_rdy[key]
                if count > self.wire[key]:
                    raising = True
                else:
                    assert not raising, "a decrease after an increase in one batch"
                    unsent = self.wire[key] - self.in_flight[key]
                    self.in_transit[key] = max(self.in_transit[key], unsent)
                self.wire[key] = count
                if raising:
                    assert sum(self.wire.values()) <= self.ctl.max_in_flight
            else:
                assert isinstance(action, ScheduleTimer)
                assert 0.0 <= action.delay <= self.config.max_backoff_duration
                assert self.timer is None, "a second backoff timer while one is pending"
                self.timer = (action.token, self.now + action.delay)

    # -- rules -----------------------------------------------------------------------------

    @rule(max_rdy=st.integers(1, 5))
    def add_connection(self, max_rdy: int) -> None:
        key = self.keys
        self.keys += 1
        self.wire[key] = 0
        self.max_rdy[key] = max_rdy
        self.in_flight[key] = 0
        self.in_transit[key] = 0
        self.execute(self.event("add_connection", key, max_rdy, self.now))

    @precondition(lambda self: self.wire)
    @rule(data=st.data())
    def remove_connection(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.wire)))
        self.orphans += self.in_flight.pop(key)
        del self.wire[key]
        del self.max_rdy[key]
        del self.in_transit[key]
        self.execute(self.event("remove_connection", key, self.now))

    @precondition(lambda self: any(r > self.in_flight[k] for k, r in self.wire.items()))
    @rule(data=st.data(), count=st.integers(1, 4))
    def receive(self, data: st.DataObject, count: int) -> None:
        """nsqd delivers up to ``count`` messages where the window allows."""
        for _ in range(count):
            ready = sorted(k for k, r in self.wire.items() if r > self.in_flight[k])
            if not ready:
                break
            key = data.draw(st.sampled_from(ready))
            self.in_flight[key] += 1
            self.execute(self.event("message_received", key, self.now))

    @precondition(lambda self: any(r > self.in_flight[k] or self.in_transit[k]
                                   for k, r in self.wire.items()))
    @rule(data=st.data())
    def receive_batch(self, data: st.DataObject) -> None:
        """One socket read: nsqd delivered k messages on one connection (what its window
        allows, then stragglers), reported in one call."""
        ready = sorted(k for k, r in self.wire.items()
                       if r > self.in_flight[k] or self.in_transit[k])
        key = data.draw(st.sampled_from(ready))
        window = max(0, self.wire[key] - self.in_flight[key])
        count = data.draw(st.integers(1, window + self.in_transit[key]))
        self.in_transit[key] -= max(0, count - window)
        self.in_flight[key] += count
        self.execute(self.batch("message_received", key, count))

    @precondition(lambda self: any(self.in_transit.values()))
    @rule(data=st.data())
    def receive_straggler(self, data: st.DataObject) -> None:
        """A message sent before nsqd saw a lower RDY arrives after it was lowered."""
        key = data.draw(st.sampled_from(sorted(k for k, n in self.in_transit.items() if n)))
        self.in_transit[key] -= 1
        self.in_flight[key] += 1
        self.execute(self.event("message_received", key, self.now))

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data(), outcomes=st.lists(
        st.sampled_from(["req", "fin", "req_no_backoff"]), min_size=1, max_size=4))
    def respond(self, data: st.DataObject, outcomes: list[str]) -> None:
        """The handlers answer up to ``len(outcomes)`` messages in flight."""
        for outcome in outcomes:
            busy = sorted(k for k, n in self.in_flight.items() if n)
            if not busy:
                break
            key = data.draw(st.sampled_from(busy))
            self.in_flight[key] -= 1
            self.execute(self.answer(key, outcome))

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data())
    def finish_batch(self, data: st.DataObject) -> None:
        """The FINs of one loop turn on one connection, reported in one call."""
        key = data.draw(st.sampled_from(sorted(k for k, n in self.in_flight.items() if n)))
        count = data.draw(st.integers(1, self.in_flight[key]))
        self.in_flight[key] -= count
        self.execute(self.batch("message_finished", key, count))

    @precondition(lambda self: self.orphans > 0)
    @rule(outcome=st.sampled_from(["fin", "req", "req_no_backoff"]))
    def respond_after_close(self, outcome: str) -> None:
        self.orphans -= 1
        self.execute(self.answer(GONE, outcome))

    @precondition(lambda self: self.orphans > 0)
    @rule(data=st.data())
    def finish_batch_after_close(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, self.orphans))
        self.orphans -= count
        self.execute(self.batch("message_finished", GONE, count))

    def answer(self, key: int, outcome: str) -> list[Action[int]]:
        if outcome == "fin":
            return self.event("message_finished", key, self.now)
        return self.event("message_requeued", key, self.now, backoff=outcome == "req")

    @rule(dt=st.sampled_from([0.1, 1.0, 5.0, 10.5, 31.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self.timer is not None)
    @rule()
    def fire_timer(self) -> None:
        assert self.timer is not None
        token, due = self.timer
        self.now = max(self.now, due)
        self.timer = None
        self.stale.append(token)
        self.execute(self.event("timer_fired", token, self.now))

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def fire_stale_timer(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(self.stale))
        assert self.event("timer_fired", token, self.now) == []

    @rule(max_in_flight=st.integers(0, 6))
    def set_max_in_flight(self, max_in_flight: int) -> None:
        self.execute(self.event("set_max_in_flight", max_in_flight, self.now))

    @rule()
    def redistribute(self) -> None:
        self.execute(self.event("redistribute", self.now))

    @precondition(
        lambda self: self.wire and self.ctl.max_in_flight >= 1 and not self.ctl.in_backoff
    )
    @rule()
    def liveness(self) -> None:
        """Whatever happened so far, a bounded number of redistribution rounds with time
        passing leaves flow open: some connection has RDY, and every one has when
        max_in_flight covers them all."""
        for _ in range(3):
            self.now += self.config.low_rdy_timeout + 1.0
            self.execute(self.event("redistribute", self.now))
        assert any(self.wire.values())
        if self.ctl.max_in_flight >= len(self.wire):
            assert all(r >= 1 for r in self.wire.values())

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def twin_matches(self) -> None:
        """Batched and unrolled events left both controllers in the same state, hidden
        counters and random generator included."""
        a, b = self.ctl, self.twin
        assert a._conns == b._conns
        assert (a._total, a._max_in_flight, a._timer_token, a._tokens) == (
            b._total, b._max_in_flight, b._timer_token, b._tokens)
        assert (a.backoff_level, a.backoff_window_active) == (
            b.backoff_level, b.backoff_window_active)
        assert a._rng.getstate() == b._rng.getstate()

    @invariant()
    def wire_matches_controller(self) -> None:
        assert set(self.ctl.connections) == set(self.wire)
        for key, rdy in self.wire.items():
            assert self.ctl.rdy(key) == rdy
            assert self.ctl.in_flight(key) == self.in_flight[key]
        assert self.ctl.total_rdy == sum(self.wire.values())

    @invariant()
    def within_budgets(self) -> None:
        assert sum(self.wire.values()) <= self.ctl.max_in_flight
        for key, rdy in self.wire.items():
            assert 0 <= rdy <= self.max_rdy[key]

    @invariant()
    def backoff_level_bounded(self) -> None:
        top = 0
        while exponential_backoff(top + 1, self.config.backoff_multiplier) <= (
            self.config.max_backoff_duration
        ):
            top += 1
        assert 0 <= self.ctl.backoff_level <= (top if self.config.backoff_enabled else 0)
        assert self.ctl.backoff_window_active == (self.timer is not None)

    @invariant()
    def mode_invariants(self) -> None:
        n = len(self.wire)
        total = sum(self.wire.values())
        mif = self.ctl.max_in_flight
        if self.ctl.backoff_window_active:
            assert total == 0
        elif self.ctl.in_backoff:
            # test the waters: exactly one connection at RDY 1 whenever that is possible
            assert total == (1 if n and mif else 0)
            assert all(r <= 1 for r in self.wire.values())
        elif n and mif >= n:
            target = per_connection_target(mif, n)
            assert all(1 <= r <= target for r in self.wire.values())
        elif n:
            assert total == mif
            assert all(r <= 1 for r in self.wire.values())

    @invariant()
    def starvation_matches_definition(self) -> None:
        expected = any(
            is_conn_starved(self.in_flight[k], r) for k, r in self.wire.items()
        )
        assert self.ctl.is_starved() == expected


SETTINGS: dict[str, Any] = {
    "max_examples": 200,
    "stateful_step_count": 50,
    "deadline": None,
    "derandomize": True,
    "suppress_health_check": [HealthCheck.too_slow],
}

TestFlow = FlowMachine.TestCase
TestFlow.settings = settings(**SETTINGS)
