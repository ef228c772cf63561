"""The consumer's queue of records: reads from several subscriptions queue their records
behind a marker, their subscription; a worker makes each message when it takes it. Owners,
closed subscriptions, stop()'s requeue and the slow path's messages in between must all come
out right."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from smartnsq.consumer.consumer import Sub
from smartnsq.consumer.discovery import Endpoint
from smartnsq.message import Message
from smartnsq.protocol.messages import MessageRecord
from smartnsq.trace import TraceSwitch
from tests.test_consumer_dispatch import FakeConn, Rig, turns


def records(start: int, n: int, attempts: int = 1) -> list[MessageRecord]:
    return [(1, attempts, b"%016x" % i, b"body-%d" % i, None, None, None, None)
            for i in range(start, start + n)]


def second_sub(rig: Rig, port: int = 2) -> tuple[Sub, FakeConn]:
    c = rig.consumer
    sub = c._subscriptions.new_sub(Endpoint(f"127.0.0.1:{port}", "127.0.0.1", port))
    conn = FakeConn()
    sub.conn = conn  # type: ignore[assignment]
    sub.subscriber = conn  # type: ignore[assignment]
    sub.registered = True
    c._subs.add(sub)
    c._driver.added(sub, 2500)
    return sub, conn


async def test_interleaved_reads_reach_the_handler_with_their_own_subscription() -> None:
    seen: list[tuple[str, bytes]] = []

    async def handler(msg: Message) -> None:
        seen.append((msg.nsqd_address, msg.body))

    rig = Rig(handler)
    sub_b, conn_b = second_sub(rig)
    d = rig.consumer._dispatch
    d.on_records(rig.sub, records(0, 3))
    d.on_records(sub_b, records(10, 2))
    d.on_records(rig.sub, records(3, 1))
    d.on_records(rig.sub, records(4, 1))  # same owner as the tail: no new marker
    await turns()
    a, b = "127.0.0.1:1", "127.0.0.1:2"
    assert seen == [(a, b"body-0"), (a, b"body-1"), (a, b"body-2"), (b, b"body-10"),
                    (b, b"body-11"), (a, b"body-3"), (a, b"body-4")]
    # each FIN went out on the connection of the message's own subscription
    assert rig.sent("FIN") == [b"%016x" % i for i in (0, 1, 2, 3, 4)]
    assert [v for k, v in conn_b.sent if k == "FIN"] == [b"%016x" % i for i in (10, 11)]
    st = rig.consumer.stats()
    assert st.received == st.finished == 7 and st.in_flight == 0 and not d.queue


async def test_records_of_a_closed_subscription_are_dropped_not_handled() -> None:
    seen: list[bytes] = []

    async def handler(msg: Message) -> None:
        seen.append(msg.body)

    rig = Rig(handler)
    sub_b, conn_b = second_sub(rig)
    d = rig.consumer._dispatch
    d.on_records(rig.sub, records(0, 2))
    d.on_records(sub_b, records(10, 3))
    d.on_records(rig.sub, records(2, 1))
    sub_b.closed = True  # its connection went away: nsqd redelivers those messages
    await turns()
    assert seen == [b"body-0", b"body-1", b"body-2"]
    assert not [v for k, v in conn_b.sent if k in ("FIN", "REQ")]
    assert d.outstanding == 0 and sub_b.outstanding == 0 and not d.queue


async def test_stop_requeues_records_still_queued_on_their_own_connections() -> None:
    gate = asyncio.Event()
    started: list[bytes] = []

    async def handler(msg: Message) -> None:
        started.append(msg.body)
        await gate.wait()

    rig = Rig(handler, max_in_flight=1)
    sub_b, conn_b = second_sub(rig)
    d = rig.consumer._dispatch
    d.on_records(rig.sub, records(0, 2))
    d.on_records(sub_b, records(10, 2))
    await turns()
    assert started == [b"body-0"]  # one worker (max_in_flight 1), stuck in the handler
    d.requeue_outstanding()
    # the one being handled and the three queued, each on its own connection
    assert sorted(v[0] for v in rig.sent("REQ")) == [b"%016x" % 0, b"%016x" % 1]
    assert [v[0] for k, v in conn_b.sent if k == "REQ"] == [b"%016x" % 10, b"%016x" % 11]
    assert d.outstanding == 0 and not d.queue
    gate.set()
    await turns()


async def test_the_slow_path_keeps_a_subscriptions_order_between_records() -> None:
    """Tracing switched on between two reads: the second read's messages take the slow
    path (a Message each, at once) and are handled after the first read's records."""
    seen: list[bytes] = []
    gate = asyncio.Event()

    async def handler(msg: Message) -> None:
        await gate.wait()
        seen.append(msg.body)

    switch = TraceSwitch()
    Rig.extra = {"trace_switch": switch}
    try:
        rig = Rig(handler, max_in_flight=1)
    finally:
        Rig.extra = {}
    d = rig.consumer._dispatch
    d.on_records(rig.sub, records(0, 3))
    await turns()  # the one worker holds body-0
    switch.enable("t")
    d.on_records(rig.sub, records(3, 2))
    assert [type(x) for x in d.queue] == [tuple, tuple, Message, Message]
    gate.set()
    await turns()
    assert seen == [b"body-%d" % i for i in range(5)]


async def test_queued_records_are_not_tracked_by_the_garbage_collector() -> None:
    """The point of queueing records: nothing per message waiting in the queue is scanned
    by the collector again and again as it ages."""
    gate = asyncio.Event()

    async def handler(msg: Message) -> Any:
        await gate.wait()

    rig = Rig(handler, max_in_flight=1)
    d = rig.consumer._dispatch
    d.on_records(rig.sub, records(0, 500))
    await turns()
    gc.collect()
    waiting = [x for x in d.queue if type(x) is tuple]
    assert len(waiting) == 499 and not any(gc.is_tracked(x) for x in waiting)
    gate.set()
    await turns(3)
    assert len(rig.sent("FIN")) == 500
