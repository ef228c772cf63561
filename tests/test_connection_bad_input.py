"""Bad input from the server: every case raises a specific smartnsq error, closes the socket,
leaves no task behind and fails every pending publish with that error (never hangs it)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn import Connection
from smartnsq.errors import (
    CompressionError,
    ConnectionClosedError,
    NSQError,
    ProtocolError,
)
from smartnsq.protocol.frames import FRAME_MESSAGE, FRAME_RESPONSE, OK, encode_frame
from tests.scripted_server import Peer, ScriptedServer, leftover_tasks

Bad = Callable[[Peer], Awaitable[None] | None]


def cfg(**kw: Any) -> ConnectionConfig:
    kw.setdefault("handshake_timeout", 3.0)
    kw.setdefault("close_timeout", 1.0)
    kw.setdefault("max_frame_size", 1024 * 1024)
    return ConnectionConfig(**kw)


def raw(data: bytes) -> Bad:
    """Write ``data`` on the socket as is, past any compression layer."""
    def send(p: Peer) -> None:
        p.writer.write(data)
    return send


def framed(data: bytes) -> Bad:
    """Write ``data`` through the session's compression layer (if any)."""
    def send(p: Peer) -> None:
        p.send_raw(data)
    return send


async def run_after_publishes(bad: Bad, exc_type: type[NSQError], match: str,
                              **config: Any) -> None:
    """Two publishes are waiting when the server misbehaves; both and the connection must end
    with ``exc_type`` and the client must close the socket by itself."""
    closes: list[BaseException | None] = []
    saw_eof = asyncio.Event()

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        await p.expect(b"PUB")
        result = bad(p)
        if result is not None:
            await result
        await p.drain()
        await p.expect_eof()  # the client, not the server, ends the connection
        saw_eof.set()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(**config),
                          on_records=lambda c, rs: None, on_close=lambda c, e: closes.append(e))
        await conn.connect()
        results = await asyncio.gather(conn.publish("t", b"a"), conn.publish("t", b"b"),
                                       return_exceptions=True)
        for r in results:
            assert isinstance(r, exc_type), r
        assert results[0] is results[1]
        with pytest.raises(exc_type, match=match):
            raise results[0]
        async with asyncio.timeout(3):
            await conn.wait_closed()
        assert conn.is_closed and conn.error is results[0]
        assert closes == [results[0]]
        with pytest.raises(ConnectionClosedError):
            await conn.publish("t", b"after")
    if exc_type is not ConnectionClosedError:
        assert saw_eof.is_set()
    assert not leftover_tasks()


@pytest.mark.parametrize(("bad", "match"), [
    (struct.pack(">ii", 200 * 1024 * 1024, 0), "exceeds the maximum"),
    (struct.pack(">ii", -5, 0), "invalid frame size -5"),
    (struct.pack(">ii", 2, 0), "invalid frame size 2"),
    (struct.pack(">ii", 6, 9) + b"OK", "unknown frame type 9"),
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "HTTP port"),
    (encode_frame(FRAME_MESSAGE, b"x" * 10), "shorter than 26"),
])
async def test_bad_frames_after_the_handshake(bad: bytes, match: str) -> None:
    await run_after_publishes(raw(bad), ProtocolError, match)


async def test_response_nobody_waits_for() -> None:
    closes: list[BaseException | None] = []

    async def script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        p.send_response(OK)
        p.send_response(OK)  # answers nothing
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(), on_close=lambda c, e: closes.append(e))
        await conn.connect()
        await conn.publish("t", b"x")
        async with asyncio.timeout(3):
            await conn.wait_closed()
    assert len(closes) == 1 and isinstance(closes[0], ProtocolError)
    assert "nothing waits for" in str(closes[0])


async def test_server_closes_mid_frame() -> None:
    def bad(p: Peer) -> None:
        p.writer.write(struct.pack(">ii", 100, FRAME_RESPONSE) + b"partial")
        p.close()

    await run_after_publishes(bad, ConnectionClosedError, "middle of a frame")


