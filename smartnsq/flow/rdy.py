"""RDY distribution across a consumer's connections (docs/protocol.md §9.1, "Building Client
Libraries" — RDY State and Backoff).

:class:`RdyController` is a plain object: the consumer feeds it events (connection added or
removed, message received, finished or requeued, backoff timer fired, periodic
redistribution, ``max_in_flight`` changed) together with the current time, and executes the
actions it returns, in order. It never touches a socket or a clock.

RDY on the wire is a window, not a credit: nsqd delivers while a connection's in-flight
count is below the last RDY value it received. So the controller's ``rdy`` for a connection
*is* the last value sent, and it only asks for a RDY command when that value must change.

Rules, in the words of the contract:

* total RDY over all connections never exceeds ``max_in_flight``; no connection exceeds the
  ``max_rdy_count`` its nsqd announced in IDENTIFY;
* per-connection target ``int(min(max(1, max_in_flight / n), max_in_flight))`` (go-nsq);
* a new connection starts at RDY 1 so that the first connections are not favoured while
  more are still being discovered; it is raised to the target once it has received a
  message (the 25 % rule below) or at the next re-balance;
* after each message: update when the window is 0 or less than 25 % of the last value sent
  remains (messages received since that RDY counted against it);
* **balanced** (``max_in_flight >= n``, not backing off): every connection holds its target
  (at least 1); **rotating** (``max_in_flight < n``): exactly ``max_in_flight`` connections
  hold RDY 1, and :meth:`RdyController.redistribute` takes it back from idle ones and gives
  it to random others, so an nsqd with messages is eventually found;
* **backoff**: during a window every connection has RDY 0; when it ends exactly one
  connection gets RDY 1 ("test the waters"): the one whose requeue last raised the backoff,
  which holds at least that message again (go-nsq picks at random, and an idle pick held the
  probe for ``low_rdy_idle_timeout``: an ordered partition retrying in place stalled that
  long), else a random one; it rotates like above while it stays idle;
  when the level is back to 0 every connection gets its target again.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Hashable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from smartnsq.config import ConsumerConfig
from smartnsq.errors import ConfigError
from smartnsq.flow.backoff import BackoffState, Pause, Resume, Transition

__all__ = [
    "Action",
    "RdyController",
    "ScheduleTimer",
    "SendRdy",
    "is_conn_starved",
    "per_connection_target",
    "rdy_update_due",
]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class SendRdy(Generic[K]):
    """Write ``RDY count`` on connection ``conn``."""

    conn: K
    count: int


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    """Call :meth:`RdyController.timer_fired` with ``token`` after ``delay`` seconds.

    This is the end of a backoff window. A firing whose token is no longer current is
    ignored, so the consumer never needs to cancel one (it may, on shutdown).
    """

    delay: float
    token: int


Action: TypeAlias = SendRdy[K] | ScheduleTimer


def per_connection_target(max_in_flight: int, n_conns: int) -> int:
    """go-nsq's share of ``max_in_flight`` per connection: float division, truncated,
    at least 1 unless ``max_in_flight`` is 0."""
    if n_conns < 1:
        raise ValueError(f"n_conns must be >= 1, got {n_conns}")
    share = max_in_flight / n_conns
    return int(min(max(1.0, share), float(max_in_flight)))


def rdy_update_due(last_rdy: int, received: int) -> bool:
    """Whether a connection's RDY should be re-evaluated after a message.

    ``last_rdy`` is the value last sent and ``received`` the messages received since; the
    update is due when that value is 0 or less than 25 % of it remains.
    """
    remaining = last_rdy - received
    return last_rdy == 0 or 4 * remaining < last_rdy


def _messages_until_due(last_rdy: int, received: int) -> int:
    """How many more messages make :func:`rdy_update_due` true (at least 1): the update is
    due once ``received > 3/4 × last_rdy``, i.e. from ``3 × last_rdy // 4 + 1`` on."""
    return max(1, 3 * last_rdy // 4 + 1 - received)


def is_conn_starved(in_flight: int, last_rdy: int) -> bool:
    """The contract's starvation test: messages in flight and at least 85 % of the last
    RDY used (exact: ``in_flight >= 0.85 × last_rdy`` without float rounding)."""
    return in_flight > 0 and 20 * in_flight >= 17 * last_rdy


@dataclass(slots=True)
class _Conn:
    max_rdy: int
    #: the RDY value last sent (0 before the first)
    rdy: int = 0
    #: when the last non-zero RDY was sent
    rdy_at: float | None = None
    #: messages received since the last RDY was sent
    received: int = 0
    in_flight: int = 0
    last_message_at: float | None = None

    def active_since(self) -> float:
        """The later of the last message and the last RDY grant: how long a connection
        holding RDY has gone without delivering."""
        times = [t for t in (self.last_message_at, self.rdy_at) if t is not None]
        return max(times) if times else float("-inf")


class RdyController(Generic[K]):
    """RDY and backoff state of one consumer over connections identified by ``K``.

    A key must identify one connection instance (for example the connection object), not
    an address: after a reconnect to the same nsqd, late FIN/REQ events for messages of the
    old connection must not be counted against the new one.

    Every event method returns the actions to execute, in order: RDY decreases come before
    increases so the total on the wire never exceeds ``max_in_flight`` in between, and a
    connection appears at most once per batch.

    :meth:`message_received` and :meth:`message_finished` take a ``count`` so that a
    consumer can report a whole socket read or loop turn at once: per message the event
    alone would cost a sizeable part of the per-message budget at high rates. A batched
    call is exactly ``count`` single calls at the same time, actions and state alike.
    """

    def __init__(self, config: ConsumerConfig, *, rng: random.Random | None = None) -> None:
        self._config = config
        self._rng = rng if rng is not None else random.Random()
        self._backoff = BackoffState.from_config(config, self._rng)
        self._max_in_flight = config.max_in_flight
        self._conns: dict[K, _Conn] = {}
        self._total = 0
        self._timer_token: int | None = None
        self._tokens = 0
        #: the connection whose requeue last counted as a backoff failure: the probe's first
        #: choice when a window ends
        self._failed_on: K | None = None
        # per event: RDY of each changed connection before the event, and timers to start
        self._before: dict[K, int] = {}
        self._timers: list[ScheduleTimer] = []

    # -- read-only views -------------------------------------------------------------------

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def total_rdy(self) -> int:
        return self._total

    @property
    def connections(self) -> tuple[K, ...]:
        return tuple(self._conns)

    def __len__(self) -> int:
        return len(self._conns)

    def __contains__(self, key: object) -> bool:
        return key in self._conns

    def rdy(self, key: K) -> int:
        """The RDY value last sent on ``key``."""
        return self._conns[key].rdy

    def in_flight(self, key: K) -> int:
        return self._conns[key].in_flight

    @property
    def backoff_level(self) -> int:
        return self._backoff.level

    @property
    def in_backoff(self) -> bool:
        """Backing off: level > 0 (a window may or may not be running)."""
        return self._backoff.in_backoff

    @property
    def backoff_window_active(self) -> bool:
        """A backoff pause is running: every connection has RDY 0."""
        return self._backoff.window_active

    def is_starved(self) -> bool:
        """True when any connection has in-flight messages and ≥ 85 % of its RDY in use:
        a batching handler should process what it holds now."""
        return any(is_conn_starved(c.in_flight, c.rdy) for c in self._conns.values())

    # -- events ----------------------------------------------------------------------------

    def add_connection(self, key: K, max_rdy_count: int, now: float) -> list[Action[K]]:
        """A connection finished SUB; ``max_rdy_count`` is from its IDENTIFY response
        (2500 when the server did not negotiate)."""
        if key in self._conns:
            raise ConfigError(f"connection {key!r} is already registered")
        if max_rdy_count < 1:
            raise ConfigError(f"max_rdy_count must be >= 1, got {max_rdy_count}")
        self._conns[key] = _Conn(max_rdy_count)
        self._rebalance(newcomer=key)
        return self._commit(now)

    def remove_connection(self, key: K, now: float) -> list[Action[K]]:
        """The connection is closing or lost: its RDY returns to the budget. Unknown keys
        are ignored, so closing twice is harmless."""
        conn = self._conns.pop(key, None)
        if conn is None:
            return []
        if self._failed_on == key:
            self._failed_on = None
        self._total -= conn.rdy
        self._before.pop(key, None)
        self._rebalance()
        return self._commit(now)

    def message_received(self, key: K, now: float, count: int = 1) -> list[Action[K]]:
        """``count`` messages arrived on ``key``; may raise its RDY (the 25 % rule).

        Exactly the same actions and state as ``count`` calls with one message each at the
        same ``now`` (a consumer reports the messages of one socket read at once). Of
        those calls at most one can change RDY: the first one after which the update is
        due. Its new value depends only on the target, ``max_rdy`` and the other
        connections' RDY, none of which a message changes, so the checks after it find
        nothing to do. That call's messages are counted before the check and the rest
        against the new RDY, as one by one.
        """
        if count < 0:
            raise ConfigError(f"count must be >= 0, got {count}")
        conn = self._conns.get(key)
        if conn is None or count == 0:
            return []
        conn.last_message_at = now
        # Nothing but the backoff machinery moves RDY while backing off.
        if self._backoff.in_backoff or self._backoff.window_active:
            conn.in_flight += count
            conn.received += count
            return []
        head = _messages_until_due(conn.rdy, conn.received)
        if head > count:
            conn.in_flight += count
            conn.received += count
            return []
        conn.in_flight += head
        conn.received += head
        want = min(per_connection_target(self._max_in_flight, len(self._conns)), conn.max_rdy)
        # The budget clamp in _set keeps a straggler on a connection whose RDY was
        # taken back (rotating mode) from stealing it back.
        self._set(key, conn, want)
        actions = self._commit(now)
        # After _commit: these count against the RDY it may just have sent.
        conn.in_flight += count - head
        conn.received += count - head
        return actions

    def message_finished(self, key: K, now: float, count: int = 1) -> list[Action[K]]:
        """``count`` messages of ``key`` were FINished (handled, or given up): backoff
        successes.

        Exactly the same actions and state as ``count`` calls with one message each at the
        same ``now``. For backoff that is one success, whatever ``count``: the first
        success either changes nothing (backoff disabled, not backing off, or a window
        running -- then neither do the others), or brings the level to 0 (further successes
        have no level to lower), or opens a new window (which ignores the rest). So a batch
        of finishes never lowers the level by more than one.
        """
        if count < 0:
            raise ConfigError(f"count must be >= 0, got {count}")
        if count == 0:
            return []
        # RDY decisions do not read in_flight, so lowering it by the whole batch before the
        # one counted success gives the same result as interleaving.
        self._message_done(key, count)
        self._apply(self._backoff.success())
        return self._commit(now)

    def message_requeued(self, key: K, now: float, *, backoff: bool = True) -> list[Action[K]]:
        """The message was REQueued: a backoff failure, or neutral with ``backoff=False``."""
        self._message_done(key)
        if backoff:
            self._failed_on = key
            self._apply(self._backoff.failure())
        else:
            self._apply(self._backoff.neutral())
        return self._commit(now)

    def timer_fired(self, token: int, now: float) -> list[Action[K]]:
        """A :class:`ScheduleTimer` elapsed: the backoff window ends and one connection
        gets RDY 1. Stale tokens are ignored."""
        if token != self._timer_token:
            return []
        self._timer_token = None
        self._backoff.window_ended()
        # With no connection, or max_in_flight 0, nobody can test the waters now; the
        # probe is then handed out by the add_connection / set_max_in_flight that makes it
        # possible, instead of polling with a retry timer like go-nsq.
        self._rebalance()
        return self._commit(now)

    def set_max_in_flight(self, max_in_flight: int, now: float) -> list[Action[K]]:
        """Change ``max_in_flight`` at run time; 0 pauses every connection."""
        if max_in_flight < 0:
            raise ConfigError(f"max_in_flight must be >= 0, got {max_in_flight}")
        if max_in_flight == self._max_in_flight:
            return []
        self._max_in_flight = max_in_flight
        self._rebalance()
        return self._commit(now)

    def redistribute(self, now: float) -> list[Action[K]]:
        """Periodic (every ``rdy_redistribute_interval``) rotation of scarce RDY.

        Only when RDY is scarce -- ``max_in_flight < n``, or backing off with more than one
        connection -- and not during a backoff window: connections holding RDY that have
        delivered nothing for ``low_rdy_idle_timeout`` since their last message or RDY
        grant, or whose RDY was set more than ``low_rdy_timeout`` ago, give it back, and
        random connections without RDY receive RDY 1 while budget remains (those that just
        gave it back only if no other is left). In every mode it then re-balances as any
        event does, which also raises a new connection still at its tentative RDY 1.
        """
        if self._backoff.window_active or not self._conns:
            return []
        n = len(self._conns)
        scarce = n > 1 if self._backoff.in_backoff else n > self._max_in_flight
        given_up: set[K] = set()
        if scarce:
            for key, conn in self._conns.items():
                if conn.rdy > 0 and self._is_idle(conn, now):
                    self._set(key, conn, 0)
                    given_up.add(key)
        self._rebalance(given_up=given_up)
        return self._commit(now)

    # -- internals -------------------------------------------------------------------------

    def _message_done(self, key: K, count: int = 1) -> None:
        conn = self._conns.get(key)
        # Clamped: a late response must not drive the count negative.
        if conn is not None:
            conn.in_flight = max(0, conn.in_flight - count)

    def _apply(self, transition: Transition) -> None:
        if isinstance(transition, Pause):
            self._tokens += 1
            self._timer_token = self._tokens
            self._timers.append(ScheduleTimer(transition.duration, self._tokens))
            self._rebalance()
        elif isinstance(transition, Resume):
            self._rebalance()

    def _is_idle(self, conn: _Conn, now: float) -> bool:
        cfg = self._config
        if now - conn.active_since() > cfg.low_rdy_idle_timeout:
            return True
        return conn.rdy_at is not None and now - conn.rdy_at > cfg.low_rdy_timeout

    def _set(self, key: K, conn: _Conn, count: int) -> None:
        """The one place RDY changes: clamps to the connection's max and the global budget."""
        budget = self._max_in_flight - (self._total - conn.rdy)
        count = max(0, min(count, conn.max_rdy, budget))
        if count != conn.rdy:
            self._before.setdefault(key, conn.rdy)
            self._total += count - conn.rdy
            conn.rdy = count

    def _rebalance(
        self, newcomer: K | None = None, given_up: Collection[K] = ()
    ) -> None:
        """Bring every connection to what the current mode says it should hold.

        ``given_up`` connections just returned their RDY for being idle; they are the last
        choice when RDY 1 is handed out again.
        """
        if self._backoff.window_active:
            for key, conn in self._conns.items():
                self._set(key, conn, 0)
            return
        if self._backoff.in_backoff:
            cap = min(1, self._max_in_flight)
            self._shed(cap)
            failed = self._failed_on
            if failed is not None and failed not in given_up and self._total < cap:
                probe = self._conns.get(failed)
                if probe is not None and probe.rdy == 0:
                    self._set(failed, probe, 1)
            self._fill(cap, given_up)
            return
        n = len(self._conns)
        if n == 0:
            return
        target = per_connection_target(self._max_in_flight, n)
        # Lower first so that the raises below find their budget.
        for key, conn in self._conns.items():
            if conn.rdy > target:
                self._set(key, conn, target)
        if self._max_in_flight >= n:
            for key, conn in self._conns.items():
                if key != newcomer and conn.rdy < min(target, conn.max_rdy):
                    self._set(key, conn, target)
            if newcomer is not None:
                self._set(newcomer, self._conns[newcomer], 1)
        else:
            self._shed(self._max_in_flight)
            self._fill(self._max_in_flight, given_up)

    def _shed(self, cap: int) -> None:
        """Take RDY from the longest-idle connections until the total is within ``cap``."""
        if self._total <= cap:
            return
        holders = sorted(
            ((k, c) for k, c in self._conns.items() if c.rdy > 0),
            key=lambda kc: kc[1].active_since(),
        )
        for key, conn in holders:
            if self._total <= cap:
                break
            self._set(key, conn, 0)

    def _fill(self, cap: int, given_up: Collection[K] = ()) -> None:
        """Give RDY 1 to random connections without RDY while the total is below ``cap``,
        trying those in ``given_up`` only when no other is left."""
        without = [k for k, c in self._conns.items() if c.rdy == 0]
        for pool in ([k for k in without if k not in given_up],
                     [k for k in without if k in given_up]):
            while self._total < cap and pool:
                key = pool.pop(self._rng.randrange(len(pool)))
                self._set(key, self._conns[key], 1)

    def _commit(self, now: float) -> list[Action[K]]:
        lowered: list[Action[K]] = []
        raised: list[Action[K]] = []
        for key, before in self._before.items():
            conn = self._conns.get(key)
            if conn is None or conn.rdy == before:
                continue
            conn.received = 0
            if conn.rdy > 0:
                conn.rdy_at = now
            (lowered if conn.rdy < before else raised).append(SendRdy(key, conn.rdy))
        self._before.clear()
        actions: list[Action[K]] = [*lowered, *raised, *self._timers]
        self._timers.clear()
        return actions
