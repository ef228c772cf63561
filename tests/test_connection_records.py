"""The one receive mode: a connection hands its messages to its delegate's ``on_records``
as plain tuples (records), one call per run of message frames in a read.

A read of messages only that fits RDY is handed on in one piece; anything else (frames
between messages, a server beyond RDY) is split into runs at the other frames, in stream
order, and ext layouts arrive as records too."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection, ConnectionCallbacks
from smartnsq.errors import ConfigError, ProtocolError, ServerError
from smartnsq.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    decode_message,
    encode_frame,
)
from smartnsq.protocol.messages import (
    BODY,
    ID,
    MessageRecord,
    RawMessage,
    encode_message,
    record_of,
)
from tests.scripted_server import YOUZAN_VERSION, Peer, ScriptedServer


def cfg(**kw: Any) -> ConnectionConfig:
    kw.setdefault("handshake_timeout", 3.0)
    kw.setdefault("close_timeout", 1.0)
    return ConnectionConfig(**kw)


def payload(i: int, **kw: Any) -> bytes:
    return encode_message(1_700_000_000_000_000_000 + i, 1 + i % 3, b"%016x" % i, b"m%d" % i,
                          **kw)


def msg(i: int, **kw: Any) -> bytes:
    return encode_frame(FRAME_MESSAGE, payload(i, **kw))


async def finish_cls(p: Peer) -> None:
    await p.expect(b"CLS")
    p.send_response(b"CLOSE_WAIT")
    await p.expect_eof()


async def test_a_read_of_messages_only_is_handed_on_whole_as_records() -> None:
    got: list[list[MessageRecord]] = []
    done = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_raw(b"".join(msg(i) for i in range(50)))
        await finish_cls(p)

    def on_records(conn: Connection, records: list[MessageRecord]) -> None:
        got.append(records)
        if sum(map(len, got)) == 50:
            done.set()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=on_records)
        await conn.connect()
        await conn.subscribe("t", "c")  # on_records alone is a subscriber
        conn.send_rdy(50)
        async with asyncio.timeout(3):
            await done.wait()
        assert conn.in_flight == 50 and conn.stats().messages_in == 50
        await conn.close()
    records = [r for batch in got for r in batch]
    assert records == [record_of(decode_message(payload(i))) for i in range(50)]
    assert all(type(r) is tuple for r in records)
    # plain tuples of ints, bytes and None: the collector stops tracking them once seen
    gc.collect()
    assert not any(gc.is_tracked(r) for r in records)


async def test_frames_between_messages_keep_their_place(
        caplog: pytest.LogCaptureFixture) -> None:
    """Runs split at a heartbeat and an error frame, each frame handled in its place; a
    failing callback is logged (naming on_records) and delivery goes on."""
    log: list[Any] = []
    second_read = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_raw(msg(0) + msg(1) + encode_frame(FRAME_RESPONSE, b"_heartbeat_") + msg(2)
                   + encode_frame(FRAME_ERROR, b"E_FIN_FAILED FIN x failed ID not in flight")
                   + msg(3) + msg(4))
        await p.expect(b"NOP")
        await p.expect(b"TOUCH")
        p.send_raw(msg(5))
        await finish_cls(p)

    def on_records(conn: Connection, records: list[MessageRecord]) -> None:
        log.append([r[BODY] for r in records])
        if records[0][BODY] == b"m3":
            conn.touch(records[0][ID])
            raise RuntimeError("callback bug")
        if records[0][BODY] == b"m5":
            second_read.set()

    caplog.set_level(logging.ERROR)
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=on_records,
                          on_error=lambda c, e: log.append(type(e).__name__))
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(10)
        async with asyncio.timeout(3):
            await second_read.wait()
        assert conn.in_flight == 6 and conn.stats().messages_in == 6
        await conn.close()
    assert log == [[b"m0", b"m1"], [b"m2"], "FinFailedError", [b"m3", b"m4"], [b"m5"]]
    assert "on_records callback failed" in caplog.text and "callback bug" in caplog.text


async def test_a_read_of_messages_beyond_rdy_hands_on_those_within_then_fails() -> None:
    batches: list[list[bytes]] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"2"]
        p.send_raw(msg(0) + msg(1) + msg(2))
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(),
                          on_records=lambda c, rs: batches.append([r[BODY] for r in rs]))
        await conn.connect()
        await conn.subscribe("t", "c", timeout=3)
        conn.send_rdy(2)
        async with asyncio.timeout(3):
            await conn.wait_closed()
    assert isinstance(conn.error, ProtocolError)
    assert "3 in flight, highest RDY granted 2" in str(conn.error)
    assert batches == [[b"m0", b"m1"]]


async def test_ext_and_position_layouts_arrive_as_records_too() -> None:
    """Ext frames and SUB_ORDERED position frames become records with decode_message's
    fields."""
    frames = [payload(i, ext_version=4, ext=b'{"k":"%d"}' % i, offset=100 * i, raw_size=100)
              for i in range(3)]
    got: list[MessageRecord] = []
    done = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"SUB_ORDERED")
        p.send_response()
        await p.expect(b"RDY")
        p.send_raw(b"".join(encode_frame(FRAME_MESSAGE, f) for f in frames))
        await finish_cls(p)

    def on_records(conn: Connection, records: list[MessageRecord]) -> None:
        got.extend(records)
        if len(got) == 3:
            done.set()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(extend_support=True),
                          on_records=on_records)
        await conn.connect()
        await conn.subscribe("t", "c", 0, "ordered", ext=True)
        conn.send_rdy(3)
        async with asyncio.timeout(3):
            await done.wait()
        layout = conn.layout
        await conn.close()
    assert [RawMessage(*r) for r in got] == [decode_message(f, layout) for f in frames]
    assert [r[BODY] for r in got] == [b"m0", b"m1", b"m2"]


async def test_a_delegate_hears_the_records_the_errors_and_the_close() -> None:
    """One object owns what a connection reports (go-nsq's ConnDelegate): the runs of
    messages, the errors no caller waits for, the close; subscribe() returns the subscriber
    side, which answers the messages."""

    class Owner:
        def __init__(self) -> None:
            self.log: list[Any] = []
            self.changed = asyncio.Event()

        def on_records(self, conn: Connection, records: list[MessageRecord]) -> None:
            self.note([r[BODY] for r in records])

        def on_error(self, conn: Connection, exc: ServerError) -> None:
            self.note(type(exc).__name__)

        def on_close(self, conn: Connection, exc: BaseException | None) -> None:
            self.note(("closed", exc))

        def note(self, what: Any) -> None:
            self.log.append(what)
            self.changed.set()

        async def wait(self, n: int) -> None:
            async with asyncio.timeout(3):
                while len(self.log) < n:
                    self.changed.clear()
                    await self.changed.wait()

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_raw(msg(0) + msg(1))
        assert (await p.expect(b"FIN")).params == [b"%016x" % 0]
        p.send_error(b"E_FIN_FAILED FIN 0000000000000000 failed ID not in flight")
        await finish_cls(p)

    owner = Owner()
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), delegate=owner)
        await conn.connect()
        sub = await conn.subscribe("t", "c")
        assert conn.subscriber is sub and sub.subscribed
        sub.send_rdy(2)
        await owner.wait(1)
        assert sub.fin(b"%016x" % 0) and sub.in_flight == 1
        await owner.wait(2)
        await conn.close()
        await owner.wait(3)
    assert owner.log == [[b"m0", b"m1"], "FinFailedError", ("closed", None)]


def test_a_delegate_or_callbacks_not_both() -> None:
    with pytest.raises(ConfigError, match="not both"):
        Connection("127.0.0.1", 1, delegate=ConnectionCallbacks(), on_close=lambda c, e: None)
