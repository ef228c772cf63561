"""Chaos soak: nothing acknowledged is lost and no key is reordered while faults pile up.

For ``--minutes`` (default 10) it runs, at once:

* producers at a steady ``--rate`` (default 5,000 msg/s): half ``publish_ordered`` over
  ``--keys`` shard keys to an ordered 4-partition topic, half to a plain 3-partition topic
  (single publishes round-robin over the partitions, and MPUBs of ``--batch`` messages). Every
  body is ``key:seq``; every acknowledgement and every failure (with its reason) is recorded;
* an :class:`~smartnsq.ordered.OrderedConsumer` on the ordered topic and a plain
  :class:`~smartnsq.Consumer` on the plain one, checking each message against the
  acknowledgements: acknowledged but never consumed, duplicates, and per-key reorderings (a
  key's sequence number arriving for the first time after a higher one);
* a fault schedule drawn from ``--seed`` and printed before the run: partition leader moves,
  an nsqd killed hard and started again, the lookupd unreachable for a while, a slow nsqd,
  dropped connections, a consumer stopped and started, a handler failing some messages.

When the load phase ends every fault is healed and the consumers get ``--drain`` seconds to
catch up. A status line is printed every ``--status-every`` seconds and a report at the end
(published, acknowledged, failed publishes and why, consumed, acknowledged but never consumed,
duplicates, reorderings, publish latency p50/p99/max, consumer lag, client RSS start / peak /
end, open fds and tasks). The exit code is 1 when a must-be-zero figure is not zero (lost
acknowledged messages, reorderings, a consumer that stopped by itself) or when the client's RSS
grew by more than ``--mem-bound-mb`` after the warm-up.

The embedded youzan cluster runs in a child process (its CPU and memory are not the client's).
``--real`` targets a real youzan cluster started with ``../shared/realnsq/start-youzan.sh 3``
under the same $REALNSQ_YOUZAN_BASE and $REALNSQ_STATE (see chaos_targets.py).

What the real cluster (youzan 0.3.7-HA.1.13.0, 3 nodes, loopback) did under these faults,
which shapes the real schedule and explains its failed publishes:

* an nsqd started again ~2 s after a SIGKILL logged ``checkAndFixLocalLogQueueEnd ... reset
  local queue backend failed: invalid offset`` in a loop and the partitions it had led stayed
  unwritable (the ordered topic had no writable partition for minutes): real kills keep the
  node down 40–60 s, past lookupd's fail-over;
* after a leader's SIGKILL, lookupd lists its partitions (and those whose ISR lost the node) as
  not writable for ~40 s before a replica takes over; publishes to them fail once the publish
  timeout (10 s) passes — expected, and counted by reason;
* on a replica-1 partition a SIGKILL loses the acknowledged messages nsqd had not flushed
  (15–30 at 250 msg/s), which is the server's durability, not the client's: the plain topic
  there has one partition with two replicas (``--plain``).

Usage: python benchmarks/chaos.py [--minutes 10] [--rate 5000] [--seed 1] [--real]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import math
import os
import random
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_targets import EmbeddedTarget, RealTarget, Target, TargetError

from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.errors import PublishError
from smartnsq.message import Message
from smartnsq.ordered import OrderedConsumer
from smartnsq.producer import Producer

FAULT_KINDS = ("leader_move", "node_kill", "lookupd_down", "slow_node", "drop_conns",
               "consumer_restart", "handler_failures")
ORDERED_PARTITIONS = 4
ORDERED_REPLICAS = 2
# A plain youzan topic holds at most one partition per node (partitions x replicas <= nodes).
# Embedded: one partition per node and no replica, so a killed node's partition is unwritable
# until it is back and the producer must route around it (the double's store keeps every
# acknowledged message). Real: a SIGKILLed nsqd loses the acknowledged messages it had not
# flushed yet (seen: ~15-30 at 250 msg/s on a replica-1 partition), which says nothing about
# the client, so the plain topic there is one partition with two replicas by default.
PLAIN_TOPOLOGY = {False: (3, 1), True: (1, 2)}
NODES = 3
CHANNEL = "chaos"

Say = Callable[[str], None]


class SoakError(ValueError):
    """A soak setting is out of range (the text names it)."""


# ---------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class SoakConfig:
    seconds: float = 600.0
    rate: float = 5000.0
    seed: int = 1
    keys: int = 1000
    real: bool = False
    #: mean seconds between two faults
    fault_every: float = 20.0
    #: fault kinds to draw from (all by default)
    faults: tuple[str, ...] = FAULT_KINDS
    #: messages per MPUB on the plain topic
    batch: int = 10
    #: seconds the consumers get after the load phase to consume every acknowledged message
    drain: float = 120.0
    #: plain topic (partitions, replicas); None: PLAIN_TOPOLOGY for the target
    plain: tuple[int, int] | None = None
    #: --real: leave the soak's topics on the cluster for a post-mortem
    keep_topics: bool = False
    #: bound on client RSS growth after the warm-up (MiB)
    mem_bound_mb: float = 64.0
    #: seconds of load before the memory baseline is taken (default: 20 % of the run, <= 60)
    warmup: float | None = None
    status_every: float = 5.0
    #: publishes in flight before the publisher stops issuing more (it then falls behind)
    max_outstanding: int = 5000

    def __post_init__(self) -> None:
        def positive(name: str, value: float) -> None:
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value <= 0:
                raise SoakError(f"{name} must be a finite number > 0, not {value!r}")

        for name in ("seconds", "rate", "fault_every", "status_every", "mem_bound_mb"):
            positive(name, getattr(self, name))
        for name in ("keys", "batch", "max_outstanding"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SoakError(f"{name} must be an integer >= 1, not {v!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SoakError(f"seed must be an integer, not {self.seed!r}")
        if isinstance(self.drain, bool) or not isinstance(self.drain, int | float) \
                or not math.isfinite(self.drain) or self.drain < 0:
            raise SoakError(f"drain must be a finite number >= 0, not {self.drain!r}")
        if self.warmup is not None:
            positive("warmup", self.warmup)
            if self.warmup >= self.seconds:
                raise SoakError(f"warmup ({self.warmup:g} s) must be shorter than the run "
                                f"({self.seconds:g} s)")
        if self.plain is not None:
            parts, reps = self.plain
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in self.plain) \
                    or parts * reps > NODES:
                raise SoakError(f"plain must be (partitions, replicas), integers >= 1 with "
                                f"partitions x replicas <= {NODES} nodes, not {self.plain!r}")
        unknown = [k for k in self.faults if k not in FAULT_KINDS]
        if unknown:
            raise SoakError(f"unknown fault kind(s) {unknown}; known: {', '.join(FAULT_KINDS)}")

    @property
    def plain_topology(self) -> tuple[int, int]:
        return self.plain if self.plain is not None else PLAIN_TOPOLOGY[self.real]

    @property
    def warmup_seconds(self) -> float:
        return self.warmup if self.warmup is not None else min(60.0, 0.2 * self.seconds)


# ---------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    #: seconds the fault lasts (0: instantaneous)
    duration: float
    node: int = 0
    topic: str = ""
    partition: int = 0
    mode: str = ""
    #: slow_node: response delay; handler_failures: share of first attempts that fail
    amount: float = 0.0

    def describe(self) -> str:
        what: str = {
            "leader_move": f"move the leader of {self.topic} partition {self.partition}",
            "node_kill": f"kill nsqd {self.node} hard, start it again after "
                         f"{self.duration:.1f} s",
            "lookupd_down": f"lookupd unreachable ({self.mode}) for {self.duration:.1f} s",
            "slow_node": f"nsqd {self.node} slow ({self.amount * 1000:.0f} ms per response) "
                         f"for {self.duration:.1f} s",
            "drop_conns": f"drop every client connection of nsqd {self.node}",
            "consumer_restart": f"stop the {self.topic} consumer, start it again after "
                                f"{self.duration:.1f} s",
            "handler_failures": f"the {self.topic} handler fails {self.amount:.1%} of first "
                                f"attempts for {self.duration:.1f} s",
        }[self.kind]
        return f"t+{self.at:6.1f}s  {self.kind:<16} {what}"


def make_schedule(cfg: SoakConfig) -> list[Fault]:
    """The run's faults, a pure function of the settings (the same seed gives the same list).

    Faults start after a short quiet period, come every ``fault_every`` seconds on average
    (uniform 0.5x–1.5x), cycle through every enabled kind in a seeded order, and end before
    the load phase does.
    """
    rng = random.Random(cfg.seed)
    kinds = list(cfg.faults)
    if not kinds:
        return []
    # durations scale down for short runs so that faults still fit between each other
    scale = max(0.1, min(1.0, cfg.seconds / 300.0))
    quiet = min(10.0, 0.1 * cfg.seconds)
    out: list[Fault] = []
    t = quiet
    cycle: list[str] = []
    while True:
        t += rng.uniform(0.5, 1.5) * cfg.fault_every
        if t >= cfg.seconds - quiet / 2:
            break
        if not cycle:
            cycle = kinds[:]
            rng.shuffle(cycle)
        kind = cycle.pop()
        room = max(cfg.seconds - quiet / 2 - t, 0.5)

        def dur(lo: float, hi: float, room: float = room) -> float:
            return round(min(max(rng.uniform(lo, hi) * scale, 0.5), room), 1)

        topic = rng.choice(("ordered", "plain"))
        node = rng.randrange(NODES)
        at = round(t, 1)
        if kind == "leader_move":
            # on the ordered topic, whose partitions have a second replica to move to
            out.append(Fault(at, kind, 0.0, topic="ordered",
                             partition=rng.randrange(ORDERED_PARTITIONS)))
        elif kind == "node_kill" and cfg.real:
            # a real nsqd back within seconds of a SIGKILL was seen never to recover its
            # partitions (see the module docstring): there, stay down past lookupd's fail-over
            down = round(rng.uniform(40, 60), 1)
            if down <= room:
                out.append(Fault(at, kind, down, node=node))
            else:
                out.append(Fault(at, "drop_conns", 0.0, node=node))
        elif kind == "node_kill":
            out.append(Fault(at, kind, dur(5, 20), node=node))
        elif kind == "lookupd_down":
            out.append(Fault(at, kind, dur(10, 30), mode=rng.choice(("refuse", "hang"))))
        elif kind == "slow_node":
            # real: the node is stalled (SIGSTOP), briefly, so that it keeps its cluster session
            out.append(Fault(at, kind, dur(1, 4) if cfg.real else dur(5, 20), node=node,
                             amount=round(rng.uniform(0.05, 0.3), 3)))
        elif kind == "drop_conns":
            out.append(Fault(at, kind, 0.0, node=node))
        elif kind == "consumer_restart":
            out.append(Fault(at, kind, dur(2, 10), topic=topic))
        else:
            out.append(Fault(at, kind, dur(10, 30), topic=topic,
                             amount=round(rng.uniform(0.005, 0.02), 4)))
    return out


# ---------------------------------------------------------------------------- bookkeeping


class Histogram:
    """Latencies in log-spaced buckets (2 % wide, 1 µs to ~1000 s): constant memory."""

    _LOG = math.log(1.02)
    _MIN = 1e-6

    def __init__(self) -> None:
        self.buckets = [0] * 1100
        self.count = 0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        i = int(math.log(max(seconds, self._MIN) / self._MIN) / self._LOG)
        self.buckets[min(i, len(self.buckets) - 1)] += 1
        self.count += 1
        if seconds > self.max:
            self.max = seconds

    def quantile(self, q: float) -> float:
        if not self.count:
            return 0.0
        want = q * self.count
        seen = 0
        for i, n in enumerate(self.buckets):
            seen += n
            if seen >= want:
                return min(self._MIN * 1.02 ** (i + 1), self.max)
        return self.max


class Book:
    """One key's (or stream's) record: what was acknowledged and what was consumed.

    Bounded while the consumer keeps up: acknowledged-but-not-yet-consumed seqs (with their
    ack time, for the lag), seqs consumed before their ack arrived, and a watermark below
    which every seq is settled (consumed, or its publish failed).
    """

    __slots__ = ("early", "failed", "hi", "next_seq", "pending", "settled", "settled_to")

    def __init__(self) -> None:
        self.next_seq = 0
        self.pending: dict[int, float] = {}
        self.early: set[int] = set()
        self.failed: set[int] = set()
        self.settled: set[int] = set()
        self.settled_to = 0
        #: highest seq consumed so far (ordered topic: the reorder check)
        self.hi = -1

    def is_settled(self, seq: int) -> bool:
        return seq < self.settled_to or seq in self.settled

    def settle(self, seq: int) -> None:
        self.settled.add(seq)
        while self.settled_to in self.settled:
            self.settled.discard(self.settled_to)
            self.settled_to += 1


@dataclass
class Ledger:
    """Every key's book for one topic, and the topic's counters."""

    name: str
    ordered: bool
    books: list[Book]
    acked: int = 0
    failed: int = 0
    consumed: int = 0
    duplicates: int = 0
    #: first deliveries of a seq after a higher seq of the same key (ordered: must be 0)
    reorders: int = 0
    #: repeated deliveries of a seq below the key's highest (a replay after a reconnect)
    rewinds: int = 0
    #: publishes that failed but whose message was stored and consumed anyway
    failed_but_stored: int = 0
    #: ... of which arrived after a higher seq of their key (ordered: an unacknowledged
    #: message stored behind its successors, e.g. a timed-out PUB answered late)
    failed_late: int = 0
    unexpected: int = 0
    reorder_examples: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, ordered: bool, keys: int) -> Ledger:
        return cls(name, ordered, [Book() for _ in range(keys)])

    def ack(self, key: int, seq: int, now: float) -> None:
        self.acked += 1
        b = self.books[key]
        if seq in b.early:
            b.early.discard(seq)
        else:
            b.pending[seq] = now

    def fail(self, key: int, seq: int) -> None:
        self.failed += 1
        b = self.books[key]
        if seq in b.early:
            b.early.discard(seq)
            self.failed_but_stored += 1
        else:
            b.failed.add(seq)
            b.settle(seq)

    def consume(self, body: bytes) -> None:
        try:
            k, s = body.split(b":")
            key, seq = int(k), int(s)
            b = self.books[key]
        except (ValueError, IndexError):
            self.unexpected += 1
            return
        if seq >= b.next_seq or seq < 0:
            self.unexpected += 1
            return
        if seq in b.failed:
            # the publish reported failure but the message was stored (e.g. a timeout)
            b.failed.discard(seq)
            self.failed_but_stored += 1
            if seq < b.hi:
                self.failed_late += 1
            self.consumed += 1
            b.hi = max(b.hi, seq)
            return
        if b.is_settled(seq):
            self.duplicates += 1
            if seq < b.hi:
                self.rewinds += 1
            return
        self.consumed += 1
        b.settle(seq)
        if b.pending.pop(seq, None) is None:
            b.early.add(seq)  # consumed before its acknowledgement came back
        if seq < b.hi:
            self.reorders += 1
            if len(self.reorder_examples) < 5:
                self.reorder_examples.append(f"key {key}: seq {seq} after {b.hi}")
        else:
            b.hi = seq

    def lag(self, now: float) -> tuple[int, float]:
        """(acknowledged messages not consumed yet, age of the oldest in seconds)."""
        n = 0
        oldest = now
        for b in self.books:
            if b.pending:
                n += len(b.pending)
                oldest = min(oldest, min(b.pending.values()))
        return n, now - oldest

    def missing(self) -> int:
        return sum(len(b.pending) for b in self.books)

    def missing_examples(self, t0: float, n: int = 5) -> list[str]:
        """A few acknowledged-but-unconsumed messages with their ack time in the run."""
        found = sorted((at, k, s) for k, b in enumerate(self.books) for s, at in b.pending.items())
        return [f"{k}:{s} acked at t+{at - t0:.1f}s" for at, k, s in found[:n]]


def short_reason(exc: BaseException) -> str:
    """An error grouped by kind: its type and text with numbers and addresses folded."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    cause = exc.__cause__
    if cause is not None and str(cause):
        text += f" <- {type(cause).__name__}: {str(cause).splitlines()[0]}"
    folded = "".join("#" if c.isdigit() else c for c in text)
    folded = "#".join(part for part in folded.split("#") if part) if "#" in folded else folded
    return f"{type(exc).__name__}: {folded[:140]}"


