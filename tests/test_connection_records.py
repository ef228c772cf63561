"""``Connection.on_records``: the consumer's receive path, messages as plain tuples.

A read of messages only that fits RDY is handed on in one piece; anything else (frames
between messages, a server beyond RDY, ext layouts) takes the per-frame path and must behave
exactly like ``on_messages``, only with records instead of objects."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection
from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, encode_frame
from smartnsq.protocol.messages import (
    BODY,
    ID,
    MessageRecord,
    RawMessage,
    decode_message,
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


async def test_frames_between_messages_keep_their_place_like_on_messages(
        caplog: pytest.LogCaptureFixture) -> None:
    """The same script as on_messages' test: runs split at a heartbeat and an error frame, a
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
                          on_message=lambda c, m: log.append("on_message called"),
                          on_error=lambda c, e: log.append(type(e).__name__))
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(10)
        async with asyncio.timeout(3):
            await second_read.wait()
        assert conn.in_flight == 6 and conn.stats().messages_in == 6
        await conn.close()
    # on_records wins over on_message
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
    """Ext frames (decoded one by one) and SUB_ORDERED position frames become the same
    records as decode_message's fields."""
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
