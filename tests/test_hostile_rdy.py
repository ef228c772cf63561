"""Hostile servers that ignore RDY: messages before SUB's OK, before any RDY, or more in
flight than the RDY granted fail the connection with a ProtocolError, and a consumer's
memory stays bounded by max_in_flight (issue 9, item 6)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.errors import ProtocolError
from smartnsq.message import Message
from smartnsq.protocol.frames import FRAME_MESSAGE, encode_frame
from smartnsq.protocol.messages import MessageRecord, RawMessage, encode_message
from tests.consumer_support import fast_config
from tests.scripted_server import Peer, ScriptedServer

TS = 1_700_000_000_000_000_000


def msg_frame(i: int, attempts: int = 1) -> bytes:
    return encode_message(TS + i, attempts, b"%016d" % i, b"body-%d" % i)


class Inbox:
    def __init__(self) -> None:
        self.messages: list[RawMessage] = []
        self.changed = asyncio.Event()

    def __call__(self, conn: Connection, records: list[MessageRecord]) -> None:
        self.messages += [RawMessage(*r) for r in records]
        self.changed.set()

    async def wait(self, n: int) -> None:
        async with asyncio.timeout(3):
            while len(self.messages) < n:
                self.changed.clear()
                await self.changed.wait()


def cfg() -> ConnectionConfig:
    return ConnectionConfig(handshake_timeout=3.0, close_timeout=1.0)


async def connect(port: int, inbox: Inbox) -> Connection:
    conn = Connection("127.0.0.1", port, cfg(), on_records=inbox)
    await conn.connect()
    return conn


async def closed_with(conn: Connection) -> ProtocolError:
    async with asyncio.timeout(3):
        await conn.wait_closed()
    assert isinstance(conn.error, ProtocolError), conn.error
    return conn.error


async def test_message_before_sub_ok_fails_subscribe() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_message(msg_frame(1))  # before the OK
        p.send_response()
        await p.expect_eof()

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = await connect(srv.port, inbox)
        with pytest.raises(ProtocolError, match="before answering SUB with OK"):
            await conn.subscribe("t", "c", timeout=3)
        await closed_with(conn)
    assert inbox.messages == []


async def test_message_before_any_rdy_fails_the_connection() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        p.send_message(msg_frame(1))  # no RDY was sent
        await p.expect_eof()

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = await connect(srv.port, inbox)
        # the message may arrive with the OK, before subscribe() resumes
        with contextlib.suppress(ProtocolError):
            await conn.subscribe("t", "c", timeout=3)
        err = await closed_with(conn)
    assert "before any RDY was sent" in str(err)
    assert inbox.messages == []


async def test_more_in_flight_than_rdy_fails_the_connection() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"2"]
        for i in range(3):
            p.send_message(msg_frame(i))
        await p.expect_eof()

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = await connect(srv.port, inbox)
        await conn.subscribe("t", "c", timeout=3)
        conn.send_rdy(2)
        err = await closed_with(conn)
    assert "3 in flight, highest RDY granted 2" in str(err)
    assert len(inbox.messages) == 2  # the third never reached the subscriber


async def test_lowering_rdy_tolerates_messages_the_server_already_sent() -> None:
    """RDY 2 then RDY 1 while two are in flight: the server had sent both under RDY 2."""
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"2"]
        p.send_message(msg_frame(1))
        p.send_message(msg_frame(2))
        assert (await p.expect(b"RDY")).params == [b"1"]
        await p.expect(b"FIN")
        await p.expect(b"FIN")
        p.send_message(msg_frame(3))  # within RDY 1 again
        await p.expect(b"FIN")
        await p.expect(b"CLS")
        p.send_response(b"CLOSE_WAIT")
        await p.expect_eof()

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = await connect(srv.port, inbox)
        await conn.subscribe("t", "c", timeout=3)
        conn.send_rdy(2)
        await inbox.wait(2)
        conn.send_rdy(1)
        for m in inbox.messages:
            conn.fin(m.id)
        await inbox.wait(3)
        conn.fin(inbox.messages[2].id)
        await conn.close()
        assert conn.error is None


async def test_redelivery_after_a_server_side_timeout_is_not_a_violation() -> None:
    """Once a message stayed unanswered for msg_timeout the server may time it out and
    redeliver it to us while we still hold the first copy (2 in flight under RDY 1)."""
    async def script(p: Peer) -> None:
        await p.handshake(extra={"msg_timeout": 1})  # 1 ms
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_message(msg_frame(1))
        await asyncio.sleep(0.05)  # the server's msg_timeout passes
        p.send_message(msg_frame(1, attempts=2))
        await p.expect(b"FIN")
        await p.expect(b"FIN")
        await p.expect(b"CLS")
        p.send_response(b"CLOSE_WAIT")
        await p.expect_eof()

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = await connect(srv.port, inbox)
        await conn.subscribe("t", "c", timeout=3)
        conn.send_rdy(1)
        await inbox.wait(2)
        assert conn.in_flight == 2
        for m in inbox.messages:
            conn.fin(m.id)
        await conn.close()
        assert conn.error is None


class _Seen(logging.Handler):
    """Sets ``event`` when a log record contains ``text``."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_flooding_server_cannot_grow_a_consumer_beyond_max_in_flight() -> None:
    flood = 5000
    first = asyncio.Event()

    async def script(p: Peer) -> None:
        if first.is_set():
            p.close()  # later reconnects: refuse, the test is about the first connection
            return
        first.set()
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"1"]
        # one write: the whole flood can arrive in a single read
        p.send_raw(b"".join(encode_frame(FRAME_MESSAGE, msg_frame(i)) for i in range(flood)))
        await p.drain()
        await p.expect_eof()

    held: list[Message] = []
    release = asyncio.Event()

    async def handler(msg: Message) -> None:
        held.append(msg)
        await release.wait()

    seen = _Seen("delivered more messages than RDY allows")
    logger = logging.getLogger("smartnsq.consumer")
    logger.addHandler(seen)
    async with ScriptedServer(script) as srv:
        consumer = Consumer("t", "c", handler, nsqd=[f"127.0.0.1:{srv.port}"],
                            config=fast_config(max_in_flight=1, drain_timeout=0.0))
        await consumer.start()
        try:
            async with asyncio.timeout(5):
                await seen.event.wait()
            stats = consumer.stats()
            assert stats.received <= 1
            assert stats.in_flight <= 1
            assert len(consumer._queue) == 0
            assert len(held) <= 1
        finally:
            logger.removeHandler(seen)
            await consumer.stop(drain_timeout=0)
    assert srv.peers  # the flood really happened on the first connection