def rss_kib() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def open_fds() -> int:
    """Open file descriptors, /dev/null aside (uvloop keeps one open after the first child
    process, which is the harness's, not the client's)."""
    n = 0
    try:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/self/fd/{fd}") != "/dev/null":
                    n += 1
    except OSError:
        return -1
    return n


# ---------------------------------------------------------------------------- the run


@dataclass
class SoakResult:
    cfg: SoakConfig
    target: str
    schedule: list[Fault]
    #: (seconds into the run, what happened) for every fault applied, healed or refused
    events: list[tuple[float, str]]
    ledgers: list[Ledger]
    scheduled: int
    issued: int
    behind: int
    fail_reasons: Counter[str]
    latency: Histogram
    lag_peak: int
    lag_peak_age: float
    rss_start: int
    rss_warm: int
    rss_peak: int
    rss_end: int
    fds_start: int
    fds_end: int
    tasks_start: int
    tasks_end: int
    consumer_errors: list[str]
    load_seconds: float
    drain_seconds: float
    drained: bool
    server_note: str
    faults_refused: int
    failures: list[str] = field(default_factory=list)
    missing_examples: list[str] = field(default_factory=list)
    #: failed publishes per second of the run
    fail_times: Counter[int] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def missing(self) -> int:
        return sum(lg.missing() for lg in self.ledgers)

    @property
    def reorders(self) -> int:
        return sum(lg.reorders for lg in self.ledgers if lg.ordered)

    @property
    def mem_growth_mib(self) -> float:
        return (self.rss_peak_after_warm - self.rss_warm) / 1024

    rss_peak_after_warm: int = 0


