"""Consuming over one connection: SUB variants, message layouts, FIN/REQ/TOUCH, heartbeats,
non-fatal errors, CLS/CLOSE_WAIT and the read timeout."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection, ConnectionCallbacks
from smartnsq.errors import (
    ConfigError,
    ConnectionClosedError,
    FinFailedError,
    InvalidError,
    NSQTimeoutError,
    ServerError,
    SubExtendNeedError,
    UnsupportedFeatureError,
)
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, encode_frame
from smartnsq.protocol.messages import MessageRecord, RawMessage, encode_message, youzan_id
from tests.scripted_server import YOUZAN_VERSION, Peer, ScriptedServer, leftover_tasks

# ids whose binary form contains the bytes nsqd's line parser would trip over
# (docs/protocol.md §5.2)
ID1 = youzan_id(0x0A20_0A20_0000_0001, 0x2020_0A0A_2020_0A0A)
ID2 = youzan_id(0x0A20_0A20_0000_0002, 0)
ID3 = youzan_id(0x0A20_0A20_0000_0003, 7)


def cfg(**kw: Any) -> ConnectionConfig:
    kw.setdefault("handshake_timeout", 3.0)
    kw.setdefault("close_timeout", 1.0)
    return ConnectionConfig(**kw)


class Inbox:
    """An ``on_records`` that collects delivered messages as RawMessage objects; ``wait(n)``
    returns once n arrived (bounded)."""

    def __init__(self) -> None:
        self.messages: list[RawMessage] = []
        self._changed = asyncio.Event()

    def __call__(self, conn: Connection, records: list[MessageRecord]) -> None:
        self.messages += [RawMessage(*r) for r in records]
        self._changed.set()

    async def wait(self, n: int) -> list[RawMessage]:
        async with asyncio.timeout(3):
            while len(self.messages) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.messages


async def finish_cls(p: Peer) -> None:
    await p.expect(b"CLS")
    p.send_response(b"CLOSE_WAIT")
    await p.expect_eof()


async def test_ordered_ext_messages_and_fixed_layout_fin_req_touch() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        assert p.identify["extend_support"] is True
        sub = await p.expect(b"SUB_ORDERED")
        assert sub.params == [b"t", b"c", b"2"]
        p.send_response()
        assert (await p.expect(b"RDY")).params == [b"3"]
        offset = 0
        for i, msg_id in enumerate((ID1, ID2, ID3)):
            p.send_message(encode_message(
                1_700_000_000_000_000_000 + i, 1 + i, msg_id, b"body%d" % i, ext_version=4,
                ext=b'{"##trace_id":"7"}' if i == 2 else b"{}", offset=offset, raw_size=40))
            offset += 40
        # youzan parses these by position: FIN/TOUCH = name, space, 16 id bytes, newline
        fin = await p.expect(b"FIN")
        assert fin.params == [ID1]
        req = await p.expect(b"REQ")
        assert req.params == [ID2, b"2500"]
        touch = await p.expect(b"TOUCH")
        assert touch.params == [ID3]
        fin = await p.expect(b"FIN")
        assert fin.params == [ID3]
        await finish_cls(p)

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(extend_support=True), on_records=inbox)
        await conn.connect()
        await conn.subscribe("t", "c", 2, mode="ordered", ext=True)
        assert conn.subscribed and conn.layout.ext and conn.layout.position
        conn.send_rdy(3)
        msgs = await inbox.wait(3)
        assert [m.id for m in msgs] == [ID1, ID2, ID3]
        assert [m.body for m in msgs] == [b"body0", b"body1", b"body2"]
        assert [m.offset for m in msgs] == [0, 40, 80]
        assert [m.attempts for m in msgs] == [1, 2, 3]
        assert msgs[2].ext_version == 4 and msgs[2].ext == b'{"##trace_id":"7"}'
        assert msgs[0].trace_id == 0x2020_0A0A_2020_0A0A
        assert conn.in_flight == 3
        assert conn.fin(ID1) and conn.req(ID2, 2500) and conn.touch(ID3)
        assert conn.in_flight == 1
        assert conn.fin(ID3)
        assert conn.in_flight == 0
        assert conn.stats().messages_in == 3
        await conn.close()


async def test_advanced_subscription_with_offset() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        sub = await p.expect(b"SUB_ADVANCED")
        assert sub.params == [b"t", b"c", b"0", b"virtual_queue:123"]
        p.send_response()
        await p.expect(b"RDY")
        p.send_message(encode_message(1, 1, ID1, b"x", offset=123, raw_size=30))
        await finish_cls(p)

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=inbox)
        await conn.connect()
        await conn.subscribe("t", "c", 0, mode="advanced",
                             offset=OffsetSpec.virtual_queue(123))
        assert conn.layout.position and not conn.layout.ext
        conn.send_rdy(1)
        (msg,) = await inbox.wait(1)
        assert (msg.offset, msg.raw_size, msg.body) == (123, 30, b"x")
        await conn.close()


async def test_heartbeat_is_answered_and_takes_no_fifo_slot() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        p.send_response(b"_heartbeat_")
        await p.expect(b"NOP")
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        await conn.publish("t", b"x", timeout=2)
        await conn.close()


async def test_non_fatal_fin_error_goes_to_on_error() -> None:
    errors: list[ServerError] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"FIN")
        p.send_error(b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
        await p.expect(b"PUB")  # the connection is still usable
        p.send_response()
        await finish_cls(p)

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=lambda c, rs: None,
                          on_error=lambda c, e: errors.append(e))
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.fin(b"0123456789abcdef")
        await conn.publish("t", b"x", timeout=2)
        assert len(errors) == 1 and isinstance(errors[0], FinFailedError)
        assert not errors[0].fatal
        assert conn.is_connected
        await conn.close()


async def test_close_sends_cls_and_delivers_until_close_wait() -> None:
    closes: list[BaseException | None] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        await p.expect(b"CLS")
        p.send_message(encode_message(1, 1, b"0123456789abcdef", b"late"))
        p.send_response(b"CLOSE_WAIT")
        fin = await p.expect(b"FIN")
        assert fin.params == [b"0123456789abcdef"]
        await p.expect_eof()

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=inbox,
                          on_close=lambda c, e: closes.append(e))
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(1)
        await conn.cls()
        assert conn.is_closing
        (msg,) = await inbox.wait(1)
        assert conn.fin(msg.id)  # still allowed after CLS
        await conn.close()
        assert conn.is_closed
    assert closes == [None]


async def test_close_is_bounded_when_close_wait_never_comes() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"CLS")
        await p.expect_eof()  # never answers

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(close_timeout=0.2),
                          on_records=lambda c, rs: None)
        await conn.connect()
        await conn.subscribe("t", "c")
        loop = asyncio.get_running_loop()
        start = loop.time()
        await conn.close()
        assert loop.time() - start < 1.0
        assert conn.is_closed
    assert not leftover_tasks()


async def test_fatal_sub_error_raises_and_closes() -> None:
    closes: list[BaseException | None] = []

    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"SUB")
        p.send_error(b"E_SUB_EXTEND_NEED need extend support for topic t")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=lambda c, rs: None,
                          on_close=lambda c, e: closes.append(e))
        await conn.connect()
        with pytest.raises(SubExtendNeedError) as info:
            await conn.subscribe("t", "c", 0, ext=True)
        assert info.value.fatal and info.value.topic == "t"
        assert not conn.subscribed
        async with asyncio.timeout(2):
            await conn.wait_closed()
    assert closes == [info.value]


async def test_fatal_error_answering_a_fire_and_forget_command_closes() -> None:
    closes: list[BaseException | None] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_error(b"E_INVALID RDY count 3000 out of range 0-2500")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=lambda c, rs: None,
                          on_close=lambda c, e: closes.append(e))
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(1)
        async with asyncio.timeout(2):
            await conn.wait_closed()
    assert len(closes) == 1 and isinstance(closes[0], InvalidError)


async def test_read_timeout_closes_and_fails_waiters() -> None:
    closes: list[BaseException | None] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        await p.expect_eof()  # silence: no heartbeat, no answer

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(heartbeat_interval=1, read_timeout=1.05),
                          on_close=lambda c, e: closes.append(e))
        await conn.connect()
        with pytest.raises(NSQTimeoutError, match="no data from nsqd"):
            await conn.publish("t", b"x")
        async with asyncio.timeout(2):
            await conn.wait_closed()
    assert len(closes) == 1 and isinstance(closes[0], NSQTimeoutError)


async def test_subscribe_argument_checks() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version="1.3.0")
        await p.expect(b"SUB")
        p.send_response()
        await finish_cls(p)

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        with pytest.raises(ConfigError, match="on_records"):
            await conn.subscribe("t", "c")
        conn.delegate = ConnectionCallbacks(on_records=lambda c, rs: None)
        with pytest.raises(UnsupportedFeatureError):
            await conn.subscribe("t", "c", 0, mode="ordered")
        with pytest.raises(ConfigError, match="advanced"):
            await conn.subscribe("t", "c", offset=OffsetSpec.end())
        with pytest.raises(ConfigError, match="mode"):
            await conn.subscribe("t", "c", mode="bogus")  # type: ignore[arg-type]
        await conn.subscribe("t", "c", 0)
        with pytest.raises(ConfigError, match="already subscribed"):
            await conn.subscribe("t", "c")
        with pytest.raises(ConfigError):
            conn.send_rdy(-1)
        await conn.close()


async def test_failing_on_records_is_logged_and_delivery_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_message(encode_message(1, 1, b"0" * 16, b"boom"))
        p.send_response(b"_heartbeat_")
        await p.expect(b"NOP")  # the failing delivery was handled: the next is a read of its own
        p.send_message(encode_message(1, 1, b"1" * 16, b"fine"))
        await finish_cls(p)

    seen: list[bytes] = []
    done = asyncio.Event()

    def on_records(conn: Connection, records: list[MessageRecord]) -> None:
        for msg in (RawMessage(*r) for r in records):
            seen.append(msg.body)
            if msg.body == b"boom":
                raise RuntimeError("handler bug")
            done.set()

    caplog.set_level(logging.ERROR)
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=on_records)
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(2)
        async with asyncio.timeout(3):
            await done.wait()
        assert conn.is_connected
        await conn.close()
    assert seen == [b"boom", b"fine"]
    assert "handler bug" in caplog.text


async def test_rdy_before_subscribe_is_refused_and_sub_timeout_closes() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        await p.expect_eof()  # never answers the SUB

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=lambda c, rs: None)
        await conn.connect()
        with pytest.raises(ConfigError, match="RDY before"):
            conn.send_rdy(1)
        with pytest.raises(NSQTimeoutError):
            await conn.subscribe("t", "c", timeout=0.1)
        # a SUB that may still succeed later leaves the state unknown: the connection ends
        async with asyncio.timeout(2):
            await conn.wait_closed()
        assert isinstance(conn.error, NSQTimeoutError)


async def test_after_a_sub_timeout_the_connection_is_gone_for_a_new_subscribe_too() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        await p.expect_eof()  # never answers the SUB

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=lambda c, rs: None)
        await conn.connect()
        with pytest.raises(NSQTimeoutError):
            await conn.subscribe("t", "c", timeout=0.1)
        assert conn.subscriber is None and not conn.subscribed
        with pytest.raises(ConnectionClosedError, match="is closed"):
            await conn.subscribe("t", "c", timeout=0.1)
        await conn.close()


async def test_cls_timeout() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"CLS")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(close_timeout=0.1),
                          on_records=lambda c, rs: None)
        await conn.connect()
        await conn.subscribe("t", "c")
        with pytest.raises(NSQTimeoutError, match="CLS"):
            await conn.cls(timeout=0.1)
        assert conn.is_closing
        await conn.close()


async def test_stock_fins_keep_their_order_among_other_commands() -> None:
    """FINs are queued as ids and joined at flush: written in one loop turn together with
    RDY/REQ/TOUCH, every command still reaches the server whole and in call order."""
    ids = [b"%016x" % i for i in range(6)]
    seen: list[tuple[bytes, list[bytes]]] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        # all messages and a heartbeat in one write: one read, decoded in order
        p.send_raw(b"".join([
            *(encode_frame(FRAME_MESSAGE, encode_message(1, 1, i, b"b")) for i in ids[:3]),
            encode_frame(FRAME_RESPONSE, b"_heartbeat_"),
            *(encode_frame(FRAME_MESSAGE, encode_message(1, 1, i, b"b")) for i in ids[3:]),
        ]))
        for _ in range(9):
            cmd = await p.read_command()
            seen.append((cmd.name, cmd.params))
        await finish_cls(p)

    inbox = Inbox()
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_records=inbox)
        await conn.connect()
        await conn.subscribe("t", "c")
        conn.send_rdy(6)
        msgs = await inbox.wait(6)
        assert [m.id for m in msgs] == ids
        # one loop turn: FIN, FIN, RDY, FIN, REQ, TOUCH, FIN, FIN
        assert conn.fin(ids[0]) and conn.fin(ids[1])
        assert conn.send_rdy(2)
        assert conn.fin(ids[2]) and conn.req(ids[3], 10) and conn.touch(ids[4])
        assert conn.fin(ids[4]) and conn.fin(ids[5])
        with pytest.raises(ConfigError, match="must be 16 bytes, got 3"):
            conn.fin(b"abc")
        with pytest.raises(ConfigError, match=r"16 bytes, got 16 \(bytearray\)"):
            conn.fin(bytearray(16))  # type: ignore[arg-type]
        for answer in (conn.fin, conn.touch, lambda x: conn.req(x, 10)):
            with pytest.raises(ConfigError, match="message id must be 16 bytes, got int"):
                answer(12345)  # type: ignore[arg-type]
        assert conn.in_flight == 0
        await conn.close()
    # the NOP answering the heartbeat went out first, from the receive path
    assert seen == [
        (b"NOP", []),
        (b"FIN", [ids[0]]), (b"FIN", [ids[1]]), (b"RDY", [b"2"]), (b"FIN", [ids[2]]),
        (b"REQ", [ids[3], b"10"]), (b"TOUCH", [ids[4]]), (b"FIN", [ids[4]]),
        (b"FIN", [ids[5]]),
    ]