async def test_more_in_flight_than_rdy_in_one_read_delivers_only_the_allowed_batch() -> None:
    """The messages of one read are counted one by one: the batch handed on holds those
    within RDY, then the connection fails."""
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"2"]
        p.send_raw(b"".join(encode_frame(FRAME_MESSAGE, msg_frame(i)) for i in range(3)))
        await p.expect_eof()

    batches: list[list[RawMessage]] = []
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(),
                          on_records=lambda c, rs: batches.append([RawMessage(*r) for r in rs]))
        await conn.connect()
        await conn.subscribe("t", "c", timeout=3)
        conn.send_rdy(2)
        err = await closed_with(conn)
    assert "3 in flight, highest RDY granted 2" in str(err)
    assert [[m.body for m in b] for b in batches] == [[b"body-0", b"body-1"]]


async def test_a_run_answered_at_once_is_counted_as_if_one_by_one() -> None:
    """RDY 1 and two messages in one read (youzan's read-ahead copy then the tracked one,
    docs/protocol.md §13.2): a callback that FINs at once keeps the connection, exactly as if
    each came alone, because the run before the excess is handed on before counting again."""
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"1"]
        p.send_raw(encode_frame(FRAME_MESSAGE, msg_frame(0)) * 2)
        assert (await p.expect(b"FIN")).params == [b"%016d" % 0]
        assert (await p.expect(b"FIN")).params == [b"%016d" % 0]
        p.send_raw(encode_frame(FRAME_MESSAGE, msg_frame(1)) * 2)  # not answered: over RDY
        await p.expect_eof()

    batches: list[list[bytes]] = []

    def on_records(conn: Connection, records: list[MessageRecord]) -> None:
        msgs = [RawMessage(*r) for r in records]
        batches.append([m.body for m in msgs])
        for m in msgs:
            if m.body == b"body-0":
                conn.fin(m.id)

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=on_records)
        await conn.connect()
        await conn.subscribe("t", "c", timeout=3)
        conn.send_rdy(1)
        err = await closed_with(conn)
    assert "2 in flight, highest RDY granted 1" in str(err)
    assert batches == [[b"body-0"], [b"body-0"], [b"body-1"]]
