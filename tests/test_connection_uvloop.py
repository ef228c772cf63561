"""The same connection on uvloop (the ``speed`` extra): its transports are not asyncio's
classes, and its TLS and buffering paths differ."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from smartnsq.config import ConnectionConfig, TLSConfig
from smartnsq.conn import Connection
from smartnsq.errors import ProtocolError, TLSError
from smartnsq.protocol.messages import MessageRecord, RawMessage, encode_message
from tests.scripted_server import Peer, ScriptedServer, leftover_tasks, make_tls

uvloop = pytest.importorskip("uvloop")


def run(main: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(20):
            await main()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(bounded())


def test_tls_snappy_publish_and_consume_on_uvloop(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)

    async def script(p: Peer) -> None:
        await p.handshake(tls=tls.server_ctx)
        for _ in range(100):
            await p.expect(b"PUB")
            p.send_response()
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        for i in range(50):
            p.send_message(encode_message(i, 1, b"%016d" % i, b"m%d" % i))
        for i in range(50):
            assert (await p.expect(b"FIN")).params == [b"%016d" % i]
        await p.expect(b"CLS")
        p.send_response(b"CLOSE_WAIT")
        await p.expect_eof()

    async def main() -> None:
        got: list[RawMessage] = []
        all_in = asyncio.Event()

        def on_records(conn: Connection, records: list[MessageRecord]) -> None:
            for msg in (RawMessage(*r) for r in records):
                got.append(msg)
                conn.fin(msg.id)
            if len(got) == 50:
                all_in.set()

        async with ScriptedServer(script) as srv:
            conn = Connection("127.0.0.1", srv.port, ConnectionConfig(
                snappy=True, tls=TLSConfig(enabled=True, ca_file=tls.ca_file)),
                on_records=on_records)
            await conn.connect()
            assert conn.tls and conn.compression == "snappy"
            # uvloop's transports report the socket address too
            peer = srv.peers[0].writer.get_extra_info("peername")
            assert conn.local_address == f"{peer[0]}:{peer[1]}"
            await asyncio.gather(*(conn.publish("t", b"x" * 200) for _ in range(100)))
            await conn.subscribe("t", "c")
            conn.send_rdy(50)
            async with asyncio.timeout(5):
                await all_in.wait()
            await conn.close()
        assert [m.body for m in got] == [b"m%d" % i for i in range(50)]
        assert not leftover_tasks()

    run(main)


def test_wrong_ca_and_bad_frame_on_uvloop(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)

    async def tls_script(p: Peer) -> None:
        await p.handshake(tls=tls.server_ctx)

    async def bad_script(p: Peer) -> None:
        await p.handshake()
        await p.expect(b"PUB")
        p.writer.write(struct.pack(">ii", -1, 0))
        await p.expect_eof()

    async def main() -> None:
        async with ScriptedServer(tls_script) as srv:
            conn = Connection("127.0.0.1", srv.port, ConnectionConfig(
                tls=TLSConfig(enabled=True, ca_file=tls.wrong_ca_file)))
            with pytest.raises(TLSError):
                await conn.connect()
            assert conn.is_closed
        async with ScriptedServer(bad_script) as srv:
            conn = Connection("127.0.0.1", srv.port, ConnectionConfig())
            await conn.connect()
            with pytest.raises(ProtocolError, match="invalid frame size"):
                await conn.publish("t", b"x")
            async with asyncio.timeout(3):
                await conn.wait_closed()
        assert not leftover_tasks()

    run(main)
