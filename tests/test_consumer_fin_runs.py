"""The workers' FIN runs (smartnsq.consumer.workers): FINs of handlers that returned are
handed over together, yet the wire sees every answer in message order, a suspended handler
does not hold back the FINs before it, and the counts a handler reads are exact."""

from __future__ import annotations

import asyncio

from smartnsq.message import Message
from smartnsq.protocol.messages import RawMessage, record_of
from tests.test_consumer_dispatch import Rig, turns


async def test_answers_keep_message_order_on_the_wire() -> None:
    # a user's handler: most messages return, some raise, some are requeued by hand
    async def handler(msg: Message) -> None:
        n = int(msg.body.split(b"-")[1])
        if n % 5 == 3:
            raise ValueError("bad record")
        if n % 7 == 6:
            msg.requeue(0, backoff=False)

    rig = Rig(handler, backoff_enabled=False)
    rig.deliver(40, batch=True)
    await turns(3)
    expected = [("REQ" if n % 5 == 3 or n % 7 == 6 else "FIN", b"%016x" % n)
                for n in range(40)]
    got = [(k, v if k == "FIN" else v[0]) for k, v in rig.conn.sent if k in ("FIN", "REQ")]
    assert got == expected
    st = rig.consumer.stats()
    assert st.received == 40 and st.finished + st.requeued == 40 and st.in_flight == 0


async def test_fins_before_a_suspended_handler_go_out_while_it_waits() -> None:
    release = asyncio.Event()

    async def handler(msg: Message) -> None:
        if msg.body == b"body-5":
            await release.wait()  # e.g. a slow database call

    rig = Rig(handler)
    rig.deliver(6, batch=True)
    await turns(3)  # the sixth handler is waiting now
    # the first five are answered while the sixth handler still waits
    assert rig.sent("FIN") == [b"%016x" % n for n in range(5)]
    assert rig.consumer.stats().in_flight == 1
    release.set()
    await turns(3)
    assert rig.sent("FIN") == [b"%016x" % n for n in range(6)]
    assert rig.consumer.stats().in_flight == 0


async def test_a_handler_reading_the_counts_sees_the_messages_before_it_finished() -> None:
    seen: list[tuple[int, int]] = []

    async def handler(msg: Message) -> None:
        st = rig.consumer.stats()
        seen.append((st.finished, st.in_flight))

    rig = Rig(handler)
    rig.deliver(5, batch=True)
    await turns(3)
    # each handler sees the ones before it finished and itself in flight
    assert seen == [(0, 5), (1, 4), (2, 3), (3, 2), (4, 1)]
    assert len(rig.sent("FIN")) == 5


async def test_two_subscriptions_in_one_batch_answer_each_their_own() -> None:
    async def handler(msg: Message) -> None:
        return None

    rig = Rig(handler)
    other = Rig(handler)  # a second fake connection, wired into the first consumer
    sub2 = rig.consumer._subscriptions.new_sub(other.sub.endpoint)
    sub2.conn = other.conn  # type: ignore[assignment]
    sub2.subscriber = other.conn  # type: ignore[assignment]
    sub2.registered = True
    rig.consumer._subs.add(sub2)
    rig.consumer._driver.added(sub2, 2500)
    dispatch = rig.consumer._dispatch
    rig.deliver(3, batch=True)
    dispatch.on_records(sub2, [record_of(RawMessage(1, 1, b"%016x" % (100 + i), b"x"))
                               for i in range(2)])
    rig.deliver(2, start=3, batch=True)
    await turns(3)
    assert rig.sent("FIN") == [b"%016x" % n for n in range(5)]
    assert [v for k, v in other.conn.sent if k == "FIN"] == [b"%016x" % 100, b"%016x" % 101]
    st = rig.consumer.stats()
    assert st.finished == 7 and st.in_flight == 0
