"""Publishing over one connection: FIFO matching, timeouts, trace replies, errors, back-pressure."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection
from smartnsq.errors import (
    BadTopicError,
    ClientClosedError,
    ConfigError,
    ConnectionClosedError,
    ExtNotSupportError,
    NSQTimeoutError,
    ProtocolError,
    PubFailedError,
    ServerError,
    ServerNotLeaderError,
    UnsupportedFeatureError,
)
from smartnsq.errors.base import CommandKind
from smartnsq.protocol import commands
from smartnsq.protocol.responses import TraceResponse, encode_trace_response
from tests.scripted_server import YOUZAN_VERSION, Peer, ScriptedServer, leftover_tasks


def pause_event(conn: Connection) -> asyncio.Event:
    """An event set when the transport pauses the connection's writes."""
    paused = asyncio.Event()
    wire = conn._core.wire
    assert wire is not None
    real_pause = wire.pause_writing

    def pause_writing() -> None:
        real_pause()
        paused.set()

    wire.pause_writing = pause_writing  # type: ignore[method-assign]
    return paused


def cfg(**kw: Any) -> ConnectionConfig:
    kw.setdefault("handshake_timeout", 3.0)
    kw.setdefault("close_timeout", 1.0)
    return ConnectionConfig(**kw)


async def test_many_publishes_in_flight_are_matched_in_order() -> None:
    n = 200

    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        cmds = [await p.read_command() for _ in range(n)]
        assert [c.body for c in cmds] == [b"m%d" % i for i in range(n)]
        assert cmds[0].params == [b"t", b"3"]
        for i in range(n):  # every 7th fails, non-fatally on youzan
            if i % 7 == 3:
                p.send_error(b"E_PUB_FAILED pub to wait channel timeout")
            else:
                p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        results = await asyncio.gather(
            *(conn.publish("t", b"m%d" % i, partition=3) for i in range(n)),
            return_exceptions=True)
        for i, r in enumerate(results):
            if i % 7 == 3:
                assert isinstance(r, PubFailedError) and not r.fatal, (i, r)
                assert r.topic == "t" and r.partition == 3
            else:
                assert r is None, (i, r)
        assert conn.is_connected  # non-fatal errors keep the connection
        stats = conn.stats()
        assert stats.publishes == n and stats.pending == 0 and stats.error_frames == n // 7 + 1
        await conn.close()


def _answers_pubs(n: int) -> Callable[[Peer], Awaitable[None]]:
    """A server script: the handshake, then OK to each of ``n`` PUBs, then the client's close."""
    async def script(p: Peer) -> None:
        await p.handshake()
        for _ in range(n):
            await p.expect(b"PUB")
            p.send_response()
        await p.expect_eof()

    return script


async def _recording(port: int) -> tuple[Connection, list[bytes]]:
    """A connected Connection and the list its socket writes are recorded in."""
    conn = Connection("127.0.0.1", port, cfg())
    await conn.connect()
    transport = conn._core.wire._transport  # type: ignore[union-attr]
    assert transport is not None
    writes: list[bytes] = []
    real_write = transport.write

    def recording_write(data: Any) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = recording_write  # type: ignore[method-assign]
    return conn, writes


async def test_publishes_in_one_iteration_share_one_socket_write() -> None:
    """The first publish on an idle connection goes out at once (nothing to wait for); the
    other 49 of the same loop turn join one socket write."""
    async with ScriptedServer(_answers_pubs(50)) as srv:
        conn, writes = await _recording(srv.port)
        await asyncio.gather(*(conn.publish("t", b"x" * 10) for _ in range(50)))
        one = commands.pub("t", b"x" * 10)
        assert writes == [one, one * 49]
        await conn.close()