async def test_server_closes_between_frames() -> None:
    await run_after_publishes(lambda p: p.close(), ConnectionClosedError,
                              "closed the connection")


@pytest.mark.parametrize(("codec", "bad", "match"), [
    # a compressed-data chunk whose CRC and payload are garbage
    ("snappy", b"\x00\x08\x00\x00" + b"\x01\x02\x03\x04garb", "corrupt snappy chunk"),
    # a reserved, unskippable chunk type
    ("snappy", b"\x05\x01\x00\x00x", "unskippable"),
    # BFINAL=1 with the reserved block type 3
    ("deflate", b"\xff\xff\xff\xff", "corrupt deflate stream"),
])
async def test_compression_corruption(codec: str, bad: bytes, match: str) -> None:
    await run_after_publishes(raw(bad), CompressionError, match, **{codec: True})


async def test_bad_frame_inside_a_valid_compressed_stream() -> None:
    await run_after_publishes(framed(struct.pack(">ii", -1, 0)), ProtocolError,
                              "invalid frame size", snappy=True)


async def handshake_failure(script: Callable[[Peer], Awaitable[None]],
                            exc_type: type[NSQError], match: str, **config: Any) -> None:
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(**config))
        with pytest.raises(exc_type, match=match):
            await conn.connect()
        assert conn.is_closed
    assert not leftover_tasks()


async def answer_identify_with(p: Peer, data: bytes) -> None:
    await p.read_magic()
    await p.expect(b"IDENTIFY")
    p.writer.write(data)
    await p.expect_eof()


@pytest.mark.parametrize(("answer", "exc_type", "match"), [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", ProtocolError, "HTTP"),
    (b"\x7f\xff\xff\xff garbage garbage", ProtocolError, "exceeds the maximum"),
    (struct.pack(">ii", -100, 0), ProtocolError, "invalid frame size"),
    (encode_frame(FRAME_RESPONSE, b"{not json"), ProtocolError, "not JSON"),
    (encode_frame(FRAME_RESPONSE, b"[1, 2]"), ProtocolError, "not a JSON object"),
    (encode_frame(FRAME_RESPONSE, b'{"max_rdy_count": "many"}'), ProtocolError,
     "invalid fields"),
    (encode_frame(FRAME_MESSAGE, b"x" * 30), ProtocolError, "frame of type 2"),
])
async def test_garbage_answer_to_identify(answer: bytes, exc_type: type[NSQError],
                                          match: str) -> None:
    async def script(p: Peer) -> None:
        await answer_identify_with(p, answer)

    await handshake_failure(script, exc_type, match)


async def test_garbage_right_after_a_plain_ok() -> None:
    async def script(p: Peer) -> None:
        await answer_identify_with(
            p, encode_frame(FRAME_RESPONSE, OK) + struct.pack(">ii", 1 << 30, 0))

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        # one write, but TCP may split it: the garbage fails either connect() itself or the
        # connection right after it; it is never ignored
        try:
            await conn.connect()
        except ProtocolError as exc:
            err: BaseException | None = exc
        else:
            async with asyncio.timeout(3):
                await conn.wait_closed()
            err = conn.error
        assert isinstance(err, ProtocolError) and "exceeds" in str(err)
        assert conn.is_closed


async def test_server_closes_in_the_middle_of_the_identify_answer() -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        p.writer.write(encode_frame(FRAME_RESPONSE, b'{"version": "1.3.0"}')[:10])
        p.close()

    await handshake_failure(script, ConnectionClosedError, "middle of a frame")


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_uncompressed_ok_after_a_compression_upgrade(codec: str) -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        resp = {"version": "1.3.0", codec: True, "deflate_level": 6}
        # the OK must be compressed; a server sending it plain breaks the stream
        p.writer.write(encode_frame(FRAME_RESPONSE, json.dumps(resp).encode())
                       + encode_frame(FRAME_RESPONSE, OK) + b"\xff" * 8)
        await p.expect_eof()

    await handshake_failure(script, CompressionError, "snappy|deflate", **{codec: True})