class ConsumerSlot:
    """One of the two consumers, which a fault may stop and start again."""

    def __init__(self, make: Callable[[], Consumer], name: str) -> None:
        self.make = make
        self.name = name
        self.consumer: Consumer | None = None
        self.errors: list[str] = []

    async def start(self) -> None:
        c = self.make()
        await c.start()
        self.consumer = c

    async def stop(self) -> None:
        c, self.consumer = self.consumer, None
        if c is not None:
            await c.stop()
            if c.error is not None:
                self.errors.append(f"{self.name} consumer: {c.error!r}")

    def check(self) -> None:
        """A consumer that closed by itself is a defect: record it and start a new one."""
        c = self.consumer
        if c is not None and c.is_closed:
            self.errors.append(f"{self.name} consumer closed by itself: {c.error!r}")
            self.consumer = None


class Soak:
    def __init__(self, cfg: SoakConfig, say: Say) -> None:
        self.cfg = cfg
        self.say = say
        self.target: Target = (RealTarget(NODES, cfg.keep_topics) if cfg.real
                               else EmbeddedTarget(NODES))
        suffix = f"{os.getpid()}_{cfg.seed}"
        self.topics = {"ordered": f"chaos_ord_{suffix}", "plain": f"chaos_plain_{suffix}"}
        self.ordered = Ledger.of("ordered", True, cfg.keys)
        self.plain = Ledger.of("plain", False, max(16, cfg.keys // 10))
        self.schedule = make_schedule(cfg)
        self.events: list[tuple[float, str]] = []
        self.fail_reasons: Counter[str] = Counter()
        #: failed publishes per second of the run (to attribute them to fault windows)
        self.fail_times: Counter[int] = Counter()
        self.latency = Histogram()
        self.window = Histogram()
        self.failing: dict[str, float] = {}
        self.outstanding = 0
        self.scheduled = self.issued = self.behind = 0
        self.t0 = 0.0
        self.stop_load = asyncio.Event()
        self.down_nodes: set[int] = set()
        self.faults_refused = 0
        self.lag_peak = 0
        self.lag_peak_age = 0.0
        self.rss_samples: list[tuple[float, int]] = []
        self.slots: dict[str, ConsumerSlot] = {}
        self.tasks: set[asyncio.Task[Any]] = set()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def event(self, text: str) -> None:
        self.events.append((self.now(), text))
        self.say(f"  [t+{self.now():6.1f}s] {text}")

    # -- consumers ----------------------------------------------------------------------------

    def _handler(self, which: str) -> Callable[[Message], Any]:
        ledger = self.ordered if which == "ordered" else self.plain
        seed = self.cfg.seed

        async def handle(msg: Message) -> None:
            share = self.failing.get(which)
            body = msg.body
            if share and msg.attempts == 1 \
                    and zlib.crc32(body, seed) % 10_000 < share * 10_000:
                raise RuntimeError("chaos: handler failure injected")
            ledger.consume(body)

        return handle

    def _consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig(
            max_in_flight=200,
            # a lost subscription re-polls the lookupd at once; the poll is a backstop
            lookupd_poll_interval=5.0,
            reconnect_min=0.1,
            reconnect_max=2.0,
            # an injected handler failure comes back soon, and pauses the consumer briefly
            default_requeue_delay=0.5,
            max_requeue_delay=2.0,
            backoff_multiplier=0.05,
            max_backoff_duration=1.0,
            ordered_retry_pause=0.05,
            drain_timeout=5.0,
            connection=ConnectionConfig(dial_timeout=1.0, close_timeout=2.0),
        )

    def _make_consumers(self) -> None:
        lookupds = self.target.lookupd_http_addresses
        cfg = self._consumer_config()
        self.slots["ordered"] = ConsumerSlot(
            lambda: OrderedConsumer(self.topics["ordered"], CHANNEL, self._handler("ordered"),
                                    lookupd=lookupds, config=cfg), "ordered")
        self.slots["plain"] = ConsumerSlot(
            lambda: Consumer(self.topics["plain"], CHANNEL, self._handler("plain"),
                             lookupd=lookupds, config=cfg), "plain")

    # -- publishing ---------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _pub_ordered(self, producer: Producer, key: int, seq: int) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            await producer.publish_ordered(self.topics["ordered"], f"key-{key}",
                                           f"{key}:{seq}".encode())
        except Exception as exc:
            self.ordered.fail(key, seq)
            self.fail_reasons[f"ordered: {short_reason(exc)}"] += 1
            self.fail_times[int(self.now())] += 1
        else:
            end = loop.time()
            self.latency.add(end - start)
            self.window.add(end - start)
            self.ordered.ack(key, seq, time.monotonic())
        finally:
            self.outstanding -= 1

    async def _pub_plain(self, producer: Producer, items: list[tuple[int, int]]) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        topic = self.topics["plain"]
        sent = 0
        try:
            if len(items) == 1:
                key, seq = items[0]
                await producer.publish(topic, f"{key}:{seq}".encode())
            else:
                await producer.publish_many(topic, [f"{k}:{s}".encode() for k, s in items])
            sent = len(items)
        except Exception as exc:
            # a split MPUB may have had its leading messages acknowledged
            sent = exc.sent if isinstance(exc, PublishError) else 0
            kind = "plain PUB" if len(items) == 1 else "plain MPUB"
            self.fail_reasons[f"{kind}: {short_reason(exc)}"] += len(items) - sent
            self.fail_times[int(self.now())] += len(items) - sent
            for k, s in items[sent:]:
                self.plain.fail(k, s)
        else:
            end = loop.time()
            self.latency.add(end - start)
            self.window.add(end - start)
        finally:
            now = time.monotonic()
            for k, s in items[:sent]:
                self.plain.ack(k, s, now)
            self.outstanding -= len(items)

    async def publisher(self, producer: Producer) -> None:
        """Issue messages at the configured rate until the load phase ends. Half go to the
        ordered topic, a quarter as single plain publishes, a quarter in plain MPUBs."""
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        tick = 0.01
        start = loop.time()
        done = 0.0  # messages accounted for (issued or skipped)
        okey = 0
        pkey = 0
        split = itertools.cycle(("o", "p", "o", "b"))
        mpub: list[tuple[int, int]] = []
        while not self.stop_load.is_set():
            due = cfg.rate * (loop.time() - start)
            self.scheduled = int(due)
            n = int(due - done)
            # a client more than a second behind skips ahead (and says so) rather than bursting
            if n > cfg.rate:
                self.behind += int(n - cfg.rate)
                done += n - cfg.rate
                n = int(cfg.rate)
            room = cfg.max_outstanding - self.outstanding
            if n > room:
                n = max(room, 0)
            for _ in range(n):
                kind = next(split)
                if kind == "o":
                    book = self.ordered.books[okey]
                    seq = book.next_seq
                    book.next_seq += 1
                    self.outstanding += 1
                    self._spawn(self._pub_ordered(producer, okey, seq))
                    okey = (okey + 1) % len(self.ordered.books)
                else:
                    book = self.plain.books[pkey]
                    item = (pkey, book.next_seq)
                    book.next_seq += 1
                    pkey = (pkey + 1) % len(self.plain.books)
                    self.outstanding += 1
                    if kind == "p":
                        self._spawn(self._pub_plain(producer, [item]))
                    else:
                        mpub.append(item)
                        if len(mpub) >= cfg.batch:
                            self._spawn(self._pub_plain(producer, mpub))
                            mpub = []
            done += n
            self.issued += n
            await asyncio.sleep(tick)
        if mpub:
            self._spawn(self._pub_plain(producer, mpub))

    # -- faults -------------------------------------------------------------------------------

    async def run_faults(self) -> None:
        for f in self.schedule:
            delay = f.at - self.now()
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self.stop_load.wait()
                    return
                except TimeoutError:
                    pass
            self._spawn(self.apply(f))

    async def apply(self, f: Fault) -> None:
        try:
            await self._apply(f)
        except (TargetError, Exception) as exc:
            self.faults_refused += 1
            self.event(f"fault {f.kind} refused or failed: {exc!r}")

    async def _hold(self, seconds: float) -> None:
        """Sleep through a fault, ending early when the load phase ends."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stop_load.wait()

    async def _apply(self, f: Fault) -> None:
        t = self.target
        if f.kind == "leader_move":
            self.event(f"leader move: {await t.move_leader(self.topics[f.topic], f.partition)}")
        elif f.kind == "node_kill":
            if self.down_nodes:
                self.event(f"node_kill of nsqd {f.node} skipped: nsqd {sorted(self.down_nodes)} "
                           "is still down (one node down at a time keeps every partition a "
                           "leader)")
                return
            self.down_nodes.add(f.node)
            try:
                self.event(f"node kill: {await t.kill_node(f.node)}")
                await self._hold(f.duration)
            finally:
                self.event(f"node back: {await t.start_node(f.node)}")
                self.down_nodes.discard(f.node)
        elif f.kind == "lookupd_down":
            self.event(f"lookupd down: {await t.lookupd_down(f.mode)}")
            try:
                await self._hold(f.duration)
            finally:
                await t.lookupd_up()
                self.event("lookupd back")
        elif f.kind == "slow_node":
            if f.node in self.down_nodes:
                self.event(f"slow_node of nsqd {f.node} skipped: it is down")
                return
            self.event(f"slow node: {await t.slow_node(f.node, f.amount)}")
            try:
                await self._hold(f.duration)
            finally:
                await t.unslow_node(f.node)
                self.event(f"nsqd {f.node} at full speed again")
        elif f.kind == "drop_conns":
            if f.node in self.down_nodes:
                self.event(f"drop_conns of nsqd {f.node} skipped: it is down")
                return
            self.event(f"dropped connections: {await t.drop_connections(f.node)}")
        elif f.kind == "consumer_restart":
            slot = self.slots[f.topic]
            if slot.consumer is None:
                self.event(f"consumer_restart of {f.topic} skipped: it is not running")
                return
            await slot.stop()
            self.event(f"{f.topic} consumer stopped")
            try:
                await self._hold(f.duration)
            finally:
                await slot.start()
                self.event(f"{f.topic} consumer started again")
        elif f.kind == "handler_failures":
            self.failing[f.topic] = f.amount
            self.event(f"{f.topic} handler fails {f.amount:.1%} of first attempts")
            try:
                await self._hold(f.duration)
            finally:
                self.failing.pop(f.topic, None)
                self.event(f"{f.topic} handler healthy again")

    # -- status -------------------------------------------------------------------------------

    def status(self) -> str:
        now = time.monotonic()
        lag_o, age_o = self.ordered.lag(now)
        lag_p, age_p = self.plain.lag(now)
        lag = lag_o + lag_p
        if lag > self.lag_peak:
            self.lag_peak = lag
        self.lag_peak_age = max(self.lag_peak_age, age_o, age_p)
        rss = rss_kib()
        self.rss_samples.append((self.now(), rss))
        acked = self.ordered.acked + self.plain.acked
        failed = self.ordered.failed + self.plain.failed
        consumed = self.ordered.consumed + self.plain.consumed
        w = self.window
        line = (f"t+{self.now():6.1f}s acked {acked:,} failed {failed:,} consumed "
                f"{consumed:,} lag {lag:,} (oldest {max(age_o, age_p):.1f}s) dup "
                f"{self.ordered.duplicates + self.plain.duplicates:,} reorder "
                f"{self.ordered.reorders} pub p50/p99/max {w.quantile(0.5) * 1e3:.1f}/"
                f"{w.quantile(0.99) * 1e3:.1f}/{w.max * 1e3:.0f} ms rss {rss / 1024:.0f} MiB "
                f"tasks {len(asyncio.all_tasks())} fds {open_fds()}")
        self.window = Histogram()
        return line

    async def status_loop(self, until: asyncio.Event) -> None:
        while not until.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.cfg.status_every):
                    await until.wait()
            for slot in self.slots.values():
                slot.check()
                if slot.consumer is None and not any(
                        f.kind == "consumer_restart" for f in self.active_faults()):
                    # a consumer that closed by itself is recorded and replaced
                    with contextlib.suppress(Exception):
                        await slot.start()
            self.say(self.status())

    def active_faults(self) -> list[Fault]:
        now = self.now()
        return [f for f in self.schedule if f.at <= now <= f.at + f.duration]

    # -- the whole run ------------------------------------------------------------------------

    async def run(self) -> SoakResult:
        tasks_start = len(asyncio.all_tasks())
        fds_start = open_fds()
        rss_start = rss_kib()
        await self.target.start()
        try:
            result = await self._run(tasks_start, fds_start, rss_start)
        finally:
            if isinstance(self.target, RealTarget):
                await self.target.heal()
            await self.target.close()
        # counted once the target's own pipes and sessions are closed too
        await asyncio.sleep(0.2)
        result.fds_end = open_fds()
        result.tasks_end = len(asyncio.all_tasks())
        result.rss_end = rss_kib()
        return judge(result)

    async def _run(self, tasks_start: int, fds_start: int, rss_start: int) -> SoakResult:
        cfg = self.cfg
        say = self.say
        t = self.target
        say(f"target: {t.kind} youzan cluster, lookupd {', '.join(t.lookupd_http_addresses)}")
        await t.create_topic(self.topics["ordered"], ORDERED_PARTITIONS, ORDERED_REPLICAS, True,
                             CHANNEL)
        plain_parts, plain_reps = cfg.plain_topology
        await t.create_topic(self.topics["plain"], plain_parts, plain_reps, False, CHANNEL)
        say(f"topics: {self.topics['ordered']} (ordered, {ORDERED_PARTITIONS} partitions, "
            f"replica {ORDERED_REPLICAS}, {cfg.keys} shard keys), {self.topics['plain']} "
            f"({plain_parts} partition(s), replica {plain_reps}, single PUB and MPUB of "
            f"{cfg.batch}); channel {CHANNEL}")
        self._make_consumers()
        for slot in self.slots.values():
            await slot.start()
        producer = Producer(lookupd=t.lookupd_http_addresses,
                            config=ProducerConfig(publish_timeout=10.0, reconnect_max=2.0))
        load_end = asyncio.Event()
        status = asyncio.create_task(self.status_loop(load_end))
        self.t0 = time.monotonic()
        rss_warm = 0
        rss_peak_after_warm = 0
        load_seconds = drain_seconds = 0.0
        drained = False
        try:
            await producer.start()
            pub = asyncio.create_task(self.publisher(producer))
            faults = asyncio.create_task(self.run_faults())
            warm_at = cfg.warmup_seconds
            while self.now() < cfg.seconds:
                await asyncio.sleep(min(1.0, cfg.seconds - self.now()))
                rss = rss_kib()
                if not rss_warm and self.now() >= warm_at:
                    rss_warm = rss
                    say(f"  warm-up over after {warm_at:.0f} s: RSS baseline "
                        f"{rss / 1024:.1f} MiB")
                if rss_warm:
                    rss_peak_after_warm = max(rss_peak_after_warm, rss)
            self.stop_load.set()
            await pub
            await faults
            # faults end early once the load phase is over; publishes finish or fail
            while self.tasks:
                await asyncio.gather(*list(self.tasks), return_exceptions=True)
            load_seconds = self.now()
            rss_peak_after_warm = max(rss_peak_after_warm, rss_kib())
            self.event("load phase over: every fault healed, every publish answered; "
                       "draining the consumers")
            for slot in self.slots.values():
                slot.check()
                if slot.consumer is None:
                    await slot.start()
            drained = await self.drain()
            drain_seconds = self.now() - load_seconds
        finally:
            self.stop_load.set()
            load_end.set()
            await asyncio.gather(status, return_exceptions=True)
            for slot in self.slots.values():
                slot.check()
                await slot.stop()
            await producer.stop()
        server_note = ""
        with contextlib.suppress(Exception):
            server_note = await t.server_note()
        result = SoakResult(
            cfg=cfg, target=t.kind, schedule=self.schedule, events=self.events,
            ledgers=[self.ordered, self.plain], scheduled=self.scheduled, issued=self.issued,
            behind=self.behind, fail_reasons=self.fail_reasons, latency=self.latency,
            lag_peak=self.lag_peak, lag_peak_age=self.lag_peak_age, rss_start=rss_start,
            rss_warm=rss_warm, rss_peak=max(s for _, s in self.rss_samples or [(0, 0)]),
            rss_end=rss_kib(), fds_start=fds_start, fds_end=open_fds(),
            tasks_start=tasks_start, tasks_end=len(asyncio.all_tasks()),
            consumer_errors=[e for s in self.slots.values() for e in s.errors],
            load_seconds=load_seconds, drain_seconds=drain_seconds, drained=drained,
            server_note=server_note, faults_refused=self.faults_refused,
            rss_peak_after_warm=rss_peak_after_warm,
            missing_examples=[f"{lg.name} {e}" for lg in (self.ordered, self.plain)
                              for e in lg.missing_examples(self.t0)],
            fail_times=self.fail_times)
        result.rss_peak = max(result.rss_peak, rss_peak_after_warm, result.rss_end)
        return result

    async def drain(self) -> bool:
        """Wait until every acknowledged message was consumed (or ``drain`` seconds)."""
        deadline = time.monotonic() + self.cfg.drain
        while time.monotonic() < deadline:
            if self.ordered.missing() == 0 and self.plain.missing() == 0:
                return True
            for slot in self.slots.values():
                slot.check()
                if slot.consumer is None:
                    with contextlib.suppress(Exception):
                        await slot.start()
            await asyncio.sleep(0.2)
        return self.ordered.missing() == 0 and self.plain.missing() == 0


def judge(r: SoakResult) -> SoakResult:
    problems: list[str] = []
    if r.missing:
        problems.append(f"{r.missing:,} acknowledged message(s) never consumed "
                        f"(after {r.drain_seconds:.0f} s of draining), e.g. "
                        + "; ".join(r.missing_examples))
    if r.reorders:
        ex = "; ".join(r.ledgers[0].reorder_examples)
        problems.append(f"{r.reorders:,} per-key reordering(s) on the ordered topic ({ex})")
    if r.consumer_errors:
        problems.append(f"{len(r.consumer_errors)} consumer stop(s) by error, first: "
                        f"{r.consumer_errors[0]}")
    unexpected = sum(lg.unexpected for lg in r.ledgers)
    if unexpected:
        problems.append(f"{unexpected:,} message(s) that were never published")
    if r.rss_warm and r.mem_growth_mib > r.cfg.mem_bound_mb:
        problems.append(f"client RSS grew {r.mem_growth_mib:.1f} MiB after the warm-up "
                        f"(bound {r.cfg.mem_bound_mb:g} MiB)")
    acked = sum(lg.acked for lg in r.ledgers)
    if not acked:
        problems.append("nothing was acknowledged")
    r.failures = problems
    return r


# ---------------------------------------------------------------------------- output

#: a fault's window for failed publishes: its duration plus the publish timeout and a margin
#: (a publish that started during the fault fails up to that long after it)
WINDOW_TAIL = 12.0


def failures_by_fault(r: SoakResult) -> tuple[dict[str, tuple[int, int]], int]:
    """({fault kind: (faults, failed publishes in their windows)}, failures outside any
    window). A second inside several windows counts for the latest fault started."""
    by_kind: dict[str, tuple[int, int]] = {}
    for f in r.schedule:
        n, failed = by_kind.get(f.kind, (0, 0))
        by_kind[f.kind] = (n + 1, failed)
    outside = 0
    for second, count in r.fail_times.items():
        covering = [f for f in r.schedule if f.at - 1 <= second <= f.at + f.duration + WINDOW_TAIL]
        if not covering:
            outside += count
            continue
        kind = max(covering, key=lambda f: f.at).kind
        n, failed = by_kind[kind]
        by_kind[kind] = (n, failed + count)
    return by_kind, outside



def render(r: SoakResult) -> str:
    lat = r.latency
    L = [
        "",
        f"chaos soak report ({r.target} youzan cluster, seed {r.cfg.seed}, rate "
        f"{r.cfg.rate:,.0f} msg/s, {r.load_seconds:.0f} s of load + {r.drain_seconds:.1f} s "
        "of draining)",
        f"  messages       scheduled {r.scheduled:,}, issued {r.issued:,}, skipped while the "
        f"client was >1 s behind {r.behind:,}",
    ]
    for lg in r.ledgers:
        published = sum(b.next_seq for b in lg.books)
        L.append(f"  {lg.name:<14} published {published:,}, acknowledged {lg.acked:,}, failed "
                 f"{lg.failed:,} (stored anyway {lg.failed_but_stored:,}"
                 + (f", {lg.failed_late:,} of them after a later seq of their key"
                    if lg.ordered else "")
                 + f"), consumed "
                 f"{lg.consumed:,}, duplicates {lg.duplicates:,} (replays below the key's "
                 f"highest {lg.rewinds:,})")
        L.append(f"  {'':<14} ACKNOWLEDGED BUT NEVER CONSUMED {lg.missing():,}"
                 + (f", PER-KEY REORDERINGS {lg.reorders:,}" if lg.ordered else "")
                 + (f", unexpected bodies {lg.unexpected:,}" if lg.unexpected else ""))
    if r.fail_reasons:
        L.append("  failed publishes, by reason:")
        for reason, n in r.fail_reasons.most_common(8):
            L.append(f"    {n:>8,} x {reason}")
    if r.schedule:
        by_kind, outside = failures_by_fault(r)
        L.append(f"  failed publishes by fault window (start .. end + {WINDOW_TAIL:g} s):")
        for kind in FAULT_KINDS:
            if kind in by_kind:
                n, failed = by_kind[kind]
                L.append(f"    {kind:<18} {n:>3} fault(s) {failed:>10,} failed")
        L.append(f"    {'outside any window':<28} {outside:>10,} failed")
    L += [
        f"  publish latency p50 {lat.quantile(0.5) * 1e3:.1f} ms, p99 "
        f"{lat.quantile(0.99) * 1e3:.1f} ms, max {lat.max * 1e3:.0f} ms ({lat.count:,} calls)",
        f"  consumer lag   peak {r.lag_peak:,} acknowledged messages not yet consumed, oldest "
        f"{r.lag_peak_age:.1f} s; drained: {'yes' if r.drained else 'NO'}",
        f"  client RSS     start {r.rss_start / 1024:.1f} MiB, after warm-up "
        f"{r.rss_warm / 1024:.1f} MiB, peak {r.rss_peak / 1024:.1f} MiB, end "
        f"{r.rss_end / 1024:.1f} MiB; growth after warm-up {r.mem_growth_mib:.1f} MiB "
        f"(bound {r.cfg.mem_bound_mb:g} MiB)",
        f"  open fds       start {r.fds_start}, end {r.fds_end}; asyncio tasks start "
        f"{r.tasks_start}, end {r.tasks_end}",
        f"  faults         {len(r.schedule)} scheduled, {r.faults_refused} refused or failed "
        "(see the log above)",
    ]
    if r.fds_end > r.fds_start or r.tasks_end > r.tasks_start:
        L.append("  warning        more fds or tasks at the end than at the start: a leak?")
    if r.server_note:
        L.append(f"  server         {r.server_note}")
    if r.ok:
        L.append("result: OK (nothing acknowledged was lost, no key was reordered)")
    else:
        L.append("result: FAILED")
        L += [f"  - {p}" for p in r.failures]
    return "\n".join(L)


def parse_args(argv: Sequence[str] | None) -> SoakConfig:
    ap = argparse.ArgumentParser(prog="benchmarks/chaos.py",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="load phase (default 10)")
    ap.add_argument("--seconds", type=float, help="load phase in seconds (overrides --minutes)")
    ap.add_argument("--rate", type=float, default=5000.0, help="messages/s (default 5000)")
    ap.add_argument("--seed", type=int, default=1, help="fault schedule seed (default 1)")
    ap.add_argument("--keys", type=int, default=1000, help="shard keys (default 1000)")
    ap.add_argument("--real", action="store_true",
                    help="a real youzan cluster from ../shared/realnsq/start-youzan.sh 3 "
                         "($REALNSQ_YOUZAN_BASE, $REALNSQ_STATE)")
    ap.add_argument("--fault-every", type=float, default=20.0,
                    help="mean seconds between faults (default 20)")
    ap.add_argument("--faults", default=",".join(FAULT_KINDS),
                    help=f"comma-separated fault kinds (default all: {','.join(FAULT_KINDS)})")
    ap.add_argument("--batch", type=int, default=10, help="messages per MPUB (default 10)")
    ap.add_argument("--drain", type=float, default=120.0,
                    help="seconds allowed for consuming the backlog after the load (default "
                         "120)")
    ap.add_argument("--mem-bound-mb", type=float, default=64.0,
                    help="allowed client RSS growth after the warm-up, MiB (default 64)")
    ap.add_argument("--warmup", type=float, help="warm-up seconds (default 20%% of the run, "
                                                 "at most 60)")
    ap.add_argument("--status-every", type=float, default=5.0,
                    help="seconds between status lines (default 5)")
    ap.add_argument("--plain", metavar="PxR",
                    help="plain topic partitions x replicas (default 3x1 embedded, 1x2 real; "
                         "youzan allows partitions x replicas <= nodes)")
    ap.add_argument("--keep-topics", action="store_true",
                    help="--real: leave the soak's topics on the cluster for a post-mortem")
    ap.add_argument("--schedule-only", action="store_true",
                    help="print the fault schedule and exit")
    a = ap.parse_args(argv)
    seconds = a.seconds if a.seconds is not None else a.minutes * 60.0
    faults = tuple(k.strip() for k in a.faults.split(",") if k.strip())
    plain: tuple[int, int] | None = None
    if a.plain is not None:
        p, _, r = a.plain.lower().partition("x")
        if not (p.isdigit() and r.isdigit()):
            ap.error(f"--plain must look like 3x1 (partitions x replicas), not {a.plain!r}")
        plain = (int(p), int(r))
    try:
        cfg = SoakConfig(seconds=seconds, rate=a.rate, seed=a.seed, keys=a.keys, real=a.real,
                         fault_every=a.fault_every, faults=faults, batch=a.batch,
                         drain=a.drain, mem_bound_mb=a.mem_bound_mb, warmup=a.warmup,
                         status_every=a.status_every, keep_topics=a.keep_topics, plain=plain)
    except SoakError as exc:
        ap.error(str(exc))
    if a.schedule_only:
        print_schedule(cfg, print)
        ap.exit(0)
    return cfg


def print_schedule(cfg: SoakConfig, say: Say) -> None:
    sched = make_schedule(cfg)
    say(f"fault schedule (seed {cfg.seed}, {len(sched)} faults over {cfg.seconds:g} s):")
    for f in sched:
        say("  " + f.describe())


async def run_soak(cfg: SoakConfig, say: Say | None = None) -> SoakResult:
    out: Say = say if say is not None else (lambda _line: None)
    print_schedule(cfg, out)
    return await Soak(cfg, out).run()


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stdout,
                        format="  log: %(name)s: %(message)s")

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"chaos soak: {cfg.seconds:g} s at {cfg.rate:,.0f} msg/s, seed {cfg.seed}, "
        f"{'real' if cfg.real else 'embedded'} youzan cluster")
    runner: Callable[..., SoakResult] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop
        runner = uvloop.run
    try:
        result = runner(run_soak(cfg, say))
    except TargetError as exc:
        print(f"chaos soak could not run: {exc}", file=sys.stderr)
        return 2
    say(render(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