async def test_one_request_at_a_time_is_written_without_a_loop_turn() -> None:
    """A publish awaited before the next (a web handler's pattern) is on the socket when
    send_request returns; with a publish already in flight, the next one waits for the loop
    turn's single write."""
    async with ScriptedServer(_answers_pubs(3)) as srv:
        conn, writes = await _recording(srv.port)
        pub = commands.pub("t", b"one")
        first = asyncio.ensure_future(conn.publish("t", b"one"))
        await asyncio.sleep(0)  # the coroutine runs up to its wait for the answer
        assert writes == [pub]
        second = asyncio.ensure_future(conn.publish("t", b"one"))
        await asyncio.sleep(0)
        assert writes == [pub]  # queued behind the first, for this turn's write
        async with asyncio.timeout(5):
            await asyncio.gather(first, second)
        assert writes == [pub, pub]
        async with asyncio.timeout(5):
            await conn.publish("t", b"one")
        assert writes == [pub, pub, pub]
        await conn.close()


@pytest.mark.parametrize("how", ["timeout", "cancel"])
async def test_abandoned_publish_keeps_its_fifo_slot(how: str) -> None:
    release = asyncio.Event()
    got_first = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"PUB")
        got_first.set()
        async with asyncio.timeout(3):
            await release.wait()  # answer the first publish only after it was abandoned
        await p.expect(b"PUB")
        p.send_response()  # answers the first (abandoned) publish
        p.send_error(b"E_PUB_FAILED second one failed")  # answers the second
        await p.expect(b"PUB")
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        if how == "timeout":
            with pytest.raises(NSQTimeoutError, match=r"did not answer within 0\.05s"):
                await conn.publish("t", b"first", timeout=0.05)
        else:
            task = asyncio.create_task(conn.publish("t", b"first"))
            async with asyncio.timeout(3):
                await got_first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert conn.pending == 1  # the slot stays until the answer arrives
        release.set()
        # if the FIFO had lost the slot, this publish would wrongly get the first one's OK
        with pytest.raises(PubFailedError, match="second one failed"):
            await conn.publish("t", b"second", timeout=2)
        await conn.publish("t", b"third", timeout=2)
        assert conn.is_connected and conn.pending == 0
        await conn.close()


async def test_timeouts_fire_for_every_waiter_independently() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        for _ in range(3):
            await p.expect(b"PUB")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(conn.publish("t", b"a", timeout=0.3),
                                       conn.publish("t", b"b", timeout=0.05),
                                       conn.publish("t", b"c", timeout=0.15),
                                       return_exceptions=True)
        assert all(isinstance(r, NSQTimeoutError) for r in results)
        assert loop.time() - start < 1.0
        await conn.close()


async def test_trace_and_ext_replies() -> None:
    trace = encode_trace_response(3, 0x0102030405060708, 45, 41)

    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        cmd = await p.expect(b"PUB_TRACE")
        assert cmd.params == [b"t", b"1"]
        assert cmd.body == struct.pack(">Q", 0x0102030405060708) + b"body"
        p.send_response(trace)
        await p.expect(b"MPUB_TRACE")
        p.send_response(encode_trace_response(4, 0, 86, 90))
        await p.expect(b"PUB_EXT")
        p.send_response(trace)
        await p.expect(b"PUB_EXT")
        p.send_response()
        await p.expect(b"MPUB_EXT")
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        r = await conn.publish_trace("t", 1, 0x0102030405060708, b"body")
        assert r == TraceResponse(3, 0x0102030405060708, 45, 41)
        r = await conn.publish_many_trace("t", 1, [(1, b"a"), (2, b"b")])
        assert r == TraceResponse(4, 0, 86, 90)
        assert await conn.publish_ext("t", 1, {"##trace_id": "72623859790382856"}, b"x") == \
            TraceResponse(3, 0x0102030405060708, 45, 41)
        assert await conn.publish_ext("t", 1, {"k": "v"}, b"x") is None
        await conn.publish_many_ext("t", 1, [({"k": "v"}, b"x"), (None, b"y")])
        await conn.close()


