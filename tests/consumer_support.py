"""Helpers for the consumer tests: publishing with a raw Connection, collecting handlers,
bounded waits, short-timeout configs."""

# the waits take their bound as an argument on purpose
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from smartnsq.config import ConnectionConfig, ConsumerConfig
from smartnsq.conn import Connection
from smartnsq.message import Message
from smartnsq.protocol.validation import parse_tcp_address

WAIT = 10.0


def fast_config(**kw: Any) -> ConsumerConfig:
    """Consumer settings with short timers so tests end quickly."""
    conn_kw = kw.pop("connection", {})
    base: dict[str, Any] = {
        "max_in_flight": 50,
        "reconnect_min": 0.05,
        "reconnect_max": 0.3,
        "lookupd_poll_interval": 0.3,
        "lookupd_poll_jitter": 0.1,
        "rdy_redistribute_interval": 0.1,
        "low_rdy_idle_timeout": 0.2,
        "low_rdy_timeout": 0.5,
        "drain_timeout": 3.0,
        "default_requeue_delay": 0.0,
        "backoff_multiplier": 0.05,
        "max_backoff_duration": 0.2,
        "connection": ConnectionConfig(**{"dial_timeout": 1.0, "close_timeout": 2.0,
                                          **conn_kw}),
    }
    base.update(kw)
    return ConsumerConfig(**base)


async def publish(address: str, topic: str, bodies: Sequence[bytes],
                  partition: int | None = None, config: ConnectionConfig | None = None,
                  batch: int = 200) -> None:
    """MPUB ``bodies`` to one nsqd (youzan: to ``partition``)."""
    host, port = parse_tcp_address(address)
    conn = Connection(host, port, config)
    await conn.connect()
    try:
        for i in range(0, len(bodies), batch):
            await conn.publish_many(topic, list(bodies[i:i + batch]), partition, timeout=5)
    finally:
        await conn.close()


def bodies(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


class Collector:
    """An async handler that records what it saw and signals when ``expected`` distinct
    bodies arrived. ``fail`` decides per message whether to raise."""

    def __init__(self, expected: int | None = None,
                 fail: Callable[[Message], bool] | None = None,
                 delay: float = 0.0) -> None:
        self.expected = expected
        self.fail = fail
        self.delay = delay
        self.messages: list[Message] = []
        self.handled: list[bytes] = []
        self.counts: Counter[bytes] = Counter()
        self.done = asyncio.Event()
        self._waiters: list[tuple[Callable[[], bool], asyncio.Event]] = []

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail is not None and self.fail(msg):
            self._check()
            raise RuntimeError(f"handler refuses {msg.body!r}")
        self.handled.append(msg.body)
        self.counts[msg.body] += 1
        self._check()

    def _check(self) -> None:
        if self.expected is not None and len(self.counts) >= self.expected:
            self.done.set()
        for cond, ev in self._waiters:
            if cond():
                ev.set()

    async def wait(self, timeout: float = WAIT) -> None:
        async with asyncio.timeout(timeout):
            await self.done.wait()

    async def wait_for(self, cond: Callable[[], bool], timeout: float = WAIT) -> None:
        """Wait until ``cond()`` holds, re-checked after every handled message."""
        if cond():
            return
        ev = asyncio.Event()
        self._waiters.append((cond, ev))
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        finally:
            self._waiters.remove((cond, ev))

    @property
    def distinct(self) -> set[bytes]:
        return set(self.counts)


async def eventually(cond: Callable[[], bool], timeout: float = WAIT,
                     interval: float = 0.01) -> None:
    """Re-check ``cond`` every ``interval`` until it holds; fail after ``timeout``."""
    async with asyncio.timeout(timeout):
        # for state without an event of its own (server-side counters, stats)
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(interval)


def all_of(groups: Iterable[Iterable[bytes]]) -> set[bytes]:
    out: set[bytes] = set()
    for g in groups:
        out.update(g)
    return out
