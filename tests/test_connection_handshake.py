"""Connection handshake against the scripted nsqd: IDENTIFY, TLS, snappy, deflate, AUTH."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest

from smartnsq.config import ConnectionConfig, TLSConfig
from smartnsq.conn import Connection
from smartnsq.errors import (
    AuthFailedError,
    BadBodyError,
    ConfigError,
    ConnectionClosedError,
    Flavour,
    NSQConnectionError,
    NSQTimeoutError,
    ProtocolError,
    TLSError,
)
from smartnsq.protocol.frames import MAGIC_V2, OK
from smartnsq.protocol.messages import BODY, ID, MessageRecord
from tests.scripted_server import (
    YOUZAN_VERSION,
    Peer,
    PeerClosed,
    ScriptedServer,
    leftover_tasks,
    make_tls,
)

SECRET = "s3cr3t-Tok3n-do-not-log"


def cfg(**kw: Any) -> ConnectionConfig:
    kw.setdefault("handshake_timeout", 3.0)
    kw.setdefault("close_timeout", 1.0)
    return ConnectionConfig(**kw)


async def pub_roundtrip(p: Peer, n: int = 1) -> list[bytes]:
    """Server side: answer ``n`` PUBs with OK; return their bodies."""
    bodies = []
    for _ in range(n):
        cmd = await p.expect(b"PUB")
        assert cmd.body is not None
        bodies.append(cmd.body)
        p.send_response()
    return bodies


async def test_identify_sends_every_field_and_records_the_answer() -> None:
    seen: dict[str, Any] = {}

    async def script(p: Peer) -> None:
        seen.update(await p.handshake(version=YOUZAN_VERSION,
                                      extra={"max_rdy_count": 100, "msg_timeout": 30000}))
        await p.expect(b"SUB")
        p.send_response()
        rdy = await p.expect(b"RDY")
        assert rdy.params == [b"100"]  # capped at the negotiated max_rdy_count
        await p.expect(b"CLS")
        p.send_response(b"CLOSE_WAIT")
        await p.expect_eof()

    config = cfg(client_id="cid", hostname="host.example", heartbeat_interval=10,
                 output_buffer_size=4096, output_buffer_timeout=0.1, sample_rate=5,
                 msg_timeout=30, extend_support=True, desired_tag="blue",
                 ext_filter={"type": 1, "filter_ext_key": "k", "filter_data": "v"})
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, config, on_records=lambda c, rs: None)
        ident = await conn.connect()
        assert conn.is_connected
        assert ident.negotiated and ident.version == YOUZAN_VERSION
        assert conn.identify is ident
        assert conn.flavour is Flavour.YOUZAN
        assert conn.max_rdy_count == 100
        assert conn.msg_timeout == 30.0
        assert conn.max_msg_timeout == 900.0
        await conn.subscribe("t", "c", 0, ext=True)
        assert conn.layout.ext and not conn.layout.position
        assert conn.send_rdy(5000)
        assert conn.rdy == 100
        await conn.close()
    assert seen == {
        "client_id": "cid", "hostname": "host.example", "user_agent": config.user_agent,
        "feature_negotiation": True, "heartbeat_interval": 10000, "output_buffer_size": 4096,
        "output_buffer_timeout": 100, "tls_v1": False, "snappy": False, "deflate": False,
        "deflate_level": 6, "sample_rate": 5, "msg_timeout": 30000, "extend_support": True,
        "desired_tag": "blue",
        "ext_filter": {"type": 1, "filter_ext_key": "k", "filter_data": "v"},
    }


@pytest.mark.parametrize("ask", [False, True])
async def test_plain_ok_answer_without_negotiation(ask: bool) -> None:
    async def script(p: Peer) -> None:
        ident = await p.handshake(negotiate=False)
        assert ident["feature_negotiation"] is ask
        assert await pub_roundtrip(p) == [b"hello"]
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(feature_negotiation=ask))
        ident = await conn.connect()
        assert not ident.negotiated
        assert conn.flavour is Flavour.UNKNOWN
        assert conn.max_rdy_count == 2500
        await conn.publish("t", b"hello")
        await conn.close()


async def test_stock_flavour_detected() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(version="1.3.0")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        assert conn.flavour is Flavour.STOCK
        await conn.close()


async def test_tls_upgrade_with_verified_certificate(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)

    async def script(p: Peer) -> None:
        await p.handshake(tls=tls.server_ctx)
        assert p.writer.get_extra_info("ssl_object") is not None
        assert await pub_roundtrip(p, 2) == [b"a", b"b"]
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port,
                          cfg(tls=TLSConfig(enabled=True, ca_file=tls.ca_file)))
        await conn.connect()
        assert conn.tls
        await asyncio.gather(conn.publish("t", b"a"), conn.publish("t", b"b"))
        await conn.close()


async def test_tls_with_client_certificate_and_snappy(tmp_path: Path) -> None:
    tls = make_tls(tmp_path, require_client_cert=True)

    async def script(p: Peer) -> None:
        await p.handshake(tls=tls.server_ctx)
        assert p.writer.get_extra_info("peercert") is not None
        assert await pub_roundtrip(p) == [b"x" * 5000]
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(
            snappy=True,
            tls=TLSConfig(enabled=True, ca_file=tls.ca_file, cert_file=tls.client_cert_file,
                          key_file=tls.client_key_file)))
        await conn.connect()
        assert conn.tls and conn.compression == "snappy"
        await conn.publish("t", b"x" * 5000)
        await conn.close()


async def test_tls_wrong_ca_fails_and_closes(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    ended = asyncio.Event()

    async def script(p: Peer) -> None:
        try:
            await p.handshake(tls=tls.server_ctx)
        finally:
            ended.set()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port,
                          cfg(tls=TLSConfig(enabled=True, ca_file=tls.wrong_ca_file)))
        with pytest.raises(TLSError, match="certificate verify failed"):
            await conn.connect()
        assert conn.is_closed
        async with asyncio.timeout(3):
            await ended.wait()  # the server saw the handshake fail and the socket close
    assert not leftover_tasks()


async def test_tls_verification_can_be_switched_off(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)

    async def script(p: Peer) -> None:
        await p.handshake(tls=tls.server_ctx)
        await pub_roundtrip(p)
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        # no CA at all: only an explicit verify=False makes this work
        conn = Connection("127.0.0.1", srv.port, cfg(tls=TLSConfig(enabled=True, verify=False)))
        await conn.connect()
        await conn.publish("t", b"x")
        await conn.close()


async def test_tls_verifies_the_host_name(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)

    async def script(p: Peer) -> None:
        await p.handshake(tls=tls.server_ctx)

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(tls=TLSConfig(
            enabled=True, ca_file=tls.ca_file, server_hostname="other.example")))
        with pytest.raises(TLSError):
            await conn.connect()


async def test_tls_refused_by_server_is_an_error() -> None:
    async def script(p: Peer) -> None:
        await p.handshake(tls=None)  # server without TLS answers tls_v1: false
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(tls=TLSConfig(enabled=True, verify=False)))
        with pytest.raises(TLSError, match="did not agree to TLS"):
            await conn.connect()
        assert conn.is_closed


@pytest.mark.parametrize("coalesce", [False, True])
@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_compression_both_directions(codec: str, coalesce: bool) -> None:
    got: list[bytes] = []
    body = b"compressible " * 2000

    async def script(p: Peer) -> None:
        await p.handshake(coalesce=coalesce)
        await p.expect(b"SUB")
        p.send_response()
        await p.expect(b"RDY")
        p.send_message(b"\x00" * 8 + b"\x00\x01" + b"0123456789abcdef" + body)
        fin = await p.expect(b"FIN")
        assert fin.params == [b"0123456789abcdef"]
        got.extend(await pub_roundtrip(p))
        await p.expect(b"CLS")
        p.send_response(b"CLOSE_WAIT")
        await p.expect_eof()

    received: list[bytes] = []
    done = asyncio.Event()

    def on_records(c: Connection, records: list[MessageRecord]) -> None:
        for r in records:
            received.append(r[BODY])
            c.fin(r[ID])
        done.set()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(**{codec: True}), on_records=on_records)
        await conn.connect()
        assert conn.compression == codec
        await conn.subscribe("t", "c")
        conn.send_rdy(1)
        async with asyncio.timeout(3):
            await done.wait()
        await conn.publish("t", body)
        stats = conn.stats()
        # the bodies went compressed: far fewer bytes than they hold
        assert stats.bytes_in < len(body) // 4 and stats.bytes_out < len(body) // 4
        await conn.close()
    assert received == [body] and got == [body]


async def test_auth_success_and_secret_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def script(p: Peer) -> None:
        await p.handshake(auth_secret=SECRET)
        await pub_roundtrip(p)
        await p.expect_eof()

    config = cfg(auth_secret=SECRET)
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, config)
        await conn.connect()
        assert conn.auth is not None and conn.auth.identity == "tester"
        await conn.publish("t", b"x")
        shown = [repr(conn), str(conn), repr(config), str(config), repr(conn.config.auth_secret),
                 repr(conn.stats()), json.dumps(config.identify_body())]
        await conn.close()
    shown.append(caplog.text)
    assert not any(SECRET in s for s in shown)


async def test_auth_failure_raises_typed_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def script(p: Peer) -> None:
        await p.handshake(auth_secret="the-right-one")

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(auth_secret=SECRET))
        with pytest.raises(AuthFailedError) as info:
            await conn.connect()
        assert conn.is_closed
    assert info.value.fatal
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    assert SECRET not in caplog.text


async def test_auth_required_without_secret() -> None:
    async def script(p: Peer) -> None:
        with contextlib.suppress(PeerClosed):
            await p.handshake(auth_secret="x")

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        with pytest.raises(ConfigError, match="requires AUTH"):
            await conn.connect()
        assert conn.is_closed


async def test_identify_error_frame_is_typed() -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        p.send_error(b"E_BAD_BODY IDENTIFY heartbeat interval (500) is invalid")
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        with pytest.raises(BadBodyError, match="heartbeat interval"):
            await conn.connect()
        assert conn.is_closed


async def test_heartbeat_during_handshake_is_answered() -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        p.send_response(b"_heartbeat_")
        await p.expect(b"NOP")
        p.send_response(OK)
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(feature_negotiation=False))
        await conn.connect()
        await conn.close()


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn = Connection("127.0.0.1", port, cfg())
    with pytest.raises(NSQConnectionError, match="cannot connect"):
        await conn.connect()
    assert conn.is_closed


async def test_server_never_answers_identify() -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        await p.expect_eof()  # says nothing until the client gives up

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg(handshake_timeout=0.2))
        with pytest.raises(NSQTimeoutError, match="handshake"):
            await conn.connect()
        assert conn.is_closed
    assert not leftover_tasks()


async def test_server_closes_during_handshake() -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        p.close()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        with pytest.raises(ConnectionClosedError):
            await conn.connect()
        assert conn.is_closed


async def test_unrequested_upgrade_is_rejected() -> None:
    async def script(p: Peer) -> None:
        await p.read_magic()
        await p.expect(b"IDENTIFY")
        p.send_response(json.dumps({"version": "1.3.0", "snappy": True}).encode())
        await p.expect_eof()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        with pytest.raises(ProtocolError, match="not asked for"):
            await conn.connect()


async def test_connect_twice_and_close_before_connect() -> None:
    conn = Connection("127.0.0.1", 1, cfg())
    await conn.close()
    assert conn.is_closed
    with pytest.raises(Exception, match="closed"):
        await conn.connect()


@pytest.mark.parametrize("tls", [False, True])
async def test_local_address_is_the_peer_address_the_server_saw(tls: bool,
                                                                tmp_path: Path) -> None:
    files = make_tls(tmp_path) if tls else None
    seen: list[str] = []
    after_dial: list[str | None] = []
    conn: Connection | None = None

    async def script(p: Peer) -> None:
        host, port = p.writer.get_extra_info("peername")[:2]
        seen.append(f"{host}:{port}")
        # the magic arrives once the client's TCP connection is up, before the handshake
        assert await p.read_magic() == MAGIC_V2
        assert conn is not None
        after_dial.append(conn.local_address)
        cmd = await p.expect(b"IDENTIFY")
        assert cmd.body is not None
        if files is None:
            p.send_response(OK)
        else:
            p.send_response(json.dumps({"version": "1.3.0", "tls_v1": True}).encode())
            await p.start_tls(files.server_ctx)
            p.send_response(OK)
        await p.expect_eof()

    config = cfg() if files is None else cfg(tls=TLSConfig(enabled=True,
                                                            ca_file=files.ca_file))
    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, config)
        assert conn.local_address is None  # before connect()
        await conn.connect()
        assert conn.tls is tls
        assert conn.local_address == seen[0]
        assert after_dial == seen
        await conn.close()
        assert conn.local_address is None  # after close


async def test_local_address_is_none_after_a_failed_connect_or_a_lost_connection() -> None:
    async def script(p: Peer) -> None:
        await p.handshake()
        p.close()

    async with ScriptedServer(script) as srv:
        conn = Connection("127.0.0.1", srv.port, cfg())
        await conn.connect()
        await conn.wait_closed()
        assert conn.local_address is None
    refused = Connection("127.0.0.1", 1, cfg(dial_timeout=2.0))
    with pytest.raises(NSQConnectionError):
        await refused.connect()
    assert refused.local_address is None