async def test_fatal_error_fails_its_waiter_then_everything_and_closes() -> None:
    closes: list[BaseException | None] = []

    async def script(p: Peer) -> None:
        await p.handshake(version="1.3.0")
        for _ in range(3):
            await p.expect(b"PUB")
        p.send_response()
        p.send_error(b"E_BAD_TOPIC PUB topic name \"bad\" is not valid")
        # a real nsqd closes now; this one waits to see the client close by itself
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_close=lambda c, e: closes.append(e))
        await conn.connect()
        results = await asyncio.gather(*(conn.publish("t", b"%d" % i) for i in range(3)),
                                       return_exceptions=True)
        assert results[0] is None
        assert isinstance(results[1], BadTopicError) and results[1].fatal
        assert isinstance(results[2], ConnectionClosedError)
        assert results[2].__cause__ is results[1]
        async with asyncio.timeout(2):
            await conn.wait_closed()
        assert closes == [results[1]]
        assert conn.error is results[1]
        with pytest.raises(ConnectionClosedError):
            await conn.publish("t", b"again")
    assert not leftover_tasks()


async def test_youzan_not_leader_on_publish_is_not_fatal() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"PUB")
        p.send_error(b"E_FAILED_ON_NOT_LEADER ")
        await p.expect(b"PUB")
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        with pytest.raises(ServerNotLeaderError) as info:
            await conn.publish("t", b"x", partition=2)
        err = info.value
        assert not err.fatal and err.refresh_lookup
        assert (err.topic, err.partition, err.address) == ("t", 2, conn.address)
        await conn.publish("t", b"y", partition=2)
        await conn.close()


async def test_error_for_an_abandoned_publish_goes_to_on_error() -> None:
    errors: list[ServerError] = []
    release = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"PUB")
        async with asyncio.timeout(3):
            await release.wait()
        p.send_error(b"E_PUB_FAILED late")
        await p.expect(b"PUB")
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(),
                          on_error=lambda c, e: errors.append(e))
        await conn.connect()
        with pytest.raises(NSQTimeoutError):
            await conn.publish("t", b"x", timeout=0.05)
        release.set()
        await conn.publish("t", b"y", timeout=2)
        assert [type(e) for e in errors] == [PubFailedError]
        await conn.close()


async def test_mpub_ext_error_closes_the_connection() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"MPUB_EXT")
        p.send_error(b"E_EXT_NOT_SUPPORT ext content not supported in topic t")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        with pytest.raises(ExtNotSupportError) as info:
            await conn.publish_many_ext("t", 0, [({"a": "b"}, b"x")])
        assert not info.value.fatal
        async with asyncio.timeout(2):
            await conn.wait_closed()


async def test_flavour_specific_commands_are_refused_before_sending() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        with pytest.raises(UnsupportedFeatureError, match="DPUB"):
            await conn.publish_deferred("t", b"x", 1000)
        assert conn.stats().requests == 0
        await conn.close()

    async def stock(p: Peer) -> None:
        await p.handshake(version="1.3.0")
        cmd = await p.expect(b"DPUB")
        assert cmd.params == [b"t", b"1500"] and cmd.body == b"later"
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(stock) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        for call in (conn.publish_trace("t", 0, 1, b"x"), conn.publish_ext("t", 0, {}, b"x"),
                     conn.publish_many_trace("t", 0, [(1, b"x")]),
                     conn.publish_many_ext("t", 0, [(None, b"x")])):
            with pytest.raises(UnsupportedFeatureError):
                await call
        await conn.publish_deferred("t", b"later", 1500)
        await conn.close()


async def test_generic_request_and_use_after_close() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        cmd = await p.expect(b"INTERNAL_CREATE_TOPIC")
        assert cmd.params == [b"t", b"0"]
        p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        with pytest.raises(Exception, match="not connected"):
            await conn.publish("t", b"x")
        await conn.connect()
        data = await conn.request(commands.internal_create_topic("t", 0), CommandKind.OTHER)
        assert data == b"OK"
        await conn.close()
        with pytest.raises(ClientClosedError):
            await conn.publish("t", b"x")
        assert not conn.fin(b"0" * 16)
        await conn.close()  # idempotent


