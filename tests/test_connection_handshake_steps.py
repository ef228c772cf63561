"""The sans-IO handshake (smartnsq.conn.handshake.Handshake) without sockets: bytes in, steps
out, against captured server answers where there are some."""

from __future__ import annotations

import json

import pytest

from smartnsq.config import ConnectionConfig
from smartnsq.conn.handshake import Compress, Done, Handshake, Send, StartTLS
from smartnsq.errors import ConfigError, Flavour, ProtocolError, ServerError, TLSError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    OK,
    encode_frame,
)
from tests.captures import capture


def hs(**cfg: object) -> Handshake:
    return Handshake(ConnectionConfig(**cfg), "127.0.0.1:4150", "127.0.0.1", 1 << 20)


def identify_frame(**fields: object) -> bytes:
    doc: dict[str, object] = {"version": "1.3.0", "max_rdy_count": 2500}
    doc.update(fields)
    return encode_frame(FRAME_RESPONSE, json.dumps(doc).encode())


def test_start_is_magic_and_identify() -> None:
    h = hs()
    data = h.start()
    assert data.startswith(MAGIC_V2)
    assert data[len(MAGIC_V2):] == commands.identify(h.config.identify_body())


def test_captured_stock_answer_is_done_with_its_facts() -> None:
    h = hs()
    h.start()
    assert h.next_step() is None  # nothing received yet
    frame = capture("stock/identify_response_frame.bin")
    h.feed(frame[:5])  # any chunking
    assert h.next_step() is None
    h.feed(frame[5:] + encode_frame(FRAME_RESPONSE, b"after"))
    step = h.next_step()
    assert isinstance(step, Done)
    assert step.negotiated.flavour is Flavour.STOCK
    assert step.negotiated.max_rdy == 2500 and step.negotiated.auth is None
    # bytes after the last handshake frame are the connection's
    assert h.take_buffer() == encode_frame(FRAME_RESPONSE, b"after")
    assert h.next_step() is None


def test_plain_ok_answer_keeps_the_default_max_rdy() -> None:
    h = hs(feature_negotiation=False)
    h.feed(encode_frame(FRAME_RESPONSE, OK))
    step = h.next_step()
    assert isinstance(step, Done)
    assert not step.negotiated.identify.negotiated
    assert step.negotiated.flavour is Flavour.UNKNOWN and step.negotiated.max_rdy == 2500


def test_heartbeat_is_answered_with_nop() -> None:
    h = hs()
    h.feed(encode_frame(FRAME_RESPONSE, HEARTBEAT) + identify_frame())
    assert h.next_step() == Send(commands.NOP)
    assert isinstance(h.next_step(), Done)


def test_tls_then_deflate_then_auth_in_order() -> None:
    h = hs(tls={"enabled": True, "server_hostname": "nsq.example"}, deflate=True,
           deflate_level=6, auth_secret="s3cret")
    h.feed(identify_frame(tls_v1=True, deflate=True, deflate_level=3, auth_required=True))
    assert h.next_step() == StartTLS("nsq.example")
    assert h.next_step() is None  # waits for upgraded()
    h.upgraded()
    h.feed(encode_frame(FRAME_RESPONSE, OK))
    # the server's lower level wins
    assert h.next_step() == Compress("deflate", 3)
    h.upgraded()
    h.feed(encode_frame(FRAME_RESPONSE, OK))
    assert h.next_step() == Send(commands.auth(b"s3cret"))
    h.feed(encode_frame(FRAME_RESPONSE, b'{"identity": "me", "permission_count": 1}'))
    step = h.next_step()
    assert isinstance(step, Done)
    assert step.negotiated.auth is not None and step.negotiated.auth.identity == "me"


def test_snappy_upgrade_step() -> None:
    h = hs(snappy=True)
    h.feed(identify_frame(snappy=True))
    assert h.next_step() == Compress("snappy", 0)
    h.upgraded()
    h.feed(encode_frame(FRAME_RESPONSE, OK))
    assert isinstance(h.next_step(), Done)


def test_error_answer_to_identify_is_the_typed_server_error() -> None:
    h = hs()
    h.feed(encode_frame(FRAME_ERROR, b"E_BAD_BODY IDENTIFY invalid"))
    with pytest.raises(ServerError, match="E_BAD_BODY"):
        h.next_step()


@pytest.mark.parametrize(("cfg", "fields", "exc", "match"), [
    ({}, {"snappy": True, "deflate": True}, ProtocolError, "both snappy and deflate"),
    ({}, {"snappy": True}, ProtocolError, "enabled snappy, which was not asked for"),
    ({"tls": {"enabled": True}}, {}, TLSError, "did not agree to TLS"),
    ({}, {"auth_required": True}, ConfigError, "requires AUTH but no auth_secret"),
])
def test_bad_negotiations_are_refused(cfg: dict[str, object], fields: dict[str, object],
                                      exc: type[Exception], match: str) -> None:
    h = hs(**cfg)
    h.feed(identify_frame(**fields))
    with pytest.raises(exc, match=match):
        h.next_step()


def test_bad_answers_are_protocol_errors() -> None:
    h = hs()
    h.feed(encode_frame(FRAME_MESSAGE, b"x" * 30))
    with pytest.raises(ProtocolError, match="answered IDENTIFY with a frame of type 2"):
        h.next_step()
    h = hs(snappy=True)
    h.feed(identify_frame(snappy=True))
    h.next_step()
    h.upgraded()
    h.feed(encode_frame(FRAME_RESPONSE, b"NOPE"))
    with pytest.raises(ProtocolError, match=r"expected OK .* after the snappy upgrade"):
        h.next_step()
    h = hs(tls={"enabled": True})
    h.feed(identify_frame(tls_v1=True) + encode_frame(FRAME_RESPONSE, OK))
    with pytest.raises(ProtocolError, match="sent data before the TLS handshake"):
        h.next_step()


def test_bad_frame_header_is_a_protocol_error() -> None:
    h = hs()
    h.feed(b"\x00\x00\x00\x02" + b"\x00" * 8)  # size 2 < 4
    with pytest.raises(ProtocolError):
        h.next_step()


def test_upgraded_without_an_upgrade_step_is_refused() -> None:
    h = hs()
    with pytest.raises(RuntimeError, match=r"upgraded\(\) in handshake phase identify"):
        h.upgraded()
