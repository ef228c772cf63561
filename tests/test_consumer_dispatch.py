"""The consumer's dispatch path without sockets: a fake connection records what would be
written. Covers REQ delays, inline vs suspended handlers, concurrency bounds, handlers that
use asyncio.timeout, batched flow-control reporting, giving up, the trace switch and the
consumer's trace=True option."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from smartnsq.config import ConsumerConfig
from smartnsq.consumer.consumer import Consumer, Sub
from smartnsq.consumer.discovery import Endpoint
from smartnsq.message import Message
from smartnsq.protocol.messages import RawMessage, record_of
from smartnsq.trace import TraceSwitch


class FakeConn:
    max_rdy_count = 2500
    is_connected = True
    msg_timeout = 60.0

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.rdy = 0

    def fin(self, msg_id: bytes) -> bool:
        self.sent.append(("FIN", msg_id))
        return True

    def fin_delivered(self, msg_id: bytes) -> bool:
        return self.fin(msg_id)

    def fin_run(self, ids: list[bytes]) -> bool:
        for msg_id in ids:
            self.fin(msg_id)
        return True

    def req(self, msg_id: bytes, delay_ms: int) -> bool:
        self.sent.append(("REQ", (msg_id, delay_ms)))
        return True

    def touch(self, msg_id: bytes) -> bool:
        self.sent.append(("TOUCH", msg_id))
        return True

    def send_rdy(self, n: int) -> bool:
        self.rdy = n
        self.sent.append(("RDY", n))
        return True


class Rig:
    """A consumer wired to one fake subscription, driven message by message."""

    def __init__(self, handler: Callable[[Message], Awaitable[object]] | None,
                 **cfg: Any) -> None:
        base: dict[str, Any] = {"max_in_flight": 100}
        base.update(cfg)
        self.config = ConsumerConfig(**base)
        self.consumer = Consumer("t", "c", handler, nsqd=["127.0.0.1:1"],
                                 config=self.config, **self.extra)
        c = self.consumer
        c._bind_loop(asyncio.get_running_loop())
        self.sub = c._subscriptions.new_sub(Endpoint("127.0.0.1:1", "127.0.0.1", 1))
        self.conn = FakeConn()
        self.sub.conn = self.conn  # type: ignore[assignment]
        self.sub.subscriber = self.conn  # type: ignore[assignment]
        self.sub.registered = True
        c._subs.add(self.sub)
        c._driver.added(self.sub, 2500)

    extra: dict[str, Any] = {}

    def deliver(self, n: int, attempts: int = 1, start: int = 0, batch: bool = False) -> None:
        """``batch``: all ``n`` in one on_records call (a connection's read) instead of one
        call each."""
        raws = [RawMessage(1, attempts, b"%016x" % i, b"body-%d" % i)
                for i in range(start, start + n)]
        dispatch = self.consumer._dispatch
        if batch:
            dispatch.on_records(self.sub, [record_of(r) for r in raws])
            return
        for raw in raws:
            dispatch.on_records(self.sub, [record_of(raw)])

    def sent(self, kind: str) -> list[Any]:
        return [v for k, v in self.conn.sent if k == kind]


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_requeue_delays_computed_explicit_and_capped() -> None:
    async def fail(msg: Message) -> None:
        raise ValueError("no")

    rig = Rig(fail, default_requeue_delay=2.0, max_requeue_delay=5.0, backoff_enabled=False)
    rig.deliver(1, attempts=1)
    rig.deliver(1, attempts=2, start=1)
    rig.deliver(1, attempts=4, start=2)  # 8 s computed, capped at 5 s
    await turns()
    assert [d for _, d in rig.sent("REQ")] == [2000, 4000, 5000]
    assert rig.consumer.stats().requeued == 3

    async def explicit(msg: Message) -> None:
        msg.requeue(0.25, backoff=False)

    rig2 = Rig(explicit, max_requeue_delay=5.0)
    rig2.deliver(1)
    await turns()
    assert [d for _, d in rig2.sent("REQ")] == [250]
    assert not rig2.consumer.stats().in_backoff


@pytest.mark.parametrize("batch", [False, True])
async def test_inline_handlers_finish_in_one_turn(batch: bool) -> None:
    seen: list[bytes] = []

    async def handler(msg: Message) -> None:
        seen.append(msg.body)

    rig = Rig(handler)
    rig.deliver(300, batch=batch)
    await turns(2)
    assert len(seen) == 300 and len(rig.sent("FIN")) == 300
    # one worker was enough: nothing suspended
    assert len(rig.consumer._workers) == 1
    st = rig.consumer.stats()
    assert st.received == st.finished == 300 and st.in_flight == 0


async def test_suspended_handlers_run_concurrently_up_to_max_in_flight() -> None:
    gate = asyncio.Event()
    running = 0
    peak = 0

    async def handler(msg: Message) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1

    rig = Rig(handler, max_in_flight=8)
    rig.deliver(20)  # more than max_in_flight (a server would not send them; we cope)
    await turns(5)
    assert peak == 8 and len(rig.consumer._workers) == 8
    gate.set()
    await turns(10)
    assert len(rig.sent("FIN")) == 20 and running == 0


@pytest.mark.parametrize("lowered_to", [0, 3])
async def test_messages_let_in_before_max_in_flight_was_lowered_keep_their_workers(
        lowered_to: int) -> None:
    """A pause (max_in_flight 0) or a lower max_in_flight from the first handler of a read
    of 10: the 9 queued behind it were let in under the old value and are handled as
    concurrently (the worker cap followed the new value: one worker at 0, so they were
    handled one after another, and a long backlog would outlive nsqd's msg_timeout)."""
    gate = asyncio.Event()
    running = peak = 0

    async def handler(msg: Message) -> None:
        nonlocal running, peak
        if msg.body == b"body-0":
            rig.consumer.set_max_in_flight(lowered_to)
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1

    rig = Rig(handler, max_in_flight=10)
    rig.deliver(10, batch=True)
    await turns(5)
    assert peak == 10
    gate.set()
    await turns(10)
    assert len(rig.sent("FIN")) == 10 and running == 0
    # once they are answered the cap is the new value again
    assert rig.consumer.stats().in_flight == 0


async def test_handler_using_asyncio_timeout() -> None:
    async def handler(msg: Message) -> None:
        async with asyncio.timeout(0.01 if msg.body.endswith(b"0") else 5):
            await asyncio.sleep(0.05)

    rig = Rig(handler, backoff_enabled=False)
    rig.deliver(2)
    async with asyncio.timeout(5):
        while len(rig.sent("FIN") + rig.sent("REQ")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    # the first timed out inside the handler (requeued), the second finished
    assert [v[0] for v in rig.sent("REQ")] == [b"%016x" % 0]
    assert rig.sent("FIN") == [b"%016x" % 1]
    # the timeout cancelled the handler, not the worker
    assert all(not w.done() for w in rig.consumer._workers)


async def test_flow_events_are_batched_per_turn() -> None:
    async def handler(msg: Message) -> None:
        return None

    rig = Rig(handler, max_in_flight=2000)
    calls: list[tuple[str, int]] = []
    flow = rig.consumer._flow
    assert flow is not None
    orig_r, orig_f = flow.message_received, flow.message_finished

    def received(key: Sub, now: float, count: int = 1) -> list[Any]:
        calls.append(("received", count))
        return orig_r(key, now, count)

    def finished(key: Sub, now: float, count: int = 1) -> list[Any]:
        calls.append(("finished", count))
        return orig_f(key, now, count)

    flow.message_received = received  # type: ignore[method-assign]
    flow.message_finished = finished  # type: ignore[method-assign]
    rig.deliver(500)
    await turns(4)
    assert ("received", 500) in calls and sum(n for k, n in calls if k == "finished") == 500
    assert len(calls) <= 4
    # the first RDY was 1; the batch raised it to the target
    assert rig.sent("RDY") == [1, 2000]


def rig_giving_up(handler: Any, giving_up: Any, **config: Any) -> Rig:
    """A rig whose consumer has ``giving_up``."""
    Rig.extra = {"giving_up": giving_up}
    try:
        return Rig(handler, **config)
    finally:
        Rig.extra = {}


@pytest.mark.parametrize("batch", [False, True])
async def test_giving_up_default_logs_and_finishes(caplog: pytest.LogCaptureFixture,
                                                   batch: bool) -> None:
    handled: list[Message] = []

    async def handler(msg: Message) -> None:
        handled.append(msg)

    caplog.set_level(logging.WARNING, logger="smartnsq.consumer")
    rig = Rig(handler, max_attempts=2)
    rig.deliver(1, attempts=3, batch=batch)
    await turns()
    assert handled == [] and rig.sent("FIN") == [b"%016x" % 0]
    assert "giving up on message" in caplog.text
    assert rig.consumer.stats().given_up == 1


async def test_giving_up_callback_sync_and_async() -> None:
    got: list[int] = []

    class Cb:
        async def __call__(self, msg: Message) -> None:
            got.append(msg.attempts)

    async def handler(msg: Message) -> None:
        return None

    rig = rig_giving_up(handler, Cb(), max_attempts=1)
    rig.deliver(2, attempts=2)
    await turns(4)
    assert got == [2, 2]


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_failing_giving_up_callback_keeps_the_message(
        kind: str, caplog: pytest.LogCaptureFixture) -> None:
    # a dead-letter publish that fails must not lose the message: it is requeued, not FINed
    calls: list[int] = []

    def sync_cb(msg: Message) -> None:
        calls.append(msg.attempts)
        raise ConnectionError("dead-letter topic unreachable")

    async def async_cb(msg: Message) -> None:
        calls.append(msg.attempts)
        await asyncio.sleep(0)
        raise ConnectionError("dead-letter topic unreachable")

    async def handler(msg: Message) -> None:
        raise AssertionError("a given-up message must not reach the handler")

    caplog.set_level(logging.ERROR, logger="smartnsq.consumer")
    rig = rig_giving_up(handler, sync_cb if kind == "sync" else async_cb, max_attempts=2)
    rig.deliver(1, attempts=3)
    await turns(4)
    assert calls == [3]
    assert rig.sent("FIN") == [] and [v[0] for v in rig.sent("REQ")] == [b"%016x" % 0]
    assert "giving_up callback failed" in caplog.text and "requeued" in caplog.text
    st = rig.consumer.stats()
    assert st.given_up == 0 and st.in_flight == 0


async def test_an_async_giving_up_callback_is_finished_after_it_returned() -> None:
    release = asyncio.Event()
    stored: list[bytes] = []

    async def dead_letter(msg: Message) -> None:
        await release.wait()
        stored.append(msg.body)

    async def handler(msg: Message) -> None:
        return None

    rig = rig_giving_up(handler, dead_letter, max_attempts=1)
    rig.deliver(1, attempts=2)
    await turns(4)
    assert rig.sent("FIN") == [] and stored == []  # not finished while the callback runs
    assert rig.consumer.stats().in_flight == 1
    release.set()
    await turns(4)
    assert stored == [b"body-0"] and rig.sent("FIN") == [b"%016x" % 0]
    st = rig.consumer.stats()
    assert st.given_up == 1 and st.in_flight == 0


async def test_one_read_mixing_messages_over_and_under_the_attempt_cap() -> None:
    handled: list[bytes] = []

    async def handler(msg: Message) -> None:
        handled.append(msg.body)

    rig = Rig(handler, max_attempts=2)
    raws = [RawMessage(1, a, b"%016x" % i, b"body-%d" % i) for i, a in enumerate((1, 3, 2, 5))]
    rig.consumer._dispatch.on_records(rig.sub, [record_of(r) for r in raws])
    # the given-up ones are finished from the receive path, before any handler ran
    assert rig.sent("FIN") == [b"%016x" % 1, b"%016x" % 3] and handled == []
    await turns()
    assert handled == [b"body-0", b"body-2"]
    assert rig.sent("FIN")[2:] == [b"%016x" % 0, b"%016x" % 2]
    st = rig.consumer.stats()
    assert st.given_up == 2 and st.received == st.finished == 4 and st.in_flight == 0
    assert rig.consumer._dispatch.outstanding == 0


@pytest.mark.parametrize("batch", [False, True])
async def test_trace_switch_is_read_per_turn(caplog: pytest.LogCaptureFixture,
                                             batch: bool) -> None:
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    switch = TraceSwitch()

    async def handler(msg: Message) -> None:
        return None

    Rig.extra = {"trace_switch": switch}
    try:
        rig = Rig(handler)
    finally:
        Rig.extra = {}
    rig.deliver(3, batch=batch)
    await turns()
    switch.enable("t")
    rig.deliver(2, start=3, batch=batch)
    await turns()
    switch.disable()
    switch.reset("t")
    rig.deliver(1, start=5, batch=batch)
    await turns()
    traced = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert [r.message_id for r in traced] == [  # type: ignore[attr-defined]
        (b"%016x" % i).hex() for i in (3, 4)]


@pytest.mark.parametrize("batch", [False, True])
async def test_trace_option_logs_every_delivery_whatever_the_switch(
        caplog: pytest.LogCaptureFixture, batch: bool) -> None:
    """``trace=True`` is the consumer's own option: every delivery is logged, while its
    switch is off for the topic too."""
    caplog.set_level(logging.INFO, logger="smartnsq.trace")
    switch = TraceSwitch()
    switch.disable("t")

    async def handler(msg: Message) -> None:
        return None

    Rig.extra = {"trace": True, "trace_switch": switch}
    try:
        rig = Rig(handler)
    finally:
        Rig.extra = {}
    assert rig.consumer.trace is True
    rig.deliver(3, batch=batch)
    await turns()
    traced = [r for r in caplog.records if r.name == "smartnsq.trace"]
    assert [r.message_id for r in traced] == [  # type: ignore[attr-defined]
        (b"%016x" % i).hex() for i in range(3)]
    assert {r.event for r in traced} == {"consume"}  # type: ignore[attr-defined]
    assert len(rig.sent("FIN")) == 3


async def test_counts_of_a_connection_closing_in_the_turn_they_happened_reach_the_totals(
        ) -> None:
    """A connection closed right after its messages were handled, before the per-turn flush:
    stats() still counts them (they were lost from the totals when the subscription's counts
    moved before its pending ones were flushed)."""
    async def handler(msg: Message) -> None:
        return None

    rig = Rig(handler)
    rig.deliver(5, batch=True)
    # the handler runs in the next turn; the FINs are flushed in the turn after
    for _ in range(50):
        await asyncio.sleep(0)
        if rig.sub.fin_pending:
            break
    assert rig.sub.fin_pending == 5
    rig.sub.on_close(rig.conn, None)  # type: ignore[arg-type]
    await turns()
    st = rig.consumer.stats()
    assert (st.received, st.finished) == (5, 5)