async def test_close_waits_for_outstanding_publishes() -> None:
    got_all = asyncio.Event()
    answer = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake()
        for _ in range(3):
            await p.expect(b"PUB")
        got_all.set()
        async with asyncio.timeout(3):
            await answer.wait()
        for _ in range(3):
            p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        tasks = [asyncio.create_task(conn.publish("t", b"x")) for _ in range(3)]
        async with asyncio.timeout(3):
            await got_all.wait()
        closer = asyncio.create_task(conn.close())
        await asyncio.sleep(0)  # one step: close() runs up to its wait for the answers
        assert conn.is_closing and not closer.done() and conn.pending == 3
        with pytest.raises(ClientClosedError):
            await conn.publish("t", b"refused while closing")
        answer.set()
        async with asyncio.timeout(3):
            await closer
        assert [t.result() for t in tasks] == [None, None, None]


async def test_back_pressure_waits_for_the_socket_to_drain() -> None:
    big = b"x" * (1024 * 1024)
    n = 24
    reading = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake()
        async with asyncio.timeout(5):
            await reading.wait()  # not reading fills the socket and pauses the client
        for _ in range(n + 1):
            await p.expect(b"PUB")
            p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(write_timeout=5.0))
        await conn.connect()
        paused = pause_event(conn)
        tasks = [asyncio.create_task(conn.publish("t", big)) for _ in range(n)]
        async with asyncio.timeout(3):
            await paused.wait()
        assert conn.write_paused and conn.pending == n
        late = asyncio.create_task(conn.publish("t", b"late"))
        await asyncio.sleep(0)  # one step: the late publish reaches its drain wait
        assert not late.done() and conn.pending == n  # waiting in drain, not yet sent
        reading.set()
        async with asyncio.timeout(5):
            await asyncio.gather(*tasks, late)
        await conn.close()


async def test_write_timeout_fails_everything_when_the_server_stops_reading() -> None:
    big = b"x" * (1024 * 1024)
    stop = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake()
        async with asyncio.timeout(5):
            await stop.wait()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(write_timeout=0.2))
        await conn.connect()
        paused = pause_event(conn)
        tasks = [asyncio.create_task(conn.publish("t", big)) for _ in range(24)]
        async with asyncio.timeout(3):
            await paused.wait()
        with pytest.raises(NSQTimeoutError, match="write_timeout"):
            await conn.publish("t", b"late")
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, NSQTimeoutError) for r in results)
        async with asyncio.timeout(2):
            await conn.wait_closed()
        stop.set()


async def test_thousands_of_stalled_publishes_all_time_out() -> None:
    n = 3000

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect_eof()  # answers nothing

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        loop = asyncio.get_running_loop()
        start = loop.time()
        results = await asyncio.gather(
            *(conn.publish("t", b"x", timeout=0.1 + i / n * 0.2) for i in range(n)),
            return_exceptions=True)
        assert all(isinstance(r, NSQTimeoutError) for r in results)
        assert loop.time() - start < 2.0
        assert conn.is_connected and conn.pending == n  # slots kept for late answers
        await conn.close()


async def test_close_during_connect() -> None:
    got_identify = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        got_identify.set()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(handshake_timeout=10))
        connecting = asyncio.create_task(conn.connect())
        async with asyncio.timeout(3):
            await got_identify.wait()
            await conn.close()
            with pytest.raises(ClientClosedError, match="while connecting"):
                await connecting
        assert conn.is_closed
    assert not leftover_tasks()


async def test_a_plain_publish_answered_with_anything_but_ok_breaks_the_connection() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version=YOUZAN_VERSION)
        await p.expect(b"PUB")
        await p.expect(b"PUB")
        # a trace reply to a plain PUB: commands and answers no longer line up
        p.send_response(encode_trace_response(1, 0, 0, 30))
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        first = asyncio.ensure_future(conn.publish("t", b"a", 0))
        second = asyncio.ensure_future(conn.publish("t", b"b", 0))
        with pytest.raises(ProtocolError, match=r"answered PUB with .* expected OK"):
            await first
        with pytest.raises(ProtocolError):
            await second
        assert conn.is_closed or conn.is_closing
        with pytest.raises(ConnectionClosedError):
            await conn.publish("t", b"c", 0)
        await conn.close()
    assert not leftover_tasks()


@pytest.mark.parametrize("cut", [None, 5])
async def test_a_read_of_many_oks_answers_the_oldest_publishes_in_order(cut: int | None) -> None:
    """A publisher's usual read, OK frames only, is taken in one step; a read that ends
    inside a frame takes the per-frame path. Either way each OK answers the next publish."""
    n = 300
    ok = struct.pack(">ii", 6, 0) + b"OK"

    async def script(p: Peer) -> None:
        await p.handshake()
        for _ in range(n):
            await p.expect(b"PUB")
        if cut is None:
            p.writer.write(ok * n)
        else:
            p.writer.write(ok * 100 + ok[:cut])
            await p.writer.drain()
            # not a wait for anything: a pause so that the client most likely reads the cut
            # frame on its own (the assertions hold however the bytes arrive)
            await asyncio.sleep(0.05)
            p.writer.write(ok[cut:] + ok * (n - 101))
        await p.expect(b"PUB")
        p.send_error(b"E_BAD_MESSAGE the last one")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        futs = [conn.send_pub("t", b"m%d" % i, 3.0) for i in range(n)]
        async with asyncio.timeout(3):
            assert await asyncio.gather(*futs) == [b"OK"] * n
        assert conn.pending == 0
        with pytest.raises(ServerError, match="the last one"):
            await conn.publish("t", b"x", timeout=3)
        await conn.close()


async def test_more_oks_in_one_read_than_publishes_waiting_fails_the_connection() -> None:
    ok = struct.pack(">ii", 6, 0) + b"OK"

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        await p.expect(b"PUB")
        p.writer.write(ok * 3)  # one too many
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        a, b = conn.send_pub("t", b"a", 3.0), conn.send_pub("t", b"b", 3.0)
        async with asyncio.timeout(3):
            assert await a == await b == b"OK"
            await conn.wait_closed()
    assert isinstance(conn.error, ProtocolError)
    assert "nothing waits for" in str(conn.error)


async def test_send_pub_refuses_a_bad_body_before_writing() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        for bad in (b"", "text", None):
            with pytest.raises(ConfigError):
                conn.send_pub("t", bad, 3.0)  # type: ignore[arg-type]
        assert conn.pending == 0 and conn.is_connected
        await conn.close()


async def test_send_publish_writes_a_body_piece_right_after_its_head() -> None:
    """The head and the body of one command go out in order, between the other commands
    of the same loop turn: the server reads whole commands."""
    body = commands.mpub_body([b"x" * 300, b"y"])

    async def script(p: Peer) -> None:
        await p.handshake()
        first = await p.read_command()
        second = await p.read_command()
        third = await p.read_command()
        assert (first.name, first.body) == (b"PUB", b"before")
        assert second.name == b"MPUB" and second.body == body
        assert (third.name, third.body) == (b"PUB", b"after")
        for _ in range(3):
            p.send_response()
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        futs = [conn.send_pub("t", b"before", 3.0),
                conn.send_publish(commands.mpub_head("t", len(body)), 3.0, "t", body),
                conn.send_pub("t", b"after", 3.0)]
        async with asyncio.timeout(3):
            assert await asyncio.gather(*futs) == [b"OK"] * 3
        await conn.close()
